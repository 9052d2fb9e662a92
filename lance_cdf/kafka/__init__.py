"""Publishing change events to Kafka: the publisher (publisher.py), the Spark sink
`format("lance-cdf-kafka")` (sink.py), the `lance-cdf publish` runner (publish.py) and the
broker / topic / registry checks (endpoints.py)."""
