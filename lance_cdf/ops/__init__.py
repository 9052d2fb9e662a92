"""Operational plumbing every job shares: the user's client settings (one place for every
Kafka, registry and object-store client), checkpoint and replica leases, metrics and the
`status` view, glibc malloc switches, small caches, and the private pylance/PySpark
interfaces lance-cdf relies on. Imports errors and format only."""
