"""docker-compose.yml cannot run here (no Docker engine): check its structure
against what the README documents."""

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_compose_names_the_documented_services_and_ports():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert set(services) == {"kafka", "schema-registry", "publisher", "replicator"}
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
