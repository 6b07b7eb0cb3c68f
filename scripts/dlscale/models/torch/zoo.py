"""A study's own models as PyTorch modules (dlscale.models.zoo; docs/pages/your-model.md), run in
the model's environment: built from a transformers configuration (random weights, nothing
downloaded, no remote code) or by a package's `dlscale.models` entry point, wrapped so that
`model(inputs)` returns the logits dlscale's loss takes (a decoder's flattened to one row per
position), and measured (`facts`: family, input shape, parameters, blocks).

`facts` is the parse-time check of a study's model, which `python -m dlscale.models.zoo_probe
probe` runs in a bounded subprocess of the model's environment (dlscale.study.study_models).

An entry point's builder takes the study's `kwargs` and returns a mapping: `model` (a
torch.nn.Module whose forward takes the input batch and returns logits), `family` ("vision",
"sequence" or "decoder"), `input_shape` (per sample: [channels, height, width], or [seq_len]),
`num_classes` (a decoder's: its vocabulary) and, where they apply, `vocab_size`, `input_dtype`
("float32" or "int64") and `no_split_modules` (the class names of its repeated blocks; default:
its largest repeated module class).
"""

from __future__ import annotations

import os

# nothing from the hub, ever: set before transformers is imported (it reads them at import)
for _variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ[_variable] = "1"
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import collections  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402

from dlscale.models import DECODER, ModelSpec  # noqa: E402
from dlscale.models.entry_points import find_entry_point, load_builder  # noqa: E402
from dlscale.registry.model_sources import TRANSFORMERS  # noqa: E402

FAMILIES = ("vision", "sequence", DECODER)
DEFAULT_IMAGE_SIZE = 224


class TransformersModel(nn.Module):
    """A transformers model (`hf`) as dlscale trains it: token ids in, one row of vocabulary
    logits per position out (a causal LM), or images in, one row of class logits per image."""

    def __init__(self, hf: nn.Module, family: str):
        super().__init__()
        self.hf = hf
        self.family = family

    def forward(self, x):
        if self.family == DECODER:
            logits = self.hf(input_ids=x, use_cache=False).logits
            return logits.reshape(-1, logits.shape[-1])
        return self.hf(pixel_values=x).logits


class EntryPointModel(nn.Module):
    """A package's model (`net`): its logits, a decoder's flattened to one row per position."""

    def __init__(self, net: nn.Module, family: str):
        super().__init__()
        self.net = net
        self.family = family

    def forward(self, x):
        out = self.net(x)
        out = getattr(out, "logits", out)
        if self.family == DECODER and out.dim() == 3:
            return out.reshape(-1, out.shape[-1])
        return out


def _transformers():
    try:
        import transformers
    except ImportError as exc:
        raise RuntimeError(
            f"transformers cannot be imported in this environment ({sys.prefix}): {exc}; "
            "models from the transformers library run in pytorch-hf (bash scripts/setup.sh "
            "pytorch-hf)"
        ) from exc
    _meta_is_tracing()
    return transformers


def _meta_is_tracing() -> None:
    """transformers' mask code reads values of tensors (`.all()` on the position ids) unless it
    is tracing, and a meta tensor has no values: a meta tensor counts as traced there, so the
    forward on the meta device (the FLOP count, the memory estimate, the probe) runs. Real
    tensors are checked as before."""
    import transformers.masking_utils as masking

    original = masking.is_tracing
    if getattr(original, "dlscale_meta", False):
        return

    def is_tracing(tensor=None) -> bool:
        return original(tensor) or (isinstance(tensor, torch.Tensor) and tensor.is_meta)

    is_tracing.dlscale_meta = True
    masking.is_tracing = is_tracing


def config_of(definition: dict):
    """The transformers configuration of a definition's `transformers` part (config_class with
    config, or config_file's content inlined as `config_json`): a class transformers exports,
    never remote code."""
    transformers = _transformers()
    base = getattr(transformers, "PreTrainedConfig", None) or transformers.PretrainedConfig
    if "config_class" in definition:
        name = definition["config_class"]
        cls = getattr(transformers, name, None)
        if not (isinstance(cls, type) and issubclass(cls, base)):
            known = sorted(n for n in dir(transformers) if n.endswith("Config") and n[0].isupper())
            close = [n for n in known if n.lower().startswith(name.lower()[:4])][:8]
            raise ValueError(
                f"config_class {name!r} is not a configuration class of transformers "
                f"{transformers.__version__}" + (f"; close: {', '.join(close)}" if close else "")
            )
        config = cls(**definition.get("config", {}))
    else:
        content = dict(definition["config_json"])
        model_type = content.get("model_type")
        mapping = transformers.CONFIG_MAPPING
        if model_type not in mapping:
            raise ValueError(
                f"config.json's model_type {model_type!r} is not one transformers "
                f"{transformers.__version__} knows (remote code is never run)"
            )
        config = mapping[model_type].from_dict(content)
    if getattr(config, "auto_map", None):
        raise ValueError("the configuration names auto_map (remote code): refused")
    return config


def task_of(config, task: str | None) -> str:
    """The task a transformers configuration is built for: the definition's, else the one its
    class has an AutoModel for (causal_lm first)."""
    transformers = _transformers()
    mappings = {
        "causal_lm": transformers.MODEL_FOR_CAUSAL_LM_MAPPING,
        "image_classification": transformers.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING,
    }
    able = [t for t, m in mappings.items() if type(config) in m]
    if task is None:
        if not able:
            raise ValueError(
                f"{type(config).__name__} has no model for a task dlscale trains; allowed: a "
                "configuration with a causal LM (LlamaConfig, MistralConfig, GPT2Config, ...) or "
                "an image classifier (ViTConfig, ResNetConfig, ConvNextConfig, ...)"
            )
        return able[0]
    if task not in able:
        raise ValueError(
            f"task {task!r}: {type(config).__name__} has no such model; its tasks: "
            f"{', '.join(able) or 'none'}"
        )
    return task


def build_transformers(record: dict) -> tuple[TransformersModel, dict]:
    """The wrapped model of a transformers record and what its builder knows (the library's
    own parameter count, its configuration)."""
    transformers = _transformers()
    definition = record["definition"]["transformers"]
    config = config_of(definition)
    task = task_of(config, definition.get("task"))
    auto = {
        "causal_lm": transformers.AutoModelForCausalLM,
        "image_classification": transformers.AutoModelForImageClassification,
    }[task]
    hf = auto.from_config(config, trust_remote_code=False)
    family = DECODER if task == "causal_lm" else "vision"
    return TransformersModel(hf, family), {"config": config, "task": task, "library": transformers}


def build_entry_point(record: dict) -> tuple[EntryPointModel, dict]:
    definition = record["definition"]
    ep = find_entry_point(definition["entry_point"])
    dist = ep.dist
    wanted = record.get("distribution")
    if wanted and dist is not None and (dist.name, dist.version) != (wanted, record["version"]):
        raise RuntimeError(
            f"entry point {ep.name!r}: the study was checked with {wanted} {record['version']}, "
            f"and {dist.name} {dist.version} is installed now: run the study again (its cells "
            "are re-measured under the new version)"
        )
    built = load_builder(ep)(**definition.get("kwargs", {}))
    if isinstance(built, nn.Module):
        raise TypeError(
            f"entry point {ep.name!r} returned a bare module; a builder returns a mapping with "
            "model, family, input_shape and num_classes (docs/pages/your-model.md)"
        )
    if not isinstance(built, dict) or not isinstance(built.get("model"), nn.Module):
        raise TypeError(f"entry point {ep.name!r} returned no mapping with a `model` module")
    family = built.get("family")
    if family not in FAMILIES:
        raise ValueError(
            f"entry point {ep.name!r}: family {family!r}; allowed: {', '.join(FAMILIES)}"
        )
    return EntryPointModel(built["model"], family), {"built": built, "dist": dist, "ep": ep}


def build(record: dict) -> nn.Module:
    """The wrapped model of a study model's record (under the current default device: the meta
    device for the FLOP count and the memory estimate)."""
    if record["source"] == TRANSFORMERS:
        return build_transformers(record)[0]
    return build_entry_point(record)[0]


def from_spec(spec: ModelSpec, record: dict) -> nn.Module:
    """dlscale.models.find_builder's builder of a study model (spec.arch zoo.<name>)."""
    return build(record)


# ---- facts (the parse-time probe)


def _pattern(name: str) -> str:
    """A module name with its list indices as `*` (one pattern for a block's every copy)."""
    return ".".join("*" if part.isdigit() else part for part in name.split("."))


def block_patterns(model: nn.Module, classes: list[str] | None) -> tuple[list[str], str]:
    """The module-name patterns of a model's repeated blocks, outermost only (fully_shard
    wraps each one, then the root): the modules of `classes` (a transformers model's
    _no_split_modules), else of its largest repeated module class (the most parameters over
    its copies, among classes with two or more copies that hold submodules). Returns the
    patterns and how they were found."""
    modules = [(n, m) for n, m in model.named_modules() if n]
    how = "_no_split_modules"
    chosen = set(classes or ())
    if not any(type(m).__name__ in chosen for _, m in modules):
        by_class: dict[str, list] = collections.defaultdict(list)
        for n, m in modules:
            if any(True for _ in m.children()):
                by_class[type(m).__name__].append(m)
        sizes = {
            c: sum(p.numel() for m in ms for p in m.parameters())
            for c, ms in by_class.items()
            if len(ms) >= 2
        }
        if not sizes:
            return [], "no repeated module class: its top-level children"
        best = max(sorted(sizes), key=lambda c: sizes[c])
        chosen, how = {best}, f"its largest repeated module class ({best})"
    names = [n for n, m in modules if type(m).__name__ in chosen]
    outer = [n for n in names if not any(n.startswith(o + ".") for o in names)]
    return sorted(dict.fromkeys(_pattern(n) for n in outer)), how


def _positions(config) -> int | None:
    for key in ("max_position_embeddings", "n_positions"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def facts(request: dict) -> dict:
    """Build the request's model on the meta device and measure what the study needs: its
    family, input shape and dtype, classes and vocabulary, parameters (dlscale's count and the
    library's own), its blocks, whether its own tensor-parallel plan exists, its attention heads,
    and where it came from (library, package and versions)."""
    from dlscale.models import zoo

    record = request["record"]
    out: dict = {"python": sys.version.split()[0], "torch": torch.__version__}
    with torch.device("meta"):
        if record["source"] == TRANSFORMERS:
            model, info = build_transformers(record)
            config, lib = info["config"], info["library"]
            hf = model.hf
            out.update(
                library="transformers",
                library_version=lib.__version__,
                title=f"transformers {type(config).__name__} ({type(hf).__name__})",
                library_param_count=hf.num_parameters(),
                heads=getattr(config, "num_attention_heads", None),
                kv_heads=getattr(config, "num_key_value_heads", None),
                tp_plan=dict(getattr(config, "base_model_tp_plan", None) or {}),
                task=info["task"],
                num_layers=getattr(config, "num_hidden_layers", None),
            )
            family = model.family
            if family == DECODER:
                positions = _positions(config)
                seq_len = record["definition"].get("seq_len") or request.get("seq_len")
                seq_len = seq_len or min(zoo.DEFAULT_SEQ_LEN, positions or zoo.DEFAULT_SEQ_LEN)
                if positions is not None and seq_len > positions:
                    raise ValueError(
                        f"seq_len {seq_len} is over the {positions} positions the configuration "
                        "has (max_position_embeddings / n_positions): set seq_len or the "
                        "configuration's positions"
                    )
                out.update(
                    input_shape=[seq_len],
                    input_dtype="int64",
                    vocab_size=config.vocab_size,
                    num_classes=config.vocab_size,
                    intermediate_size=getattr(config, "intermediate_size", None),
                )
            else:
                shape = record["definition"].get("input_shape")
                if shape is None:
                    size = getattr(config, "image_size", None) or DEFAULT_IMAGE_SIZE
                    size = size if isinstance(size, int) else int(size[0])
                    shape = [getattr(config, "num_channels", 3), size, size]
                out.update(
                    input_shape=list(shape),
                    input_dtype="float32",
                    vocab_size=None,
                    num_classes=config.num_labels,
                )
            classes = list(getattr(hf, "_no_split_modules", None) or [])
        else:
            model, info = build_entry_point(record)
            built, dist, ep = info["built"], info["dist"], info["ep"]
            family = model.family
            shape = built.get("input_shape")
            if not (
                isinstance(shape, list | tuple) and shape and all(isinstance(v, int) for v in shape)
            ):
                raise ValueError(f"entry point {ep.name!r}: input_shape {shape!r} is not a shape")
            vocab = built.get("vocab_size")
            if family != "vision" and not isinstance(vocab, int):
                raise ValueError(f"entry point {ep.name!r}: a {family} model states vocab_size")
            out.update(
                library="entry point",
                title=f"entry point {ep.name} ({dist.name} {dist.version})"
                if dist
                else f"entry point {ep.name}",
                distribution=dist.name if dist else None,
                version=dist.version if dist else None,
                input_shape=list(shape),
                input_dtype=built.get("input_dtype")
                or ("float32" if family == "vision" else "int64"),
                vocab_size=vocab,
                num_classes=built.get("num_classes") or vocab,
                heads=None,
                kv_heads=None,
                tp_plan={},
            )
            classes = list(built.get("no_split_modules") or [])
        params = sum(p.numel() for p in model.parameters())
        out["family"] = family
        out["param_count"] = params
        out["library_param_count"] = out.get("library_param_count", params)
        out["fsdp_units"], out["fsdp_units_from"] = block_patterns(model, classes)
        # one forward on the meta device: the inputs fit and the logits are one row per label
        spec_facts = {k: out[k] for k in ("input_shape", "input_dtype", "num_classes")}
        _check_forward(model, family, spec_facts, out.get("vocab_size"))
    return out


def _check_forward(model, family, spec_facts, vocab) -> None:
    from dlscale.models.torch import example_batch

    spec = ModelSpec(
        name="probe",
        family=family,
        input_shape=tuple(spec_facts["input_shape"]),
        input_dtype=spec_facts["input_dtype"],
        num_classes=spec_facts["num_classes"],
        vocab_size=vocab,
        description="",
        param_count=0,
        arch="zoo",
    )
    x, y = example_batch(spec, 2, device="meta")
    logits = model(x)
    if logits.dim() != 2 or logits.shape[0] != y.shape[0]:
        raise ValueError(
            f"the model's logits have shape {tuple(logits.shape)} for {tuple(x.shape)} inputs; "
            f"dlscale's loss takes one row per label ({y.shape[0]} rows, "
            f"{spec.num_classes} classes)"
        )


# ---- tensor parallel through the model's own plan


def tensor_parallel(model: nn.Module, tp_mesh) -> list[str]:
    """Split a transformers model over `tp_mesh` by its own plan, as its from_pretrained does
    with a tensor-parallel plan (transformers' maybe_distribute_model): the plan resolved from
    the model (`_resolve_parallel_plans` of DistributedConfig(tp_plan="auto"): its
    base_model_tp_plan, embedding and head included), then `apply_tensor_parallelism` with
    transformers' own styles, on the cell's mesh. Its weights agree on every rank by now, so
    each rank keeps its part of them (distribute_tensor without communication).
    (from_pretrained(folder, tp_plan="auto") itself builds a mesh over every rank of the job
    and ignores a mesh it is given: it could not compose with fully_shard over the cell's
    data-parallel dimensions, nor split a tensor-parallel group of a larger job.) Returns the
    plan's entries."""
    if not isinstance(model, TransformersModel):
        raise ValueError(
            "tensor parallel needs a transformers model's own plan; an entry point's model has none"
        )
    _transformers()
    from transformers.distributed import DistributedConfig
    from transformers.distributed.tensor_parallel import apply_tensor_parallelism

    hf = model.hf
    plan, _, _ = hf._resolve_parallel_plans(
        DistributedConfig(tp_plan="auto", tp_size=tp_mesh.size())
    )
    if not plan:
        raise ValueError(f"{type(hf).__name__} has no tensor-parallel plan (base_model_tp_plan)")
    model.hf = apply_tensor_parallelism(hf, tp_mesh, plan)
    return sorted(plan)
