"""`python -m lance_cdf.devtools provision|up`."""

from __future__ import annotations

import argparse
import signal
import sys

from lance_cdf.devtools.provision import provision
from lance_cdf.devtools.services import KafkaBroker, SchemaRegistry


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lance_cdf.devtools")
    ap.add_argument("command", choices=["provision", "up"])
    args = ap.parse_args(argv)
    cache = provision()
    if args.command == "provision":
        print(f"devtools ready in {cache}")
        return 0
    with KafkaBroker() as kafka, SchemaRegistry() as registry:
        print(f"kafka bootstrap servers: {kafka.bootstrap_servers}")
        print(f"schema registry url:     {registry.url}", flush=True)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
