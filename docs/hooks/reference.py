"""MkDocs hook (mkdocs.yml `hooks:`): the reference tables generated from the code at build
time, so they cannot drift from it.

A page asks for a table with a marker line:

    <!-- generated: cli -->       every `lance-cdf` subcommand, its usage, flags and help
                                  (from `lance_cdf.cli.build_parser()`)
    <!-- generated: metrics -->   every Prometheus metric of publish / replicate, its type
                                  and help (collected from `lance_cdf.ops.metrics.PipelineMetrics`)

tests/project/test_docs.py imports `cli_markdown` and `metrics_markdown` from here.
"""

from __future__ import annotations

import argparse
from typing import Any

MARKERS = {
    "<!-- generated: cli -->": "cli_markdown",
    "<!-- generated: metrics -->": "metrics_markdown",
}


def _cell(text: object) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _value(action: argparse.Action) -> str:
    if action.nargs == 0:  # store_true / store_false / version
        return ""
    if action.metavar is not None:
        return str(action.metavar)
    if action.choices is not None:
        return "{" + ",".join(str(c) for c in action.choices) + "}"
    return action.dest.upper()


def _default(action: argparse.Action) -> str:
    if action.required:
        return "required"
    default = action.default
    if default is None or default is argparse.SUPPRESS or default in (False, [], ""):
        return ""
    if isinstance(default, list):
        return ", ".join(str(d) for d in default)
    return f"`{default}`"


def _flags_table(parser: argparse.ArgumentParser) -> list[str]:
    rows = ["| argument | value | default | meaning |", "|---|---|---|---|"]
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        names = ", ".join(f"`{o}`" for o in action.option_strings) or f"`{action.dest}`"
        value = _value(action)
        shown = f"`{value}`" if value else ""
        repeat = " (repeatable)" if isinstance(action, argparse._AppendAction) else ""
        meaning = _cell(action.help or "") if action.help is not argparse.SUPPRESS else ""
        if repeat and "repeatable" not in meaning:
            meaning += repeat
        rows.append(f"| {names} | {shown} | {_default(action)} | {meaning} |")
    return rows


def cli_markdown() -> str:
    """The CLI reference: the top-level help, then one section per subcommand."""
    from lance_cdf.cli import build_parser

    parser = build_parser()
    out = [
        "```text",
        parser.format_usage().strip(),
        "```",
        "",
        _cell(parser.description or ""),
        "",
        *_flags_table(parser),
        "",
    ]
    for name, sub in _subcommands(parser).items():
        out += [
            f"## `lance-cdf {name}`",
            "",
            _cell(sub.description or ""),
            "",
            "```text",
            sub.format_usage().strip(),
            "```",
            "",
            *_flags_table(sub),
            "",
        ]
        if sub.epilog:
            out += ["```text", sub.epilog.strip(), "```", ""]
    return "\n".join(out)


def metrics_markdown() -> str:
    """The metrics reference: what a scrape of each role exposes, with its type and help."""
    from lance_cdf.ops.metrics import PipelineMetrics, Progress

    class _Offline(PipelineMetrics):  # no table to read: a made-up latest version
        def _source(self, version: int | None) -> tuple[int | None, float | None]:
            return 2, None

    seen: dict[str, dict[str, Any]] = {}
    for role in ("publish", "replicate"):
        # only replicate's progress has a Kafka lag (cli/replicate_command.py sets it)
        progress = Progress(version=1, kafka_lag=0 if role == "replicate" else None)
        if role == "replicate":  # the replica's indexes (replicate/index_keeper.py)
            progress.index_builds, progress.indexes_unbuilt = 0, 0
            progress.consumer_restarts = 0  # (replicate/consumers.py)
        if role == "publish":  # known once the writer tasks met an outage (kafka/outage.py)
            progress.kafka_unavailable_s, progress.kafka_retries = 0.0, 0
            # a database publisher's take-up retries and tables set aside (ops/takeup.py)
            progress.takeup_retries, progress.tables_aside, progress.set_asides = 0, 0, 0
            # publish --commit-events (ops/commit_hints.py)
            progress.events_heard, progress.commit_hints, progress.commits_unannounced = 1, 0, 0
        metrics = _Offline(role, lambda p=progress: p, table="t", topic="t")
        for family in metrics.collect():
            suffix = {"counter": "_total", "info": "_info"}.get(family.type, "")
            name = family.name + suffix
            if family.type == "info":
                labels = ",".join(sorted(family.samples[0].labels))
                name += "{" + labels + "}"
            entry = seen.setdefault(name, {"type": family.type, "roles": [], "help": {}})
            entry["roles"].append(role)
            entry["help"][role] = family.documentation
    rows = ["| metric | type | served by | meaning |", "|---|---|---|---|"]
    for name, entry in seen.items():
        helps = entry["help"]
        if len(set(helps.values())) == 1:
            meaning = next(iter(helps.values()))
        else:
            meaning = "; ".join(f"{role}: {text}" for role, text in helps.items())
        roles = " and ".join(entry["roles"])
        rows.append(f"| `{name}` | {entry['type']} | {roles} | {_cell(meaning)} |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    for marker, function in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, globals()[function]())
    return markdown
