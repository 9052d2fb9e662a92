"""The documentation site (mkdocs.yml, docs/): it builds with --strict (every internal link
and anchor resolves, every API reference and included snippet exists), its generated
reference pages hold what the code has, and the code a user is told to run runs."""

from __future__ import annotations

import argparse
import ast
import html
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MKDOCS = Path(sys.executable).with_name("mkdocs")


def _hooks():
    path = ROOT / "docs/hooks/reference.py"
    spec = importlib.util.spec_from_file_location("docs_reference", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built as `make docs` builds it (--strict: a warning fails the build)."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [str(MKDOCS), "build", "--strict", "--site-dir", str(out)],  # not --quiet: it hides
        # the warnings --strict counts, and the build would pass with broken links
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def _text(page: Path) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))


def _all_flags() -> dict[str, list[str]]:
    from lance_cdf.cli import build_parser

    parser = build_parser()
    flags = {"": [o for a in parser._actions for o in a.option_strings]}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                flags[name] = [o for a in sub._actions for o in a.option_strings]
    return flags


def test_the_cli_page_has_every_subcommand_and_flag(site):
    page = _text(site / "reference/cli/index.html")
    sections = re.split(r"lance-cdf ([a-z][a-z-]*)¶", page)
    by_command = dict(zip(sections[1::2], sections[2::2], strict=True))
    flags = _all_flags()
    assert set(by_command) == set(flags) - {""}
    for command, options in flags.items():
        text = by_command.get(command, sections[0])
        missing = [o for o in options if o not in ("-h", "--help") and o not in text]
        assert not missing, f"{command or 'lance-cdf'}: {missing} not on the CLI page"


def test_the_metrics_page_has_every_metric_the_module_documents(site):
    import lance_cdf.ops.metrics

    documented = set(re.findall(r"lance_cdf_[a-z_]+", lance_cdf.ops.metrics.__doc__ or ""))
    assert len(documented) >= 10
    page = _text(site / "reference/metrics/index.html")
    served = set(re.findall(r"lance_cdf_[a-z_]+", page))
    assert documented <= served, f"in lance_cdf.ops.metrics, not on the page: {documented - served}"


def test_the_spark_options_page_has_every_option_the_source_accepts(site):
    from lance_cdf.spark.source.options import KNOWN, STORAGE_PREFIX

    page = _text(site / "reference/spark-options/index.html").lower()
    missing = sorted(o for o in KNOWN if o not in page)
    assert not missing, f"Spark options not on the page: {missing}"
    assert STORAGE_PREFIX in page


def test_the_spark_options_page_has_every_option_the_sink_accepts(site):
    from lance_cdf.spark.sink.sink_options import KNOWN, PREFIXES

    page = _text(site / "reference/spark-options/index.html").lower()
    missing = sorted(o for o in [*KNOWN, *PREFIXES] if o not in page)
    assert not missing, f"sink options not on the page: {missing}"


def test_the_generated_tables_come_from_the_code():
    hooks = _hooks()
    cli = hooks.cli_markdown()
    assert "## `lance-cdf publish`" in cli and "`--bootstrap-servers`" in cli
    metrics = hooks.metrics_markdown()
    assert "`lance_cdf_applied_version` | gauge | replicate |" in metrics
    assert "`lance_cdf_published_version` | gauge | publish |" in metrics


# ------------------------------------------------------------------ the code a user runs
SNIPPETS = ROOT / "docs/snippets"


def _in(tmp: Path, text: str) -> str:
    """A snippet's text with its /tmp/ paths moved into the test's own directory."""
    return text.replace("/tmp/", f"{tmp}/")


def _expected_outputs(code: str) -> list[str]:
    """What the snippet says a print shows (`print(...)  # {'a': 1}`), where the comment is
    a Python literal (an exact value, not a description)."""
    shown = []
    for line in code.splitlines():
        if not line.lstrip().startswith("print(") or "  # " not in line:
            continue
        comment = line.split("  # ", 1)[1].strip()
        try:
            shown.append(str(ast.literal_eval(comment)))
        except (ValueError, SyntaxError):
            continue  # a description of the output, or an elided one ("{..., 'updated': 9}")
    return shown


def _run_python(names: list[str], tmp: Path, capsys, namespace: dict | None = None) -> dict:
    namespace = {"__name__": "__snippet__"} if namespace is None else namespace
    for name in names:
        code = _in(tmp, (SNIPPETS / name).read_text())
        exec(compile(code, str(SNIPPETS / name), "exec"), namespace)
        out = capsys.readouterr().out
        for shown in _expected_outputs(code):
            assert shown in out, f"{name}: {shown!r} not in its output:\n{out}"
    return namespace


def _run_shell(name: str, tmp: Path, replace: dict[str, str] | None = None) -> list[str]:
    """Each command of a .sh snippet (lines joined at trailing backslashes), as written."""
    text = _in(tmp, (SNIPPETS / name).read_text()).replace("\\\n", " ")
    for old, new in (replace or {}).items():
        text = text.replace(old, new)
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}
    outputs = []
    for command in filter(None, (c.strip() for c in text.splitlines())):
        done = subprocess.run(
            command, shell=True, cwd=tmp, env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"
        outputs.append(done.stdout)
    return outputs


def test_the_python_tour_runs_as_written(tmp_path, capsys):
    """Getting started and the Python guide, then the concepts page, in page order."""
    ns = _run_python(["read_changes.py", "net_and_carry_over.py"], tmp_path, capsys)
    jsonl, net, dropped = _run_shell("changes_cli.sh", tmp_path)
    assert '"_change_type": "snapshot"' in jsonl.replace('":"', '": "')
    assert net.strip() and dropped.strip()
    ns = _run_python(
        ["change_feed.py", "range_events.py", "versions_loop.py"], tmp_path, capsys, ns
    )
    _run_python(["column_rename.py", "blobs.py", "metadata_only.py"], tmp_path, capsys, ns)


def test_the_tour_reads_the_changes_it_made(tmp_path, capsys):
    """Getting started: the table, its changes from Python and from the command line."""
    ns = _run_python(["read_changes.py"], tmp_path, capsys)
    (printed,) = _run_shell("changes_first.sh", tmp_path)
    assert "b → z" in printed and "5 change(s)" in printed  # the update, and all five
    import lance_cdf

    events = lance_cdf.read_changes(ns["uri"], 1).read_all()
    versions, types = events["_commit_version"].to_pylist(), events["_change_type"].to_pylist()
    got = list(zip(versions, types, strict=True))
    assert got == [(1, "insert")] * 3 + [(2, "update_preimage"), (2, "update_postimage")] + [
        (3, "delete")
    ]


def test_the_older_writers_example_runs_as_written(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)  # it reads a fixture table of the repository
    _run_python(["older_writers.py"], ROOT, capsys)


@pytest.mark.integration
def test_the_spark_examples_run_as_written(tmp_path, capsys, spark):
    ns = _run_python(["read_changes.py"], tmp_path, capsys)
    ns["spark"] = spark
    _run_python(
        ["spark_stream.py", "spark_lag.py", "spark_sql_view.py", "spark_udtf.py"],
        tmp_path,
        capsys,
        ns,
    )
    written = spark.read.parquet(str(tmp_path / "events-changes"))
    assert written.count() == 6  # 3 inserts, an update pair, a delete


@pytest.mark.integration
def test_publish_and_replicate_run_as_written(tmp_path, capsys, kafka_broker, schema_registry):
    """The two commands of Getting started (and the README): the replica they leave
    equals the source table."""
    import lance

    _run_python(["read_changes.py"], tmp_path, capsys)
    _run_shell(
        "publish_replicate.sh",
        tmp_path,
        {
            "127.0.0.1:9092": kafka_broker.bootstrap_servers,
            "http://127.0.0.1:8081/apis/ccompat/v7": schema_registry.url,
            "events.cdf": f"docs-tour-{tmp_path.name}",
        },
    )
    source = lance.dataset(str(tmp_path / "events.lance")).to_table().sort_by("id")
    replica = lance.dataset(str(tmp_path / "events-replica.lance")).to_table()
    assert replica.select(["id", "s"]).sort_by("id").to_pylist() == source.to_pylist()


def test_the_help_says_where_the_docs_are():
    from lance_cdf.cli import build_parser

    text = build_parser().format_help()
    assert "documentation: the site in docs/" in text and "make docs" in text
    assert (ROOT / "docs/index.md").is_file() and (ROOT / "mkdocs.yml").is_file()


def test_the_python_api_reference_documents_returns_and_raises(site):
    page = _text(site / "reference/python-api/index.html")
    for name in ("read_changes", "ChangeFeed", "LanceCdfError", "VersionNotFoundError"):
        assert name in page
    assert page.count("Raises:") >= 3 and page.count("Returns:") >= 3


# the short paths of the public names, and the modules documented whole beside them
PUBLIC = ("lance_cdf", "lance_cdf.spark", "lance_cdf.replicate")
DOCUMENTED_WHOLE = ("lance_cdf.cli", "lance_cdf.errors")


def test_the_python_api_reference_lists_exactly_the_public_names():
    """The reference lists each public name at its short path (`lance_cdf`,
    `lance_cdf.spark`, `lance_cdf.replicate`), and nothing at an internal path."""
    import importlib

    text = (ROOT / "docs/reference/python-api.md").read_text()
    listed = set(re.findall(r"^::: ([\w.]+)", text, flags=re.M))
    public = {
        f"{m}.{n}"
        for m in PUBLIC
        for n in importlib.import_module(m).__all__
        if not n.startswith("__") and n != "LanceCdfError"  # (under lance_cdf.errors)
    }
    whole = {n for n in listed if n.startswith(DOCUMENTED_WHOLE)}
    assert listed - whole == public
    for name in public:  # each resolves at its short path
        module, attr = name.rsplit(".", 1)
        assert getattr(importlib.import_module(module), attr) is not None


def test_the_guides_import_only_public_names():
    """What a guide or snippet imports from lance-cdf comes from a public path."""
    paths = sorted((ROOT / "docs").rglob("*.md")) + sorted((ROOT / "docs/snippets").glob("*.py"))
    found = set()
    for path in [ROOT / "README.md", *paths]:
        found |= set(re.findall(r"from (lance_cdf[\w.]*) import", path.read_text()))
        found |= set(re.findall(r"^\s*import (lance_cdf[\w.]*)", path.read_text(), re.M))
    assert found, "no import found: the pattern is wrong"
    assert found <= set(PUBLIC) | set(DOCUMENTED_WHOLE), sorted(found)


# ------------------------------------------------------------------ the README's tour
def _readme_blocks(language: str) -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def test_the_readme_is_short_and_its_tour_is_the_tested_one():
    """README.md (≤ 200 lines) shows the tour's code exactly as the snippets the tests run:
    the Python read, and publish + replicate; every page it links to exists."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    linked = re.findall(r"\]\((docs/[^)#]+)", text)
    assert linked and all((ROOT / page).is_file() for page in linked), linked
    python, spark = _readme_blocks("python")
    assert python == (SNIPPETS / "read_changes.py").read_text()
    assert _readme_blocks("bash")[1] == (SNIPPETS / "publish_replicate.sh").read_text()
    assert "readStream" in spark and len(spark.strip().splitlines()) == 4


@pytest.mark.integration
def test_the_readme_spark_lines_run_as_written(tmp_path, capsys, spark):
    ns = _run_python(["read_changes.py"], tmp_path, capsys)
    ns["spark"] = spark
    exec(compile(_in(tmp_path, _readme_blocks("python")[1]), "README.md", "exec"), ns)
    progress = ns["query"].lastProgress
    assert progress is not None
    end = progress["sources"][0]["endOffset"]
    end = json.loads(end) if isinstance(end, str) else end
    assert end["version"] == 3  # (with the table's identity and start: spark/source/identity.py)


FENCE = re.compile(r"^```(python|bash|sql|properties)\n(.*?)^```", flags=re.S | re.M)


def test_every_block_a_user_runs_is_tested_or_marked_illustrative():
    """A python / bash / sql / properties block is a snippet the tests run (`--8<--`), the
    `make` targets, or says on its first line that it is illustrative."""
    unmarked = []
    for page in sorted((ROOT / "docs").rglob("*.md")):
        for _language, body in FENCE.findall(page.read_text()):
            lines = [line for line in body.splitlines() if line.strip()]
            if not lines or lines[0].startswith("--8<--"):
                continue
            if re.match(r"(#|--) illustrative: \S", lines[0]):
                continue
            if all(line.startswith(("make ", "            #")) for line in lines):
                continue  # the two make targets (CI runs them)
            unmarked.append(f"{page.relative_to(ROOT)}: {lines[0][:60]}")
    assert not unmarked, "blocks neither tested nor marked illustrative:\n" + "\n".join(unmarked)
