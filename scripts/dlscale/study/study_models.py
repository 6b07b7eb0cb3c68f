"""A study's own models at parse time (config `models:`; docs/pages/your-model.md): each one's
definition checked (dlscale.models.zoo), then measured in its environment by one bounded
subprocess per (environment, model) (dlscale.models.zoo_probe probe), cached on disk, and
registered beside the shipped models; the combinations its cells cannot run refused, naming
why; and its cells given their environment and their record (Cell.model_source: the source,
the definition and what was measured, with the library's or the package's name and version).

What a user asks of them: `dlscale models list|show` (dlscale.workflow.models_command).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from dlscale.models import zoo
from dlscale.models.zoo_probe import PROBE_PREFIX
from dlscale.registry.frameworks import FRAMEWORKS, environments_dir
from dlscale.registry.model_sources import (
    ENTRY_POINT,
    LAYERED,
    TRANSFORMERS,
    WHY_NO_PIPELINE,
    hf_environment,
)
from dlscale.registry.model_sources import (
    FRAMEWORKS as MODEL_FRAMEWORKS,
)
from dlscale.registry.parallel_dims import cell_tp_degree
from dlscale.registry.strategies import STRATEGIES
from dlscale.study.errors import ConfigError
from dlscale.study.hardware import environment_variant

# One probe's limit: it imports torch (and transformers) and builds the model on the meta
# device, about a second on an idle core; a loaded login node gets this much.
PROBE_TIMEOUT_S = 180
CACHE_DIR = ".cache/model-probes"  # under the checkout
PROBE_MODULE = "dlscale.models.zoo_probe"
# facts that say where the probe ran, not what the model is: kept out of the cells' record
ENVIRONMENT_FACTS = ("python", "torch")
# the workloads whose cells train a model of axes.model
MODEL_WORKLOADS = ("throughput", "convergence")


@dataclass(frozen=True)
class StudyModel:
    name: str
    source: str
    record: dict  # Cell.model_source's content
    python: str  # the interpreter of the environment it was measured in
    environment: str  # that environment's name (a path's last folder for a path)
    seconds: float  # how long its check took (0 from the cache)
    cached: bool


def _short_hash(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:12]


def checkout() -> Path:
    return Path(__file__).resolve().parents[3]


def environment_python(name: str | None, workflow_dir: Path) -> Path:
    """The interpreter of an environment named in a study (None: the driver's; a name: under the
    environments folder; an absolute path: that venv)."""
    if name is None:
        return Path(sys.executable)
    folder = Path(name) if Path(name).is_absolute() else environments_dir(workflow_dir) / name
    return folder / "bin" / "python"


def transformers_environment(entry: dict | None) -> str:
    """The environment a transformers model's cells run in on a hardware entry (None: the
    probe's, CPU): the pytorch framework's environment there with transformers layered over it
    (pytorch-hf, pytorch-cuda-hf)."""
    variant = environment_variant(entry) if entry else "cpu"
    base = FRAMEWORKS["pytorch"].environment_for(variant, entry or {})
    return hf_environment(base)


def _site_marker(python: Path) -> list:
    """What changes when a package is installed into an environment: its site-packages
    folders' modification times and its set-up stamp."""
    venv = python.parent.parent
    marks = []
    for site in sorted(venv.glob("lib/python*/site-packages")):
        try:
            marks.append([str(site), site.stat().st_mtime_ns])
        except OSError:
            pass
    stamp = venv / ".dlscale-setup"
    if stamp.is_file():
        marks.append(stamp.read_text().strip())
    if python == Path(sys.executable):
        import sysconfig

        site = Path(sysconfig.get_paths()["purelib"])
        marks.append([str(site), site.stat().st_mtime_ns if site.exists() else None])
    return marks


def _probe_code() -> str:
    models = Path(__file__).parents[1] / "models"
    parts = ("zoo_probe.py", "entry_points.py", "torch/zoo.py")
    return _short_hash([(models / part).read_text() for part in parts])


def probe(
    name: str, record: dict, python: Path, workflow_dir: Path, seq_len: int | None
) -> tuple[dict | None, str | None, float, bool]:
    """The facts of one study model, measured in its environment (one subprocess, at most
    PROBE_TIMEOUT_S) or read from the cache: (facts, error, seconds, cached)."""
    request = {"record": record, "seq_len": seq_len}
    key = _short_hash([request, str(python), _site_marker(python), _probe_code()])
    cache = workflow_dir / CACHE_DIR / f"{key}.json"
    if cache.is_file():
        try:
            hit = json.loads(cache.read_text())
            return hit.get("facts"), hit.get("error"), 0.0, True
        except ValueError:
            pass
    if not python.exists():
        return None, f"its environment's interpreter {python} does not exist", 0.0, False
    env = dict(os.environ)
    scripts = str(workflow_dir / "scripts")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (scripts, env.get("PYTHONPATH")) if p)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1")
    started = time.perf_counter()
    try:
        done = subprocess.run(
            [str(python), "-m", PROBE_MODULE, "probe"],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            cwd=workflow_dir,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return None, f"its check did not finish in {PROBE_TIMEOUT_S} s", PROBE_TIMEOUT_S, False
    seconds = time.perf_counter() - started
    lines = [line for line in done.stdout.splitlines() if line.startswith(PROBE_PREFIX)]
    if not lines:
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-4:])
        return (
            None,
            f"its check in {python} failed (exit {done.returncode}): {tail}",
            seconds,
            False,
        )
    result = json.loads(lines[-1].removeprefix(PROBE_PREFIX))
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(result, sort_keys=True))
    tmp.replace(cache)
    return result.get("facts"), result.get("error"), seconds, False


def _record(name: str, definition: dict, workflow_dir: Path) -> dict:
    """The record a cell carries, before its facts: the source and the definition as measured
    (a config.json's content inlined: what is built, not where the file is)."""
    source = zoo.source_of(definition)
    definition = json.loads(json.dumps(definition))
    if source == TRANSFORMERS and "config_file" in definition["transformers"]:
        part = definition["transformers"]
        content, _ = zoo.read_config_file("", part.pop("config_file"), workflow_dir)
        part["config_json"] = content
    if source == ENTRY_POINT:
        definition.pop("environment", None)  # where it is installed, not what it builds
    return {"source": source, "definition": definition}


def _used_models(by_workload: dict) -> list[str]:
    used = []
    for workload, axes in by_workload.items():
        if workload in MODEL_WORKLOADS:
            used += [m for m in axes["model"] if m not in used]
    return used


def study_models(
    config: dict,
    hardware: dict,
    workflow_dir: str | Path | None,
    by_workload: dict,
    ranks_of,
) -> dict[str, StudyModel]:
    """Check, measure and register the study's own models that its axes use (every definition
    is checked; a definition no axis uses is not measured). `by_workload`: the study's axes per
    workload (dlscale.study.workloads.workload_axes), `ranks_of(config, entry)`: a hardware
    entry's ranks per node values (ranks_per_node_values). Raises ConfigError naming every
    problem, before any job."""
    zoo.unregister_all()
    models = config.get("models") or {}
    if not models:
        return {}
    workflow_dir = Path(workflow_dir) if workflow_dir is not None else checkout()
    problems = zoo.definition_problems(models, workflow_dir)
    if problems:
        raise ConfigError("config", problems)
    used = [m for m in _used_models(by_workload) if m in models]
    jobs = {}
    for name in used:
        definition = models[name]
        record = _record(name, definition, workflow_dir)
        if record["source"] == TRANSFORMERS:
            env = transformers_environment(None)
            python = environment_python(env, workflow_dir)
            if not python.exists():
                problems.append(
                    f"models.{name}: a transformers model is checked and run in the environment "
                    f"{env}, which is not built ({python} is missing): bash scripts/setup.sh {env}"
                )
                continue
        else:
            env_name = definition.get("environment")
            python = environment_python(env_name, workflow_dir)
            env = Path(env_name).name if env_name else "pytorch"
            if not python.exists():
                problems.append(
                    f"models.{name}.environment: {env_name!r} has no interpreter ({python}); "
                    "name the venv the package is installed in (a name under the environments "
                    "folder, or an absolute path)"
                )
                continue
        jobs[name] = (record, python, env)
    if problems:
        raise ConfigError("config", problems)
    with ThreadPoolExecutor(max_workers=max(1, min(4, len(jobs)))) as pool:
        futures = {
            name: pool.submit(probe, name, record, python, workflow_dir, config.get("seq_len"))
            for name, (record, python, env) in jobs.items()
        }
    out = {}
    for name, future in futures.items():
        record, python, env = jobs[name]
        facts, error, seconds, cached = future.result()
        if error:
            problems.append(f"models.{name}: {error}")
            continue
        record = {
            **record,
            "title": facts.pop("title"),
            "environment_facts": {k: facts.pop(k, None) for k in ENVIRONMENT_FACTS},
            "facts": facts,
        }
        if record["source"] == ENTRY_POINT:
            record["distribution"] = facts.get("distribution")
            record["version"] = facts.get("version")
        zoo.register(name, {k: v for k, v in record.items() if k != "environment_facts"})
        out[name] = StudyModel(name, record["source"], record, str(python), env, seconds, cached)
    if problems:
        zoo.unregister_all()
        raise ConfigError("config", problems)
    problems = strategy_problems(config, hardware, out, by_workload, ranks_of)
    if problems:
        zoo.unregister_all()
        raise ConfigError("config", problems)
    return out


def _excluded(pair: dict, exclude: list[dict]) -> bool:
    return any(set(e) <= set(pair) and all(pair[k] == v for k, v in e.items()) for e in exclude)


def strategy_problems(
    config: dict, hardware: dict, models: dict[str, StudyModel], by_workload: dict, ranks_of
) -> list[str]:
    """What a study model's cells cannot run, before any job: another framework than
    pytorch's adapters, a pipeline, tensor parallel without the model's own plan or at a
    degree its heads, vocabulary or MLP do not divide, and a GPU entry with no transformers
    environment. Each names the reason and what is allowed (or the exclude that leaves it)."""
    problems = []
    exclude = config["exclude"]
    for workload, axes in by_workload.items():
        if workload not in MODEL_WORKLOADS:
            continue
        for name in (m for m in axes["model"] if m in models):
            model = models[name]
            facts = model.record["facts"]
            for framework in axes["framework"]:
                if framework not in MODEL_FRAMEWORKS and not _excluded(
                    {"framework": framework, "model": name}, exclude
                ):
                    problems.append(
                        f"axes.model: {name!r} (models.{name}) is a PyTorch module, and framework "
                        f"{framework!r} does not train it; allowed frameworks: "
                        f"{', '.join(MODEL_FRAMEWORKS)} (or exclude {{framework: {framework}, "
                        f"model: {name}}})"
                    )
            for strategy in axes.get("parallelism") or ():
                record = STRATEGIES[strategy]
                pair = {"model": name, "parallelism": strategy}
                if _excluded(pair, exclude):
                    continue
                if record.pipeline:
                    problems.append(
                        f"axes.parallelism: {strategy!r} cannot run model {name!r}: "
                        f"{WHY_NO_PIPELINE}; allowed for it: the strategies that do not "
                        f"pipeline (or exclude {{model: {name}, parallelism: {strategy}}})"
                    )
                    continue
                if not record.splits_layers:
                    continue
                if not facts.get("tp_plan"):
                    why = (
                        "an entry point's model has none"
                        if model.source == ENTRY_POINT
                        else f"{model.record['title']} has none (base_model_tp_plan)"
                    )
                    problems.append(
                        f"axes.parallelism: {strategy!r} splits model {name!r} by its own "
                        f"tensor-parallel plan (transformers' base_model_tp_plan), and {why}; "
                        f"allowed for it: ddp, fsdp, hsdp (or exclude {{model: {name}, "
                        f"parallelism: {strategy}}})"
                    )
                    continue
                for hw_key in axes["hardware"]:
                    for rpn in ranks_of(config, hardware.get(hw_key) or {}):
                        tp = cell_tp_degree(strategy, rpn, config["tp_degree"])
                        bad = zoo.indivisible(facts, tp)
                        if bad:
                            problems.append(
                                f"axes.parallelism: {strategy!r} splits model {name!r} over "
                                f"tensor-parallel degree {tp} (hardware {hw_key!r}), which does "
                                f"not divide its {', '.join(bad)}; allowed tp_degree: a common "
                                "divisor of them"
                            )
            mode = config.get("activation_checkpointing", "none")
            if mode != "none" and not facts.get("fsdp_units"):
                problems.append(
                    f"activation_checkpointing: {mode!r} checkpoints a model's blocks, and model "
                    f"{name!r} has no repeated blocks; allowed for it: none"
                )
            if model.source == TRANSFORMERS:
                for hw_key in axes["hardware"]:
                    entry = hardware.get(hw_key)
                    env = transformers_environment(entry) if entry else None
                    if env is not None and env not in LAYERED:
                        problems.append(
                            f"axes.hardware: {hw_key!r} runs PyTorch in {env.removesuffix('-hf')}, "
                            f"which has no transformers environment for model {name!r}; "
                            f"transformers environments: {', '.join(LAYERED)}"
                        )
    return list(dict.fromkeys(problems))


def apply(
    cells: list,
    models: dict[str, StudyModel],
    hardware: dict,
    workflow_dir=None,
    requirements_text=Path.read_text,
) -> list:
    """The study models' cells with their record (Cell.model_source) and environment: a
    transformers model's `<environment>-hf` (its requirements and its base's in the id), an
    entry point's the environment it is installed in (the interpreter and torch it reported)."""
    if not models:
        return cells
    workflow_dir = Path(workflow_dir) if workflow_dir is not None else checkout()
    out = []
    for cell in cells:
        model = models.get(cell.model)
        if model is None:
            out.append(cell)
            continue
        record = {k: v for k, v in model.record.items() if k != "environment_facts"}
        if model.source == TRANSFORMERS:
            env = transformers_environment(hardware[cell.hardware])
            req = workflow_dir / "envs" / f"{env}.txt"
            text = requirements_text(req) if req.exists() else "unknown"
            environment = f"{env}:{_short_hash([cell.environment, text])}"
        else:
            environment = (
                f"{model.environment}:"
                f"{_short_hash([cell.environment, model.record['environment_facts']])}"
            )
        out.append(
            dataclasses.replace(
                cell,
                environment=environment,
                model_source=json.dumps(record, sort_keys=True, separators=(",", ":")),
            )
        )
    return out


def model_python(study, hardware: str, model: str, workflow_dir=None) -> str | None:
    """The interpreter a study model's cells run in on a hardware entry (None: not a study
    model): its transformers environment there, or the entry point's environment."""
    definition = (study.config.get("models") or {}).get(model)
    if definition is None:
        return None
    workflow_dir = Path(workflow_dir) if workflow_dir is not None else checkout()
    if zoo.source_of(definition) == TRANSFORMERS:
        env = transformers_environment(study.hardware[hardware])
        return str(environment_python(env, workflow_dir))
    return str(environment_python(definition.get("environment"), workflow_dir))


def show(study) -> str:
    """What a study's own models are, as `dlscale models show` prints it:
    each model's source, parameters (dlscale's count and the library's), input, blocks and
    environment, then its cells."""
    lines = []
    for name in (
        m for m in study.config["axes"]["model"] if m in (study.config.get("models") or {})
    ):
        cells = [c for c in study.cells if c.model == name]
        if not cells:
            continue
        record = json.loads(cells[0].model_source)
        f = record["facts"]
        shape = "x".join(map(str, f["input_shape"]))
        what = (
            f"decoder, seq_len {shape}, vocab {f['vocab_size']}"
            if f["family"] == "decoder"
            else f"{f['family']}, input {shape}, {f['num_classes']} classes"
        )
        library = f.get("library_version") and f"{f['library']} {f['library_version']}"
        lines += [
            f"{name}: {record['title']}",
            f"  parameters {f['param_count']:,} (the library's count: "
            f"{f['library_param_count']:,}){', ' + library if library else ''}",
            f"  {what}; blocks {', '.join(f['fsdp_units']) or 'none'} ({f['fsdp_units_from']})",
            f"  environment {cells[0].environment.split(':')[0]}; "
            f"tensor-parallel plan: {'its own' if f.get('tp_plan') else 'none'}",
            f"  {len(cells)} cell(s):",
            *(f"    {c.path}" for c in cells),
        ]
    return "\n".join(lines) + "\n"


def entry_points(python: Path) -> list[dict]:
    """The entry points of the dlscale.models group installed in an environment (its
    interpreter reads their metadata: no torch started, a fraction of a second)."""
    env = dict(os.environ)
    scripts = str(checkout() / "scripts")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (scripts, env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [str(python), "-m", PROBE_MODULE, "entry-points"],
        capture_output=True,
        text=True,
        timeout=PROBE_TIMEOUT_S,
        env=env,
    )
    for line in done.stdout.splitlines():
        if line.startswith(PROBE_PREFIX):
            return json.loads(line.removeprefix(PROBE_PREFIX))["entry_points"]
    raise RuntimeError(f"{python} could not list its entry points: {done.stderr.strip()[-500:]}")
