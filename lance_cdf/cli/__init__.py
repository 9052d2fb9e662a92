"""The `lance-cdf` command line: `changes`, `publish`, `replicate`, `status`, a module each
(`changes_command`, `publish_command`, `replicate_command`, `status_command`; the flags they
share in `flags`).

Each subcommand is one `cmd_*` function taking the parsed arguments and returning the exit
status: 0 on success or a clean stop (SIGTERM / SIGINT), 2 for a `LanceCdfError` (printed as
one line, `lance-cdf: error: ...`, with secrets scrubbed) or a missing optional extra. The flags
are listed, from this parser, in the documentation's CLI reference (docs/reference/cli.md).
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import sys
from collections.abc import Callable

from lance_cdf import __version__
from lance_cdf.cli.changes_command import changes_parser, cmd_changes
from lance_cdf.cli.flags import EXAMPLES
from lance_cdf.cli.publish_command import cmd_publish, publish_parser
from lance_cdf.cli.replicate_command import cmd_replicate, replicate_parser
from lance_cdf.cli.status_command import cmd_status, status_parser
from lance_cdf.errors import LanceCdfError
from lance_cdf.ops import malloc

__all__ = [
    "build_parser",
    "cmd_changes",
    "cmd_publish",
    "cmd_replicate",
    "cmd_status",
    "entry",
    "main",
]


def build_parser() -> argparse.ArgumentParser:
    """The `argparse` parser of every subcommand and flag (also what the documentation's CLI
    reference is generated from)."""
    parser = argparse.ArgumentParser(
        prog="lance-cdf",
        description="Row-level change data feed for Lance tables (insert / update / delete "
        "events read straight from the table's manifests).",
        epilog=EXAMPLES
        + "\ndocumentation: the site in docs/ of the lance-cdf repository (`make docs` builds it"
        "\n  into site/index.html): getting started, how-to guides, and the reference of every"
        "\n  command and flag. `lance-cdf COMMAND --help` lists a command's flags.\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"lance-cdf {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    changes_parser(sub)
    publish_parser(sub)
    replicate_parser(sub)
    status_parser(sub)
    return parser


# top-level modules of the optional dependencies -> the extra that installs them
EXTRAS = {
    "pyspark": "spark",
    "pandas": "spark",
    "confluent_kafka": "kafka",
    "fastavro": "kafka",
    "prometheus_client": "kafka",
}


def main(argv: list[str] | None = None) -> int:
    """Run the `lance-cdf` command with `argv` (default: `sys.argv[1:]`) and return its exit
    status; `LanceCdfError`s and missing extras become one line on stderr and status 2."""
    parser = build_parser()
    args = parser.parse_args(argv)
    command: Callable[[argparse.Namespace], int] = args.func  # set_defaults(func=cmd_...)
    try:
        return command(args)
    except LanceCdfError as exc:
        from lance_cdf.ops.clientconfig import scrub

        # one redaction rule for errors too: URL user-info and every secret value given
        print(f"lance-cdf: error: {scrub(str(exc))}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        extra = EXTRAS.get((exc.name or "").split(".")[0])
        if extra is None:
            raise
        print(
            f"lance-cdf: error: this command needs {exc.name}, which the core install leaves "
            f"out; install it with: pip install 'lance-cdf[{extra}]'",
            file=sys.stderr,
        )
        return 2
    except BrokenPipeError:
        return 0


def entry() -> None:
    """The `lance-cdf` command: `main` in a process of lance-cdf's own, which keeps freed
    decode buffers for reuse (`lance_cdf.ops.malloc`) and passes that opt-in on to the Spark
    Python workers it starts (they inherit the environment), and holds glibc to two
    arenas (`LANCE_CDF_MALLOC_ARENAS`; the command's own process only). A crash in native code
    (librdkafka, pylance, pyarrow) prints every thread's Python stack to stderr, so the
    log says where. (A crash in a thread of librdkafka's own leaves no Python stack: the
    replicator's SIGSEGV at start was one, found from a core dump;
    `kafka.endpoints._check_group`.) SIGUSR2 prints them too and the process goes on: where
    a running `publish` or `replicate` waits (`kill -USR2 PID`)."""
    faulthandler.enable()
    faulthandler.register(signal.SIGUSR2, all_threads=True)
    malloc.bound_arenas_unless_told()  # before any thread of pylance or librdkafka starts
    os.environ.setdefault(malloc.ENV, "1")
    malloc.keep_freed_memory_if_asked()
    sys.exit(main())
