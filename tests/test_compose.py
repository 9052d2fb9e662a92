"""docker-compose.yml cannot run here (no Docker engine): check its structure
against what the README documents."""

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_compose_names_the_documented_services_and_ports():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert set(services) == {
        "kafka", "schema-registry", "publisher", "replicator", "postgres", "connect",
        "connect-sink",
    }  # fmt: skip
    assert "9092:9092" in services["kafka"]["ports"]
    assert "8081:8080" in services["schema-registry"]["ports"]
    publisher = services["publisher"]
    assert set(publisher["depends_on"]) == {"kafka", "schema-registry"}
    assert "./data:/data" in publisher["volumes"]
    command = publisher["command"]
    assert command.startswith("lance-cdf publish") and "--bootstrap-servers kafka:29092" in command
    replicator = services["replicator"]
    assert "./data:/data" in replicator["volumes"]
    assert replicator["command"].startswith("lance-cdf replicate")
    assert "--topic source.cdf" in replicator["command"]  # the topic the publisher writes
    advertised = services["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    assert "INTERNAL://kafka:29092" in advertised
    readme = (ROOT / "README.md").read_text()
    for port in ("9092", "8081"):
        assert port in readme
    assert (ROOT / "Dockerfile").exists()


def test_compose_runs_lance_to_kafka_to_postgresql_with_debeziums_jdbc_sink():
    """The Connect + Debezium JDBC + PostgreSQL services, and a sink configuration with
    the settings tests/test_debezium.py runs (key mode, converter, topic, table)."""
    import json

    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    assert "5432:5432" in services["postgres"]["ports"]
    connect = services["connect"]
    assert connect["image"].startswith("quay.io/debezium/connect:")
    assert {"kafka", "schema-registry", "postgres"} <= set(connect["depends_on"])
    env = connect["environment"]
    assert env["BOOTSTRAP_SERVERS"] == "kafka:29092" and env["ENABLE_APICURIO_CONVERTERS"] == "true"
    sink = services["connect-sink"]
    assert "./docker:/docker:ro" in sink["volumes"]
    assert "/docker/pg-sink.json" in sink["command"] and "connect:8083" in sink["command"]
    config = json.loads((ROOT / "docker" / "pg-sink.json").read_text())
    publisher = services["publisher"]["command"]
    assert f"--topic {config['topics']}" in publisher
    assert config["connector.class"] == "io.debezium.connector.jdbc.JdbcSinkConnector"
    assert config["connection.url"].startswith("jdbc:postgresql://postgres:5432/")
    assert (config["insert.mode"], config["delete.enabled"], config["primary.key.mode"]) == (
        "upsert",
        "true",
        "record_key",
    )
    for side in ("key", "value"):
        assert config[f"{side}.converter"] == "io.apicurio.registry.utils.converter.AvroConverter"
        assert config[f"{side}.converter.apicurio.registry.url"] == (
            "http://schema-registry:8080/apis/registry/v2"
        )
        assert config[f"{side}.converter.apicurio.registry.as-confluent"] == "true"
    # the README's sink configuration is the one the Debezium test runs
    readme = (ROOT / "README.md").read_text()
    assert "## Consume with Kafka Connect / Debezium" in readme
    for line in ("connector.class=io.debezium.connector.jdbc.JdbcSinkConnector",
                 "primary.key.mode=record_key", "insert.mode=upsert", "delete.enabled=true",
                 "value.converter.apicurio.registry.as-confluent=true"):  # fmt: skip
        assert line in readme
