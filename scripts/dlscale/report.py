"""The report: numbers reach LaTeX only as generated macros and tables, never typed by hand.

results/report/macros.tex      \\newcommand per reported number or fact (dls... names)
results/report/cells_table.tex booktabs longtable of every cell (n, spread, efficiency)
results/report/report.tex      rendered from templates/report.tex.j2 (jinja2, LaTeX-safe delimiters)
results/report/report.pdf      latexmk -pdf (Debian's TeX Live)
"""
from __future__ import annotations

import re
import shutil
import subprocess
from importlib import resources
from pathlib import Path

import jinja2
import pandas as pd

from .frameworks.base import ALLREDUCE_BYTES, ALLREDUCE_REPEATS, BREAKDOWN_STEPS, \
    COMPETING_BUSY_CPUS, IDLE_PROBE_SECONDS
from .stats import CI_METHOD

_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
                  "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}",
                  "^": r"\textasciicircum{}"}


def tex_escape(value) -> str:
    return re.sub(r"[\\&%$#_{}~^]", lambda m: _LATEX_SPECIAL[m.group()], str(value))


def _macro_name(name: str) -> str:
    if not re.fullmatch(r"[A-Za-z]+", name):
        raise ValueError(f"LaTeX macro names are letters only: {name!r}")
    return "dls" + name


def _fmt(x: float, digits: int = 3) -> str:
    return f"{x:.{digits}g}" if abs(x) < 10 ** digits else f"{x:,.0f}"


def _join(values) -> str:
    return ", ".join(str(v) for v in values)


def build_macros(config: dict, cells: pd.DataFrame, scaling: pd.DataFrame,
                 quarantine: pd.DataFrame, status: pd.DataFrame, n_planned: int) -> dict[str, str]:
    axes = config["axes"]
    m = {
        "Study": config["study"],
        "CellsPlanned": n_planned,
        "CellsMeasured": len(cells),
        "CellsQuarantined": len(quarantine),
        "CellsFailed": int((status["status"] == "failed").sum()) if not status.empty else 0,
        "CellsMissing": int((status["status"] == "missing").sum()) if not status.empty else 0,
        "Repetitions": config["repetitions"],
        "WarmupSteps": config["warmup_steps"],
        "TimedSteps": config["steps"],
        "PerRankBatch": config["per_rank_batch"],
        "Frameworks": _join(axes["framework"]),
        "Models": _join(axes["model"]),
        "Hardware": _join(axes["hardware"]),
        "NodeCounts": _join(axes["nodes"]),
        "Policies": _join(axes["policy"]),
        "Precisions": _join(axes["precision"]),
        "RanksPerNode": config["ranks_per_node"],
        "IdleProbeSeconds": IDLE_PROBE_SECONDS,
        "CIMethod": CI_METHOD,
        "StragglerThreshold": f"{config['straggler_threshold']:.0%}",
        "BreakdownSteps": BREAKDOWN_STEPS,
        "AllreduceSizes": " and ".join(f"{b >> 20}" for b in ALLREDUCE_BYTES),
        "AllreduceRepeats": ALLREDUCE_REPEATS,
        "CompetingBusyCpus": COMPETING_BUSY_CPUS,
    }
    measured_keys = ["GlobalBatchStrong", "GitCommit", "ConfigHash", "Libraries", "Python",
                     "DeviceModel", "Launcher", "Hosts", "ThroughputMax", "MaxNodes",
                     "EfficiencyAtMaxNodesMin", "EfficiencyAtMaxNodesMax", "CellsCompeting", "CellsStraggler", "EnergyNote",
                     "RepsMin", "RepsMax"]
    m.update({k: "n/a" for k in measured_keys})    # a report with no measured cell still builds
    if not cells.empty:
        strong = cells[cells["policy"] == "strong"]
        m["GlobalBatchStrong"] = (_join(sorted(strong["global_batch"].unique()))
                                  if not strong.empty else "n/a")
        m["GitCommit"] = _join(sorted(cells["git_commit"].fillna("unknown").unique()))
        m["ConfigHash"] = _join(sorted(cells["config_hash"].unique()))
        m["Libraries"] = _join(sorted(cells["libraries"].unique()))
        m["Python"] = _join(sorted(cells["python"].unique()))
        m["DeviceModel"] = _join(sorted(cells["device_model"].unique()))
        m["Launcher"] = _join(sorted(cells["launcher"].unique()))
        m["Hosts"] = _join(sorted({h for hs in cells["hosts"] for h in hs.split()}))
        m["ThroughputMax"] = _fmt(cells["throughput_samples_per_s"].max())
        top = scaling[scaling["nodes"] == scaling["nodes"].max()]
        m["MaxNodes"] = int(scaling["nodes"].max())
        m["EfficiencyAtMaxNodesMin"] = _fmt(top["scaling_efficiency_median"].min())
        m["EfficiencyAtMaxNodesMax"] = _fmt(top["scaling_efficiency_median"].max())
        m["CellsCompeting"] = int(cells["competing"].sum())
        m["CellsStraggler"] = int(cells["straggler"].sum())
        energy = cells["joules_per_sample"].dropna()
        m["EnergyNote"] = (f"measured for {len(energy)} of {len(cells)} cells "
                           f"(median {_fmt(energy.median())} J/sample)" if len(energy) else
                           "not available: " + "; ".join(sorted(
                               cells["energy_unavailable"].dropna().unique())))
        m["RepsMin"] = int(scaling["n"].min())
        m["RepsMax"] = int(scaling["n"].max())
    return {_macro_name(k): tex_escape(v) for k, v in m.items()}


def write_macros(macros: dict[str, str], out: str) -> None:
    lines = ["% Generated by dlscale.report.write_macros -- do not edit."]
    lines += [f"\\newcommand{{\\{k}}}{{{v}}}" for k, v in macros.items()]
    Path(out).write_text("\n".join(lines) + "\n")


def _ci(r, column: str) -> str:
    med = getattr(r, f"{column}_median")
    low, high = getattr(r, f"{column}_ci_low"), getattr(r, f"{column}_ci_high")
    if pd.isna(low):
        return _fmt(med)
    return f"{_fmt(med)} [{_fmt(low)}, {_fmt(high)}]"


def _opt(value, digits: int = 2, scale: float = 1.0) -> str:
    return "--" if value is None or pd.isna(value) else _fmt(value * scale, digits)


def write_cell_table(scaling: pd.DataFrame, out: str) -> None:
    """One row per group and node count: median over n repetitions with its 95 % CI."""
    head = (r"\begin{longtable}{lllllrrrrrrrr}" "\n" r"\toprule" "\n"
            r"HW & Framework & Model & Policy & Prec. & Nodes & Ranks & Global & n & "
            r"Throughput [samples/s] & Efficiency & Comm. & busbw \\" "\n"
            r"& & & & & & & batch & & median [95\,\% CI] & median [95\,\% CI] & share & GB/s \\"
            "\n" r"\midrule\endhead" "\n")
    rows = []
    for r in scaling.sort_values(["hardware", "framework", "model", "policy", "precision",
                                  "nodes"]).itertuples(index=False):
        cols = [tex_escape(v) for v in (r.hardware, r.framework, r.model, r.policy, r.precision,
                                        r.nodes, r.world_size, r.global_batch, r.n)]
        cols += [_ci(r, "throughput_samples_per_s"), _ci(r, "scaling_efficiency"),
                 _opt(r.comm_fraction_median), _opt(r.allreduce_busbw_gb_per_s_median)]
        flags = ("$^\\dagger$" if r.competing_reps else "") + ("$^\\ddagger$" if r.straggler_reps else "")
        rows.append(" & ".join(cols) + flags + r" \\")
    body = "\n".join(rows) if rows else r"\multicolumn{13}{c}{no measured cells} \\"
    foot = (r"\bottomrule" "\n" r"\multicolumn{13}{l}{$^\dagger$ a repetition was measured while "
            r"other processes kept the host busy (idle probe); $^\ddagger$ a repetition had a "
            r"straggler rank.}\\" "\n")
    Path(out).write_text(r"{\footnotesize\setlength\tabcolsep{3pt}" "\n" + head + body + "\n"
                         + foot + r"\end{longtable}}" + "\n")


def write_status_table(status: pd.DataFrame, out: str) -> None:
    """Failed and missing cells with the reason, Slurm state, failing rank and last log line."""
    bad = status[status["status"] != "ok"] if not status.empty else status
    if bad.empty:
        Path(out).write_text(f"All {len(status)} planned cells were measured.\n")
        return
    rows = []
    for r in bad.sort_values(["status", "hardware", "framework", "model", "nodes", "rep"]
                             ).itertuples(index=False):
        cell = f"{r.hardware}/{r.framework}/{r.model}/{r.policy}/{r.precision}/n{r.nodes}/r{r.rep}"
        last = (str(r.log_tail).strip().splitlines() or [""])[-1] if not pd.isna(r.log_tail) else ""
        slurm = "" if pd.isna(r.slurm_state) else f"{r.slurm_state} ({r.slurm_exit_code})"
        rank = "" if pd.isna(r.failed_rank) else str(int(r.failed_rank))
        rows.append(" & ".join(tex_escape(v) for v in (
            cell, r.status, r.reason if not pd.isna(r.reason) else "", slurm, rank,
            last[:90])) + r" \\")
    Path(out).write_text(
        "{\\footnotesize\\setlength\\tabcolsep{3pt}\n"
        "\\begin{longtable}{p{0.26\\linewidth}lp{0.22\\linewidth}p{0.12\\linewidth}r"
        "p{0.22\\linewidth}}\n\\toprule\n"
        "Cell & Status & Reason & Slurm state (exit) & Rank & Last log line \\\\\n"
        "\\midrule\\endhead\n" + "\n".join(rows) + "\n\\bottomrule\n\\end{longtable}}\n")


def write_quarantine_table(quarantine: pd.DataFrame, out: str) -> None:
    if quarantine.empty:
        Path(out).write_text("No metrics file was rejected.\n")
        return
    rows = "\n".join(f"\\texttt{{{tex_escape(r.metrics_path)}}} & {tex_escape(r.reason)} \\\\"
                     for r in quarantine.itertuples(index=False))
    Path(out).write_text("\\begin{longtable}{p{0.45\\linewidth}p{0.5\\linewidth}}\n\\toprule\n"
                         "Metrics file & Reason \\\\\n\\midrule\n" + rows +
                         "\n\\bottomrule\n\\end{longtable}\n")


def render_tex(out: str, *, title: str, figures: list[str]) -> None:
    env = jinja2.Environment(
        block_start_string="((*", block_end_string="*))",
        variable_start_string="(((", variable_end_string=")))",
        comment_start_string="((=", comment_end_string="=))",
        loader=jinja2.FunctionLoader(
            lambda name: resources.files("dlscale").joinpath("templates", name).read_text()),
        undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True)
    tex = env.get_template("report.tex.j2").render(title=tex_escape(title), figures=figures)
    Path(out).write_text(tex)


class LatexMissing(RuntimeError):
    pass


def compile_pdf(tex: str, log: str) -> None:
    """latexmk -g -pdf in the report's folder (-g: always compile, since Snakemake already decided
    the report is out of date; latexmk would otherwise repeat a remembered failure). A clear
    message when TeX Live is missing."""
    if shutil.which("latexmk") is None or shutil.which("pdflatex") is None:
        raise LatexMissing(
            "latexmk/pdflatex not found: the report PDF needs Debian's TeX Live "
            "(apt-get install latexmk texlive-latex-base texlive-latex-recommended "
            "texlive-fonts-recommended lmodern; scripts/setup.sh does this). Tables "
            "(results/tables/) and figures (results/figures/) are already built.")
    tex_path = Path(tex)
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as fh:
        proc = subprocess.run(["latexmk", "-g", "-pdf", "-interaction=nonstopmode", "-halt-on-error",
                               "-file-line-error", tex_path.name],
                              cwd=tex_path.parent, stdout=fh, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = "\n".join(Path(log).read_text(errors="replace").splitlines()[-30:])
        raise RuntimeError(f"latexmk failed (exit {proc.returncode}); last lines of {log}:\n{tail}")
