"""The report's memory table (dlscale.outputs.report): memory per rank, predicted beside
measured, one row per series (hardware, framework, model, policy, precision, mode, parallelism)
and node count, for the cells whose ranks recorded the predicted parts
(dlscale.frameworks.torch_memory: PyTorch cells).

Columns: the optimizer; the state bytes per rank (parameters + gradients + optimizer state)
predicted and as allocated, and their difference; under fsdp and hsdp the exact shard fraction
(the whole model's state / dp_shard); the predicted activations; and on GPUs the timed window's
peak allocated memory beside the predicted total (state + activations). On CPUs the state bytes
are the comparable figure: a rank's peak resident set is mostly the interpreter and torch. The
largest rank of each cell, median over its repetitions."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from dlscale.analysis.stats import GROUP, with_axes
from dlscale.outputs.latex_text import _fmt, tex_escape

MAX_MEMORY_ROWS = 60  # about one page of \footnotesize rows; the rest are counted
MIB = 2**20

_MEDIANS = {
    "state_measured": "state_bytes_per_rank_max",
    "state_predicted": "predicted_state_bytes_per_rank_max",
    "activation_predicted": "predicted_activation_bytes_per_rank_max",
    "total_predicted": "predicted_total_bytes_per_rank_max",
    "full_state": "full_state_bytes",
    "shard_degree": "shard_degree",
    "peak_allocated_mb": "peak_allocated_mb_max",
}


def memory_rows(cells: pd.DataFrame) -> pd.DataFrame:
    """One row per series and node count of the cells with predicted memory: the medians over
    repetitions of _MEDIANS, the optimizer, what the device peak spans, the repetitions."""
    if cells.empty or "predicted_state_bytes_per_rank_max" not in cells:
        return pd.DataFrame()
    cells = with_axes(cells)
    cells = cells[pd.to_numeric(cells["predicted_state_bytes_per_rank_max"], "coerce").notna()]
    if cells.empty:
        return pd.DataFrame()
    keys = [*GROUP, "nodes"]
    rows = []
    for key, part in cells.groupby(keys, sort=True):
        row = dict(zip(keys, key))
        for name, column in _MEDIANS.items():
            values = pd.to_numeric(part.get(column, pd.Series(dtype=float)), errors="coerce")
            row[name] = values.median() if values.notna().any() else float("nan")
        row["optimizer"] = ", ".join(sorted(set(part.get("optimizer", pd.Series(["sgd"])))))
        scopes = part.get("peak_scope", pd.Series(dtype=object)).dropna()
        row["peak_scope"] = ", ".join(sorted(set(scopes))) or None
        row["n"] = len(part)
        rows.append(row)
    return pd.DataFrame(rows)


def _mib(value) -> str:
    return "--" if pd.isna(value) else _fmt(value / MIB)


def _difference(measured, predicted) -> str:
    if pd.isna(measured) or pd.isna(predicted) or not predicted:
        return "--"
    return f"{100 * (measured - predicted) / predicted:+.1f}"


def _row(r) -> str:
    shard = (
        r.full_state / r.shard_degree
        if not pd.isna(r.shard_degree) and r.shard_degree
        else float("nan")
    )
    peak = "--" if pd.isna(r.peak_allocated_mb) else _fmt(r.peak_allocated_mb)
    total = _mib(r.total_predicted) if peak != "--" else "--"
    cols = [
        tex_escape(r.hardware),
        tex_escape(r.model),
        tex_escape(r.policy),
        tex_escape(r.precision),
        tex_escape(r.parallelism),
        str(int(r.nodes)),
        tex_escape(r.optimizer),
        _mib(r.state_predicted),
        _mib(r.state_measured),
        _difference(r.state_measured, r.state_predicted),
        _mib(shard),
        _mib(r.activation_predicted),
        total,
        peak,
    ]
    return " & ".join(cols) + r" \\"


INTRO = (
    r"\noindent Memory per rank, predicted beside measured: the rank that holds the most of "
    r"each cell, median over its repetitions, in MiB. State: parameters, gradients and "
    r"optimizer state (float32; SGD's momentum 4 bytes per parameter, AdamW's two moments 8), "
    r"predicted from the full parameter shapes and the strategy's layout, measured as the "
    r"tensors this rank holds (a shard's under fsdp and hsdp); $\Delta$: measured against "
    r"predicted, in \%. Shard: under fsdp and hsdp the exact shard fraction, the whole "
    r"model's state divided by the sharding degree (FSDP2 pads each sharded parameter's first "
    r"dimension to a multiple of it). Act.: the activations autograd saves in one forward of "
    r"the rank's batch (estimated on the meta device; not under tensor parallel or a "
    r"pipeline). On GPUs, Total (state + activations) beside the peak allocated device memory "
    r"of the timed window (statistics reset after the warm-up); on CPUs the state bytes are "
    r"the comparable figure (a process's peak resident set is mostly the interpreter and torch). "
    r"Neither part counts the CUDA context, communication buffers or temporaries freed within "
    r"the step."
)


def write_memory_table(cells: pd.DataFrame, out: str, max_rows: int = MAX_MEMORY_ROWS) -> int:
    """The report's memory table (module docstring), at most `max_rows` rows (the rest counted,
    in cells.csv); a sentence where no cell recorded predicted memory. Returns the rows."""
    table = memory_rows(cells)
    if table.empty:
        Path(out).write_text(
            r"\noindent No cell recorded predicted memory per rank (PyTorch cells record it "
            r"since it was added; cells measured before, and the other frameworks' cells, have "
            r"only what they measured: \texttt{cells.csv})." + "\n"
        )
        return 0
    shown = table.head(max_rows)
    spec = "lllllrl" + "r" * 7
    head = (
        r"HW & Model & Policy & Prec. & Parallelism & Nodes & Opt. & \multicolumn{3}{c}{State} & "
        r"Shard & Act. & Total & Peak \\"
        "\n"
        r" & & & & & & & pred. & meas. & $\Delta$\,\% & & pred. & pred. & meas. \\"
    )
    rest = len(table) - len(shown)
    more = (
        rf"\multicolumn{{{len(spec)}}}{{l}}{{{rest} more rows: see \texttt{{cells.csv}}}} \\"
        "\n"
        if rest
        else ""
    )
    Path(out).write_text(
        INTRO
        + "\n\n"
        + r"{\footnotesize\setlength\tabcolsep{3pt}"
        + "\n"
        + rf"\begin{{longtable}}{{{spec}}}"
        + "\n\\toprule\n"
        + head
        + "\n\\midrule\\endhead\n"
        + "\n".join(_row(r) for r in shown.itertuples(index=False))
        + "\n"
        + more
        + "\\bottomrule\n\\end{longtable}}\n"
    )
    return len(shown)
