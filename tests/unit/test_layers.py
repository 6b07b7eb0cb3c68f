"""The package's floors hold: every subpackage sits on one floor, a module
imports only its own floor and the floors below it, analysis and outputs never import the run
side, a framework or a framework's model builders, and no import cycle exists, counting imports
inside functions too (a lazy import is still a dependency a reader must follow).

The checker is plain AST reading of scripts/dlscale; the last tests feed it a small package
with a forbidden import and a cycle, so a checker that stopped seeing imports fails here."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "scripts" / "dlscale"

# The floors, ground first (docs/pages/architecture.md draws them): a module may import its own
# floor and the floors below it, never one above.
# - registry: what exists (framework and strategy records, degrees, bindings, formats);
# - models: the model specs, builders, FLOP counter and each architecture's parallel plan;
# - study: the study's description (cells, config, hardware, protocol);
# - data: datasets and loaders;
# - rank: one rank's kit (device, timing loop, energy, telemetry, probes, provenance);
# - store: metrics files, measurements, archives;
# - frameworks: the adapters, which call down into rank;
# - run: what drives the adapters (launcher, the rank's main, the convergence loop);
# - analysis, outputs, decisions, workflow: the stages after the run, in order.
# No arrow runs back up a floor.
FLOORS = (
    "registry",
    "models",
    "study",
    "data",
    "rank",
    "store",
    "frameworks",
    "run",
    "analysis",
    "outputs",
    "decisions",
    "workflow",
)
# package -> module prefixes it must never import although they sit below it: analysis and
# outputs read files and run without a framework installed (dlscale.models' spec registry,
# its FLOP method text and its plans are pure Python; its framework subpackages build models)
FORBIDDEN = {
    "analysis": ("run", "rank", "frameworks", "data", "models.torch", "models.tf", "models.mxnet"),
    "outputs": ("run", "rank", "frameworks", "data", "models.torch", "models.tf", "models.mxnet"),
}


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, root: Path) -> set[str]:
    """The package modules `path` imports anywhere in its body (module or function level):
    `from X import Y` counts as X, and as X.Y where Y is a module."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    top = root.name
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == top}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != top:
                continue
            found.add(target)
            for a in node.names:
                sub = root.parent / Path(*f"{target}.{a.name}".split("."))
                if sub.with_suffix(".py").exists() or (sub / "__init__.py").exists():
                    found.add(f"{target}.{a.name}")
    found.discard(name)
    return found


def graph(root: Path) -> dict[str, set[str]]:
    modules = {module_name(p, root): p for p in root.rglob("*.py")}
    return {m: {i for i in imports_of(p, root) if i in modules} for m, p in modules.items()}


def stage(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def layer_violations(g: dict[str, set[str]]) -> list[str]:
    out = []
    for module, targets in sorted(g.items()):
        here = stage(module)
        for target in sorted(targets):
            rel = target.split(".", 1)[1] if "." in target else ""
            for banned in FORBIDDEN.get(here, ()):
                if rel == banned or rel.startswith(banned + "."):
                    out.append(f"{module} imports {target} ({here} must not import {banned})")
            there = stage(target)
            if here in FLOORS and there in FLOORS and FLOORS.index(there) > FLOORS.index(here):
                out.append(f"{module} imports {target} (floor {here} is below {there})")
    return out


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_every_module_sits_on_a_floor():
    """No flat modules beside the floors: only the package's entry points; and every
    subpackage is on exactly one floor, so the check below covers all of them."""
    flat = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert flat == ["__init__.py", "__main__.py"]
    subpackages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert subpackages == set(FLOORS)


def test_no_import_runs_up_a_floor_and_analysis_never_imports_the_run_side():
    assert layer_violations(graph(PACKAGE)) == []


def test_the_pure_python_parts_import_no_framework():
    """The registry, the model specs, their FLOP method text and parallel plans, and the study
    load without torch, TensorFlow or MXNet: the schema, the parse-time checks, the report and
    scripts/setup.sh read them where no framework is installed."""
    code = (
        "import sys; import dlscale.registry.frameworks, dlscale.registry.parallel_dims, "
        "dlscale.registry.gpu_bindings, dlscale.models.flops, dlscale.models.parallelize, "
        "dlscale.study.matrix_checks; "
        "plans = dlscale.models.parallelize; plans.plan_for('gpt'); plans.plan_for('transformer'); "
        "print(sorted(m for m in ('torch', 'tensorflow', 'mxnet') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(PACKAGE.parent), "PATH": "/usr/bin:/bin"},
    )
    assert out.stdout.strip() == "[]"


def test_no_import_cycle():
    assert cycles(graph(PACKAGE)) == []


def test_no_two_modules_share_a_name():
    """A reader finds a module by its name: no name twice across the stages (models' per-
    framework builders, which mirror each other on purpose, aside)."""
    names: dict[str, list[str]] = {}
    for p in PACKAGE.rglob("*.py"):
        if p.name in ("__init__.py", "__main__.py") or p.parent.parent.name == "models":
            continue
        names.setdefault(p.stem, []).append(str(p.relative_to(PACKAGE)))
    assert {n: ps for n, ps in names.items() if len(ps) > 1} == {}


@pytest.fixture()
def toy(tmp_path):
    """A package laid out as dlscale is, with one forbidden import inside a function and a
    two-module cycle."""
    root = tmp_path / "toy"
    for sub in ("analysis", "run", "study", "store"):
        (root / sub).mkdir(parents=True)
        (root / sub / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "run" / "launch.py").write_text("X = 1\n")
    (root / "analysis" / "collect.py").write_text(
        "def f():\n    from toy.run.launch import X\n    return X\n"
    )
    (root / "study" / "cell.py").write_text("from ..store import metrics\n")
    (root / "store" / "metrics.py").write_text("from toy.study.cell import *\n")
    return root


def test_the_checker_sees_a_lazy_forbidden_import_and_a_cycle(toy):
    g = graph(toy)
    assert g["toy.analysis.collect"] == {"toy.run.launch"}
    assert layer_violations(g) == [
        "toy.analysis.collect imports toy.run.launch (analysis must not import run)",
        "toy.study.cell imports toy.store (floor study is below store)",
        "toy.study.cell imports toy.store.metrics (floor study is below store)",
    ]
    assert cycles(g) == [["toy.store.metrics", "toy.study.cell"]]
