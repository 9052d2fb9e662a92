"""Client settings from files and the environment, and the redaction rule
(lance_cdf/ops/clientconfig.py)."""

import json
import logging
import subprocess

import pytest

from lance_cdf import cli
from lance_cdf.cli import flags
from lance_cdf.errors import ClientConfigError
from lance_cdf.ops.clientconfig import (
    LIBRDKAFKA_SENSITIVE,
    ScrubFilter,
    expand_env,
    is_secret,
    parse_properties,
    redact,
    redact_url,
    remember,
    scrub,
    settings,
)

# what Kafka users write in client.properties, with the corners of the format
PROPERTIES = r"""# a comment
! another comment
   # an indented comment

bootstrap.servers=broker1:9093,broker2:9093
security.protocol = SASL_SSL
sasl.mechanism: SCRAM-SHA-512
sasl.username   alice
sasl.password=p\=ss\:w\\ord\u00e9
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \
    username="alice" \
    password="s3cret";
ssl.ca.location=/etc/ssl/ca.pem
empty.value=
key\ with\ spaces=v
tab\tkey=a\tb
trailing.spaces=x   
only.key
hash.in.value=a#b!c
even.backslashes=ends\\\\
\u0041key=\u00e9t\u00e9
continued.empty=a\
	
after.empty=b
colon:=x
"""


def test_parse_properties_the_subset_kafka_users_write():
    got = parse_properties(PROPERTIES)
    assert got["bootstrap.servers"] == "broker1:9093,broker2:9093"
    assert got["security.protocol"] == "SASL_SSL"
    assert got["sasl.mechanism"] == "SCRAM-SHA-512"
    assert got["sasl.username"] == "alice"
    assert got["sasl.password"] == "p=ss:w\\ord\u00e9"
    assert got["sasl.jaas.config"] == (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="alice" password="s3cret";'
    )
    assert got["empty.value"] == ""
    assert got["key with spaces"] == "v"
    assert got["tab\tkey"] == "a\tb"
    assert got["trailing.spaces"] == "x   "
    assert got["only.key"] == ""
    assert got["hash.in.value"] == "a#b!c"
    assert got["even.backslashes"] == "ends\\\\"
    assert got["Akey"] == "\u00e9t\u00e9"
    assert got["continued.empty"] == "a" and got["after.empty"] == "b"
    assert got["colon"] == "=x"
    assert len(got) == 18


def test_a_malformed_unicode_escape_names_its_line():
    text = "a=1\r\n\f\n# note\nb=ok\\\n  more\nbad=\\u00zz\n"
    with pytest.raises(ClientConfigError, match=r"^client.properties:6: malformed \\uXXXX"):
        parse_properties(text, "client.properties")


@pytest.mark.integration  # runs the JDK: java.util.Properties is the oracle
def test_parse_properties_agrees_with_java_util_properties(tmp_path):
    from lance_cdf_devtools.process import java_executable

    (tmp_path / "p.properties").write_text(PROPERTIES, encoding="utf-8")
    (tmp_path / "Dump.java").write_text(
        "import java.io.*; import java.util.*; import java.nio.charset.StandardCharsets;\n"
        "public class Dump { public static void main(String[] a) throws Exception {\n"
        " Properties p = new Properties();\n"
        " try (Reader r = new InputStreamReader(new FileInputStream(a[0]), "
        "StandardCharsets.UTF_8)) { p.load(r); }\n"
        ' StringBuilder b = new StringBuilder("{"); boolean first = true;\n'
        " for (String k : p.stringPropertyNames()) { if (!first) b.append(','); first = false;\n"
        "  b.append(q(k)).append(':').append(q(p.getProperty(k))); }\n"
        " System.out.print(b.append('}')); }\n"
        ' static String q(String s) { StringBuilder b = new StringBuilder("\\"");\n'
        '  for (char c : s.toCharArray()) b.append(String.format("\\\\u%04x", (int) c));\n'
        "  return b.append('\"').toString(); } }\n"
    )
    done = subprocess.run(
        [java_executable(), str(tmp_path / "Dump.java"), str(tmp_path / "p.properties")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert parse_properties(PROPERTIES) == json.loads(done.stdout)


def test_env_references_expand_and_a_missing_one_is_named_not_shown():
    env = {"KAFKA_PW": "hunter2", "USER": "bob"}
    assert expand_env("${env:USER}:${env:KAFKA_PW}", env) == "bob:hunter2"
    assert expand_env("no reference", env) == "no reference"
    with pytest.raises(ClientConfigError, match="'NOPE'.*--producer-config sasl.password"):
        expand_env("x${env:NOPE}", env, "--producer-config sasl.password")


def test_flags_win_over_the_file_and_env_expands_in_both(tmp_path, monkeypatch):
    f = tmp_path / "client.properties"
    f.write_text("sasl.username=${env:U}\nsasl.password=from-file\nacks=all\n")
    monkeypatch.setenv("U", "alice")
    monkeypatch.setenv("PW", "pw-from-env")
    got = settings(
        ["sasl.password=${env:PW}", "linger.ms=5"],
        str(f),
        "--producer-config",
        "--producer-config-file",
    )
    assert got == {
        "sasl.username": "alice",
        "sasl.password": "pw-from-env",
        "acks": "all",
        "linger.ms": "5",
    }
    monkeypatch.delenv("U")
    with pytest.raises(ClientConfigError, match="'U'.*--producer-config-file"):
        settings([], str(f), "--producer-config", "--producer-config-file")


def test_file_and_flag_errors_never_repeat_a_value(tmp_path):
    with pytest.raises(ClientConfigError, match="cannot read --registry-config-file"):
        settings([], str(tmp_path / "missing"), file_flag="--registry-config-file")
    with pytest.raises(ClientConfigError) as err:
        settings(["sasl.passwordhunter2"], flag="--producer-config")
    assert "hunter2" not in str(err.value)


def test_every_librdkafka_sensitive_property_and_registry_credential_is_secret():
    for key in LIBRDKAFKA_SENSITIVE | {
        "basic.auth.user.info",
        "bearer.auth.token",
        "bearer.auth.client.secret",
        "aws_secret_access_key",
        "aws_access_key_id",
        "aws_session_token",
        "google_service_account_key",
        "azure_storage_account_key",
        "SECRET",
        "x_credential",
        "kafka.sasl.jaas.config",
        "storage.aws_secret_access_key",
    }:
        assert is_secret(key), key
    for key in (
        "bootstrap.servers",
        "security.protocol",
        "sasl.mechanism",
        "acks",
        "ssl.ca.location",
        "enable.ssl.certificate.verification",
        "aws_region",
        "session.timeout.ms",
        "url",
    ):
        assert not is_secret(key), key


def test_redact_masks_secrets_and_url_user_info():
    cfg = {
        "sasl.oauthbearer.config": "principal=x secret=y",
        "sasl.oauthbearer.assertion.private.key.passphrase": "pp",
        "security.protocol": "SASL_SSL",
        "aws_endpoint": "https://minio:m1n10pw@minio.local:9000",
    }
    assert redact(cfg) == {
        "sasl.oauthbearer.config": "***",
        "sasl.oauthbearer.assertion.private.key.passphrase": "***",
        "security.protocol": "SASL_SSL",
        "aws_endpoint": "https://***@minio.local:9000",
    }
    assert redact_url("GET https://u:p@h:1/x and http://h/y s3://k:s@bucket/t") == (
        "GET https://***@h:1/x and http://h/y s3://***@bucket/t"
    )


def test_scrub_removes_remembered_values_from_errors_and_log_records(caplog):
    remember(
        {
            "sasl.password": "Zq9-secret-value",
            "acks": "all",
            "url": "https://reg:Reg-pw-77@registry:8443/apis",
        }
    )
    assert scrub("auth failed for Zq9-secret-value at all") == "auth failed for *** at all"
    assert "Reg-pw-77" not in scrub("bad basic auth reg:Reg-pw-77")
    logger = logging.getLogger("test_clientconfig.scrub")
    handler = logging.StreamHandler()
    handler.addFilter(ScrubFilter())
    record = logger.makeRecord(
        logger.name,
        logging.INFO,
        __file__,
        1,
        "HTTP Request: GET %s",
        ("https://reg:Reg-pw-77@registry/x",),
        None,
    )
    handler.filter(record)
    assert record.getMessage() == "HTTP Request: GET https://***@registry/x"


def test_cli_reads_settings_files_and_env(tmp_path, monkeypatch):
    f = tmp_path / "producer.properties"
    f.write_text("sasl.password=${env:PW}\nacks=all\n")
    monkeypatch.setenv("PW", "from-env")
    args = cli.build_parser().parse_args(
        [
            "publish",
            "--table",
            "t",
            "--bootstrap-servers",
            "b:1",
            "--topic",
            "x",
            "--schema-registry",
            "http://r",
            "--checkpoint",
            "c",
            "--producer-config-file",
            str(f),
            "--producer-config",
            "acks=1",
            "--registry-config-file",
            str(f),
            "--storage-option",
            "aws_secret_access_key=${env:PW}",
        ]
    )
    assert flags.client_settings(args, "producer_config") == {
        "sasl.password": "from-env",
        "acks": "1",
    }
    assert flags.client_settings(args, "registry_config") == {
        "sasl.password": "from-env",
        "acks": "all",
    }
    assert flags.storage_options(args.storage_option) == {"aws_secret_access_key": "from-env"}


def test_cli_error_names_the_variable_and_exits_2(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("LANCE_CDF_TEST_UNSET", raising=False)
    secret = "aws_secret_access_key=${env:LANCE_CDF_TEST_UNSET}"
    code = cli.main(["status", "--table", str(tmp_path / "x"), "--storage-option", secret])
    assert code == 2
    err = capsys.readouterr().err
    assert "LANCE_CDF_TEST_UNSET" in err and "--storage-option" in err


def test_each_role_gets_every_connection_setting_and_only_its_own_keys():
    """What the user gave reaches every kind of client (TLS verification off, a CA,
    SASL, client.id, a socket timeout, DNS), less the keys of another kind of client; the
    role's defaults yield to the user, its fixed keys do not; no client auto-creates."""
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient

    from lance_cdf.ops.clientconfig import CONSUMER_ONLY, KafkaConnection, registry_config

    connection_settings = {
        "security.protocol": "SASL_SSL",
        "enable.ssl.certificate.verification": "false",
        "ssl.ca.location": "/etc/ssl/certs",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "u",
        "sasl.password": "p",
        "client.id": "probe",
        "socket.timeout.ms": "45000",
        "client.dns.lookup": "use_all_dns_ips",
    }
    producer_only = {"acks": "1", "linger.ms": "5", "compression.type": "lz4"}
    consumer_only = {"fetch.wait.max.ms": "7", "isolation.level": "read_uncommitted"}
    given = {
        **connection_settings,
        **producer_only,
        **consumer_only,
        "allow.auto.create.topics": "true",
    }
    c = KafkaConnection("127.0.0.1:9", given)
    producer = c.producer(defaults={"acks": "all", "linger.ms": 20}, fixed={"retries": 3})
    assert producer == {
        **connection_settings,
        **producer_only,
        "retries": 3,
        "bootstrap.servers": "127.0.0.1:9",
        "allow.auto.create.topics": False,
    }
    consumer = c.consumer(
        defaults={"auto.offset.reset": "earliest"},
        fixed={"group.id": "g", "isolation.level": "read_committed"},
    )
    assert consumer == {
        **connection_settings,
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": "7",
        "group.id": "g",
        "isolation.level": "read_committed",
        "bootstrap.servers": "127.0.0.1:9",
        "allow.auto.create.topics": False,
    }
    admin = c.admin()
    assert admin == {
        **connection_settings,
        "bootstrap.servers": "127.0.0.1:9",
        "allow.auto.create.topics": False,
    }
    assert not set(admin) & CONSUMER_ONLY
    # librdkafka takes each as a configuration of its kind
    Producer(producer).flush(0)
    Consumer(consumer).close()
    AdminClient(admin)
    reg = {"ssl.ca.location": "/ca.pem", "basic.auth.user.info": "a:b", "timeout": 5}
    assert registry_config("https://r", reg, defaults={"timeout": 10, "max.retries": 0}) == {
        **reg,
        "max.retries": 0,
        "url": "https://r",
    }


def test_a_registry_error_names_the_url_without_its_user_info():
    from lance_cdf.kafka.endpoints import check_registry
    from lance_cdf_devtools.process import free_port

    url = f"http://reg-user:Reg-Secret-91@127.0.0.1:{free_port()}/apis/ccompat/v7"
    with pytest.raises(Exception) as err:  # noqa: PT011 - the message is what is checked
        check_registry(url, {"timeout": 2, "max.retries": 0})
    text = str(err.value)
    assert "Reg-Secret-91" not in text and "reg-user" not in text
    assert "http://***@127.0.0.1:" in text
