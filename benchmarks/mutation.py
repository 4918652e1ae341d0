"""Mutation score of the core modules: how many small changes to the code the tests catch.

    python -m benchmarks.mutation [--per-target 25] [--seed 1] [--only NAME] [--json FILE]
    python -m benchmarks.mutation --only signals --per-target 9999 --module PATH --list
    python -m benchmarks.mutation --set fixed [--group security --group policy] [--name N]
    python -m benchmarks.mutation --check     # every fixed mutant's snippet still matches

Two sets. The random sample (below) and the fixed set (benchmarks/mutants_fixed.py): named
guards, each a snippet of its file and what replaces it, with the tests that cover its
module. `--set` picks random, fixed or both (the default). The exit status is 1 when a fixed
mutant survives or no longer matches its code, so CI can run the fixed set as a gate.

A small AST mutator (no dependency): each mutant changes one thing in one module, the way
a slip of the keyboard would: a comparison flipped or loosened (`<` -> `<=`, `==` -> `!=`),
an arithmetic operator swapped (`+` -> `-`, `*` -> `/`), a number moved by one (`0` -> `1`,
`0.5` -> `1.5`), `True` <-> `False`, `and` <-> `or`, `min` <-> `max`, a `not` dropped.
The module is rewritten in a copy of the checkout and the target's tests run there
(`pytest -x`); the mutant is killed when they fail or time out. The same tests run once on
the unmutated code first: any that fail there are left out of every mutant's run (and named
in the output), so a test broken before any mutation kills nothing. Mutants are sampled with
a fixed seed, `--per-target` per target, because every run costs a pytest start. Scores
are reported per target, per module, and for the security modules on their own.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from benchmarks import mutants_fixed
from benchmarks.mutants_fixed import FIXED, SECURITY_MODULES, Fixed
from benchmarks.report import emit

REPO = Path(__file__).resolve().parent.parent


def _cover(*modules: str) -> tuple[list[str], list[str]]:
    """A target of modules with fixed mutants: the union of their covering tests."""
    tests = [t for m in modules for t in mutants_fixed.COVER[m]]
    return list(modules), list(dict.fromkeys(tests))


# target -> (modules, tests that cover them)
TARGETS: dict[str, tuple[list[str], list[str]]] = {
    "signals": (
        [*sorted(
            str(p.relative_to(REPO)) for p in (REPO / "gpuwatch/signals/leak").glob("*.py")),
         "gpuwatch/signals/projection.py",
         "gpuwatch/signals/zone.py", "gpuwatch/signals/oom.py",
         "gpuwatch/signals/fragmentation.py", "gpuwatch/signals/memory.py",
         "gpuwatch/signals/conditions.py"],
        ["tests/test_bite_signals.py", "tests/test_bite_signal_guards.py",
         "tests/test_bite_zone_frag.py",
         "tests/test_bite_leak_fast.py", "tests/test_zone.py",
         "tests/test_oom.py", "tests/test_fragmentation.py", "tests/test_leak.py",
         "tests/test_leak_rates.py", "tests/test_leak_troughs.py",
         "tests/test_leak_found_loaded.py", "tests/test_leak_loading_pace.py",
         "tests/test_leak_projection.py", "tests/test_leak_replayed_alarms.py",
         "tests/test_leak_traces.py", "tests/test_leak_family1.py",
         "tests/test_leak_steep_pause.py"]),
    # the leak detector alone: its own sample, so its modules are not a few among many
    "leak": (
        sorted(str(p.relative_to(REPO)) for p in (REPO / "gpuwatch/signals/leak").glob("*.py")),
        ["tests/test_bite_signals.py", "tests/test_bite_signal_guards.py",
         "tests/test_bite_leak_fast.py", "tests/test_leak.py", "tests/test_leak_rates.py",
         "tests/test_leak_troughs.py", "tests/test_leak_found_loaded.py",
         "tests/test_leak_loading_pace.py", "tests/test_leak_projection.py",
         "tests/test_leak_replayed_alarms.py", "tests/test_leak_traces.py",
         "tests/test_leak_family1.py", "tests/test_leak_steep_pause.py"]),
    "engine windows": (
        ["gpuwatch/engines/windows.py", "gpuwatch/signals/windows.py"],
        ["tests/test_bite_windows.py", "tests/test_bite_engine_signals.py",
         "tests/test_engine_windows.py",
         "tests/test_bite_engines.py",
         "tests/test_engine_analyzer.py"]),
    "engine analyzer": (
        ["gpuwatch/engines/analyzer.py", "gpuwatch/signals/engine.py"],
        ["tests/test_bite_engine_signals.py", "tests/test_bite_signal_guards.py",
         "tests/test_bite_engines.py", "tests/test_engine_analyzer.py"]),
    "guardrails": (
        ["gpuwatch/remediation/guardrails.py"],
        ["tests/test_bite_guardrails.py", "tests/test_bite_policy.py",
         "tests/test_remediation_remediator.py"]),
    "config": (
        ["gpuwatch/config.py"],
        ["tests/test_bite_config.py", "tests/test_config.py"]),
    "thresholds": (
        ["gpuwatch/thresholds/table.py", "gpuwatch/thresholds/schema.py"],
        ["tests/test_bite_thresholds.py", "tests/test_bite_table.py",
         "tests/test_thresholds.py"]),
    "policy": _cover("gpuwatch/remediation/policy.py"),
    "probe channel": _cover("gpuwatch/probe_channel/requests.py",
                            "gpuwatch/probe_channel/protocol.py"),
    "probe reader": _cover("gpuwatch/sources/probes.py"),
    "probe agent": _cover("gpuwatch/probe_agent/agent.py"),
    "web": _cover("gpuwatch/webconfig.py"),
    "redaction": _cover("gpuwatch/redact.py"),
}

_CMP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt,
        ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is,
        ast.In: ast.NotIn, ast.NotIn: ast.In}
_BIN = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
        ast.FloorDiv: ast.Div, ast.Mod: ast.FloorDiv}


@dataclass(frozen=True)
class Mutant:
    path: str
    index: int  # the index-th mutation point of the file, in walk order
    line: int
    what: str


def _points(tree: ast.AST):
    """Every (node, description, apply) a mutation can be made at; apply mutates in place."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                if type(op) in _CMP:
                    def apply(n=node, i=i, op=op):
                        n.ops[i] = _CMP[type(op)]()
                    yield node, f"{type(op).__name__} -> {_CMP[type(op)].__name__}", apply
        elif isinstance(node, ast.BinOp) and type(node.op) in _BIN:
            def apply(n=node):
                n.op = _BIN[type(n.op)]()
            yield node, f"{type(node.op).__name__} -> {_BIN[type(node.op)].__name__}", apply
        elif isinstance(node, ast.BoolOp):
            def apply(n=node):
                n.op = ast.Or() if isinstance(n.op, ast.And) else ast.And()
            yield node, f"{type(node.op).__name__} -> other", apply
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            yield node, "drop not", None  # handled by the transformer below
        elif isinstance(node, ast.Constant) and type(node.value) in (int, float, bool):
            if isinstance(node.value, bool):
                def apply(n=node):
                    n.value = not n.value
                yield node, f"{node.value} -> {not node.value}", apply
            else:
                def apply(n=node):
                    n.value = n.value + 1
                yield node, f"{node.value!r} -> {node.value + 1!r}", apply
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("min", "max")):
            def apply(n=node):
                n.func.id = "max" if n.func.id == "min" else "min"
            yield node, f"{node.func.id} -> other", apply


def _in_docstring_or_annotation(tree: ast.AST) -> set[int]:
    """ids of constant nodes that are not code: docstrings, annotations, msgspec Meta."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign | ast.arg) and getattr(node, "annotation", None):
            skip.update(id(n) for n in ast.walk(node.annotation))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns:
            skip.update(id(n) for n in ast.walk(node.returns))
    return skip


def enumerate_mutants(path: str) -> list[Mutant]:
    tree = ast.parse((REPO / path).read_text())
    skip = _in_docstring_or_annotation(tree)
    return [Mutant(path, i, getattr(node, "lineno", 0), what)
            for i, (node, what, _) in enumerate(_points(tree)) if id(node) not in skip]


class _DropNot(ast.NodeTransformer):
    def __init__(self, target: ast.AST) -> None:
        self.target = target

    def visit_UnaryOp(self, node):
        self.generic_visit(node)
        return node.operand if node is self.target else node


def mutate(source: str, index: int) -> str:
    tree = ast.parse(source)
    for i, (node, _, apply) in enumerate(_points(tree)):
        if i == index:
            if apply is None:
                tree = _DropNot(node).visit(tree)
            else:
                apply()
            return ast.unparse(ast.fix_missing_locations(tree))
    raise IndexError(index)


def _copy_checkout(work: Path) -> None:
    for part in ("gpuwatch", "tests", "benchmarks", "pyproject.toml", "alerts",
                 "dashboards", "docs", "exporters", "README.md"):
        src = REPO / part
        if src.is_dir():
            shutil.copytree(src, work / part, ignore=shutil.ignore_patterns(
                "__pycache__", "*.pyc", "results"))
        elif src.exists():
            shutil.copy(src, work / part)


def run_mutant(path: str | None, change: Callable[[str], str] | None, tests: list[str],
               timeout: float, deselect: tuple[str, ...] = (),
               first: bool = True) -> tuple[str, float, str, list[str]]:
    """(verdict, seconds, the first test that failed, every test that failed): the module
    at path rewritten by change() in a copy of the checkout (none: the code as it is), and
    the tests run there, less those deselected."""
    with tempfile.TemporaryDirectory(prefix="gpuwatch-mut-") as tmp:
        work = Path(tmp)
        _copy_checkout(work)
        if path is not None and change is not None:
            target = work / path
            target.write_text(change(target.read_text()))
        env = {**os.environ, "PYTHONPATH": str(work), "PYTHONDONTWRITEBYTECODE": "1"}
        t0 = time.monotonic()
        failed: list[str] = []
        try:
            # Hypothesis's pytest plugin costs a second or two of CPU per start; the tests
            # that use hypothesis run the same without it.
            r = subprocess.run(
                [sys.executable, "-m", "pytest", *(["-x"] if first else []), "-q", "-rfE",
                 "-p", "no:cacheprovider", "-p", "no:hypothesispytest",
                 "-m", "not slow and not gpu",
                 *(a for d in deselect for a in ("--deselect", d)), *tests],
                cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
            verdict = "survived" if r.returncode == 0 else (
                "killed" if r.returncode in (1, 2) else f"error rc={r.returncode}")
            # "FAILED tests/x.py::name - why"; captured log lines may start with ERROR too
            failed = [line.split(" ", 1)[1].split(" - ", 1)[0] for line in
                      r.stdout.splitlines() if line.startswith(("FAILED tests/", "ERROR tests/"))]
        except subprocess.TimeoutExpired:
            verdict = "killed (timeout)"
        return verdict, time.monotonic() - t0, failed[0] if failed else "", failed


def baseline(tests: list[str], timeout: float) -> tuple[str, ...]:
    """The tests that fail on the code as it is: left out of every mutant's run, so that a
    test broken before any mutation kills no mutant (and the rest still judge them)."""
    verdict, _, _, failed = run_mutant(None, None, tests, timeout * 4, first=False)
    if verdict.startswith("killed") and not failed:
        raise SystemExit(f"the tests fail on the unmutated code ({verdict}) and name no test")
    return tuple(failed)


def check_fixed(mutants: tuple[Fixed, ...] = FIXED) -> list[str]:
    """Why any fixed mutant cannot be applied to the code as it is now (empty: all can)."""
    problems = []
    for m in mutants:
        if not (REPO / m.path).exists():
            problems.append(f"fixed mutant {m.name!r}: {m.path} does not exist")
            continue
        try:
            ast.parse(mutants_fixed.apply(m, (REPO / m.path).read_text()))
        except mutants_fixed.SnippetError as exc:
            problems.append(str(exc))
        except SyntaxError as exc:
            problems.append(f"fixed mutant {m.name!r}: the mutated {m.path} does not parse "
                            f"({exc.msg}, line {exc.lineno})")
        missing = [t for t in m.tests if not (REPO / t).exists()]
        if missing:
            problems.append(f"fixed mutant {m.name!r}: covering tests missing: {missing}")
    return problems


def _score(rows: list[dict]) -> dict:
    killed = sum(r["verdict"].startswith("killed") for r in rows)
    errors = sum(r["verdict"].startswith("error") for r in rows)
    judged = len(rows) - errors
    return {"mutants": len(rows), "killed": killed, "errors": errors,
            "score": round(killed / judged, 3) if judged else None}


def _by_module(rows: list[dict]) -> dict[str, dict]:
    modules: dict[str, list[dict]] = {}
    for r in rows:
        modules.setdefault(r["file"], []).append(r)
    return {m: _score(modules[m]) for m in sorted(modules)}


def _plan_random(args) -> tuple[list[tuple[str, Mutant, list[str]]], dict[str, int]]:
    plan: list[tuple[str, Mutant, list[str]]] = []
    population: dict[str, int] = {}
    for name, (modules, tests) in TARGETS.items():
        if args.only and name not in args.only:
            continue
        present = [m for m in modules if (REPO / m).exists()]
        tests = [t for t in tests if (REPO / t).exists()]
        every = [mut for path in present for mut in enumerate_mutants(path)]
        population[name] = len(every)
        # One generator per target: a target's sample does not depend on the others run.
        rng = random.Random(f"{args.seed}-{name}")
        for mut in rng.sample(every, min(args.per_target, len(every))):
            if not args.module or mut.path in args.module:
                plan.append((name, mut, tests))
    return plan, population


def _plan_fixed(args) -> list[Fixed]:
    names = mutants_fixed.by_name()
    unknown = [n for n in args.name or () if n not in names]
    if unknown:
        raise SystemExit(f"no fixed mutant named {', '.join(unknown)} "
                         f"(see --set fixed --list)")
    return [m for m in FIXED
            if (not args.group or m.group in args.group)
            and (not args.name or m.name in args.name)
            and (not args.module or m.path in args.module)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--set", choices=("random", "fixed", "all"), default="all",
                    help="the random sample, the fixed named mutants, or both (default)")
    ap.add_argument("--per-target", type=int, default=25)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--only", action="append", help="random: target name (repeatable)")
    ap.add_argument("--group", action="append",
                    choices=("security", "policy", "thresholds", "signals"),
                    help="fixed: only this group (repeatable)")
    ap.add_argument("--name", action="append", help="fixed: only this mutant (repeatable)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=180)
    ap.add_argument("--json")
    ap.add_argument("--module", action="append",
                    help="run only the mutants of this module (repeatable); the random "
                         "sample itself stays that of the whole target")
    ap.add_argument("--list", action="store_true",
                    help="print the selected mutants and exit, without running them")
    ap.add_argument("--check", action="store_true",
                    help="only check that every fixed mutant still applies to the code")
    args = ap.parse_args()
    problems = check_fixed()
    if args.check:
        print("\n".join(problems) or f"all {len(FIXED)} fixed mutants apply")
        raise SystemExit(1 if problems else 0)
    plan, population = _plan_random(args) if args.set != "fixed" else ([], {})
    fixed = _plan_fixed(args) if args.set != "random" else []
    if args.list:
        for name, m, _ in sorted(plan, key=lambda x: (x[1].path, x[1].line, x[1].index)):
            print(f"{name:>16}  {m.path}:{m.line}  {m.what}  (#{m.index})")
        for f in fixed:
            print(f"{'fixed ' + f.group:>16}  {f.name}  {f.path}: {f.what}")
        return
    if fixed and problems:
        # Never skipped: a guard that moved needs its mutant moved with it.
        raise SystemExit("\n".join(problems))
    results: dict[str, list[dict]] = {name: [] for name in population}
    fixed_rows: list[dict] = []
    t0 = time.monotonic()
    everything = list(dict.fromkeys([t for _, _, ts in plan for t in ts]
                                    + [t for f in fixed for t in f.tests]))
    broken = baseline(everything, args.timeout)
    if broken:
        print(f"failing before any mutation, left out: {', '.join(broken)}", file=sys.stderr)
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = {}
        for name, mut, tests in plan:
            fut = pool.submit(run_mutant, mut.path,
                              lambda src, i=mut.index: mutate(src, i), tests, args.timeout,
                              broken)
            futures[fut] = (name, {"file": mut.path, "line": mut.line,
                                   "mutation": mut.what, "index": mut.index})
        for f in fixed:
            fut = pool.submit(run_mutant, f.path, lambda src, f=f: mutants_fixed.apply(f, src),
                              list(f.tests), args.timeout, broken)
            futures[fut] = (None, {"name": f.name, "group": f.group, "file": f.path,
                                   "mutation": f.what})
        for fut in concurrent.futures.as_completed(futures):
            name, row = futures[fut]
            verdict, secs, by, _ = fut.result()
            row.update(verdict=verdict, seconds=round(secs, 1))
            if by:
                row["killed_by"] = by
            (results[name] if name is not None else fixed_rows).append(row)
            label = row.get("name") or f"{row['file']}:{row['line']}"
            print(f"{verdict:>16}  {label}  {row['mutation']}", file=sys.stderr)
    out: dict = {"benchmark": "mutation", "seed": args.seed, "per_target": args.per_target,
                 "machine": f"{os.cpu_count()} vCPU", "cpus": os.cpu_count(),
                 "date": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()),
                 "wall_seconds": round(time.monotonic() - t0),
                 "failing_before_mutation": list(broken)}
    if plan:
        rows = [r for rs in results.values() for r in rs]
        out["random"] = {
            **_score(rows),
            "targets": {name: {"mutants_in_code": population[name], **_score(rs)}
                        for name, rs in results.items()},
            "modules": _by_module(rows),
            "security_modules": _score([r for r in rows if r["file"] in SECURITY_MODULES]),
            "survivors": [dict(r, target=n) for n, rs in results.items() for r in rs
                          if r["verdict"] == "survived"],
        }
    if fixed_rows:
        fixed_rows.sort(key=lambda r: [f.name for f in FIXED].index(r["name"]))
        out["fixed"] = {
            **_score(fixed_rows),
            "groups": {g: _score([r for r in fixed_rows if r["group"] == g])
                       for g in dict.fromkeys(r["group"] for r in fixed_rows)},
            "modules": _by_module(fixed_rows),
            "security_modules": _score([r for r in fixed_rows
                                        if r["file"] in SECURITY_MODULES]),
            "mutants": fixed_rows,
        }
    emit(out, args.json)
    survived = [r["name"] for r in fixed_rows if not r["verdict"].startswith("killed")]
    if survived:
        print(f"fixed mutants not killed: {', '.join(survived)}", file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
