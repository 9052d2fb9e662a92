"""Local infrastructure for tests and the demo: a real single-node Apache Kafka broker
(KRaft) and a real Apicurio schema registry (Confluent-compatible API), both run from
jars that Maven resolves from Maven Central into `.cache/devtools/` (see pom.xml), and
an S3-compatible server (moto, from PyPI) for tables on object storage.

    provision()                        # once; later calls do no network work
    with KafkaBroker() as kafka, SchemaRegistry() as registry:
        kafka.bootstrap_servers        # "127.0.0.1:<port>"
        registry.url                   # "http://127.0.0.1:<port>/apis/ccompat/v7"

    with S3Server() as s3:
        s3.create_bucket("tables")
        s3.storage_options()           # aws_endpoint, aws_region, keys, allow_http

    with SecureKafkaBroker() as kafka, SecureSchemaRegistry() as registry:
        kafka.client_config            # SASL_SSL, SCRAM-SHA-512, sasl.*, ssl.ca.location
        registry.client_config         # basic.auth.user.info, ssl.ca.location (HTTPS url)

    with KafkaCluster() as cluster:    # three KRaft nodes, replication factor 3
        cluster.kill(cluster.leader("topic", 0)); cluster.restart(...)

Modules: maven (provisioning), process (child-process lifecycle), kafka, kafkacluster
(three brokers), registry, tls (a CA and certificates per run), authproxy (HTTPS + basic
auth in front of the registry), s3 (+ s3app, the server process).
"""

from lance_cdf_devtools.kafka import KafkaBroker, SecureKafkaBroker
from lance_cdf_devtools.kafkacluster import KafkaCluster
from lance_cdf_devtools.maven import default_cache_dir, provision, versions
from lance_cdf_devtools.process import free_port
from lance_cdf_devtools.registry import SchemaRegistry, SecureSchemaRegistry
from lance_cdf_devtools.s3 import S3Server

__all__ = [
    "KafkaBroker",
    "KafkaCluster",
    "S3Server",
    "SchemaRegistry",
    "SecureKafkaBroker",
    "SecureSchemaRegistry",
    "default_cache_dir",
    "free_port",
    "provision",
    "versions",
]
