"""A study's own models (config `models:`; docs/pages/your-model.md), as data: what a definition
may say (checked before anything runs), and their registration beside the shipped models.

A definition names its model under a path-safe name of the study's (NAME_PATTERN; the name
alone enters cell paths and wildcards) and one source (dlscale.registry.model_sources):

    models:
      llama_2l:
        transformers:
          config_class: LlamaConfig        # a class transformers exports, ...Config
          config: {num_hidden_layers: 2, hidden_size: 64, ...}
          # or: config_file: models/llama.json   (inside the checkout, relative)
        seq_len: 64                        # a decoder's tokens per sample
      tiny_net:
        entry_point: tiny_net              # a builder in the `dlscale.models` entry point group
        environment: my-models             # the venv it is installed in (a name under the
                                           # environments folder, or an absolute path)
        kwargs: {width: 32}                # plain values passed to the builder

Nothing here is code: a class name is looked up among transformers' exports (never imported by
a dotted path from YAML), values are plain data, remote code is refused wherever it is asked
for. The facts of a model (its family, input shape, parameters, blocks) are measured in its
environment (dlscale.models.torch.zoo, run by dlscale.study.study_models) and registered here,
so every part of dlscale that reads a spec or a plan (get_spec, spec_for, plan_for) reads them.

Pure Python: no framework is imported.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from dlscale.models import DECODER, SPECS, STUDY_SPECS, ModelSpec
from dlscale.registry.model_sources import ENTRY_POINT, SOURCES, TRANSFORMERS
from dlscale.registry.strategies import ParallelPlan

# A study model's name: path-safe (no slash, colon, dot or space), not a shipped model's.
NAME_PATTERN = r"^[a-z][a-z0-9_]{0,39}$"
# transformers' configuration classes by name (LlamaConfig, GPT2Config, ViTConfig, ...)
CONFIG_CLASS_PATTERN = r"^[A-Z][A-Za-z0-9]{0,63}Config$"
# an entry point's name and an environment's name
ENTRY_POINT_PATTERN = r"^[A-Za-z][A-Za-z0-9_-]{0,63}$"
ENVIRONMENT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
# what a definition may hold, besides its source
DEFINITION_KEYS = {
    TRANSFORMERS: ("transformers", "seq_len", "input_shape"),
    ENTRY_POINT: ("entry_point", "environment", "kwargs"),
}
TRANSFORMERS_KEYS = ("config_class", "config", "config_file", "task")
# the tasks a transformers model is built for: AutoModelFor<...>.from_config
TASKS = {
    "causal_lm": "AutoModelForCausalLM: next-token logits over the vocabulary (family decoder)",
    "image_classification": "AutoModelForImageClassification: one label per image (family vision)",
}
# keys that ask for code or files from elsewhere, refused wherever they appear in a
# configuration (a config.json's or the kwargs')
REMOTE_KEYS = (
    "auto_map",
    "trust_remote_code",
    "custom_pipelines",
    "_name_or_path",
    "name_or_path",
    "pretrained_model_name_or_path",
    "revision",
    "code_revision",
    "quantization_config",
)
# attention implementations built into torch (transformers also takes a kernel from the hub by
# a repository name: never)
ATTENTION_IMPLEMENTATIONS = ("eager", "sdpa")
MAX_CONFIG_FILE_BYTES = 1_000_000
MAX_STRING = 256
MAX_ITEMS = 500
MAX_DEPTH = 5
DEFAULT_SEQ_LEN = 128  # a decoder's tokens per sample where neither it nor the study says
MAX_SEQ_LEN = 1 << 20


def _plain_problems(value, where: str, depth: int = 0, count: list | None = None) -> list[str]:
    """Plain data only (str, int, float, bool, null, lists and mappings of them, bounded):
    never an object YAML could construct."""
    count = count if count is not None else [0]
    count[0] += 1
    if count[0] > MAX_ITEMS:
        return [f"{where}: more than {MAX_ITEMS} values; a model's settings are a few dozen"]
    if depth > MAX_DEPTH:
        return [f"{where}: nested deeper than {MAX_DEPTH} levels"]
    if value is None or isinstance(value, bool | int):
        return []
    if isinstance(value, float):
        return [] if math.isfinite(value) else [f"{where}: {value!r} is not a finite number"]
    if isinstance(value, str):
        return [] if len(value) <= MAX_STRING else [f"{where}: a string over {MAX_STRING} chars"]
    if isinstance(value, list):
        out = []
        for i, v in enumerate(value):
            out += _plain_problems(v, f"{where}[{i}]", depth + 1, count)
        return out
    if isinstance(value, dict):
        out = []
        for k, v in value.items():
            if not isinstance(k, str):
                out.append(f"{where}: key {k!r} is not a string")
                continue
            if k in REMOTE_KEYS:
                out.append(
                    f"{where}.{k}: refused: dlscale builds a model from its configuration "
                    "alone, with random weights; nothing is downloaded and no remote code runs "
                    f"(refused keys: {', '.join(REMOTE_KEYS)})"
                )
                continue
            if k == "attn_implementation" and v not in (None, *ATTENTION_IMPLEMENTATIONS):
                out.append(
                    f"{where}.{k}: {v!r}; allowed values: "
                    f"{', '.join(ATTENTION_IMPLEMENTATIONS)} (a kernel from the hub is never "
                    "fetched)"
                )
                continue
            out += _plain_problems(v, f"{where}.{k}", depth + 1, count)
        return out
    return [f"{where}: {type(value).__name__} is not plain data (a string, number, list, mapping)"]


def name_problem(name) -> str | None:
    """Why `name` cannot name a study model, or None."""
    if not isinstance(name, str) or not re.fullmatch(NAME_PATTERN, name):
        return (
            f"models.{name}: the name must be path-safe (it names the cells' folders and "
            f"wildcards): lower-case letters, digits and _, starting with a letter, at most 40 "
            f"characters ({NAME_PATTERN}); no path, colon or dot"
        )
    if name in SPECS:
        return (
            f"models.{name}: {name!r} is a shipped model's name; name the study's model "
            f"otherwise (shipped: {', '.join(SPECS)})"
        )
    return None


def source_of(definition: dict) -> str | None:
    """The definition's source (SOURCES), or None where it names none or both."""
    found = [s for s in SOURCES if s in definition]
    return found[0] if len(found) == 1 else None


def inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
    except ValueError:
        return False
    return True


def read_config_file(where: str, value, workflow_dir: Path) -> tuple[dict | None, list[str]]:
    """A transformers config.json named relatively inside the checkout: read as JSON, bounded,
    checked for remote code. Returns (its content, problems)."""
    if not isinstance(value, str) or not value.strip():
        return None, [f"{where}: must name a config.json, relative to the checkout"]
    path = Path(value)
    if path.is_absolute() or ".." in path.parts:
        return None, [
            f"{where}: {value!r}: a config.json is named relative to the checkout and inside it "
            "(no absolute path, no ..); copy the file into the checkout"
        ]
    full = workflow_dir / path
    if not inside(full, workflow_dir):
        return None, [f"{where}: {value!r} leads outside the checkout (a link); copy the file in"]
    if not full.is_file():
        return None, [f"{where}: {value!r} is not a file (relative to the checkout)"]
    if full.stat().st_size > MAX_CONFIG_FILE_BYTES:
        return None, [f"{where}: {value!r} is over {MAX_CONFIG_FILE_BYTES} bytes"]
    try:
        content = json.loads(full.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        return None, [f"{where}: {value!r} is not JSON: {exc}"]
    if not isinstance(content, dict):
        return None, [f"{where}: {value!r} must hold a JSON object"]
    problems = _plain_problems(content, f"{where} ({value})")
    model_type = content.get("model_type")
    if not isinstance(model_type, str) or not re.fullmatch(r"[a-z0-9_-]{1,64}", model_type):
        problems.append(
            f"{where}: {value!r} names no model_type (a transformers config.json has one, e.g. "
            "llama, gpt2, vit)"
        )
    return content, problems


def definition_problems(models, workflow_dir: str | Path) -> list[str]:
    """Everything wrong with a study's `models:` section that can be seen without running
    anything: names, sources, keys, plain values, remote code, files outside the checkout."""
    if models is None:
        return []
    if not isinstance(models, dict):
        return [f"models: a mapping of names to definitions, not {type(models).__name__}"]
    workflow_dir = Path(workflow_dir)
    problems = []
    for name, definition in models.items():
        bad = name_problem(name)
        if bad:
            problems.append(bad)
            continue
        where = f"models.{name}"
        if not isinstance(definition, dict):
            problems.append(f"{where}: a mapping with one source: {', '.join(SOURCES)}")
            continue
        source = source_of(definition)
        if source is None:
            both = all(s in definition for s in SOURCES)
            problems.append(
                f"{where}: names {'two sources' if both else 'no source'}"
                f"; allowed: exactly one of {', '.join(SOURCES)} ("
                + "; ".join(f"{k}: {v}" for k, v in SOURCES.items())
                + ")"
            )
            continue
        unknown = [k for k in definition if k not in DEFINITION_KEYS[source]]
        if unknown:
            problems.append(
                f"{where}: unknown key(s) {', '.join(map(str, unknown))} for source {source}; "
                f"allowed: {', '.join(DEFINITION_KEYS[source])}"
            )
        if source == TRANSFORMERS:
            problems += _transformers_problems(where, definition, workflow_dir)
        else:
            problems += _entry_point_problems(where, definition)
    return problems


def _transformers_problems(where: str, definition: dict, workflow_dir: Path) -> list[str]:
    problems = []
    spec = definition["transformers"]
    where = f"{where}.transformers"
    if not isinstance(spec, dict):
        return [f"{where}: a mapping with config_class and config, or config_file"]
    unknown = [k for k in spec if k not in TRANSFORMERS_KEYS]
    if unknown:
        problems.append(
            f"{where}: unknown key(s) {', '.join(map(str, unknown))}; allowed: "
            f"{', '.join(TRANSFORMERS_KEYS)}"
        )
    has_class, has_file = "config_class" in spec, "config_file" in spec
    if has_class == has_file:
        problems.append(
            f"{where}: name either config_class (with config: its keyword arguments) or "
            "config_file (a config.json inside the checkout), not "
            + ("both" if has_class else "neither")
        )
    if has_class:
        cls = spec["config_class"]
        if not isinstance(cls, str) or not re.fullmatch(CONFIG_CLASS_PATTERN, cls):
            problems.append(
                f"{where}.config_class: {cls!r} is not a transformers configuration class's "
                f"name ({CONFIG_CLASS_PATTERN}, e.g. LlamaConfig, GPT2Config, ViTConfig); a "
                "dotted path or code is never imported"
            )
        config = spec.get("config", {})
        if not isinstance(config, dict):
            problems.append(f"{where}.config: the configuration's keyword arguments, a mapping")
        else:
            problems += _plain_problems(config, f"{where}.config")
    elif "config" in spec:
        problems.append(f"{where}.config: only with config_class (config_file is whole)")
    if has_file and not has_class:
        _, found = read_config_file(f"{where}.config_file", spec["config_file"], workflow_dir)
        problems += found
    task = spec.get("task")
    if task is not None and task not in TASKS:
        problems.append(f"{where}.task: {task!r}; allowed values: {', '.join(TASKS)}")
    seq_len = definition.get("seq_len")
    if seq_len is not None and (
        not isinstance(seq_len, int) or isinstance(seq_len, bool) or not 1 <= seq_len <= MAX_SEQ_LEN
    ):
        problems.append(
            f"{where.rpartition('.')[0]}.seq_len: {seq_len!r}; an integer 1..{MAX_SEQ_LEN}"
        )
    shape = definition.get("input_shape")
    if shape is not None and not (
        isinstance(shape, list)
        and len(shape) == 3
        and all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 4096 for v in shape)
    ):
        problems.append(
            f"{where.rpartition('.')[0]}.input_shape: {shape!r}; an image's [channels, height, "
            "width], integers 1..4096"
        )
    return problems


def _entry_point_problems(where: str, definition: dict) -> list[str]:
    problems = []
    name = definition["entry_point"]
    if not isinstance(name, str) or not re.fullmatch(ENTRY_POINT_PATTERN, name):
        problems.append(
            f"{where}.entry_point: {name!r} is not an entry point's name "
            f"({ENTRY_POINT_PATTERN}): the name a package registers in the `dlscale.models` "
            "group, never a module path or code"
        )
    env = definition.get("environment")
    if env is not None:
        if not isinstance(env, str) or not (
            re.fullmatch(ENVIRONMENT_PATTERN, env) or (Path(env).is_absolute() and ".." not in env)
        ):
            problems.append(
                f"{where}.environment: {env!r}; allowed: an environment's name under the "
                f"environments folder ({ENVIRONMENT_PATTERN}: .venvs/<name> or "
                "$DLSCALE_ENVS_DIR/<name>) or an absolute path to a venv (no relative path)"
            )
    kwargs = definition.get("kwargs", {})
    if not isinstance(kwargs, dict):
        problems.append(f"{where}.kwargs: the builder's keyword arguments, a mapping")
    else:
        problems += _plain_problems(kwargs, f"{where}.kwargs")
    return problems


def indivisible(facts: dict, degree: int) -> list[str]:
    """What a tensor-parallel degree does not divide of a transformers model's shapes (its own
    plan splits the attention heads, the key/value heads, the vocabulary and the MLP's width),
    as "name value" texts; empty where it divides them all."""
    out = []
    for key in ("heads", "kv_heads", "vocab_size", "intermediate_size"):
        value = facts.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value % degree:
            out.append(f"{key} {value}")
    return out


def plan_of(facts: dict) -> ParallelPlan:
    """A study model's plan: its blocks (fully_shard's units, checkpointing's blocks) as the
    measured module names' patterns; no dlscale tensor-parallel plan (a transformers model's
    own plan splits it) and no pipeline."""
    return ParallelPlan(fsdp_units=tuple(facts.get("fsdp_units") or ()))


def arch_of(name: str) -> str:
    """A study model's architecture name: zoo.<name> (built by dlscale.models.<framework>.zoo;
    its plan in dlscale.models.parallelize.STUDY_PLANS)."""
    return f"zoo.{name}"


def spec_of(name: str, record: dict) -> ModelSpec:
    """The ModelSpec of a study model from its record (Cell.model_source's content: source,
    definition and the facts measured in its environment)."""
    facts = record["facts"]
    family = facts["family"]
    description = (
        f"{record['title']} ({facts['param_count']:,} parameters, "
        + (
            f"seq_len {facts['input_shape'][0]}, vocab {facts['vocab_size']}"
            if family == DECODER
            else f"input {'x'.join(map(str, facts['input_shape']))}, {facts['num_classes']} classes"
        )
        + ")"
    )
    return ModelSpec(
        name=name,
        family=family,
        input_shape=tuple(facts["input_shape"]),
        input_dtype=facts["input_dtype"],
        num_classes=facts["num_classes"],
        vocab_size=facts.get("vocab_size"),
        description=description,
        param_count=facts["param_count"],
        arch=arch_of(name),
        arch_kwargs={"record": record},
        frameworks=("pytorch",),
        frameworks_why="a model from the study's `models:` section is a PyTorch module, "
        "trained by the pytorch adapter",
    )


def register(name: str, record: dict | str) -> ModelSpec:
    """Register a study model in this process (its spec beside the shipped ones, its plan),
    from its record or the record's JSON (a Cell's model_source). Returns its spec."""
    from dlscale.models.parallelize import STUDY_PLANS

    if isinstance(record, str):
        record = json.loads(record)
    spec = spec_of(name, record)
    STUDY_SPECS[name] = spec
    STUDY_PLANS[spec.arch] = plan_of(record["facts"])
    return spec


def unregister_all() -> None:
    """Forget every study model of this process (a new study is loaded)."""
    from dlscale.models.parallelize import STUDY_PLANS

    for name in list(STUDY_SPECS):
        STUDY_PLANS.pop(arch_of(name), None)
    STUDY_SPECS.clear()


def record_of_cell(model: str, model_source: str | None) -> dict | None:
    """A cell's study-model record (its model_source), registering the model in this process
    where it is not yet: what a rank, collect or an analysis reading a cell's JSON calls."""
    if not model_source:
        return None
    record = json.loads(model_source)
    if model not in STUDY_SPECS:
        register(model, record)
    return record
