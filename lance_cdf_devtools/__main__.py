"""`python -m lance_cdf_devtools provision|up|s3`.

provision  resolve the broker and registry into the cache (no network once cached)
up         start both on free 127.0.0.1 ports, print where, run until Ctrl-C or SIGTERM
           (--secure: the broker's only client listener is SASL_SSL with SCRAM-SHA-512 and
           ACLs are enforced, and the registry sits behind HTTPS + basic auth; the client
           settings, credentials included, go to Java-properties files whose paths are
           printed: the client's, the registry's, and the broker admin's)
deny       with --admin-config-file (from `up --secure`): deny the client user every
           operation on --topic / --group (ACLs), to try a refused client
s3         start the local S3 server with bucket `tables`, print its storage options,
           run until Ctrl-C or SIGTERM
connect    resolve Kafka Connect + the Debezium JDBC sink (PostgreSQL driver, Apicurio
           converter) into the cache and print the worker's classpath and plugin.path
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
import time
from pathlib import Path
from typing import NoReturn

from lance_cdf_devtools.kafka import KafkaBroker, SecureKafkaBroker
from lance_cdf_devtools.maven import provision, versions
from lance_cdf_devtools.registry import SchemaRegistry, SecureSchemaRegistry
from lance_cdf_devtools.s3 import S3Server


def _stop(*_: object) -> NoReturn:
    raise KeyboardInterrupt


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m lance_cdf_devtools",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("command", choices=["provision", "up", "s3", "connect", "deny"])
    ap.add_argument("--cache-dir", help="default: $LANCE_CDF_DEVTOOLS_CACHE or .cache/devtools")
    ap.add_argument("--no-auto-create-topics", action="store_true")
    ap.add_argument(
        "--secure", action="store_true", help="up: SASL_SSL broker, HTTPS + basic-auth registry"
    )
    ap.add_argument("--admin-config-file", help="deny: the admin settings `up --secure` wrote")
    ap.add_argument("--topic", action="append", default=[], help="deny: a topic (repeatable)")
    ap.add_argument("--group", action="append", default=[], help="deny: a group (repeatable)")
    ap.add_argument(
        "--principal",
        default=f"User:{SecureKafkaBroker.USERNAME}",
        help="deny: whom (default: the client user of `up --secure`)",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "deny":
        return _deny(args)
    if args.command == "s3":
        return _s3()
    if args.command == "connect":
        return _connect(args.cache_dir)
    t0 = time.monotonic()
    cache = provision(args.cache_dir)
    v = versions()
    if args.command == "provision":
        print(
            f"Kafka {v['kafka.version']} and Apicurio Registry {v['apicurio.version']} ready "
            f"in {cache} ({time.monotonic() - t0:.1f}s)"
        )
        return 0
    return _up(cache, args.secure, not args.no_auto_create_topics)


def _connect(cache_dir: str | None) -> int:
    """`connect`: Kafka Connect and the Debezium JDBC sink resolved; where they are."""
    from lance_cdf_devtools.maven import (
        connect_lib,
        connect_plugins,
        connect_versions,
        provision_connect,
    )

    cache, v = provision_connect(cache_dir), connect_versions()
    print(f"Kafka Connect {v['connect.version']}, Debezium JDBC sink {v['debezium.version']}")
    print(f"classpath:   {connect_lib(cache)}/*")
    print(f"plugin.path={connect_plugins(cache)}")
    return 0


def _up(cache: Path, secure: bool, auto_create: bool) -> int:
    """`up`: the broker and the registry, until Ctrl-C, SIGTERM or one of them exits."""
    signal.signal(signal.SIGTERM, _stop)
    registry_type: type[SchemaRegistry] | type[SecureSchemaRegistry] = (
        SecureSchemaRegistry if secure else SchemaRegistry
    )
    try:
        with (
            (
                SecureKafkaBroker(auto_create_topics=auto_create, cache_dir=cache, authorizer=True)
                if secure
                else KafkaBroker(auto_create_topics=auto_create, cache_dir=cache)
            ) as kafka,
            registry_type(cache_dir=cache) as registry,
        ):
            print(f"kafka bootstrap servers: {kafka.bootstrap_servers}")
            print(f"schema registry url:     {registry.url}")
            if isinstance(registry, SecureSchemaRegistry):
                _print_secure_settings(kafka, registry)
            print("Ctrl-C or SIGTERM stops both.", flush=True)
            while kafka.running() and registry.running():
                time.sleep(1)
            dead = kafka if not kafka.running() else registry
            print(f"{dead.name} exited; log tail:\n{dead.log_tail()}", file=sys.stderr)
            return 1
    except KeyboardInterrupt:
        return 0


def _print_secure_settings(kafka: KafkaBroker, registry: SecureSchemaRegistry) -> None:
    """The client settings of `up --secure`, credentials included, into files (mode 0600)
    whose paths are printed: never the credentials on the terminal."""
    client = _properties(kafka.workdir / "client.properties", kafka.client_config)
    reg = _properties(registry.workdir / "registry.properties", registry.client_config)
    print(f"--producer-config-file / --consumer-config-file {client}")
    print(f"--registry-config-file {reg}")
    if isinstance(kafka, SecureKafkaBroker):
        admin = _properties(
            kafka.workdir / "admin.properties",
            {"bootstrap.servers": kafka.bootstrap_servers, **kafka.admin_client_config},
        )
        print(
            f"broker admin (ACLs): python -m lance_cdf_devtools deny "
            f"--admin-config-file {admin} --topic NAME"
        )


def _properties(path: Path, settings: dict[str, str]) -> Path:
    """`settings` as a Java-properties file readable by its owner only."""
    path.touch(mode=0o600)
    path.chmod(0o600)
    escape = str.maketrans({"\\": "\\\\", "\n": "\\n", "=": "\\=", ":": "\\:"})
    path.write_text("".join(f"{k}={v.translate(escape)}\n" for k, v in settings.items()))
    return path


def _deny(args: argparse.Namespace) -> int:
    from lance_cdf_devtools.kafka import deny

    if not args.admin_config_file or not (args.topic or args.group):
        print("deny needs --admin-config-file and --topic or --group", file=sys.stderr)
        return 2
    config = _read_properties(Path(args.admin_config_file))
    deny(config, args.principal, args.topic, args.group)
    what = [f"topic {t!r}" for t in args.topic] + [f"group {g!r}" for g in args.group]
    print(f"{args.principal} denied all operations on {', '.join(what)}")
    return 0


def _read_properties(path: Path) -> dict[str, str]:
    """What `_properties` wrote (key=value lines, its escapes)."""
    out = {}
    for line in path.read_text().splitlines():
        key, value = re.split(r"(?<!\\)=", line, maxsplit=1)
        out[key] = re.sub(r"\\(.)", lambda m: "\n" if m[1] == "n" else m[1], value)
    return out


def _s3() -> int:
    signal.signal(signal.SIGTERM, _stop)
    try:
        with S3Server() as s3:
            s3.create_bucket("tables")
            opts = s3.storage_options()
            print("bucket: s3://tables")
            print("storage options:", " ".join(f"{k}={v}" for k, v in opts.items()))
            print("Ctrl-C or SIGTERM stops it.", flush=True)
            while s3.running():
                time.sleep(1)
            print(f"s3 exited; log tail:\n{s3.log_tail()}", file=sys.stderr)
            return 1
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
