"""The package's imports point down the flow (format → core → Kafka → Spark → replica →
command line): each part may import only the parts listed for it, lazy imports included;
inside every part, no module imports one that imports it."""

import ast
import io
import os
import re
import tokenize
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "lance_cdf"

# part -> the lance_cdf parts it may import ("" is the package root: __version__ and the
# public names), from the bottom up. A part is a top-level module or package of lance_cdf;
# spark's three packages are parts of their own (the source, the sink that reads with it,
# the publish job that runs both). Every part is listed (test_every_part_is_listed): a new
# package says where it belongs.
ALLOWED = {
    "errors": set(),
    "retry": set(),
    "format": {"retry", "errors"},
    "ops": {"format", "retry", "errors"},
    "core": {"ops", "format", "retry", "errors"},
    "avro": {"core", "errors"},  # core: only its names (change_types), no pyarrow
    "": {"core", "ops", "format", "errors"},
    "kafka": {"", "avro", "core", "ops", "format", "retry", "errors"},
    "spark.source": {"core", "ops", "format", "retry", "errors"},
    "spark.sink": {"spark.source", "kafka", "avro", "core", "ops", "format", "retry", "errors"},
    "spark.publish": {
        "spark.sink",
        "spark.source",
        "kafka",
        "core",
        "ops",
        "format",
        "retry",
        "errors",
    },
    "replicate": {"kafka", "avro", "ops", "format", "retry", "errors"},
    "cli": {
        "",
        "replicate",
        "spark.publish",
        "spark.source",
        "kafka",
        "core",
        "ops",
        "format",
        "retry",
        "errors",
    },
}
SPLIT = {"spark"}  # packages whose subpackages are parts of their own


def _part(module: str) -> str:
    """lance_cdf.x.y -> x (spark.x for lance_cdf.spark.x.y); lance_cdf -> ''."""
    parts = module.split(".")[1:]
    if parts and parts[0] in SPLIT and len(parts) > 1:
        return f"{parts[0]}.{parts[1]}"
    return parts[0] if parts else ""


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "lance_cdf":  # from lance_cdf import x: x is a part or a name
                found |= {
                    a.name
                    if (PACKAGE / a.name).exists() or (PACKAGE / f"{a.name}.py").exists()
                    else ""
                    for a in node.names
                }
            elif node.module.startswith("lance_cdf."):
                found |= {_part(f"{node.module}.{a.name}") for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {_part(a.name) for a in node.names if a.name.startswith("lance_cdf")}
    return found


def _files(part: str) -> list[Path]:
    if part == "":
        return [PACKAGE / "__init__.py"]
    d = PACKAGE.joinpath(*part.split("."))
    return sorted(d.rglob("*.py")) if d.is_dir() else [PACKAGE / f"{part}.py"]


@pytest.mark.parametrize("part", sorted(ALLOWED))
def test_imports_point_down(part):
    files = [f for f in _files(part) if "_proto" not in f.parts]
    assert files, f"lance_cdf/{part} is missing"
    for f in files:
        wrong = _imports(f) - ALLOWED[part] - {part}
        assert not wrong, f"{f.relative_to(PACKAGE)} imports {sorted(wrong)} (not below it)"


def _packages(root: Path) -> set[str]:
    return {p.name for p in root.iterdir() if p.is_dir() and (p / "__init__.py").exists()}


def test_every_part_is_listed():
    parts = {p.stem for p in PACKAGE.glob("*.py") if p.name != "__init__.py"}
    parts |= _packages(PACKAGE) - SPLIT
    parts |= {f"{s}.{sub}" for s in SPLIT for sub in _packages(PACKAGE / s)}
    assert parts - set(ALLOWED) == set(), "parts of lance_cdf not placed in ALLOWED"
    assert set(ALLOWED) - parts - {""} == set(), "ALLOWED lists parts that do not exist"


def test_the_layers_have_no_cycle():
    seen: dict[str, int] = {}

    def depth(part: str, path: tuple[str, ...] = ()) -> int:
        assert part not in path, f"import cycle: {' -> '.join(path + (part,))}"
        if part not in seen:
            seen[part] = 1 + max((depth(p, path + (part,)) for p in ALLOWED[part]), default=0)
        return seen[part]

    for part in ALLOWED:
        depth(part)


def _module_imports() -> dict[str, set[str]]:
    """Every module of lance_cdf -> the lance_cdf modules it imports (lazy ones included;
    `from lance_cdf.x import y` names module x.y where that is a module, else x)."""
    names = {}
    for path in PACKAGE.rglob("*.py"):
        if "_proto" in path.parts:
            continue
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        names[".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    found.add(full if full in names else node.module)
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
        graph[name] = {m for m in found if m in names and m != name}
    return graph


def test_no_module_import_cycle():
    """Inside the packages too: no module imports, however lazily, one that imports it."""
    graph = _module_imports()
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import cycle: {' -> '.join(path + (module,))}"
        if module in done:
            return
        for other in sorted(graph[module]):
            if not module.startswith(f"{other}."):  # (a package's own __init__: its modules')
                visit(other, path + (module,))
        done.add(module)

    for module in sorted(graph):
        visit(module, ())


def test_no_connectors_package_left():
    assert not (PACKAGE / "connectors").exists()


LAYOUT_PAGE = PACKAGE.parent / "docs/reference/internals.md"  # the site's "Layout" section


def _documented_layout() -> str:
    page = LAYOUT_PAGE.read_text()
    section = page.split("\n## Layout\n", 1)[1]
    return section.split("```", 2)[1]


def test_documented_layout_matches_the_tree():
    """The Layout section of the docs (docs/reference/internals.md) names every part of the
    package, and nothing that is not there; each package's entry names each of its modules
    (the words after the package's line, up to the next entry)."""
    layout = _documented_layout()
    top = set(re.findall(r"^  ([a-z_]+)(?:\.py|/)", layout, re.M))
    nested = {f"{s}.{n}" for s in SPLIT for n in re.findall(r"^    ([a-z_]+)/", layout, re.M)}
    listed = {p.split(".")[0] for p in ALLOWED if p} | set(ALLOWED) - {""}
    assert top | nested == listed, "the Layout page and the package's parts differ"
    files = set(re.findall(r"\b([a-z_]+\.(?:py|c))\b", layout))
    for name in files:
        found = list(PACKAGE.parent.glob(f"lance_cdf*/**/{name}"))
        assert found, f"the Layout page names {name}: no such file"
    entries = re.split(r"\n(?=  {1,3}[a-z_])", layout)
    for part in sorted(set(ALLOWED) - {""}):
        folder = PACKAGE.joinpath(*part.split("."))
        if not folder.is_dir():
            continue
        head = f"    {part.split('.')[1]}/" if "." in part else f"  {part}/"
        block = next(e for e in entries if e.startswith(head))
        modules = {p.stem for p in folder.glob("*.py")} - {"__init__"}
        missing = sorted(m for m in modules if not re.search(rf"\b{m}\b", block))
        assert not missing, f"the Layout page does not describe {part}: {missing}"


def test_sparks_commit_process_loads_neither_pyarrow_nor_numpy():
    """Spark keeps a Python process for the sink's commit (and one for the writer's
    creation) beside the query: pyarrow and numpy would make each of them, and so the
    publisher's footprint, much larger. Importing the sink, making its writer for a
    work-item stream (the `_work` columns checked) and the commit's own modules must not
    load them."""
    import subprocess
    import sys

    code = """
import sys
from lance_cdf.spark.sink.kafka_sink import LanceCdfKafkaSink
from lance_cdf.spark.source.handoff import work_struct
options = {"kafka.bootstrap.servers": "b:9092", "topic": "t", "table": "/t.lance",
           "schema.registry.url": "http://r"}
writer = LanceCdfKafkaSink(options).streamWriter(work_struct(), False)
assert writer.handoff and writer.routed
import lance_cdf.kafka.transactions, lance_cdf.kafka.outage, lance_cdf.avro.names
print(sorted(m for m in ("pyarrow", "numpy", "pandas", "lance") if m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


# Process-wide switches: signal handlers, the garbage collector, the environment, glibc's
# malloc. The command line (cli/) and the processes lance-cdf is the main program of
# (the Spark worker daemon, the test services, the demo) may set them; the library may only
# where the function says why: (module, function) -> the reason.
SWITCHES = {
    "signal.signal",
    "gc.disable",
    "gc.enable",
    "gc.freeze",
    "gc.set_threshold",
    "os.environ.setdefault",
    "os.environ.pop",
    "os.environ.update",
    "os.putenv",
    "mallopt",
}
PROGRAMS = {"cli/", "spark/sink/warm_daemon.py"}  # main programs of their processes
ALLOWED_SWITCHES = {
    ("ops/malloc.py", "_mallopt"): "the opt-ins `lance-cdf` turns on for its own process",
    ("replicate/poll_loop.py", "gc_paused"): "only with pause_gc, which `replicate` sets",
    ("spark/publish/spark_driver.py", "jvm_ignores_sigterm"): "in the JVM's child, before exec",
    ("spark/publish/spark_driver.py", "signal_handlers_kept"): "puts back the caller's handlers",
    ("spark/publish/spark_driver.py", "python_for_spark"): "while Spark starts; removed after",
}


def test_the_library_sets_no_process_wide_switch_and_starts_no_thread_at_import():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith((*PROGRAMS, "format/_proto/")):
            continue
        tree = ast.parse(path.read_text())
        for node in tree.body:  # at import: no pool, no thread
            text = ast.get_source_segment(path.read_text(), node) or ""
            if isinstance(node, ast.Assign | ast.AnnAssign | ast.Expr) and re.search(
                r"\b(ThreadPoolExecutor|ProcessPoolExecutor|threading\.Thread)\(", text
            ):
                found.append(f"{rel}: {text.splitlines()[0]}")
        allowed = {n for f, n in ALLOWED_SWITCHES if f == rel}
        for func, outer in _functions(tree):
            if _switches(func) and not ({func.name, *outer} & allowed):
                found.append(f"{rel}: {func.name} ({', '.join(sorted(_switches(func)))})")
    assert not found, f"process-wide switches or threads at import in the library: {found}"


def _functions(tree, outer=()):
    """Every function of `tree` with the names of the functions it is nested in."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node, outer
            yield from _functions(node, (*outer, node.name))
        else:
            yield from _functions(node, outer)


def _switches(func):
    """The process-wide switches `func` itself flips (calls in SWITCHES, os.environ[k] = v)."""
    out = set()
    for node in ast.walk(func):
        if isinstance(node, ast.Call) and ast.unparse(node.func) in SWITCHES:
            out.add(ast.unparse(node.func))
        targets = node.targets if isinstance(node, ast.Assign) else []
        out |= {"os.environ[...] =" for t in targets if ast.unparse(t).startswith("os.environ[")}
    return out


# "issue N", "issues N item M and K", "(Issue N)", "#NN" (N, M, K: digits); not a URL's
# ".../issues/N" nor "PKCS#12"
ISSUE_NUMBER = re.compile(r"(?<![/\w])issues? \d+|(?<![\w&])#\d{2,}", re.I)

# The repository's own Python: every directory of the checkout but what tools make in it
# (hidden ones such as .venv, .cache and .git; the ignored build/, dist/, site/, bench/out/,
# caches, egg-info, Spark's warehouse and Lance tables), and the top level's scripts.
NOT_OURS = {"build", "dist", "site", "__pycache__", "spark-warehouse", "metastore_db", "demo-data"}
OWN_CODE = {
    "lance_cdf",
    "lance_cdf_devtools",
    "lance_cdf_demo",
    "pyspark_lance_cdf",
    "pyspark_lance_cdf_kafka",
    "bench",
    "tests",
    "docs",
    "setup.py",
}


def _own_python_files() -> list[Path]:
    root, found = PACKAGE.parent, []
    for folder, dirs, files in os.walk(root):
        here = Path(folder)
        dirs[:] = [
            d
            for d in dirs
            if not d.startswith(".")
            and d not in NOT_OURS
            and not d.endswith((".egg-info", ".lance"))
            and (here / d) != root / "bench" / "out"
        ]
        found += [here / f for f in files if f.endswith(".py")]
    return sorted(found)


def _comments_and_docstrings(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring of a module's source."""
    found = [
        (tok.start[0], tok.string)
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                found.append((node.body[0].lineno, doc))
    return found


def test_comments_name_no_issue_numbers():
    """Comments and docstrings say what the code does and why; the project's issue numbers
    belong to the history (commit messages), measured figures to docs/benchmarks.md. Every
    Python file of the repository: the package, the devtools, the demo, the PySpark entry
    packages, bench/, tests/, docs' snippets."""
    files = _own_python_files()
    tops = {path.relative_to(PACKAGE.parent).parts[0] for path in files}
    assert OWN_CODE <= tops, sorted(OWN_CODE - tops)  # the walk reaches every one
    # tokenizing is slow (seconds for the whole tree): only a source with a match anywhere
    # can have one in a comment or docstring
    sources = {path: path.read_text() for path in files}
    named = [
        f"{path.relative_to(PACKAGE.parent)}:{line + text.count(chr(10), 0, match.start())}: "
        f"{match.group(0)}"
        for path, source in sources.items()
        if ISSUE_NUMBER.search(source)
        for line, text in _comments_and_docstrings(source)
        for match in ISSUE_NUMBER.finditer(text)
    ]
    assert not named, "issue numbers in comments or docstrings:\n" + "\n".join(named)


def test_the_wheel_holds_what_users_run(tmp_path):
    """The wheel has the package and its data, not the local test services nor the demo
    (the tests and `make demo` use them from the repository)."""
    import shutil
    import subprocess
    import sys
    import zipfile

    root, src = PACKAGE.parent, tmp_path / "src"  # (a copy: no build/ left in the checkout)
    for name in (
        "lance_cdf",
        "lance_cdf_devtools",
        "lance_cdf_demo",
        "pyspark_lance_cdf",
        "pyspark_lance_cdf_kafka",
    ):
        shutil.copytree(root / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(root / name, src / name)
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(src),
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = tmp_path.glob("lance_cdf-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.startswith(("lance_cdf_devtools/", "lance_cdf_demo/"))]
    for wanted in (
        "lance_cdf/cli/__init__.py",
        "lance_cdf/spark/source/data_source.py",
        "lance_cdf/py.typed",
        "lance_cdf/avro/schemas/key.avsc",
        "lance_cdf/avro/schemas/transaction.avsc",
        "pyspark_lance_cdf/__init__.py",
        "pyspark_lance_cdf_kafka/__init__.py",
    ):
        assert wanted in names, wanted


def test_module_names_are_unique_across_the_tree():
    """One name, one module: a name read in a stack trace, a log line or a review names one
    file of the repository (packages' __init__ and __main__ aside)."""
    import subprocess
    from collections import Counter

    tracked = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=PACKAGE.parent, capture_output=True, text=True, check=True
    ).stdout.split()
    names = Counter(Path(p).name for p in tracked if "_proto/" not in p and not p.endswith("__.py"))
    assert not [n for n, count in names.items() if count > 1], [
        p for p in tracked if names[Path(p).name] > 1
    ]


# a file of the tree named by its path ("kafka/outage.py", "replica_shape.py"); setup.py is
# the build's, and __init__/__main__ name a package's parts
FILE_PATH = re.compile(r"(?<![\w./-])(?:[a-z_]+/)*(?!setup\.py|__)[a-z_]+\.py\b")


def test_comments_link_by_symbol_not_by_path():
    """The library's comments and docstrings point at code by the symbol they mean (a class,
    a function, a module's name), which a rename carries or a search finds, not by a file's
    path, which a move leaves pointing nowhere."""
    files = [p for p in _own_python_files() if p.is_relative_to(PACKAGE)]
    named = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {match.group(0)}"
        for path in files
        for line, text in _comments_and_docstrings(path.read_text())
        for match in FILE_PATH.finditer(text)
    ]
    assert not named, "file paths in comments or docstrings:\n" + "\n".join(named)
