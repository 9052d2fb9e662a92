"""Kafka, without Spark: the producer of change records (publisher.py), the BEGIN/END
records of each commit version (transactions.py), the topics lance-cdf writes, created on
purpose (topics.py), the broker / topic / registry checks (endpoints.py), a broker outage
ridden out (outage.py) and the clients a process shares (clients.py)."""
