"""docker-compose.yml cannot run here (no Docker engine): validate it against the
Compose Specification's JSON schema, and check what the schema cannot know (the
services, ports, topics and sink settings the documentation describes) against the docs.

The schema is `compose-spec.json` as the `check-jsonschema` package on PyPI ships it
(with its Apache-2.0 licence, `builtin_schemas/vendor/licenses/LICENSE.compose-spec`)."""

import copy
import importlib.resources
import json
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def compose_file() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


@pytest.fixture(scope="module")
def compose_validator():
    vendor = importlib.resources.files("check_jsonschema.builtin_schemas.vendor")
    schema = json.loads(vendor.joinpath("compose-spec.json").read_text())
    assert schema["title"] == "Compose Specification"
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def schema_errors(validator, document) -> list[str]:
    return sorted(
        f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
        for e in validator.iter_errors(document)
    )


def test_compose_file_follows_the_compose_specification(compose_validator):
    assert schema_errors(compose_validator, compose_file()) == []


def _set(path, value):
    def mutate(doc):
        *parents, last = path
        for key in parents:
            doc = doc[key]
        doc[last] = value

    return mutate


# case: (where the error must be reported, what its message must say, the breakage)
BROKEN = {
    "unknown top-level key": ([], "'servics'", _set(["servics"], {})),
    "misspelt service key": (
        ["services", "publisher"],
        "'comand' was unexpected",
        _set(["services", "publisher", "comand"], "lance-cdf"),
    ),
    "ports not a list": (
        ["services", "kafka", "ports"],
        "is not of type 'array'",
        _set(["services", "kafka", "ports"], 9092),
    ),
    "unknown depends_on condition": (
        ["services", "connect", "depends_on"],
        "is not valid under any",
        _set(["services", "connect", "depends_on"], {"kafka": {"condition": "when_ready"}}),
    ),
    "environment value a list": (
        ["services", "connect", "environment"],
        "is not valid under any",
        _set(["services", "connect", "environment", "GROUP_ID"], ["a", "b"]),
    ),
    "volume of an unknown type": (
        ["services", "replicator", "volumes", 0],
        "is not valid under any",
        _set(["services", "replicator", "volumes"], [{"type": "disk", "target": "/data"}]),
    ),
}


@pytest.mark.parametrize("case", BROKEN)
def test_the_schema_rejects_a_broken_copy_where_it_is_broken(compose_validator, case):
    """The validation can fail: each broken copy of the file is rejected, with an error
    at the place that was broken."""
    where, says, mutate = BROKEN[case]
    broken = copy.deepcopy(compose_file())
    mutate(broken)
    errors = [(list(e.absolute_path), e.message) for e in compose_validator.iter_errors(broken)]
    assert any(path == where and says in message for path, message in errors), errors


def test_compose_names_the_documented_services_and_ports():
    compose = compose_file()
    services = compose["services"]
    assert set(services) == {
        "kafka",
        "schema-registry",
        "publisher",
        "replicator",
        "postgres",
        "connect",
        "connect-sink",
    }
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
    docker = (ROOT / "docs/guides/replicate.md").read_text().split("## With Docker", 1)[1]
    for port in ("localhost:9092", "localhost:8081"):
        assert port in docker
    assert (ROOT / "Dockerfile").exists()


def test_compose_runs_lance_to_kafka_to_postgresql_with_debeziums_jdbc_sink():
    """The Connect + Debezium JDBC + PostgreSQL services, and a sink configuration with
    the settings test_debezium runs (key mode, converter, topic, table)."""
    services = compose_file()["services"]
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
    # the Debezium guide's sink configuration is the one the Debezium test runs
    guide = (ROOT / "docs/guides/debezium.md").read_text()
    assert guide.startswith("# Consume with Debezium / Kafka Connect")
    for line in (
        "connector.class=io.debezium.connector.jdbc.JdbcSinkConnector",
        "primary.key.mode=record_key",
        "insert.mode=upsert",
        "delete.enabled=true",
        "value.converter.apicurio.registry.as-confluent=true",
    ):
        assert line in guide
