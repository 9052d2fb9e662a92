"""The package's imports point down the flow (manifest → plan → rows → events → Kafka →
replica): each part may import only the parts listed for it, lazy imports included."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "lance_cdf"

# part -> the lance_cdf parts it may import ("" is the package root: __version__)
ALLOWED = {
    "cache": set(),
    "errors": set(),
    "malloc": set(),
    "keyhash": {"errors"},
    "format": {"errors", "cache"},
    "plan": {"format", "errors", "cache"},
    "read": {"plan", "format", "malloc", "errors", "cache"},
    "snapshot": {"read", "plan", "format", "errors", "cache"},
    "modes": {"read", "errors"},
    "candidates": {"modes", "read", "plan", "errors"},
    "avro": {"errors"},
    "metrics": {"format", "errors", "cache"},
    "kafka": {"avro", "read", "feed", "streaming", "metrics", "keyhash", "errors", ""},
    "replicate": {"avro", "kafka", "errors"},
}


def _part(module: str) -> str:
    """lance_cdf.x.y -> x; lance_cdf -> ''."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


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
                found.add(_part(node.module))
        elif isinstance(node, ast.Import):
            found |= {_part(a.name) for a in node.names if a.name.startswith("lance_cdf")}
    return found


def _files(part: str) -> list[Path]:
    d = PACKAGE / part
    return sorted(d.rglob("*.py")) if d.is_dir() else [PACKAGE / f"{part}.py"]


@pytest.mark.parametrize("part", sorted(ALLOWED))
def test_imports_point_down(part):
    files = [f for f in _files(part) if "_proto" not in f.parts]
    assert files, f"lance_cdf/{part} is missing"
    for f in files:
        wrong = _imports(f) - ALLOWED[part] - {part}
        assert not wrong, f"{f.relative_to(PACKAGE)} imports {sorted(wrong)} (not below it)"


def test_no_connectors_package_left():
    assert not (PACKAGE / "connectors").exists()
