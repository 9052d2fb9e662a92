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

Modules: maven (provisioning), process (child-process lifecycle), kafka, registry,
s3 (+ s3app, the server process).
"""

from lance_cdf.devtools.kafka import KafkaBroker
from lance_cdf.devtools.maven import default_cache_dir, provision, versions
from lance_cdf.devtools.process import free_port
from lance_cdf.devtools.registry import SchemaRegistry
from lance_cdf.devtools.s3 import S3Server

__all__ = [
    "KafkaBroker",
    "S3Server",
    "SchemaRegistry",
    "default_cache_dir",
    "free_port",
    "provision",
    "versions",
]
