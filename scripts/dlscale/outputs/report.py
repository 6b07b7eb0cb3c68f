"""The report: numbers reach LaTeX only as generated macros and tables, never typed by hand.

results/report/macros.tex      \\newcommand per reported number or fact (dls... names)
results/report/cells_table.tex a bounded summary of the cells (write_cell_summary); the full
                               per-cell table (results/tables/cells.csv) is attached to the PDF
results/report/report.tex      rendered from templates/report.tex.j2 (jinja2, LaTeX-safe delimiters)
results/report/report.pdf      latexmk -pdf (TeX Live; none on PATH: no PDF, tex.py)

The macros come from `report_macros`, the cell table from `cell_table`, LaTeX escaping and the
macros file from `latex_text`; here the status, quarantine and Systems tables, the rule
report_inputs, the template and latexmk.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping
from importlib import resources
from pathlib import Path

import jinja2
import pandas as pd

from dlscale.analysis.systems_table import MAX_VALUES as MAX_SYSTEM_VALUES
from dlscale.analysis.systems_table import PLACEMENT_AWAY, PLACEMENT_FIELD
from dlscale.outputs.cell_table import write_cell_summary
from dlscale.outputs.figure_layout import MAX_PANELS, MAX_SERIES
from dlscale.outputs.latex_text import _macro_name, tex_escape, write_macros
from dlscale.outputs.memory_table import write_memory_table
from dlscale.outputs.report_macros import build_macros, workload_counts_text
from dlscale.outputs.tex import tex_missing
from dlscale.outputs.tta_section import convergence_macros, write_convergence_table
from dlscale.store.preflight_results import report_lines
from dlscale.study.cell import cell_label

MAX_LISTED_CELLS = 60  # rows of the failed/missing and quarantine tables (~2 pages)


def write_status_table(status: pd.DataFrame, out: str) -> None:
    """Failed and missing cells with the reason, Slurm state, failing rank and last log line."""
    bad = status[status["status"] != "ok"] if not status.empty else status
    if bad.empty:
        Path(out).write_text(
            f"All {len(status)} planned cells were measured ({workload_counts_text(status)}).\n"
        )
        return
    rows = []
    # failed before missing (sorted by status), at most MAX_LISTED_CELLS rows: a large study
    # with many missing cells would otherwise fill pages; the rest are counted below the table
    ordered = bad.sort_values(["status", "hardware", "framework", "model", "nodes", "rep"])
    for r in ordered.head(MAX_LISTED_CELLS).itertuples(index=False):
        cell = cell_label(r._asdict())
        last = (str(r.log_tail).strip().splitlines() or [""])[-1] if not pd.isna(r.log_tail) else ""
        slurm = "" if pd.isna(r.slurm_state) else f"{r.slurm_state} ({r.slurm_exit_code})"
        rank = "" if pd.isna(r.failed_rank) else str(int(r.failed_rank))
        rows.append(
            " & ".join(
                tex_escape(v)
                for v in (
                    cell,
                    r.status,
                    r.reason if not pd.isna(r.reason) else "",
                    slurm,
                    rank,
                    last[:90],
                )
            )
            + r" \\"
        )
    counts = ", ".join(f"{(bad['status'] == s).sum()} {s}" for s in ("failed", "missing"))
    unfit = int((bad["status"] == "does_not_fit").sum()) if not bad.empty else 0
    if unfit:  # out of memory at this size: a result (dlscale.store.does_not_fit)
        counts += f", {unfit} did not fit in memory"
    Path(out).write_text(
        f"\\noindent {len(status) - len(bad)} of {len(status)} planned cells were measured "
        f"({workload_counts_text(status)}); {counts}.\n\n"
        "{\\footnotesize\\setlength\\tabcolsep{3pt}\n"
        "\\begin{longtable}{p{0.26\\linewidth}lp{0.22\\linewidth}p{0.12\\linewidth}r"
        "p{0.22\\linewidth}}\n\\toprule\n"
        "Cell & Status & Reason & Slurm state (exit) & Rank & Last log line \\\\\n"
        "\\midrule\\endhead\n"
        + "\n".join(rows)
        + "\n\\bottomrule\n\\end{longtable}}\n"
        + _more_rows(ordered.iloc[MAX_LISTED_CELLS:], "status.csv")
    )


def _more_rows(rest: pd.DataFrame, table: str) -> str:
    if rest.empty:
        return ""
    counts = (
        ", ".join(f"{n} {status}" for status, n in rest["status"].value_counts().items())
        if "status" in rest
        else ""
    )
    return (
        f"\\noindent {len(rest)} more not listed{f' ({counts})' if counts else ''}: "
        f"see \\texttt{{{tex_escape(table)}}}.\n"
    )


def write_quarantine_table(quarantine: pd.DataFrame, out: str) -> None:
    if quarantine.empty:
        Path(out).write_text("No metrics file was rejected.\n")
        return
    rows = "\n".join(
        f"\\texttt{{{tex_escape(r.metrics_path)}}} & {tex_escape(r.reason)} \\\\"
        for r in quarantine.head(MAX_LISTED_CELLS).itertuples(index=False)
    )
    Path(out).write_text(
        "\\begin{longtable}{p{0.45\\linewidth}p{0.5\\linewidth}}\n\\toprule\n"
        "Metrics file & Reason \\\\\n\\midrule\n"
        + rows
        + "\n\\bottomrule\n\\end{longtable}\n"
        + _more_rows(quarantine.iloc[MAX_LISTED_CELLS:], "quarantine.csv")
    )


def write_systems_table(systems: pd.DataFrame, out: str, preflight: list[str] = ()) -> None:
    """The Systems table (dlscale.analysis.systems_table): per hardware entry, one row per field
    with its
    values (how many cells show each where they differ), the MLPerf system-description field it
    fills, and a flag where the nodes of one cell disagree. The preflight's lines
    (dlscale.store.preflight_results.report_lines) come first."""
    head = "".join(f"\\noindent {tex_escape(line)}\\par\n" for line in preflight)
    if systems.empty:
        Path(out).write_text(head + "No measured cell recorded a system description.\n")
        return
    mark = r"$^\S$"
    parts = [head]
    for hardware, hw in systems.groupby("hardware", sort=True):
        rows = []
        for field, f in hw.groupby("field", sort=False):
            shown = f.head(MAX_SYSTEM_VALUES)
            several = len(f) > 1
            values = "; ".join(
                tex_escape(v) + (f" ({c} cell{'s' if c > 1 else ''})" if several else "")
                for v, c in zip(shown["value"].astype(str), shown["cells"])
            )
            if len(f) > MAX_SYSTEM_VALUES:
                values += f"; {len(f) - MAX_SYSTEM_VALUES} more values (systems.csv)"
            differ = int(f["cells_nodes_differ"].iloc[0])
            if differ:
                names = str(f["differing_cells"].iloc[0]).split()
                listed = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
                values += (
                    r" \textbf{[nodes differ in "
                    + f"{differ} cell{'s' if differ > 1 else ''}: {tex_escape(listed)}]}}"
                )
            mlperf = tex_escape(f["mlperf_fields"].iloc[0])
            rows.append(
                tex_escape(field)
                + (mark if differ else "")
                + f" & {values} & \\texttt{{{mlperf}}} \\\\"
            )
        flagged = int((hw.groupby("field")["cells_nodes_differ"].first() > 0).sum())
        placement = hw[hw["field"] == PLACEMENT_FIELD]
        away = placement[placement["value"].astype(str).str.startswith(PLACEMENT_AWAY)]
        parts.append(
            f"\\subsection*{{Hardware \\texttt{{{tex_escape(hardware)}}}}}\n"
            + (
                f"{flagged} field(s) differ between the nodes of one cell ({mark}).\n"
                if flagged
                else "The nodes of every cell agree on every field.\n"
            )
            + (
                f"\\textbf{{Placement: GPU ranks ran on CPUs away from their GPU's NUMA node on "
                f"{int(away['nodes'].sum())} node record(s) of {int(away['cells'].sum())} "
                "cell(s)}} (row: " + tex_escape(PLACEMENT_FIELD) + "); their host work crossed the "
                "socket.\n"
                if len(away)
                else ""
            )
            + "{\\footnotesize\\setlength\\tabcolsep{3pt}\n"
            "\\begin{longtable}{p{0.2\\linewidth}p{0.5\\linewidth}p{0.24\\linewidth}}\n"
            "\\toprule\nField & Value & MLPerf system-description field \\\\\n"
            "\\midrule\\endhead\n" + "\n".join(rows) + "\n\\bottomrule\n\\end{longtable}}\n"
        )
    Path(out).write_text("".join(parts))


def write_report_inputs(
    paths: Mapping[str, str], *, config: dict, n_planned: int, preflight_dir: str | None = None
) -> dict[str, pd.DataFrame]:
    """The rule report_inputs (the complete and the partial report alike): the tables at
    paths["cells"], ["scaling"], ["quarantine"], ["status"] (CSV) -> the macros and LaTeX tables
    at paths["macros"], ["cells_table"], ["quarantine_table"], ["status_table"] (the keys of
    dlscale.workflow.paths.output_paths; others are ignored), and paths["systems"] ->
    ["systems_table"] where given, opened by what the run's preflight found (`preflight_dir`).
    Returns the tables read, by the same keys."""
    tables = {key: pd.read_csv(paths[key]) for key in ("cells", "scaling", "quarantine", "status")}
    Path(paths["macros"]).parent.mkdir(parents=True, exist_ok=True)
    macros = build_macros(config, **tables, n_planned=n_planned)
    # the time-to-accuracy section (real data; dlscale.outputs.tta_section), apart from the
    # throughput
    conv = {k: pd.read_csv(paths[k]) for k in ("convergence", "time_to_accuracy") if k in paths}
    tolerance = config["convergence"]["validity_tolerance"]
    if len(conv) < 2:  # tables from before the convergence workload: an empty section
        from dlscale.analysis.time_to_accuracy import CELL_COLUMNS, time_to_accuracy_summary

        conv = {"convergence": pd.DataFrame(columns=CELL_COLUMNS)}
        conv["time_to_accuracy"] = time_to_accuracy_summary(conv["convergence"], tolerance)
    elif len(conv["convergence"]) and "convergence_validity" not in conv["time_to_accuracy"]:
        # a summary from before convergence validity: summarised again from its cells
        from dlscale.analysis.time_to_accuracy import time_to_accuracy_summary

        conv["time_to_accuracy"] = time_to_accuracy_summary(conv["convergence"], tolerance)
    macros.update(
        {
            _macro_name(k): tex_escape(v)
            for k, v in convergence_macros(
                config, conv["convergence"], conv["time_to_accuracy"]
            ).items()
        }
    )
    write_macros(macros, paths["macros"])
    if "convergence_table" in paths:
        write_convergence_table(conv["time_to_accuracy"], paths["convergence_table"], tex_escape)
    tables.update(conv)
    if "systems" in paths:  # and paths["systems_table"]
        tables["systems"] = pd.read_csv(paths["systems"], keep_default_na=False)
        preflight = [] if preflight_dir is None else report_lines(Path(preflight_dir), config)
        write_systems_table(tables["systems"], paths["systems_table"], preflight)
    write_cell_summary(tables["scaling"], tables["status"], paths["cells_table"])
    if "script_section" in paths:  # the script workload's section (an empty file without one)
        from dlscale.outputs.script_section import write_script_section

        write_script_section(tables["cells"], tables["scaling"], paths["script_section"])
    if "memory_table" in paths:  # predicted beside measured memory per rank
        write_memory_table(tables["cells"], paths["memory_table"])
    write_quarantine_table(tables["quarantine"], paths["quarantine_table"])
    write_status_table(tables["status"], paths["status_table"])
    return tables


def render_tex(
    out: str,
    *,
    title: str,
    figures: list[dict],
    attachment: str,
    convergence_figures: list[dict] = (),
) -> None:
    """report.tex from the template. `figures`: the layout
    (dlscale.outputs.figure_layout.figure_layout) with
    file, caption, hardware, width_in, ci; `convergence_figures`: the convergence workload's
    (dlscale.outputs.figure_layout.convergence_layout), in their own section; `attachment`: the
    cell table's
    path relative to the report's folder, embedded in the PDF (attachfile2)."""
    env = jinja2.Environment(
        block_start_string="((*",
        block_end_string="*))",
        variable_start_string="(((",
        variable_end_string=")))",
        comment_start_string="((=",
        comment_end_string="=))",
        loader=jinja2.FunctionLoader(
            lambda name: resources.files("dlscale").joinpath("templates", name).read_text()
        ),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
    )
    if not re.fullmatch(r"[A-Za-z0-9_./-]+", attachment):
        raise ValueError(f"attachment path must be a plain relative path: {attachment!r}")

    def tex_figures(layout):
        return [
            {
                "file": f["file"],
                "caption": tex_escape(f["caption"]),
                "hardware": tex_escape(f["hardware"]),
                "width_in": f"{float(f['width_in']):.3f}",
                "ci": bool(f.get("ci", True)),
                "family": f["family"],
            }
            for f in layout
        ]

    figs = tex_figures(figures)
    tex = env.get_template("report.tex.j2").render(
        title=tex_escape(title),
        figures=figs,
        convergence_figures=tex_figures(convergence_figures),
        attachment=attachment,
        attachment_name=tex_escape(Path(attachment).name),
        attachment_name_plain=Path(attachment).name,
        hardware_count=len({f["hardware"] for f in figs}),
        max_panels=MAX_PANELS,
        max_series=MAX_SERIES,
    )
    Path(out).write_text(tex)


class LatexMissing(RuntimeError):
    pass


def compile_pdf(tex: str, log: str) -> None:
    """latexmk -g -pdf in the report's folder (-g: always compile, since Snakemake already decided
    the report is out of date; latexmk would otherwise repeat a remembered failure). A clear
    message when TeX Live is missing."""
    if tex_missing():
        raise LatexMissing(
            "latexmk/pdflatex not found: the report PDF needs TeX Live on PATH (a site's "
            "`module load texlive`, or Debian's packages: as root, "
            "`bash scripts/setup.sh --system-packages`). The study's tables, figures and "
            f"report sources ({tex}) are already built."
        )
    tex_path = Path(tex)
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    # attachfile2's record of the attached table (<name>.atfi), empty where none exists yet: the
    # first pdflatex run then reads it as every later run does, so latexmk does not take its
    # appearance in the second run for a change and run a third, identical pass (2 runs, not 3,
    # for the same PDF)
    atfi = tex_path.with_suffix(".atfi")
    if not atfi.exists():
        atfi.touch()
    with open(log, "w") as fh:
        proc = subprocess.run(
            [
                "latexmk",
                "-g",
                "-pdf",
                "-interaction=nonstopmode",
                "-halt-on-error",
                "-file-line-error",
                tex_path.name,
            ],
            cwd=tex_path.parent,
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
    if proc.returncode != 0:
        tail = "\n".join(Path(log).read_text(errors="replace").splitlines()[-30:])
        raise RuntimeError(f"latexmk failed (exit {proc.returncode}); last lines of {log}:\n{tail}")
