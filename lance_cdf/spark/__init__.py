"""Everything that runs inside Spark: the `lance-cdf` data source (source/), the
`lance-cdf-kafka` sink and its writer tasks (sink/), and the Spark job that `lance-cdf
publish` runs (publish/)."""
