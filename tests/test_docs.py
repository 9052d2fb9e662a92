"""The documentation site (mkdocs.yml, docs/): it builds with --strict (every internal link
and anchor resolves, every API reference and included snippet exists), its generated
reference pages hold what the code has, and the code a user is told to run runs."""

from __future__ import annotations

import argparse
import html
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
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
        [str(MKDOCS), "build", "--strict", "--quiet", "--site-dir", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
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
    sections = re.split(r"lance-cdf (changes|publish|replicate|status)¶", page)
    by_command = dict(zip(sections[1::2], sections[2::2], strict=True))
    flags = _all_flags()
    assert set(by_command) == set(flags) - {""}
    for command, options in flags.items():
        text = by_command.get(command, sections[0])
        missing = [o for o in options if o not in ("-h", "--help") and o not in text]
        assert not missing, f"{command or 'lance-cdf'}: {missing} not on the CLI page"


def test_the_generated_tables_come_from_the_code():
    hooks = _hooks()
    cli = hooks.cli_markdown()
    assert "## `lance-cdf publish`" in cli and "`--bootstrap-servers`" in cli
    metrics = hooks.metrics_markdown()
    assert "`lance_cdf_applied_version` | gauge | replicate |" in metrics
    assert "`lance_cdf_published_version` | gauge | publish |" in metrics
