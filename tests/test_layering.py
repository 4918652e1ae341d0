"""The layers of DESIGN.md §1: sources do I/O, signals are pure. A signal module that imports
the engine collectors (or any source) would pull scraping and discovery into replay."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "gpuwatch"


def imported(path: Path, root: Path = PACKAGE) -> set[str]:
    """Every module a file imports, absolute, relative ones resolved against its package."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = ".".join(path.relative_to(root.parent).with_suffix("").parts[:-1])
    out: set[str] = set()
    for node in ast.walk(tree):  # also imports inside functions
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return out


def offenders(folder: str, forbidden: tuple[str, ...], root: Path = PACKAGE) -> list[str]:
    bad = []
    for path in sorted((root / folder).rglob("*.py")):
        for name in sorted(imported(path, root)):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                bad.append(f"{path.relative_to(root.parent)} imports {name}")
    return bad


@pytest.mark.parametrize(("folder", "forbidden"), [
    ("signals", ("gpuwatch.engines", "gpuwatch.sources")),
    # what an exposition means is read the same way live and in replay: no I/O side
    ("exposition", ("gpuwatch.engines", "gpuwatch.sources", "gpuwatch.signals")),
])
def test_pure_layers_import_no_io_side(folder, forbidden):
    assert offenders(folder, forbidden) == []


def test_the_check_sees_every_import_form(tmp_path):
    pkg = tmp_path / "gpuwatch" / "signals"
    pkg.mkdir(parents=True)
    (pkg / "a.py").write_text("import gpuwatch.engines.config\n")
    (pkg / "b.py").write_text("from gpuwatch.engines import discovery\n")
    (pkg / "c.py").write_text("def f():\n    from ..engines.body import prepare\n")
    (pkg / "d.py").write_text("from gpuwatch import engines\n")
    (pkg / "ok.py").write_text("from gpuwatch.exposition import read\nimport gpuwatch.enginesx\n")
    bad = offenders("signals", ("gpuwatch.engines",), tmp_path / "gpuwatch")
    assert sorted({b.split()[0] for b in bad}) == [
        "gpuwatch/signals/a.py", "gpuwatch/signals/b.py", "gpuwatch/signals/c.py",
        "gpuwatch/signals/d.py"]


def cycles(folder: str, root: Path = PACKAGE) -> list[list[str]]:
    """Groups of modules under folder that import each other (a package's __init__ counts
    only where it is imported for itself, not as the way to one of its submodules)."""
    paths = {".".join(p.relative_to(root.parent).with_suffix("").parts): p
             for p in (root / folder).rglob("*.py") if p.name != "__init__.py"}
    graph = {m: {i for i in imported(p, root) if i in paths and i != m}
             for m, p in paths.items()}
    found: list[list[str]] = []
    for start in sorted(graph):
        seen = _reach(graph, start)
        if start in seen:
            group = sorted(m for m in seen if start in _reach(graph, m) | {m})
            if group not in found:
                found.append(group)
    return found


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), list(graph[start])
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph[m])
    return seen


@pytest.mark.parametrize("folder", ["monitoring", "exporter", "signals", "sources/simulate"])
def test_packages_import_no_cycle(folder):
    assert cycles(folder) == []


def test_the_cycle_check_sees_a_cycle(tmp_path):
    pkg = tmp_path / "gpuwatch" / "sim"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("from gpuwatch.sim.a import x\n")
    (pkg / "a.py").write_text("x = 1\ndef f():\n    from gpuwatch.sim import b\n")
    (pkg / "b.py").write_text("import gpuwatch.sim.a\n")
    (pkg / "c.py").write_text("from gpuwatch.sim import a\n")
    assert cycles("sim", tmp_path / "gpuwatch") == [["gpuwatch.sim.a", "gpuwatch.sim.b"]]
