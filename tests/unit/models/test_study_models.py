"""A study's own models (config `models:`, dlscale.models.zoo, dlscale.study.study_models) before
anything runs: hostile definitions refused when the study is parsed, naming the key, with no
subprocess started (the probe and subprocess are replaced by ones that fail the test); the
combinations their cells cannot run refused with the reason (a model's facts given as its
environment would report them); names only path-safe ones in cell paths; a study without
`models:` hashes as before."""

from __future__ import annotations

import copy
import json
import subprocess

import pytest
import yaml

from dlscale.models import zoo
from dlscale.study import study_models
from dlscale.study.config import ConfigError
from dlscale.study.matrix import load_study

from helpers.checkout import ROOT

TINY = yaml.safe_load((ROOT / "tests" / "fixtures" / "tiny.yaml").read_text())
LLAMA = {
    "transformers": {
        "config_class": "LlamaConfig",
        "config": {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4},
    },
    "seq_len": 16,
}


def study(models: dict, axes_models: list[str], **changes) -> dict:
    config = copy.deepcopy(TINY)
    config.update(study="own_models", workloads=["throughput"], models=models, **changes)
    config["axes"]["model"] = axes_models
    return config


@pytest.fixture
def nothing_runs(monkeypatch):
    """Any probe or subprocess fails the test: a refusal must come before them."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"something was run: {args[:1]}")

    monkeypatch.setattr(study_models, "probe", refuse)
    monkeypatch.setattr(subprocess, "run", refuse)
    monkeypatch.setattr(subprocess, "Popen", refuse)


def refusal(config) -> str:
    with pytest.raises(ConfigError) as info:
        load_study(config, ROOT)
    return str(info.value)


def transformers(**spec) -> dict:
    return {"transformers": spec}


# (case, models, axes.model, what the message names)
HOSTILE = [
    ("colon in the name", {"llama:2": LLAMA}, ["cnn_small"], "models.llama:2: the name must be"),
    ("path in the name", {"../x": LLAMA}, ["cnn_small"], "no path, colon or dot"),
    ("a shipped name", {"cnn_small": LLAMA}, ["cnn_small"], "is a shipped model's name"),
    (
        "trust_remote_code in the kwargs",
        {"m": transformers(config_class="LlamaConfig", config={"trust_remote_code": True})},
        ["m"],
        "models.m.transformers.config.trust_remote_code: refused",
    ),
    (
        "auto_map in the kwargs",
        {"m": transformers(config_class="LlamaConfig", config={"auto_map": {"AutoModel": "x.Y"}})},
        ["m"],
        "config.auto_map: refused",
    ),
    (
        "a config.json outside the checkout, relative",
        {"m": transformers(config_file="../../etc/config.json")},
        ["m"],
        "relative to the checkout and inside it",
    ),
    (
        "a config.json by absolute path",
        {"m": transformers(config_file="/tmp/config.json")},
        ["m"],
        "no absolute path",
    ),
    (
        "a dotted class path",
        {"m": transformers(config_class="transformers.models.llama.LlamaConfig")},
        ["m"],
        "is not a transformers configuration class's name",
    ),
    (
        "code as the class",
        {"m": transformers(config_class="__import__('os').system('touch x')")},
        ["m"],
        "a dotted path or code is never imported",
    ),
    (
        "a module path as the entry point",
        {"m": {"entry_point": "os:system"}},
        ["m"],
        "models.m.entry_point: 'os:system' is not an entry point's name",
    ),
    (
        "a relative environment",
        {"m": {"entry_point": "net", "environment": "../venv"}},
        ["m"],
        "models.m.environment: '../venv'",
    ),
    (
        "an attention kernel from the hub",
        {"m": transformers(config_class="LlamaConfig", config={"attn_implementation": "org/x"})},
        ["m"],
        "attn_implementation: 'org/x'",
    ),
    ("two sources", {"m": {**LLAMA, "entry_point": "net"}}, ["m"], "names two sources"),
    ("no source", {"m": {"seq_len": 8}}, ["m"], "names no source"),
    (
        "an unknown key",
        {"m": {**LLAMA, "pretrained": "meta-llama/Llama-3"}},
        ["m"],
        "unknown key(s) pretrained",
    ),
    (
        "a revision to download",
        {"m": transformers(config_class="LlamaConfig", config={"revision": "main"})},
        ["m"],
        "config.revision: refused",
    ),
    ("a negative seq_len", {"m": {**LLAMA, "seq_len": -1}}, ["m"], "models.m.seq_len: -1"),
    (
        "an undefined model in the axes",
        {"m": LLAMA},
        ["m", "not_defined"],
        "'not_defined'",
    ),
]


@pytest.mark.parametrize(
    ("models", "axes", "named"), [c[1:] for c in HOSTILE], ids=[c[0] for c in HOSTILE]
)
def test_hostile_definitions_are_refused_before_anything_runs(nothing_runs, models, axes, named):
    assert named in refusal(study(models, axes))


def test_a_config_json_with_remote_code_is_refused(nothing_runs, tmp_path):
    """A config.json inside the checkout that names auto_map (remote code) is refused as read."""
    path = ROOT / ".cache" / "test-remote-config.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({"model_type": "llama", "auto_map": {"AutoModel": "evil.Model"}}))
    try:
        message = refusal(
            study({"m": transformers(config_file=str(path.relative_to(ROOT)))}, ["m"])
        )
    finally:
        path.unlink()
    assert "auto_map: refused" in message


FACTS = {
    "family": "decoder",
    "input_shape": [16],
    "input_dtype": "int64",
    "num_classes": 256,
    "vocab_size": 256,
    "param_count": 1000,
    "library_param_count": 1000,
    "fsdp_units": ["hf.model.layers.*"],
    "heads": 4,
    "kv_heads": 2,
    "intermediate_size": 96,
    "tp_plan": {"layers.*.self_attn.q_proj": "colwise"},
    "title": "transformers LlamaConfig (LlamaForCausalLM)",
    "python": "3.11",
    "torch": "2.13.0",
}


@pytest.fixture
def probed(monkeypatch, tmp_path):
    """The probe answers with FACTS (an entry point's: no plan of its own), as the model's
    environment would; the environments' interpreters exist."""

    def probe(name, record, python, workflow_dir, seq_len):
        facts = dict(FACTS)
        if record["source"] == "entry_point":
            facts.update(tp_plan={}, distribution="pkg", version="1.0", title="entry point net")
        return facts, None, 0.0, True

    monkeypatch.setattr(study_models, "probe", probe)
    monkeypatch.setattr(study_models, "environment_python", lambda name, wd: ROOT / "README.md")
    yield
    zoo.unregister_all()


def test_strategies_a_study_model_cannot_run_are_refused(probed):
    config = study({"m": LLAMA, "e": {"entry_point": "net"}}, ["m", "e"], tp_degree=3)
    config["axes"].update(parallelism=["ddp", "pp", "tp"], framework=["pytorch", "tensorflow"])
    config["ranks_per_node"] = 3
    message = refusal(config)
    assert "'pp' cannot run model 'm': a pipeline cuts a model into stages" in message
    assert "framework 'tensorflow' does not train it; allowed frameworks: pytorch" in message
    assert "'tp' splits model 'e' by its own tensor-parallel plan" in message
    assert "an entry point's model has none" in message
    assert "does not divide its heads 4, kv_heads 2, vocab_size 256;" in message


def test_a_study_model_gets_its_cells_record_and_environment(probed):
    """Its cells: the name in the path, the record (source, definition, facts) in model_source,
    the transformers environment; a shipped cell of the same study keeps its identity."""
    config = study({"llama_2l": LLAMA}, ["llama_2l", "cnn_small"])
    cells = load_study(config, ROOT).cells
    own = [c for c in cells if c.model == "llama_2l"]
    assert (
        own[0].path
        == "results/own_models/runs/cpu/pytorch/llama_2l/weak/fp32/eager/n1/r1/metrics.jsonl"
    )
    record = json.loads(own[0].model_source)
    assert record["source"] == "transformers" and record["facts"]["param_count"] == 1000
    assert own[0].environment.startswith("pytorch-hf:") and own[0].seq_len == 16
    plain = load_study(study({}, ["cnn_small"]), ROOT).cells
    shipped = [c for c in cells if c.model == "cnn_small"]
    assert [c.config_hash for c in shipped] == [c.config_hash for c in plain]
    assert all(c.model_source is None for c in shipped)


def test_a_study_without_models_hashes_as_before(nothing_runs):
    config = copy.deepcopy(TINY)
    with_key = {**copy.deepcopy(TINY), "models": {}}
    assert load_study(config, ROOT).config_hash == load_study(with_key, ROOT).config_hash
