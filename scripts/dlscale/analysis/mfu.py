"""Model FLOPs utilisation (MFU) from a cell's counted FLOPs and measured throughput.

Two halves, two modules:

- **FLOPs per sample** of a model spec (forward + backward of one training step), counted by
  PyTorch's FLOP counter (``torch.utils.flop_counter.FlopCounterMode``) once per spec and
  sequence length (:func:`dlscale.models.flops.count_flops_per_sample`, cached in the process): the
  model is built
  on the ``meta`` device (no memory, no arithmetic), one batch of COUNT_BATCH samples runs
  forward and backward with attention in PyTorch's math backend (so attention's two batched
  matrix products are counted; the CPU's fused attention kernel is not in the counter's
  registry). The counter counts matrix multiplications, convolutions and attention products;
  elementwise operations, normalisation, softmax, the loss and the optimizer's update are not
  counted. Recomputation is not counted either: under activation checkpointing (selective,
  full, selective_op) the backward repeats forward operators (up to a whole extra forward of
  each recomputed block), which the hardware runs and MFU leaves out, as torchtitan and PaLM
  count model FLOPs (a hardware FLOPs utilisation would count them); such a cell's MFU is the
  model's, not the device's busy share. The ranks of a PyTorch cell record
  the count in their ``rank_start`` (``model_flops``) before any step, off the timed path.
- **MFU** from a cell's measured throughput: achieved TFLOP/s per device =
  flops_per_sample x throughput_samples_per_s / world_size / 1e12, against the **dense** peak of
  the cell's hardware entry and precision (hardware file ``peak_tflops``, the datasheet's figure
  without structured sparsity, kept with its source). An entry without a peak for the
  precision has an "unknown peak" and no MFU.

The decoder's cross-check (:func:`dlscale.models.flops.decoder_flops_per_token`): per token, 6 N (N
= trainable parameters, less the input embedding where the head has a weight of its own, as
torchtitan counts: the Llama family) + 12 L d S (attention scores and the weighted sum of
values, L layers, width d, sequence length S; PaLM, Chowdhery et al. 2022, appendix B). What the
counter counts exactly is 6 x the parameters in matrix products + 12 L d S: GPT-2's position
table, biases and LayerNorms and a Llama's RMSNorm weights hold parameters but do no matrix
product.

This module (the MFU half) imports no framework; the counting half is dlscale.models.flops,
which builds the model with PyTorch.
"""

from __future__ import annotations

MFU_METHOD = (
    "achieved TFLOP/s per device = FLOPs per sample (counted, forward + backward) x the cell's "
    "throughput in samples/s / world size / 1e12; MFU = that / the dense peak TFLOP/s of the "
    "hardware entry at the cell's precision (hardware file peak_tflops, with its source; "
    "sparse peaks are refused); fp32 cells whose fast paths ran TF32 (matmuls for sequence "
    "models, cuDNN for vision models) are held against the tf32 peak, float8 cells against "
    "the fp8 peak; recomputation under activation checkpointing is not counted"
)
UNKNOWN_PEAK = "unknown peak"


def peak_key(precision: str, tf32: bool = False) -> str:
    """The peak_tflops key a cell is held against: its precision, tf32 for an fp32 cell whose
    math ran on TF32 tensor cores."""
    if precision == "float8":  # torchao's float8 linears: held against the FP8 peak
        return "fp8"
    return "tf32" if precision == "fp32" and tf32 else precision


def peak_of(entry: dict | None, precision: str, tf32: bool = False) -> tuple[float | None, str]:
    """(dense peak TFLOP/s, how it is known) of a hardware entry at a cell's precision:
    (value, 'hardware file peak_tflops.<key>: <source>') or (None, 'unknown peak (...why)')."""
    # imported here, not with the module: dlscale.study.hardware brings PyYAML and jsonschema
    # (dlscale.study.config), and a PyTorch rank's FLOP count (dlscale.models.flops) imports
    # this module, so the count works where only torch and numpy are (benchmarks/gpu_suite.py)
    from dlscale.study.hardware import PEAK_KEY

    key = peak_key(precision, tf32)
    peak = (entry or {}).get(PEAK_KEY) or {}
    value = peak.get(key)
    if not isinstance(value, (int, float)) or value <= 0:
        return None, f"{UNKNOWN_PEAK} (no {PEAK_KEY}.{key} in the hardware entry)"
    return float(value), f"{PEAK_KEY}.{key} {value:g}: {peak.get('source', 'no source given')}"


def achieved_tflops_per_device(
    flops_per_sample: float | None, throughput_samples_per_s: float | None, world_size: int
) -> float | None:
    """Model TFLOP/s per device: FLOPs per sample x the cell's samples/s (summed over its
    ranks) / world size / 1e12; None when either is unknown."""
    if not flops_per_sample or throughput_samples_per_s is None or not world_size:
        return None
    return flops_per_sample * throughput_samples_per_s / world_size / 1e12


def mfu(achieved_tflops: float | None, peak_tflops: float | None) -> float | None:
    """Model FLOPs utilisation (0..1): achieved over dense peak TFLOP/s; None when either is
    unknown."""
    if achieved_tflops is None or not peak_tflops:
        return None
    return achieved_tflops / peak_tflops


# ---- the cells table's columns (dlscale.analysis.collect)
# --------------------------------------------

#: cells.csv columns this module adds, in order (after the cell's throughput).
CELL_COLUMNS = (
    "seq_len",
    "per_rank_batch_tokens",
    "global_batch_tokens",
    "throughput_tokens_per_s",
    "flops_per_sample",
    "achieved_tflops_per_device",
    "peak_precision",
)
#: cells.csv columns add_mfu adds (the peak comes from the hardware file, at analysis time).
MFU_COLUMNS = ("peak_tflops", "mfu", "mfu_note")


def cell_columns(cell: dict, summary: dict, rank0: dict) -> dict:
    """A cell's token and FLOP columns from its metrics: sequence length (a decoder's cell
    seq_len; a sequence classifier's input length; None for vision models), the batches and
    throughput in tokens (sequences x seq_len), FLOPs per sample as rank 0 counted them
    (None where the framework does not count: TensorFlow, Keras, MXNet, or files from before),
    achieved TFLOP/s per device, and the precision whose peak the cell is held against."""
    from dlscale.models import SPECS, seq_len_of

    spec = SPECS.get(cell["model"])
    seq_len = cell.get("seq_len") or (seq_len_of(spec) if spec is not None else None)
    thr = summary.get("throughput_samples_per_s")
    flops = (rank0.get("model_flops") or {}).get("flops_per_sample")
    fast = rank0.get("fast_paths") or {}
    vision = spec is not None and spec.family == "vision"
    tf32 = bool(fast.get("tf32_cudnn") if vision else fast.get("tf32_matmul"))
    return {
        "seq_len": seq_len,
        "per_rank_batch_tokens": cell["per_rank_batch"] * seq_len if seq_len else None,
        "global_batch_tokens": cell["global_batch"] * seq_len if seq_len else None,
        "throughput_tokens_per_s": thr * seq_len if seq_len and thr is not None else None,
        "flops_per_sample": flops,
        "achieved_tflops_per_device": achieved_tflops_per_device(
            flops, thr, cell.get("world_size") or summary.get("world_size")
        ),
        "peak_precision": peak_key(cell["precision"], tf32 and cell.get("device") == "cuda"),
    }


def hardware_peaks(hardware: dict) -> dict:
    """hardware key -> its peak_tflops (or None): what collect needs of the hardware file."""
    from dlscale.study.hardware import PEAK_KEY

    return {key: (entry or {}).get(PEAK_KEY) for key, entry in hardware.items()}


def add_mfu(cells, peaks: dict | None):
    """cells.csv with MFU_COLUMNS: each cell's dense peak (hardware file, `peaks`: hardware key
    -> peak_tflops), its MFU, and how the MFU is known or why it is not ("unknown peak ...",
    "no FLOP count ...")."""
    cells = cells.copy()
    if cells.empty:
        for c in MFU_COLUMNS:
            cells[c] = None
        return cells
    from dlscale.study.hardware import PEAK_KEY

    peak_col, mfu_col, notes = [], [], []
    for row in cells.to_dict("records"):
        if "peak_precision" not in row:  # a table without the FLOP columns
            row["peak_precision"] = row["precision"]
        if peaks is None:
            value, note = None, f"{UNKNOWN_PEAK} (no hardware peaks given to the analysis)"
        else:
            value, note = peak_of({PEAK_KEY: peaks.get(row["hardware"])}, row["peak_precision"])
        achieved = row.get("achieved_tflops_per_device")
        achieved = None if achieved is None or achieved != achieved else achieved  # NaN
        if achieved is None:
            note = f"no FLOP count ({row['framework']} cells do not count FLOPs); {note}"
        peak_col.append(value)
        mfu_col.append(mfu(achieved, value))
        notes.append(note)
    cells["peak_tflops"], cells["mfu"], cells["mfu_note"] = peak_col, mfu_col, notes
    return cells


def mfu_summary(cells) -> str:
    """The report's sentence on MFU at the largest node count of the throughput cells: the
    range of the groups' medians over repetitions where the peak is known, else "unknown peak"
    with the achieved TFLOP/s per device, else why there is no number."""
    if cells is None or cells.empty or "mfu" not in cells:
        return "no cells with a FLOP count"
    from dlscale.analysis.stats import GROUP

    top = cells[cells["nodes"] == cells["nodes"].max()]
    group = [k for k in GROUP if k in top]
    nodes = int(top["nodes"].iloc[0])
    medians = top.groupby(group)[["mfu", "achieved_tflops_per_device"]].median()
    known = medians["mfu"].dropna()
    achieved = medians["achieved_tflops_per_device"].dropna()
    where = f"at the largest node count ({nodes})"
    if not known.empty:
        low, high = 100 * known.min(), 100 * known.max()
        span = f"{low:.3g} %" if low == high else f"{low:.3g} % to {high:.3g} %"
        text = (
            f"MFU {where}: {span} of the dense peak (medians over repetitions of "
            f"{len(known)} group(s))"
        )
        if len(known) < len(medians):
            text += f"; {len(medians) - len(known)} group(s) with an unknown peak or no FLOP count"
        return text
    if not achieved.empty:
        low, high = achieved.min(), achieved.max()
        span = f"{low:.3g}" if low == high else f"{low:.3g} to {high:.3g}"
        return (
            f"MFU {where}: {UNKNOWN_PEAK} (no dense peak_tflops in the hardware file for the "
            f"cells' hardware and precision); achieved {span} TFLOP/s per device"
        )
    return f"MFU {where}: no FLOP count (the cells' frameworks count no FLOPs)"


def attention_summary(cells) -> str:
    """The report's sentence on the attention kernels the cells ran (cells.csv
    `attention_kernel`: rank 0's profiler operator names after the window) and the traces their
    rank 0 wrote (`trace`: the cell's trace.json, Chrome/Perfetto)."""
    if cells is None or cells.empty or "attention_kernel" not in cells:
        return "No cell recorded an attention kernel."
    kernels = cells["attention_kernel"].dropna()
    parts = []
    if not kernels.empty:
        counts = kernels.value_counts()
        ran = "; ".join(f"{k} in {n} cell(s)" for k, n in counts.items())
        parts.append(
            "Attention kernels that ran (read from torch.profiler's operator names of one step "
            f"after the timed window): {ran}"
        )
    else:
        parts.append("No cell recorded an attention kernel")
    if "trace" in cells:
        traced = cells.dropna(subset=["trace"])
        from dlscale.study.cell import cell_label

        for _, row in traced.iterrows():
            parts.append(f"profiler trace of {cell_label(row.to_dict())}: {row['trace']}")
    return ". ".join(parts) + "."
