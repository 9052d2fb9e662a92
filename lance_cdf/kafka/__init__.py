"""Kafka, without Spark: the producer of change records (`publisher`), the BEGIN/END
records of each commit version (`transactions`), the topics lance-cdf writes, created on
purpose (`topics`), the broker / topic / registry checks (`endpoints`), a broker outage
ridden out (`outage`) and the clients a process shares (`clients`)."""
