"""The package's layers hold (issue 28): analysis and outputs read files and never import the run
side, a framework or a framework's model builders; the stages import only stages below them; and
no import cycle exists, counting imports inside functions too (a lazy import is still a
dependency a reader must follow).

The checker is plain AST reading of scripts/dlscale; the last tests feed it a small package
with a forbidden import and a cycle, so a checker that stopped seeing imports fails here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "scripts" / "dlscale"

# The stages in order: a stage may import itself and the stages before it, never one after it.
# The run side and the frameworks/models/data side sit beside this order: the description and
# storage stages may name them (the framework registry, the model spec registry), analysis and
# outputs may not (FORBIDDEN).
STAGES = ("study", "store", "analysis", "outputs", "decisions", "workflow")
# package -> module prefixes it must never import (dlscale.models alone is the spec registry,
# pure Python; its framework subpackages and the FLOP counter build models)
FORBIDDEN = {
    "analysis": ("run", "frameworks", "models.torch", "models.tf", "models.mxnet", "models.flops"),
    "outputs": ("run", "frameworks", "models.torch", "models.tf", "models.mxnet", "models.flops"),
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
            if here in STAGES and there in STAGES and STAGES.index(there) > STAGES.index(here):
                out.append(f"{module} imports {target} (stage {here} comes before {there})")
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


def test_every_module_sits_in_a_stage_or_a_side_package():
    """No flat modules beside the stages (issue 28): only the package's entry points."""
    flat = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert flat == ["__init__.py", "__main__.py"]
    subpackages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert subpackages == set(STAGES) | {"run", "frameworks", "models", "data"}


def test_analysis_and_outputs_never_import_the_run_side_or_a_framework():
    assert layer_violations(graph(PACKAGE)) == []


def test_no_import_cycle():
    assert cycles(graph(PACKAGE)) == []


def test_no_two_modules_share_a_name():
    """A reader finds a module by its name: no name twice across the stages (models' per-
    framework builders, which mirror each other on purpose, aside)."""
    names: dict[str, list[str]] = {}
    for p in PACKAGE.rglob("*.py"):
        if p.name == "__init__.py" or p.parent.parent.name == "models":
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
        "toy.study.cell imports toy.store (stage study comes before store)",
        "toy.study.cell imports toy.store.metrics (stage study comes before store)",
    ]
    assert cycles(g) == [["toy.store.metrics", "toy.study.cell"]]
