"""Model FLOPs, tokens and MFU: the decoder's FLOP count against a hand
count and 6N, MFU from constructed numbers, the unknown-peak path, sparse peaks refused, the
peak in no hash, sequence length as a study parameter, and the tiny decoder trained by one real
rank through the launcher."""

from __future__ import annotations

import copy
from pathlib import Path

import pandas as pd
import pytest

from dlscale.analysis import mfu
from dlscale.models import DECODER, SPECS, get_spec, spec_for
from dlscale.models import flops as counting
from dlscale.study.config import ConfigError, load_schema, load_yaml
from dlscale.study.hardware import validate_hardware
from dlscale.study.hashes import hashed_hardware

ROOT = Path(__file__).resolve().parents[3]
DECODERS = [n for n, s in SPECS.items() if s.family == DECODER]


def hand_count_per_token(vocab, seq_len, d, layers, ffn) -> int:
    """FLOPs per token of one training step (forward + backward = 3 x forward) of the GPT-2
    decoder, by hand: every weight matrix does 2 FLOPs per weight and token forward (the four
    d x d attention projections and the two d x ffn FFN matrices per layer, and the head, tied
    to the vocab x d token embedding); attention does 2 S d for Q K^T and 2 S d for A V per
    token and layer forward. The position table, biases and LayerNorms do no matrix product."""
    matrices = vocab * d + layers * (4 * d * d + 2 * d * ffn)
    forward = 2 * matrices + layers * (2 * seq_len * d + 2 * seq_len * d)
    return 3 * forward


def test_tiny_decoder_flops_match_the_hand_count() -> None:
    spec = get_spec("gpt2_tiny")
    counted = counting.count_flops_per_sample("gpt2_tiny")
    per_token = hand_count_per_token(4096, 32, 64, 2, 256)
    assert per_token == 6 * (4096 * 64 + 2 * (4 * 64 * 64 + 2 * 64 * 256)) + 12 * 2 * 64 * 32
    assert counted["flops_per_sample"] == 32 * per_token == 70_778_880
    assert counted["seq_len"] == 32 and "FlopCounterMode" in counted["method"]
    assert counting.decoder_flops_per_token(spec)["counted"] == per_token


@pytest.mark.parametrize("name", DECODERS)
def test_decoder_flops_within_2_percent_of_6n_plus_attention(name: str) -> None:
    """The count (FlopCounterMode on the meta device, at the registry's sequence length: 8,192
    for the Llama 3 shapes) is within 2 % of 6 N + 12 L d S per token (6 N alone leaves out
    attention: 14 % of the count for the 1024-token GPT-2 models); the difference is exactly 6 x
    the parameters that do no matrix product (GPT-2: position table, biases, LayerNorms; Llama:
    the RMSNorm weights)."""
    spec = get_spec(name)
    seq_len = spec.input_shape[0]
    per_token = counting.count_flops_per_sample(name)["flops_per_sample"] / seq_len
    formula = counting.decoder_flops_per_token(spec)
    assert per_token == formula["counted"]
    assert abs(per_token / formula["six_n_plus_attention"] - 1) < 0.02
    a = spec.arch_kwargs
    d, layers = a["d_model"], a["num_layers"]
    if spec.arch == "llama":
        no_matmul = layers * 2 * d + d
    else:
        f = a["dim_feedforward"]
        no_matmul = seq_len * d + layers * (4 * d + f + d + 4 * d) + 2 * d
    assert formula["six_n_plus_attention"] - per_token == 6 * no_matmul
    if name == "gpt2_tiny":  # short sequences: 6 N alone is within 2 % as well
        assert abs(per_token / formula["six_n"] - 1) < 0.02


def test_llama3_8b_flops_per_token_as_torchtitan_counts_them() -> None:
    """Llama 3.1 8B at sequence 8,192: 57.9 GFLOP per token within 1 %, in
    torchtitan's convention (6 N, N the 8,030,261,248 parameters less the 525,336,576 of the
    input embedding, a lookup; + 12 L d S), and counted by FlopCounterMode over a forward and
    backward of the model built on the meta device (2 sequences of 8,192 tokens; no memory)."""
    spec = get_spec("llama3_8b")
    formula = counting.decoder_flops_per_token(spec)
    assert spec.param_count == 8_030_261_248
    assert formula["n"] == 8_030_261_248 - 128_256 * 4096 == 7_504_924_672
    assert formula["attention"] == 12 * 32 * 4096 * 8192
    assert formula["six_n_plus_attention"] == 57_914_449_920
    counted = counting.count_flops_per_sample("llama3_8b")
    assert counted["seq_len"] == 8192 and "meta device" in counted["method"]
    per_token = counted["flops_per_sample"] / 8192
    assert per_token == formula["counted"] == 57_912_852_480
    for value in (per_token, formula["six_n_plus_attention"]):
        assert abs(value / 57.9e9 - 1) < 0.01
    # Llama 3.2 1B ties its head to the embedding: the shared matrix is the head's, counted
    one_b = counting.decoder_flops_per_token(get_spec("llama3_1b"))
    assert one_b["n"] == get_spec("llama3_1b").param_count == 1_235_814_400


def test_llama_flops_follow_the_sequence_length() -> None:
    """The S-term on its own: the debug Llama counted at two sequence lengths differs per token
    by exactly 12 L d (S1 - S2); its parameters (RoPE is a buffer) do not change."""
    short, long = spec_for("llama3_debug", 32), spec_for("llama3_debug", 128)
    assert short.param_count == long.param_count == get_spec("llama3_debug").param_count
    per_token = {
        s.input_shape[0]: counting.count_flops_per_sample("llama3_debug", s.input_shape[0])[
            "flops_per_sample"
        ]
        / s.input_shape[0]
        for s in (short, long)
    }
    assert per_token[128] - per_token[32] == 12 * 2 * 64 * (128 - 32)
    assert per_token[128] == counting.decoder_flops_per_token(long)["counted"]


def test_sequence_length_is_a_parameter() -> None:
    spec = spec_for("gpt2_tiny", 16)
    assert spec.input_shape == (16,)
    assert spec.param_count == get_spec("gpt2_tiny").param_count - 16 * 64
    counted = counting.count_flops_per_sample("gpt2_tiny", 16)
    assert counted["flops_per_sample"] == 16 * hand_count_per_token(4096, 16, 64, 2, 256)
    with pytest.raises(ValueError, match="only decoder models do: gpt2_tiny"):
        spec_for("cnn_small", 16)


def test_mfu_from_constructed_numbers() -> None:
    # 1e9 FLOPs per sample x 2,000 samples/s over 4 devices = 0.5 TFLOP/s per device
    achieved = mfu.achieved_tflops_per_device(1e9, 2000.0, 4)
    assert achieved == pytest.approx(0.5)
    assert mfu.mfu(achieved, 2.0) == pytest.approx(0.25)
    assert mfu.mfu(achieved, None) is None and mfu.mfu(None, 2.0) is None
    peaks = {
        "h100": {"source": "whitepaper, dense", "fp32": 66.9, "bf16": 989.4},
        "cpu": None,
    }
    cells = pd.DataFrame(
        [
            # 100 TFLOP/s per device at bf16 on an H100: 10.1 % of 989.4
            {"hardware": "h100", "framework": "pytorch", "precision": "bf16",
             "peak_precision": "bf16", "achieved_tflops_per_device": 100.0},
            {"hardware": "h100", "framework": "pytorch", "precision": "fp16",
             "peak_precision": "fp16", "achieved_tflops_per_device": 100.0},
            {"hardware": "cpu", "framework": "pytorch", "precision": "fp32",
             "peak_precision": "fp32", "achieved_tflops_per_device": 0.01},
            {"hardware": "h100", "framework": "tensorflow", "precision": "bf16",
             "peak_precision": "bf16", "achieved_tflops_per_device": None},
        ]
    )  # fmt: skip
    out = mfu.add_mfu(cells, peaks)
    assert out["mfu"][0] == pytest.approx(100.0 / 989.4)
    assert out["peak_tflops"][0] == 989.4
    assert out["mfu_note"][0] == "peak_tflops.bf16 989.4: whitepaper, dense"
    # no fp16 figure in this entry, and no peak at all for the CPU: unknown peak
    for i, key in ((1, "fp16"), (2, "fp32")):
        assert pd.isna(out["mfu"][i])
        assert out["mfu_note"][i] == f"unknown peak (no peak_tflops.{key} in the hardware entry)"
    assert pd.isna(out["mfu"][3]) and out["mfu_note"][3].startswith("no FLOP count (tensorflow")


def test_cell_columns_tokens_flops_and_tf32() -> None:
    cell = {"model": "gpt2_tiny", "seq_len": 32, "per_rank_batch": 4, "global_batch": 8,
            "world_size": 2, "precision": "fp32", "device": "cuda"}  # fmt: skip
    summary = {"throughput_samples_per_s": 100.0}
    rank0 = {"model_flops": {"available": True, "flops_per_sample": 70_778_880},
             "fast_paths": {"tf32_matmul": False, "tf32_cudnn": True}}  # fmt: skip
    row = mfu.cell_columns(cell, summary, rank0)
    assert row["per_rank_batch_tokens"] == 128 and row["global_batch_tokens"] == 256
    assert row["throughput_tokens_per_s"] == 3200.0
    assert row["achieved_tflops_per_device"] == pytest.approx(70_778_880 * 100 / 2 / 1e12)
    assert row["peak_precision"] == "fp32"  # a decoder's matmuls ran fp32, not TF32
    vision = {**cell, "model": "cnn_small", "seq_len": None}
    vis = mfu.cell_columns(vision, summary, rank0)
    assert vis["peak_precision"] == "tf32"  # cuDNN convolutions on TF32 tensor cores
    assert vis["seq_len"] is None and vis["throughput_tokens_per_s"] is None
    assert mfu.cell_columns({**vision, "device": "cpu"}, summary, rank0)["peak_precision"] == (
        "fp32"
    )
    tf = mfu.cell_columns(cell, summary, {})  # a framework that counts no FLOPs
    assert tf["flops_per_sample"] is None and tf["achieved_tflops_per_device"] is None


def test_mfu_summary_known_and_unknown_peak() -> None:
    cells = pd.DataFrame(
        {
            "hardware": ["h100"] * 3, "framework": ["pytorch"] * 3, "model": ["gpt2_124m"] * 3,
            "policy": ["weak"] * 3, "precision": ["bf16"] * 3, "mode": ["eager"] * 3,
            "nodes": [1, 2, 2], "mfu": [0.5, 0.40, 0.42],
            "achieved_tflops_per_device": [494.7, 395.8, 415.5],
        }
    )  # fmt: skip
    text = mfu.mfu_summary(cells)
    assert text.startswith("MFU at the largest node count (2): 41 % of the dense peak")
    unknown = cells.assign(mfu=None)
    assert "unknown peak" in mfu.mfu_summary(unknown)
    assert "achieved 406 TFLOP/s per device" in mfu.mfu_summary(unknown)


def _hardware() -> dict:
    return load_yaml(ROOT / "config" / "hardware.yaml")


def test_shipped_peaks_are_dense_with_sources() -> None:
    schema = load_schema(ROOT / "config" / "schemas" / "hardware.schema.json")
    hw = validate_hardware(_hardware(), schema)
    assert hw["h100"]["peak_tflops"]["bf16"] == 989.4  # 1,978.9 is the sparse figure
    assert hw["a100"]["peak_tflops"]["bf16"] == 312  # 624 is the sparse figure
    assert "bf16" not in hw["v100"]["peak_tflops"]  # no BF16 on V100: unknown peak
    for key in ("v100", "a100", "h100"):
        assert "dense" in hw[key]["peak_tflops"]["source"]
    assert hw["cpu"]["peak_tflops"] is None  # the CPU: unknown peak


@pytest.mark.parametrize(
    "change, where",
    [
        ({"bf16_sparse": 1978.9}, "h100.peak_tflops.bf16_sparse"),
        ({"bf16": "1978.9 sparse"}, "h100.peak_tflops.bf16"),
        ({"source": "datasheet, with sparsity (sparse)"}, "h100.peak_tflops.source"),
    ],
)
def test_sparse_peaks_are_refused(change: dict, where: str) -> None:
    schema = load_schema(ROOT / "config" / "schemas" / "hardware.schema.json")
    hw = copy.deepcopy(_hardware())
    hw["h100"]["peak_tflops"].update(change)
    with pytest.raises(ConfigError) as excinfo:
        validate_hardware(hw, schema)
    message = str(excinfo.value)
    assert f"{where}: sparse peaks are refused" in message
    assert "allowed keys: fp32, tf32, bf16, fp16, fp8, source" in message


def test_peak_is_in_no_hash() -> None:
    hw = _hardware()
    without = {k: v for k, v in hw["h100"].items() if k != "peak_tflops"}
    assert hashed_hardware(hw["h100"]) == hashed_hardware(without)


def _study(**config):
    from dlscale.study.matrix import load_workflow_study

    axes = {"framework": ["pytorch"], "model": ["gpt2_tiny", "cnn_small"], "hardware": ["cpu"],
            "nodes": [1], "policy": ["weak"], "precision": ["fp32"], "mode": ["eager"]}  # fmt: skip
    return load_workflow_study(
        {"workloads": ["throughput"], "axes": {**axes, **config.pop("axes", {})}, **config}, ROOT
    )


def test_study_seq_len_reaches_decoder_cells_only() -> None:
    cells = {c.model: c for c in _study().cells}
    assert cells["gpt2_tiny"].seq_len == 32 and cells["cnn_small"].seq_len is None
    assert "seq_len" not in cells["cnn_small"].identity()  # every other cell keeps its hash
    cells = {c.model: c for c in _study(seq_len=16).cells}
    assert cells["gpt2_tiny"].seq_len == 16 and cells["cnn_small"].seq_len is None


def test_framework_without_a_decoder_builder_is_refused() -> None:
    with pytest.raises(ConfigError) as excinfo:
        _study(axes={"framework": ["pytorch", "mxnet"]})
    assert (
        "axes.model: framework 'mxnet' has no builder for model 'gpt2_tiny'; frameworks that "
        "build it: pytorch, horovod" in str(excinfo.value)
    )


def test_tiny_decoder_trains_through_the_launcher(tmp_path) -> None:
    """One real rank trains gpt2_tiny at seq_len 16 (1 warm-up + 2 timed steps); rank 0 records
    the FLOP count, and the cells table's columns follow from the metrics."""
    from dlscale.store.metrics import read_metrics

    from helpers.cells import cell_dict, launch_cell

    code, out = launch_cell(
        tmp_path, cell_dict(model="gpt2_tiny", nodes=1, global_batch=4, seq_len=16)
    )
    assert code == 0
    records = read_metrics(out, steps=False)
    start = next(r["value"] for r in records if r["event"] == "rank_start")
    assert start["input_shape"] == [16]
    assert start["param_count"] == spec_for("gpt2_tiny", 16).param_count
    assert start["model_flops"]["flops_per_sample"] == 16 * hand_count_per_token(
        4096, 16, 64, 2, 256
    )
    summary = records[-1]["value"]
    row = {**summary, **mfu.cell_columns(records[0]["value"]["cell"], summary, start)}
    row.update(hardware="cpu", framework="pytorch", precision="fp32")
    assert row["seq_len"] == 16 and row["per_rank_batch_tokens"] == 64
    assert row["throughput_tokens_per_s"] == pytest.approx(16 * row["throughput_samples_per_s"])
    assert row["achieved_tflops_per_device"] > 0
    cells = mfu.add_mfu(pd.DataFrame([row]), {"cpu": None})
    assert pd.isna(cells["mfu"][0]) and cells["mfu_note"][0].startswith("unknown peak")
