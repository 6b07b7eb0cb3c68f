"""One home for what a framework is and what a strategy is: the records in
dlscale.registry are complete or refused at import, every other place reads them, and the names
are listed once."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dlscale.models import get_spec
from dlscale.models import names as model_names
from dlscale.models.parallelize import NO_PLAN, plan_for
from dlscale.registry import cuda_probes, frameworks, gpu_bindings
from dlscale.registry.frameworks import FRAMEWORKS, Framework
from dlscale.registry.launchers import LAUNCHERS
from dlscale.registry.parallel_dims import ParallelDims
from dlscale.registry.strategies import DEFAULT_STRATEGY, STRATEGIES, RegistryError, Strategy
from dlscale.study.config import load_schema

ROOT = Path(__file__).resolve().parents[3]
REGISTRY = ROOT / "scripts" / "dlscale" / "registry"


def test_a_framework_record_missing_a_fact_fails_at_import_naming_record_and_fact():
    good = dataclasses.asdict(FRAMEWORKS["keras"]) | {"cuda_probe": cuda_probes.tensorflow_cuda}
    for fact in ("adapter", "model_package", "host_sync_per_step", "initialisation_and_data_order"):
        with pytest.raises(RegistryError, match=rf"framework record 'keras'.*fact '{fact}'"):
            Framework(**{**good, fact: ""})
    with pytest.raises(RegistryError, match=r"fact 'environment' .* envs/nope.txt does not exist"):
        Framework(**{**good, "environment": "nope"})
    with pytest.raises(TypeError):  # a fact left out entirely: the dataclass refuses at import
        Framework(**{k: v for k, v in good.items() if k != "cuda_probe"})


def test_a_strategy_record_missing_a_fact_fails_at_import(monkeypatch):
    def ddp_degrees(n, r, t, p):
        return (n * r, 1)

    with pytest.raises(RegistryError, match=r"strategy record 'x'.*fact 'description'"):
        Strategy("x", "", ddp_degrees)
    with pytest.raises(RegistryError, match=r"fact 'model_plan' is 'heads'; allowed: tp, "):
        Strategy("x", "y", ddp_degrees, model_plan="heads")
    zigzag = Strategy("zigzag", "y", ddp_degrees, frameworks=("pytorch", "chainer"))
    monkeypatch.setitem(STRATEGIES, "zigzag", zigzag)
    with pytest.raises(RegistryError, match=r"'zigzag'.*'frameworks' names chainer; allowed: "):
        frameworks._check_strategy_records()
    # which frameworks offer a strategy is its record's fact: the framework records read it
    monkeypatch.setitem(
        STRATEGIES, "zigzag", Strategy("zigzag", "y", ddp_degrees, frameworks=("mxnet",))
    )
    assert FRAMEWORKS["mxnet"].strategies == ("ddp", "zigzag")
    assert "zigzag" not in FRAMEWORKS["pytorch"].strategies


@pytest.mark.parametrize("name", list(STRATEGIES))
@pytest.mark.parametrize(("nodes", "rpn"), [(1, 4), (2, 4), (4, 2)])
def test_every_strategys_degrees_multiply_to_the_world_size(name, nodes, rpn):
    record = STRATEGIES[name]
    dims = ParallelDims.of(name, nodes, rpn, tp_degree=2, pp_degree=2)
    assert dims.world_size == nodes * rpn
    assert dims.tp == (2 if record.splits_layers else 1)
    assert dims.pp == (2 if record.pipeline else 1)
    assert (dims.dp_shard > 1 or nodes * rpn == 1) == (record.sharded and dims.dp_shard > 1)


def test_what_a_framework_offers_and_a_model_needs_come_from_the_records():
    assert frameworks.offering(DEFAULT_STRATEGY) == list(FRAMEWORKS)
    for name, record in STRATEGIES.items():
        assert frameworks.offering(name), f"no framework offers {name}"
        if record.model_plan is None:
            continue
        able = [m for m in model_names() if plan_for(get_spec(m).arch).offers(record.model_plan)]
        assert able, f"no model has the {record.model_plan!r} plan {name} needs"
    assert plan_for("no_such_arch") is NO_PLAN


def test_a_pipeline_plan_has_its_split_beside_the_model_and_tp_plans_name_linears():
    import torch

    from dlscale.models.torch import build

    for model in model_names():
        arch = get_spec(model).arch
        plan = plan_for(arch)
        module = __import__(f"dlscale.models.torch.{arch}", fromlist=["x"])
        assert hasattr(module, "pipeline_stage") == plan.pipeline, arch
        if plan.pipeline or not plan.why_not_pipeline:
            assert plan.pipeline or plan == NO_PLAN or not plan.tp, arch
        if not plan.tp or model not in ("transformer_small", "gpt2_tiny", "llama3_debug"):
            continue
        import fnmatch

        built = dict(build(model).named_modules())
        for pattern in plan.tp:
            found = [m for n, m in built.items() if fnmatch.fnmatchcase(n, pattern)]
            assert found and all(isinstance(m, torch.nn.Linear) for m in found), pattern


def test_the_schemas_enums_and_defaults_are_the_registrys():
    config = load_schema(ROOT / "config" / "schemas" / "config.schema.json")
    axis = config["properties"]["axes"]["properties"]["parallelism"]
    assert axis["items"]["enum"] == list(STRATEGIES)
    assert axis["default"] == [DEFAULT_STRATEGY]
    assert config["properties"]["axes"]["properties"]["framework"]["items"]["enum"] == list(
        FRAMEWORKS
    )
    hardware = load_schema(ROOT / "config" / "schemas" / "hardware.schema.json")
    binding = next(
        v["properties"]["gpu_binding"]
        for v in _subschemas(hardware)
        if isinstance(v.get("properties"), dict) and "gpu_binding" in v["properties"]
    )
    # a name of the registry's, or a map (dlscale.registry.gpu_bindings.GpuMap)
    names = next(b for b in binding["oneOf"] if b["type"] == "string")
    assert names["enum"] == list(gpu_bindings.GPU_BINDINGS)
    assert binding["default"] == gpu_bindings.DEFAULT_GPU_BINDING
    text = (ROOT / "config" / "schemas" / "config.schema.json").read_text()
    assert '"fsdp+tp"' not in text and '"enum": [\n              "ddp"' not in text


def _subschemas(schema):
    if isinstance(schema, dict):
        yield schema
        for v in schema.values():
            yield from _subschemas(v)
    elif isinstance(schema, list):
        for v in schema:
            yield from _subschemas(v)


def test_setup_reads_the_environments_with_the_standard_library_alone():
    """scripts/setup.sh runs `python3 -m dlscale.registry environments` before any venv: with
    site-packages off (-S), the registry still loads and says what setup.sh builds."""
    code = (
        "import sys; sys.path.insert(0, 'scripts'); "
        "from dlscale.registry.__main__ import main; "
        "main(['environments', 'cpu']); main(['environments', 'cuda'])"
    )
    out = subprocess.run(
        [sys.executable, "-S", "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    expected = frameworks.environments("cpu") + frameworks.environments("cuda")
    assert out.stdout.split() == expected
    cpu = {f.environment for f in FRAMEWORKS.values()} - {None}  # the driver's .venv aside
    assert set(frameworks.environments("cpu")) == cpu and len(expected) == len(set(expected))
    lines = [e for f in FRAMEWORKS.values() for e in f.line_environments()]
    # + the driver's pytorch-cuda, + PyTorch's CUDA lines of their own (pytorch-cu128, ...)
    assert len(frameworks.environments("cuda")) == len(cpu) + 1 + len(lines)
    for env in expected:
        assert (ROOT / "envs" / f"{env}.txt").is_file()
    bad = subprocess.run(
        ["bash", "scripts/setup.sh", "nope"], cwd=ROOT, capture_output=True, text=True
    )
    assert bad.returncode == 2
    from dlscale.registry.model_sources import LAYERED

    assert f"allowed: {' '.join([*expected, *LAYERED])} none" in bad.stderr


def test_the_environments_folder_is_the_checkouts_or_dlscale_envs_dir(tmp_path):
    """Where setup.sh builds the framework environments and the workflow finds them:
    .venvs/ in the checkout, or DLSCALE_ENVS_DIR (absolute, or from the checkout)."""
    co = tmp_path / "co"
    assert frameworks.environments_dir(co, {}) == co / ".venvs"
    assert frameworks.environments_dir(co, {"DLSCALE_ENVS_DIR": "/scratch/me/envs"}) == Path(
        "/scratch/me/envs"
    )
    assert frameworks.environments_dir(co, {"DLSCALE_ENVS_DIR": "../envs"}) == tmp_path / "envs"
    assert frameworks.environments_folder({"DLSCALE_ENVS_DIR": "../envs"}) == "../envs"
    out = subprocess.run(
        [sys.executable, "-S", "-m", "dlscale.registry", "environments-dir"],
        cwd=ROOT, capture_output=True, text=True, check=True,
        env={"PYTHONPATH": str(ROOT / "scripts"), "DLSCALE_ENVS_DIR": "../envs"},
    ).stdout  # fmt: skip
    assert out == f"{ROOT.parent / 'envs'}\n"


# ---- the "listed once" claims --------------------------------------------------------------
# Where code may enumerate the names on purpose: the registry itself, and tests that
# parametrise over an explicit list (each says why).
ON_PURPOSE = {"tests/unit/registry/test_registry.py"}


def _code_files():
    for folder in ("scripts", "benchmarks", "tests", "rules", "docs"):
        for path in sorted((ROOT / folder).rglob("*")):
            rel = path.relative_to(ROOT).as_posix()
            if path.suffix in (".py", ".smk", ".sh") and not rel.startswith(
                "scripts/dlscale/registry/"
            ):
                yield rel, path
    yield "Snakefile", ROOT / "Snakefile"


def _literal_lists(path: Path, rel: str):
    """Each list, tuple or set literal of strings in a Python file; for Snakemake and shell
    files, each run of quoted or bare words on one line."""
    text = path.read_text()
    if path.suffix == ".py":
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
                words = [
                    e.value
                    for e in node.elts
                    if isinstance(e, ast.Constant) and isinstance(e.value, str)
                ]
                if words:
                    yield node.lineno, words
            elif isinstance(node, ast.Dict):
                keys = [k.value for k in node.keys if isinstance(k, ast.Constant)]
                if keys:
                    yield node.lineno, [k for k in keys if isinstance(k, str)]
    else:
        for i, line in enumerate(text.splitlines(), 1):
            if not line.lstrip().startswith("#"):
                yield i, re.findall(r"[\w+-]+", line)


@pytest.mark.parametrize(
    ("what", "names", "in_tests"),
    [
        ("strategy", list(STRATEGIES), True),
        ("framework", list(FRAMEWORKS), True),
        # two launchers: a test comparing a cell of each names both, which is all of them
        ("launcher", list(LAUNCHERS), False),
    ],
)
def test_the_names_are_listed_once(what, names, in_tests):
    """No code outside the registry lists two or more strategy names (or framework or launcher
    names) in one literal (comments aside): such a list is a second home that a new record
    would miss. Tests may name some on purpose (a case, a pair compared), never all of them: a
    test over every framework or strategy reads the registry."""
    found = []
    for rel, path in _code_files():
        if rel in ON_PURPOSE:
            continue
        test = rel.startswith("tests/")
        if test and not in_tests:
            continue
        for line, words in _literal_lists(path, rel):
            hits = [w for w in dict.fromkeys(words) if w in names]
            if (not test and len(hits) >= 2) or (test and set(hits) == set(names)):
                found.append(f"{rel}:{line}: {', '.join(hits)}")
    assert found == [], f"{what} names listed outside dlscale.registry"


def _name_comparisons(path: Path, rel: str, subject: str, names):
    """Each comparison in a Python file of something whose text holds `subject` with one of
    `names` (`cell.launcher == "srun"`, `combo["framework"] != "pytorch"`, `x in (...)`)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        named = [
            c.value
            for side in sides
            for c in ast.walk(side)
            if isinstance(c, ast.Constant) and c.value in names
        ]
        if named and subject in " ".join(ast.unparse(side) for side in sides).lower():
            yield f"{rel}:{node.lineno}: {ast.unparse(node)}"


def _package_files(*homes: str):
    for path in sorted((ROOT / "scripts" / "dlscale").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if not rel.startswith(tuple(f"scripts/dlscale/{home}" for home in homes)):
            yield rel, path


def test_no_module_branches_on_a_launchers_or_a_frameworks_name():
    """What differs between launchers is a fact of their records (dlscale.registry.launchers)
    or their classes (dlscale.run.launchers), and what only some frameworks run is a
    capability of their records (Framework.capabilities): no other module of the package
    compares a launcher or a framework with a name."""
    found = []
    for rel, path in _package_files("registry/", "run/launchers/"):
        found += _name_comparisons(path, rel, "launcher", LAUNCHERS)
    for rel, path in _package_files("registry/", "frameworks/"):
        found += _name_comparisons(path, rel, "framework", FRAMEWORKS)
    assert found == []


def test_a_frameworks_variables_are_named_only_in_its_record_and_its_adapter():
    """The prefixes of a framework's own environment variables, those of its communication,
    and the variables its adapter sets (Framework.env_prefixes, comm_env, reserved_env) are
    written only in its record (the provenance, the diagnosis, the Systems table and the
    hardware file's env: check read them there) and in the adapter that sets them."""
    written = set(frameworks.env_prefixes()) | set(frameworks.comm_env())
    written |= set(frameworks.reserved_env())
    found = []
    for rel, path in _package_files("registry/frameworks.py", "frameworks/"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in written:
                found.append(f"{rel}:{node.lineno}: {node.value}")
    assert found == []
    from dlscale.analysis.systems_table import PERFORMANCE_ENV
    from dlscale.rank.provenance import ENV_PREFIXES
    from dlscale.run.diagnosis import COMM_PREFIXES
    from dlscale.study.env_names import env_name_problem

    for record in FRAMEWORKS.values():
        assert set(record.env_prefixes) <= set(ENV_PREFIXES) & set(PERFORMANCE_ENV), record.name
        assert set(record.comm_env) <= set(COMM_PREFIXES), record.name
        for name, _ in record.reserved_env:
            why = frameworks.reserved_env()[name]  # the first record's reason, where two share
            assert why in env_name_problem(name if not name.endswith("_") else name + "X")
    with pytest.raises(RegistryError, match=r"fact 'comm_env' names NCCL_, under none of its"):
        Framework(**{**dataclasses.asdict(FRAMEWORKS["mxnet"]), "comm_env": ("NCCL_",)})
    with pytest.raises(RegistryError, match=r"fact 'capabilities' names fp4; allowed: llm_step"):
        Framework(**{**dataclasses.asdict(FRAMEWORKS["mxnet"]), "capabilities": ("fp4",)})
    assert frameworks.with_capability("float8") == [
        n for n, r in FRAMEWORKS.items() if "float8" in r.capabilities
    ]


def test_the_branch_check_sees_a_comparison(tmp_path):
    code = tmp_path / "x.py"
    code.write_text('if cell.launcher == "srun":\n    pass\nok = executor == "srun"\n')
    assert list(_name_comparisons(code, "x.py", "launcher", LAUNCHERS)) == [
        "x.py:1: cell.launcher == 'srun'"
    ]


def test_every_launcher_record_has_its_class_and_the_schemas_enums_are_the_records():
    """Record and class come in pairs (a class without a record is refused at import), each
    class in a file of its own under dlscale.run.launchers, and the config's `launcher` and the
    metrics' provenance `launcher` enums list the records."""
    from dlscale.registry import launchers
    from dlscale.run.launchers import REGISTERED
    from dlscale.run.launchers import launcher_base as base

    assert set(REGISTERED) == set(LAUNCHERS)
    files = {sys.modules[type(c).__module__].__file__ for c in REGISTERED.values()}
    assert len(files) == len(LAUNCHERS)
    with pytest.raises(RegistryError, match=r"launcher 'mpirun'; allowed: local, srun"):
        base.register(type("Mpirun", (base.Launcher,), {"name": "mpirun"}))
    config = load_schema(ROOT / "config" / "schemas" / "config.schema.json")
    assert config["properties"]["launcher"]["enum"] == list(LAUNCHERS)
    assert config["properties"]["launcher"]["default"] == launchers.DEFAULT_LAUNCHER
    metrics = json.loads((ROOT / "scripts/dlscale/schemas/metrics.schema.json").read_text())
    enums = [
        s["properties"]["launcher"]["enum"]
        for s in _subschemas(metrics)
        if "launcher" in (s.get("properties") or {}) and "enum" in s["properties"]["launcher"]
    ]
    assert enums == [list(LAUNCHERS)]
    for executor in ("slurm", "dlscale", "local"):
        assert launchers.for_executor(executor) is not None, executor
    assert launchers.for_executor("a-site-plugin") is None


def test_the_listing_check_sees_a_list(tmp_path):
    """The check above finds a literal list in Python and a word list in a shell script."""
    py, sh = tmp_path / "x.py", tmp_path / "x.sh"
    py.write_text("A = 1\nB = ('ddp', 'fsdp')\n")
    sh.write_text("# tensorflow mxnet: a comment\nENVS=(tensorflow mxnet horovod)\n")
    assert list(_literal_lists(py, "x.py")) == [(2, ["ddp", "fsdp"])]
    assert list(_literal_lists(sh, "x.sh")) == [(2, ["ENVS", "tensorflow", "mxnet", "horovod"])]
