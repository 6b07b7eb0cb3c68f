"""Published references: figures other projects published for a configuration (torchtitan's
Llama 3.1 8B on H100, ...), with their source and conditions (config/references.yaml
`published:`). A measured cell of the same model, framework, strategy and precision is set
against the closest of them: the fraction of the published tokens/s per GPU it reached, and
every condition in which it differs (world size, local batch, sequence length, compile,
activation checkpointing, the device), so a reader never takes a CPU test cell, or a
differently configured GPU cell, for a reproduction.

Not a regression check (dlscale.decisions.regression_check: the site's own references with
tolerances): a published figure has no tolerance, and another site's hardware.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from dlscale.models import cell_seq_len

# What a published entry must match to be compared at all; the rest are conditions that may differ.
MATCH = ("model", "framework", "parallelism", "precision")
CONDITIONS = ("world_size", "per_rank_batch", "seq_len", "mode", "activation_checkpointing")
COLUMNS = [
    "hardware",
    "cell",
    "reference",
    "measured_tokens_per_s_per_gpu",
    "n",
    "published_tokens_per_s_per_gpu",
    "fraction",
    "conditions_differing",
    "source",
    "notes",
]


def _cell_name(r) -> str:
    return f"{r['framework']}/{r['model']}/{r['policy']}/{r['precision']}/{r['mode']}/" + (
        f"{r['parallelism']}/n{int(r['nodes'])}"
    )


def differences(cell: dict, ref: dict, device: str | None) -> list[str]:
    """Each condition in which a measured cell differs from a published entry, as text."""
    out = []
    for key in CONDITIONS:
        mine, theirs = cell.get(key), ref.get(key)
        if theirs is None or mine == theirs:
            continue
        out.append(f"{key.replace('_', ' ')} {mine} (published {theirs})")
    if ref.get("device") and device != ref["device"]:
        out.append(f"device {device or 'not stated'} (published {ref['device']})")
    return out


def comparison(
    scaling: pd.DataFrame, published: list[dict], devices: dict, seq_len: int | None = None
) -> pd.DataFrame:
    """One row per measured cell (a scaling row with tokens/s) that a published entry matches
    on MATCH: the entry with the fewest differing conditions, the fraction of its tokens/s per
    GPU reached (the cell's median over repetitions ÷ its world size), and the differences.
    `devices`: hardware key -> the entry's device_model (what the cells ran on); `seq_len`:
    the study's config seq_len (None: each model's registry default)."""
    rows = []
    if scaling.empty or not published or "throughput_tokens_per_s_median" not in scaling:
        return pd.DataFrame(columns=COLUMNS)
    for _, r in scaling.iterrows():
        tokens = r["throughput_tokens_per_s_median"]
        if tokens is None or (isinstance(tokens, float) and math.isnan(tokens)):
            continue
        cell = {
            "model": r["model"],
            "framework": r["framework"],
            "parallelism": r["parallelism"],
            "precision": r["precision"],
            "world_size": int(r["world_size"]),
            "per_rank_batch": int(r["per_rank_batch"]),
            "seq_len": cell_seq_len(r["model"], seq_len),
            "mode": r["mode"],
            "activation_checkpointing": r.get("activation_checkpointing", "none") or "none",
        }
        device = devices.get(r["hardware"])
        matching = [p for p in published if all(p[k] == cell[k] for k in MATCH)]
        if not matching:
            continue
        best = min(matching, key=lambda p: len(differences(cell, p, device)))
        per_gpu = float(tokens) / cell["world_size"]
        rows.append(
            {
                "hardware": r["hardware"],
                "cell": _cell_name(r),
                "reference": best["name"],
                "measured_tokens_per_s_per_gpu": per_gpu,
                "n": int(r["n"]) if "n" in r and not pd.isna(r["n"]) else None,
                "published_tokens_per_s_per_gpu": float(best["tokens_per_s_per_gpu"]),
                "fraction": per_gpu / float(best["tokens_per_s_per_gpu"]),
                "conditions_differing": "; ".join(differences(cell, best, device)) or "none",
                "source": best["source"],
                "notes": best.get("notes", ""),
            }
        )
    return pd.DataFrame(rows, columns=COLUMNS)


def tex(table: pd.DataFrame, published: list[dict]) -> str:
    """The report's paragraph (Regression check section): the published entries the file
    holds, and each matched cell with its fraction and what differs; nothing matched says so."""
    from dlscale.outputs.latex_text import tex_escape

    head = (
        "\n\\paragraph{Published references.} "
        f"{len(published)} published figure(s) in the references file; a cell of the same "
        "model, framework, strategy and precision is set against the closest one, with the "
        "fraction of its tokens/s per GPU reached (the cell's median over its repetitions "
        "divided by its world size) and every condition that differs."
    )
    if table.empty:
        return head + " No measured cell of this study matches one.\n"
    lines = [head, "", "\\begin{description}"]
    for r in table.itertuples(index=False):
        n = f", n = {r.n}" if r.n else ""
        lines.append(
            f"\\item[{tex_escape(r.hardware)}/{tex_escape(r.cell)}] "
            f"{r.measured_tokens_per_s_per_gpu:,.1f} tokens/s per GPU{n}: "
            f"{100 * r.fraction:.3g}\\,\\% of {r.published_tokens_per_s_per_gpu:,.0f} "
            f"({tex_escape(r.reference)}; {tex_escape(r.source)}). Differs in: "
            f"{tex_escape(r.conditions_differing)}."
            + (f" Note: {tex_escape(r.notes)}" if r.notes else "")
        )
    lines.append("\\end{description}")
    return "\n".join(lines) + "\n"


def write(
    scaling: pd.DataFrame,
    published: list[dict],
    devices: dict,
    out_csv: str | Path,
    seq_len: int | None = None,
) -> tuple[pd.DataFrame, str]:
    """comparison -> out_csv; returns the table and the report's paragraph."""
    table = comparison(scaling, published, devices, seq_len)
    Path(out_csv).parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(out_csv, index=False)
    return table, tex(table, published)
