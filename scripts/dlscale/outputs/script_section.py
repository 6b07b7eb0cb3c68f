"""The report's section of the script workload (report/script_section.tex): one subsection per
script, stating its command, its content hash, where it ran and how its throughput was read,
with its scaling table in its own unit. Numbers come from the tables (cells.csv, scaling.csv),
never typed by hand; a study without script cells gets an empty file (a comment).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from dlscale.outputs.latex_text import _fmt, tex_escape

SECTION_HEAD = r"""\clearpage
\section{Your scripts}\label{sec:scripts}
\begin{sloppypar}
%(cells)d script cell(s) ran the study's own training scripts (the \texttt{script} workload,
docs/pages/your-model.md). dlscale started their ranks through its launcher, each with
torchrun's environment (\texttt{RANK}, \texttt{LOCAL\_RANK}, \texttt{WORLD\_SIZE},
\texttt{LOCAL\_WORLD\_SIZE}, \texttt{MASTER\_ADDR}, \texttt{MASTER\_PORT},
\texttt{GROUP\_RANK}), and read each cell's throughput from what the script printed or wrote;
it measured nothing inside them, so the warm-up, timed window, communication breakdown, energy
and telemetry of the Methods section describe dlscale's own cells only. A script's series in
the scaling figures, the tables and the scaling model's predictions are in the script's unit.
Speedup and efficiency are taken as for every series (median over repetitions against the
smallest node count).
\end{sloppypar}
"""


def _tt(text) -> str:
    """Typewriter text that may break after its separators (a long command line)."""
    escaped = tex_escape(text).replace("-", "-{}")  # no -- ligature
    for sep in ("/", ",", "="):
        escaped = escaped.replace(sep, sep + r"\allowbreak{}")
    return r"\texttt{" + escaped + "}"


def _values(frame: pd.DataFrame, column: str) -> list:
    if column not in frame:
        return []
    return [v for v in dict.fromkeys(frame[column].dropna()) if v != ""]


def _table(scaling: pd.DataFrame, unit: str) -> list[str]:
    lines = [
        r"\begin{tabular}{lrrrrrrr}",
        r"\toprule",
        rf"hardware & policy & nodes & ranks & $n$ & {tex_escape(unit)} & speedup & "
        r"efficiency \\",
        r"\midrule",
    ]
    for r in scaling.sort_values(["hardware", "policy", "precision", "nodes"]).itertuples():
        lines.append(
            f"{tex_escape(r.hardware)} & {tex_escape(r.policy)} & {int(r.nodes)} & "
            f"{int(r.world_size)} & {int(r.n)} & {_fmt(r.throughput_samples_per_s_median, 4)} & "
            f"{_fmt(r.speedup_median)} & {_fmt(r.scaling_efficiency_median)} \\\\"
        )
    return [*lines, r"\bottomrule", r"\end{tabular}"]


def script_section(cells: pd.DataFrame, scaling: pd.DataFrame) -> str:
    """The section's LaTeX (an empty comment for a study without script cells)."""
    if cells.empty or "workload" not in cells or not (cells["workload"] == "script").any():
        return "% no script cells: no section (dlscale.outputs.script_section)\n"
    mine = cells[cells["workload"] == "script"]
    out = [SECTION_HEAD % {"cells": len(mine)}]
    for label, part in mine.groupby("framework", sort=True):
        unit = _values(part, "throughput_unit")[0] if _values(part, "throughput_unit") else ""
        hashes = _values(part, "script_sha256")
        out.append(rf"\subsection*{{Script \texttt{{{tex_escape(label)}}}}}")
        out.append(r"\begin{itemize}")
        for command in _values(part, "script_command"):
            out.append(r"\item Command (an argv list, run without a shell): " + _tt(command))
        for argv in _values(part, "script_argv")[:1]:
            out.append(r"\item As run, e.g.: " + _tt(argv))
        files = _values(part, "script_files")
        out.append(
            r"\item Script: "
            + ", ".join(_tt(s) for s in _values(part, "script"))
            + "; content hash (sha256 over "
            + (f"{int(files[0])} file(s)" if files else "its files")
            + ": the script and those hashed with it): "
            + "; ".join(_tt(h) for h in hashes)
            + (" (cells measured with different versions)" if len(hashes) > 1 else "")
        )
        out.append(
            r"\item Environment: "
            + ", ".join(_tt(v) for v in _values(part, "script_environment"))
            + "; launch: "
            + ", ".join(_tt(v) for v in _values(part, "script_launch"))
            + f"; models: {', '.join(_tt(m) for m in _values(part, 'model'))}"
        )
        for how in _values(part, "throughput_read"):
            out.append(r"\item Throughput " + tex_escape(how) + ".")
        out.append(r"\end{itemize}")
        rows = scaling[scaling["framework"] == label] if "framework" in scaling else scaling[:0]
        if len(rows):
            out.append(r"\begin{center}")
            out += _table(rows, unit or "samples/s")
            out.append(r"\end{center}")
    return "\n".join(out) + "\n"


def write_script_section(cells: pd.DataFrame, scaling: pd.DataFrame, out: str) -> None:
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(script_section(cells, scaling))
