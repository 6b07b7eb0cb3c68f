"""Two studies side by side: what did the upgrade (or the other cluster) change?

`python -m dlscale.decisions.compare A B` (or `dlscale compare A B`) reads two results folders
(results/<study>/, their tables/cells.csv and tables/systems.csv) and matches their cells on the
axes (hardware, framework, model, policy, precision, mode, nodes; repetitions are the samples).
Per matched cell it reports the ratio of median throughputs B / A (below 1: B is slower) with
the conservative interval of a ratio of medians (dlscale.analysis.stats.median_interval of each
side,
ratio_interval: the order-statistic CI where both sides have n >= 6, the min-max range for
fewer repetitions, none for one), and flags a difference as beyond noise when

- the ratio has an interval (both sides n >= 2) and the interval excludes 1, or
- it has none (a side has one repetition) and |ratio - 1| exceeds the threshold (default 5 %):
  the table says so (`basis`), since without repetitions the noise is unknown.

Cells present in only one study are listed, never dropped. What else differs between the two
sides comes first, each in a column of its own, per cell and study-wide: the cells' settings
(SETTINGS: steps, warm-up, batch sizes, ranks, device: `settings_differ`), the competition flag
(repetitions measured while other processes kept the host busy: `competing`), and the
provenance (library versions, Python, device, launcher, hosts, commit: `provenance_differs`;
the system fields that differ, driver, CUDA/NCCL, OS, framework build, ...:
dlscale.analysis.systems_table). A cell whose settings differ is never called plainly faster or
slower: its difference reads "faster, settings differ" and is counted apart, since its ratio
measures the settings as much as the change under test.

Outputs (compare_outputs): compare.csv (every cell), summary.md and summary.tex (the short
summary), ratios.pdf (ratio per cell grouped by framework and model, with its interval).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from dlscale.analysis.collect import CELL_FIELDS
from dlscale.analysis.stats import (
    CI,
    GROUP,
    RANGE,
    interval_label,
    median_interval,
    ratio_interval,
    with_axes,
)
from dlscale.decisions.reference_verdicts import cell_name

POINT = [*GROUP, "nodes"]
MEASURE = "throughput_samples_per_s"
DEFAULT_THRESHOLD = 0.05
# Per-cell provenance columns of cells.csv compared between the two sides.
PROVENANCE = ["libraries", "python", "device_model", "launcher", "hosts", "git_commit"]
# Per-cell settings of cells.csv compared between the two sides: a difference makes a ratio a
# comparison of settings, not only of the change under test.
SETTINGS = list(CELL_FIELDS)
# System fields (systems.csv) worth printing beside the ratios when they differ.
SYSTEM_FIELDS = [
    "Operating system",
    "CPU model",
    "Accelerator model",
    "GPU driver",
    "CUDA runtime / cuDNN / NCCL",
    "Network interfaces",
    "InfiniBand / RoCE",
    "Framework build",
    "Python",
    "Package environment",
    "Slurm",
]
SLOWER, FASTER, WITHIN = "slower", "faster", "within noise"
SETTINGS_DIFFER = "settings differ"
ONLY_A, ONLY_B, BOTH = "only in A", "only in B", "both"
MAX_FIGURE_ROWS = 80
MAX_SUMMARY_ROWS = 50
COLUMNS = [
    *POINT,
    "cell",
    "side",
    "settings_differ",
    "competing",
    "provenance_differs",
    "n_a",
    "n_b",
    "median_a",
    "median_b",
    "ratio",
    "ratio_low",
    "ratio_high",
    "interval",
    "basis",
    "difference",
    "beyond_noise",
]


def _values(part: pd.DataFrame, column: str) -> str:
    if column not in part:
        return ""
    return "; ".join(sorted({str(v) for v in part[column].dropna()}))


def _settings_differ(ga: pd.DataFrame, gb: pd.DataFrame) -> str:
    """`steps 10 -> 12, warmup_steps 3 -> 5`: the settings (SETTINGS) whose values differ."""
    return ", ".join(
        f"{c} {_values(ga, c) or '--'} -> {_values(gb, c) or '--'}"
        for c in SETTINGS
        if _values(ga, c) != _values(gb, c)
    )


def _n_competing(g: pd.DataFrame | None) -> int:
    if g is None or "competing" not in g:
        return 0
    return int(g["competing"].fillna(False).astype(bool).sum())


def _competing(ga: pd.DataFrame | None, gb: pd.DataFrame | None) -> str:
    """`A 0/2, B 2/2`: repetitions measured under competition on each side, empty where none."""
    if not (_n_competing(ga) or _n_competing(gb)):
        return ""
    return ", ".join(
        f"{side} {_n_competing(g)}/{0 if g is None else len(g)}"
        for side, g in (("A", ga), ("B", gb))
    )


def compare_cells(a: pd.DataFrame, b: pd.DataFrame, threshold: float = DEFAULT_THRESHOLD):
    """One row per cell (scaling point) of either side (COLUMNS): the ratio of median
    throughputs B / A with its interval and whether it is beyond noise."""
    groups_a = {k: g for k, g in a.groupby(POINT, sort=False)} if not a.empty else {}
    groups_b = {k: g for k, g in b.groupby(POINT, sort=False)} if not b.empty else {}
    keys = sorted(
        set(groups_a) | set(groups_b), key=lambda k: tuple(map(str, k[:-1])) + (int(k[-1]),)
    )
    rows = []
    for key in keys:
        point = dict(zip(POINT, key))
        row = {**point, "cell": cell_name(point)}
        ga, gb = groups_a.get(key), groups_b.get(key)
        if ga is None or gb is None:
            g = gb if ga is None else ga
            values = g[MEASURE].to_numpy(dtype=float)
            row.update(
                side=ONLY_B if ga is None else ONLY_A,
                n_a=0 if ga is None else len(values),
                n_b=0 if gb is None else len(values),
                median_a=np.nan if ga is None else float(np.median(values)),
                median_b=np.nan if gb is None else float(np.median(values)),
                basis="",
                difference="",
                beyond_noise=False,
                settings_differ="",
                competing=_competing(ga, gb),
                provenance_differs="",
            )
            rows.append(row)
            continue
        va, vb = (g[MEASURE].to_numpy(dtype=float) for g in (ga, gb))
        med_a, med_b = float(np.median(va)), float(np.median(vb))
        low, high, kind = ratio_interval(median_interval(vb), median_interval(va))
        ratio = med_b / med_a
        n = f"{len(vb)}/{len(va)}"
        if kind in (CI, RANGE):
            beyond = bool(low > 1 or high < 1)
            basis = (
                f"interval excludes 1 ({interval_label(kind, n)})"
                if beyond
                else (f"interval contains 1 ({interval_label(kind, n)})")
            )
        else:
            beyond = bool(abs(ratio - 1) > threshold)
            basis = f"threshold +-{threshold:.0%} (no interval: n={n})"
        settings = _settings_differ(ga, gb)
        difference = (SLOWER if ratio < 1 else FASTER) if beyond else WITHIN
        if beyond and settings:
            difference = f"{difference}, {SETTINGS_DIFFER}"
        row.update(
            side=BOTH,
            n_a=len(va),
            n_b=len(vb),
            median_a=med_a,
            median_b=med_b,
            ratio=ratio,
            ratio_low=low,
            ratio_high=high,
            interval=interval_label(kind, n),
            basis=basis,
            difference=difference,
            beyond_noise=beyond,
            settings_differ=settings,
            competing=_competing(ga, gb),
            provenance_differs=", ".join(c for c in PROVENANCE if _values(ga, c) != _values(gb, c)),
        )
        rows.append(row)
    out = pd.DataFrame(rows, columns=COLUMNS)
    return out.astype({"beyond_noise": bool})


def provenance_differences(
    a: pd.DataFrame, b: pd.DataFrame, sys_a: pd.DataFrame | None, sys_b: pd.DataFrame | None
) -> pd.DataFrame:
    """Study-wide provenance that differs: field, values in A, values in B (cells.csv columns
    over the cells both sides measured, and the system fields of SYSTEM_FIELDS)."""
    rows = []
    both = a.merge(b[POINT].drop_duplicates(), on=POINT) if not a.empty and not b.empty else a
    both_b = b.merge(a[POINT].drop_duplicates(), on=POINT) if not a.empty and not b.empty else b
    for column in PROVENANCE:
        va, vb = _values(both, column), _values(both_b, column)
        if va != vb:
            rows.append({"field": column, "a": va, "b": vb})
    if sys_a is not None and sys_b is not None:
        for field in SYSTEM_FIELDS:
            va = "; ".join(sorted(set(sys_a.loc[sys_a["field"] == field, "value"].astype(str))))
            vb = "; ".join(sorted(set(sys_b.loc[sys_b["field"] == field, "value"].astype(str))))
            if va != vb:
                rows.append({"field": field, "a": va, "b": vb})
    return pd.DataFrame(rows, columns=["field", "a", "b"])


def _read(results: Path) -> tuple[pd.DataFrame, pd.DataFrame | None, str]:
    # a study measured before the parallelism axis: every cell ddp (stats.with_axes)
    cells = with_axes(pd.read_csv(results / "tables" / "cells.csv"))
    systems_csv = results / "tables" / "systems.csv"
    systems = pd.read_csv(systems_csv, keep_default_na=False) if systems_csv.is_file() else None
    study = str(cells["study"].iloc[0]) if len(cells) and "study" in cells else results.name
    return cells, systems, study


# ---- the summary -------------------------------------------------------------------------------


def _f(x, digits: int = 4) -> str:
    return "--" if x is None or pd.isna(x) else f"{x:.{digits}g}"


def _interval(r) -> str:
    return "--" if pd.isna(r.ratio_low) else f"[{_f(r.ratio_low, 3)}, {_f(r.ratio_high, 3)}]"


def counts(table: pd.DataFrame) -> dict:
    """Matched cells by difference: slower and faster count cells of equal settings only; a
    cell beyond noise whose settings differ is counted under settings_beyond."""
    matched = table[table["side"] == BOTH]
    settings = matched["settings_differ"].fillna("") != ""
    return {
        "matched": len(matched),
        "slower": int((matched["difference"] == SLOWER).sum()),
        "faster": int((matched["difference"] == FASTER).sum()),
        "within": int((matched["difference"] == WITHIN).sum()),
        "settings": int(settings.sum()),
        "settings_beyond": int((settings & matched["beyond_noise"]).sum()),
        "competing": int((matched["competing"].fillna("") != "").sum()),
        "only_a": int((table["side"] == ONLY_A).sum()),
        "only_b": int((table["side"] == ONLY_B).sum()),
    }


def settings_differences(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Study-wide settings that differ over the cells both sides measured: field, A, B."""
    if a.empty or b.empty:
        return pd.DataFrame(columns=["field", "a", "b"])
    both = a.merge(b[POINT].drop_duplicates(), on=POINT)
    both_b = b.merge(a[POINT].drop_duplicates(), on=POINT)
    rows = [
        {"field": c, "a": _values(both, c), "b": _values(both_b, c)}
        for c in SETTINGS
        if _values(both, c) != _values(both_b, c)
    ]
    return pd.DataFrame(rows, columns=["field", "a", "b"])


def competition_text(a: pd.DataFrame, b: pd.DataFrame) -> str:
    """How many cells of each side were measured while other processes competed."""

    def one(cells: pd.DataFrame) -> str:
        if cells.empty:
            return "0 of 0"
        per_cell = (
            cells.groupby(POINT)["competing"].apply(
                lambda c: bool(c.fillna(False).astype(bool).any())
            )
            if "competing" in cells
            else pd.Series(dtype=bool)
        )
        return f"{int(per_cell.sum())} of {cells[POINT].drop_duplicates().shape[0]}"

    na, nb = one(a), one(b)
    if na.startswith("0 ") and nb.startswith("0 "):
        return "no cell of either study was measured while other processes competed."
    return (
        f"cells measured while other processes competed for the host (a repetition or more; "
        f"column competing): A {na}, B {nb}. Their ratios may reflect the load, not the change."
    )


def _differs_first_md(settings: pd.DataFrame, competition: str, prov: pd.DataFrame) -> list:
    """The differences besides the change under test, shown before any ratio."""
    lines = ["## What differs besides the change under test", ""]
    if settings.empty:
        lines.append("Settings: no difference in " + ", ".join(SETTINGS) + ".")
    else:
        lines += [
            "Settings differ (a ratio of these cells measures the settings too):",
            "",
            "| setting | A | B |",
            "| --- | --- | --- |",
        ]
        lines += [f"| {r.field} | {r.a or '--'} | {r.b or '--'} |" for r in settings.itertuples()]
    lines += ["", f"Competition: {competition}", ""]
    if prov.empty:
        lines.append("Provenance: no difference in versions, driver, device, launcher or hosts.")
    else:
        lines += ["Provenance differences:", "", "| field | A | B |", "| --- | --- | --- |"]
        lines += [f"| {r.field} | {r.a or '--'} | {r.b or '--'} |" for r in prov.itertuples()]
    return [*lines, ""]


def _counts_sentence(c: dict, threshold: float) -> str:
    text = (
        f"{c['matched']} matched cell(s): {c['slower']} slower and {c['faster']} faster beyond "
        f"noise, {c['within']} within noise; {c['only_a']} only in A, {c['only_b']} only in B."
    )
    if c["settings_beyond"]:
        text += (
            f" {c['settings_beyond']} more differ beyond noise but their settings differ too "
            "(difference 'faster, settings differ' or 'slower, settings differ'): not counted "
            "as faster or slower."
        )
    return text


def markdown_summary(
    table: pd.DataFrame,
    prov: pd.DataFrame,
    name_a: str,
    name_b: str,
    threshold: float,
    settings: pd.DataFrame | None = None,
    competition: str = "",
) -> str:
    c = counts(table)
    settings = settings if settings is not None else pd.DataFrame(columns=["field", "a", "b"])
    lines = [
        f"# dlscale compare: B = {name_b} against A = {name_a}",
        "",
        *_differs_first_md(settings, competition or "not compared.", prov),
        "## Ratios",
        "",
        f"Ratio of median throughput B / A per cell (below 1: B is slower), matched on "
        f"{', '.join(POINT)}. {_counts_sentence(c, threshold)} Beyond noise: the ratio's "
        "interval (from each side's median interval, dlscale.analysis.stats) excludes 1; where "
        "a side has one repetition there is "
        f"no interval and a difference beyond +-{threshold:.0%} counts (column basis).",
        "",
    ]
    matched = table[table["side"] == BOTH]
    shown = matched if len(matched) <= MAX_SUMMARY_ROWS else matched[matched["beyond_noise"]]
    if not shown.empty:
        if len(shown) < len(matched):
            lines.append(
                f"Cells beyond noise ({len(shown)} of {len(matched)}; all in compare.csv):"
            )
            lines.append("")
        lines += [
            "| hardware | cell | settings differ | competing | provenance differs | A median "
            "| B median | B / A | interval | difference | basis |",
            "| --- | --- | --- | --- | --- | ---: | ---: | ---: | --- | --- | --- |",
        ]
        for r in shown.itertuples(index=False):
            diff = f"**{r.difference}**" if r.beyond_noise else r.difference
            lines.append(
                f"| {r.hardware} | {r.cell} | {r.settings_differ or '--'} | "
                f"{r.competing or '--'} | {r.provenance_differs or '--'} | {_f(r.median_a)} | "
                f"{_f(r.median_b)} | {_f(r.ratio, 3)} | {_interval(r)} | {diff} | {r.basis} |"
            )
        lines.append("")
    only = table[table["side"] != BOTH]
    if not only.empty:
        lines += ["Cells in only one study:", ""]
        lines += [
            f"- {r.side}: {r.hardware}/{r.cell} (n={r.n_a or r.n_b})" for r in only.itertuples()
        ]
        lines.append("")
    return "\n".join(lines) + "\n"


def latex_summary(
    table: pd.DataFrame,
    prov: pd.DataFrame,
    name_a: str,
    name_b: str,
    threshold: float,
    settings: pd.DataFrame | None = None,
    competition: str = "",
) -> str:
    """A fragment to \\input into a LaTeX document (booktabs, longtable): numbers generated;
    the differences besides the change under test (settings, competition, provenance) first."""
    from dlscale.outputs.latex_text import tex_escape as e

    c = counts(table)
    settings = settings if settings is not None else pd.DataFrame(columns=["field", "a", "b"])
    text = f"Study \\texttt{{{e(name_b)}}} (B) against \\texttt{{{e(name_a)}}} (A).\n"
    differs = pd.concat(
        [settings.assign(kind="setting"), prov.assign(kind="provenance")], ignore_index=True
    )
    text += "\nCompetition: " + e(competition or "not compared.") + "\n"
    if not differs.empty:
        text += (
            "\n{\\footnotesize\\begin{longtable}{lp{0.2\\linewidth}p{0.3\\linewidth}"
            "p{0.3\\linewidth}}\n\\toprule\nDiffers & Field & A & B \\\\\n\\midrule\n"
            + "\n".join(
                f"{e(r.kind)} & {e(r.field)} & {e(r.a)} & {e(r.b)} \\\\"
                for r in differs.itertuples()
            )
            + "\n\\bottomrule\n\\end{longtable}}\n"
        )
    else:
        text += "\nSettings and provenance: no difference.\n"
    text += (
        "\nRatio of median throughput B/A per cell. "
        + e(_counts_sentence(c, threshold))
        + " A difference is beyond noise when the ratio's interval "
        f"excludes 1, or, without an interval (one repetition), when it exceeds "
        f"$\\pm${threshold * 100:g}\\,\\%.\n"
    )
    flagged = table[table["beyond_noise"]]
    if not flagged.empty:
        rows = "\n".join(
            e(f"{r.hardware}/{r.cell}").replace("/", r"/\allowbreak{}")
            + f" & {e(r.settings_differ or '--')} & {e(r.competing or '--')} & "
            f"{e(r.provenance_differs or '--')} & {_f(r.median_a)} & {_f(r.median_b)} & "
            f"{_f(r.ratio, 3)} & {e(_interval(r))} & {e(r.difference)} \\\\"
            for r in flagged.head(MAX_SUMMARY_ROWS).itertuples(index=False)
        )
        text += (
            "\n{\\footnotesize\\setlength\\tabcolsep{3pt}\n"
            "\\begin{longtable}{p{0.24\\linewidth}p{0.12\\linewidth}p{0.08\\linewidth}"
            "p{0.1\\linewidth}rrrlp{0.1\\linewidth}}\n\\toprule\n"
            "Cell & Settings differ & Competing & Provenance differs & A & B & B/A & Interval & "
            "Difference \\\\\n\\midrule\\endhead\n" + rows + "\n\\bottomrule\n\\end{longtable}}\n"
        )
    only = table[table["side"] != BOTH]
    if not only.empty:
        text += (
            "\nOnly in one study: "
            + "; ".join(e(f"{r.side}: {r.hardware}/{r.cell}") for r in only.itertuples())
            + ".\n"
        )
    return text


def plot_ratios(table: pd.DataFrame, out: str, *, name_a: str, name_b: str, threshold: float):
    """Ratio B/A per matched cell, grouped by framework and model, with its interval; a dashed
    line at 1 and the threshold band used where there is no interval; red beyond noise, blue
    within, orange where the cell's settings differ (whatever its ratio)."""
    from dlscale.outputs.figure_kit import paper_style, plt  # drawn under its lock (Agg)

    matched = table[table["side"] == BOTH]
    if len(matched) > MAX_FIGURE_ROWS:  # every flagged cell, then the others in order
        matched = pd.concat([matched[matched["beyond_noise"]], matched[~matched["beyond_noise"]]])
        matched = matched.head(MAX_FIGURE_ROWS)
    # grouped by framework and model (the figure's labels), then the other axes in POINT's order
    first = ["framework", "model"]
    matched = matched.sort_values([*first, *(a for a in POINT if a not in first)])
    with paper_style():
        fig, ax = plt.subplots(figsize=(7.0, 1.3 + 0.24 * max(len(matched), 1)))
        ax.axvline(1.0, color="0.3", linestyle="--", linewidth=0.8)
        ax.axvspan(
            1 - threshold,
            1 + threshold,
            color="0.92",
            zorder=0,
            label=f"+-{threshold:.0%} (used without an interval)",
        )
        labels = []
        for y, r in enumerate(matched.itertuples(index=False)):
            colour = "tab:red" if r.beyond_noise else "tab:blue"
            if r.settings_differ:  # its ratio measures the settings too: never plain red/blue
                colour = "tab:orange"
            has = not pd.isna(r.ratio_low)
            ax.errorbar(
                r.ratio,
                y,
                xerr=[[max(r.ratio - r.ratio_low, 0)], [max(r.ratio_high - r.ratio, 0)]]
                if has
                else None,
                fmt="o",
                color=colour,
                markersize=4,
                capsize=2 if has else 0,
            )
            labels.append(
                f"{r.framework} / {r.model} / {r.hardware} "
                f"{r.policy} {r.precision} {r.mode} n{r.nodes}"
            )
        ax.set_yticks(range(len(labels)), labels)
        ax.invert_yaxis()
        ax.set_xlabel(f"Throughput ratio B / A (B = {name_b}, A = {name_a})")
        from matplotlib.lines import Line2D

        handles = [
            Line2D([], [], marker="o", linestyle="", color="tab:red", label="beyond noise"),
            Line2D([], [], marker="o", linestyle="", color="tab:blue", label="within noise"),
            Line2D([], [], marker="o", linestyle="", color="tab:orange", label=SETTINGS_DIFFER),
            *ax.get_legend_handles_labels()[0],
        ]
        ax.legend(
            handles=handles,
            loc="lower center",
            bbox_to_anchor=(0.5, 1.0),
            ncols=4,
            fontsize="small",
        )
        ax.set_title(
            "error bars: the ratio's interval (CI or range of each side; n per cell in "
            "compare.csv); none with one repetition",
            fontsize="x-small",
            pad=22,
        )
        if not labels:
            ax.text(0.5, 0.5, "no matched cell", ha="center", transform=ax.transAxes)
        fig.tight_layout()
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out)
        plt.close(fig)


def compare_outputs(
    a_dir: str | Path,
    b_dir: str | Path,
    out_dir: str | Path,
    *,
    threshold: float = DEFAULT_THRESHOLD,
) -> tuple[pd.DataFrame, str]:
    """compare.csv, summary.md, summary.tex and ratios.pdf in out_dir; returns the table and
    the markdown summary."""
    cells_a, sys_a, name_a = _read(Path(a_dir))
    cells_b, sys_b, name_b = _read(Path(b_dir))
    table = compare_cells(cells_a, cells_b, threshold)
    prov = provenance_differences(cells_a, cells_b, sys_a, sys_b)
    differs = {
        "settings": settings_differences(cells_a, cells_b),
        "competition": competition_text(cells_a, cells_b),
    }
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "compare.csv", index=False)
    md = markdown_summary(table, prov, name_a, name_b, threshold, **differs)
    (out / "summary.md").write_text(md)
    (out / "summary.tex").write_text(
        latex_summary(table, prov, name_a, name_b, threshold, **differs)
    )
    plot_ratios(table, str(out / "ratios.pdf"), name_a=name_a, name_b=name_b, threshold=threshold)
    return table, md


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m dlscale.decisions.compare",
        description="Compare two studies' results folders cell by cell: ratio of median "
        "throughput B / A with its interval, differences beyond noise flagged, cells in one "
        "side only listed, provenance differences beside.",
    )
    p.add_argument("a", help="results folder A (the reference, e.g. before an upgrade)")
    p.add_argument("b", help="results folder B (compared against A)")
    p.add_argument("--out", help="output folder (default: B/compare/<name of A>)")
    p.add_argument(
        "--threshold",
        type=float,
        default=DEFAULT_THRESHOLD,
        help="relative difference that counts where a cell has no interval (n=1)",
    )
    args = p.parse_args(argv)
    for d in (args.a, args.b):
        if not (Path(d) / "tables" / "cells.csv").is_file():
            print(f"dlscale compare: {Path(d) / 'tables' / 'cells.csv'} not found", file=sys.stderr)
            return 2
    out = args.out or str(Path(args.b) / "compare" / Path(args.a).name)
    table, md = compare_outputs(args.a, args.b, out, threshold=args.threshold)
    print(md)
    print(f"written: {out}/compare.csv, summary.md, summary.tex, ratios.pdf")
    return 0


if __name__ == "__main__":
    sys.exit(main())


def compare_rule(baseline_cells: str, cells: str, table: str, log: str) -> None:
    """The workflow's `compare` job (rules/check.smk): each study's folder from its cells.csv,
    the outputs beside `table`, the markdown summary in the job's log."""
    _, summary = compare_outputs(
        Path(baseline_cells).parents[1], Path(cells).parents[1], Path(table).parent
    )
    Path(log).write_text(summary)
