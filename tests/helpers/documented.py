"""The commands README.md and the quickstart show, and the walk that runs every one of them on a
study measured on the local Slurm cluster by a plain user (tests/workflow/test_login_node.py).

`documented_commands()` reads them from the two pages. `SLURM_WALK` maps each one to the command
as the walk runs it in that user's checkout, whose own study (config/config.yaml, `tiny`) is
measured locally and whose first-day study (`my-study.yaml`, `mine`) on the cluster: every
command that takes a study runs on `mine`, with the page's `--config study_file=my-study.yaml`
(and `launcher=srun` where the Slurm form says so), placeholders filled in. `NOT_WALKED` names
the commands the walk does not run, with why. tests/workflow/test_documented_commands.py runs
the local forms that measure cells on a study measured locally.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

PAGES = ("README.md", "docs/pages/quickstart.md")
COMMAND_START = ("snakemake", "python -m ", "dlscale ", "mkdocs ", "bash scripts/")

# The plain user's two studies: the checkout's own, measured locally, and the first-day study
TINY = "tiny"
MINE = "mine"
MINE_FILE = "my-study.yaml"
MINE_CELL = f"results/{MINE}/runs/cpu/pytorch/cnn_small/weak/fp32/eager/n2/r1/metrics.jsonl"
MINE_ARCHIVE = f"results/{MINE}/archive/{MINE}.tar.gz"
ON_MINE = f"--config study_file={MINE_FILE}"  # every command of the study file (quickstart)
ON_MINE_SLURM = f"--config study_file={MINE_FILE} launcher=srun"  # the Slurm forms
# The command the local form of "re-measure one cell" prints for a study measured on Slurm, as
# the Slurm form of that row reads with the study file
REMEASURE_CELL_ON_SLURM = (
    f"snakemake --profile profiles/slurm --forcerun {MINE_CELL} {ON_MINE_SLURM}"
)
PLANNER_OPTIONS = "--job cnn_small:1e6 --objective min_node_hours --deadline-hours 100"

# documented command -> the command as the walk runs it
SLURM_WALK: dict[str, str] = {
    # rows that measure: the local forms on the study measured on Slurm (they measure nothing
    # there, or stop with the Slurm form), the Slurm forms measuring it
    "snakemake --profile profiles/local": "snakemake --profile profiles/local",  # tiny, locally
    "snakemake --profile profiles/slurm": f"snakemake --profile profiles/slurm {ON_MINE_SLURM}",
    "snakemake --profile profiles/local -n": f"snakemake --profile profiles/local {ON_MINE} -n",
    "snakemake --profile profiles/slurm -n": (
        f"snakemake --profile profiles/slurm {ON_MINE_SLURM} -n"
    ),
    "snakemake --profile profiles/local --forcerun <the cell's metrics.jsonl>": (
        f"snakemake --profile profiles/local --forcerun {MINE_CELL} {ON_MINE}"
    ),
    "snakemake --profile profiles/local --forcerun results/demo/runs/cpu/pytorch/cnn_small/weak/"
    "fp32/eager/n2/r1/metrics.jsonl": (
        f"snakemake --profile profiles/local --forcerun {MINE_CELL} {ON_MINE}"
    ),
    "snakemake --profile profiles/slurm --forcerun <the cell's metrics.jsonl>": (
        REMEASURE_CELL_ON_SLURM
    ),
    "snakemake --profile profiles/slurm --forcerun <the cell's metrics.jsonl> "
    "--config launcher=srun": REMEASURE_CELL_ON_SLURM,
    "snakemake --profile profiles/local --config study_file=my-study.yaml": (
        f"snakemake --profile profiles/local {ON_MINE}"
    ),
    "snakemake --profile profiles/slurm --config study_file=my-study.yaml launcher=srun": (
        f"snakemake --profile profiles/slurm {ON_MINE_SLURM}"
    ),
    "snakemake --profile profiles/local --config remeasure=True": (
        f"snakemake --profile profiles/local {ON_MINE} remeasure=True"
    ),
    "snakemake --profile profiles/slurm --config launcher=srun remeasure=True": (
        f"snakemake --profile profiles/slurm {ON_MINE_SLURM} remeasure=True"
    ),
    # rows that measure nothing: with either profile on the study measured on Slurm
    "dlscale status results/<study>": f"dlscale status results/{MINE}",
    "snakemake --profile profiles/local --forcerun figure convergence_figure": (
        f"snakemake --profile profiles/local --forcerun figure convergence_figure {ON_MINE}"
    ),
    "snakemake --profile profiles/local --forcerun report_inputs report_tex": (
        f"snakemake --profile profiles/local --forcerun report_inputs report_tex {ON_MINE}"
    ),
    "snakemake --profile profiles/local --report results/<study>/report.zip": (
        f"snakemake --profile profiles/local --report results/{MINE}/report.zip {ON_MINE}"
    ),
    "snakemake --profile profiles/local check": (
        f"snakemake --profile profiles/local check {ON_MINE}"
    ),
    "python -m dlscale.decisions.regression_check results/<study>": (
        f"python -m dlscale.decisions.regression_check results/{MINE}"
    ),
    "python -m dlscale.decisions.regression_check bless results/<study> --system cpu "
    "[--tolerance 0.05] [--dry-run]": (
        f"python -m dlscale.decisions.regression_check bless results/{MINE} --system cpu "
        "--tolerance 0.05 --dry-run"
    ),
    "python -m dlscale.decisions.compare results/<before> results/<after>": (
        f"python -m dlscale.decisions.compare results/{TINY} results/{MINE}"
    ),
    "dlscale compare A B": f"dlscale compare results/{TINY} results/{MINE}",
    "snakemake results/<after>/compare/<before>/summary.md --profile profiles/local": (
        f"snakemake results/{MINE}/compare/{TINY}/summary.md --profile profiles/local {ON_MINE}"
    ),
    "snakemake results/<after>/compare/<before>/summary.md --profile profiles/local "
    "--config study_file=my-study.yaml": (
        f"snakemake results/{MINE}/compare/{TINY}/summary.md --profile profiles/local {ON_MINE}"
    ),
    "python -m dlscale.decisions.planner results/<study>": (
        f"python -m dlscale.decisions.planner results/{MINE}"
    ),
    "python -m dlscale.decisions.planner results/<study> [--job MODEL:SAMPLES ...] "
    "[--budget-node-hours B \\| --objective min_node_hours --deadline-hours D] [--out DIR]": (
        f"python -m dlscale.decisions.planner results/{MINE} {PLANNER_OPTIONS} --out plan-out"
    ),
    "snakemake --profile profiles/local --forcerun scaling_model": (
        f"snakemake --profile profiles/local --forcerun scaling_model {ON_MINE}"
    ),
    "snakemake study_archive --profile profiles/local": (
        f"snakemake study_archive --profile profiles/local {ON_MINE}"
    ),
    "snakemake study_archive --profile profiles/local [--config study_file=my-study.yaml]": (
        f"snakemake study_archive --profile profiles/local {ON_MINE}"
    ),
    "python -m dlscale.store.study_archive create results/<study> "
    "[--config study_file=my-study.yaml]": (
        f"python -m dlscale.store.study_archive create results/{MINE} {ON_MINE}"
    ),
    "python -m dlscale.store.study_archive verify results/<study>/archive/<study>.tar.gz": (
        f"python -m dlscale.store.study_archive verify {MINE_ARCHIVE}"
    ),
    "python -m dlscale.store.migrate": "python -m dlscale.store.migrate --dry-run",
    # the results database the drivers of both studies wrote (results/dlscale.sqlite)
    "dlscale history --model <model> --nodes <n>": "dlscale history --model cnn_small --nodes 2",
    "dlscale history import results/<study>": f"dlscale history import results/{MINE}",
    "mkdocs build --strict -f docs/mkdocs.yml": "mkdocs build --strict -f docs/mkdocs.yml",
}
NOT_WALKED = {
    "bash scripts/demo.sh": "the demo: this workflow on the 20-cell demo study (about 3 min; run "
    "by hand, benchmarks/reports/2026-11-29-demo-in-120-s.md); the same commands run on small "
    "studies, and the demo's plan is checked by a dry run "
    "(tests/workflow/test_documented_commands.py)",
    "bash scripts/test.sh": "the test command itself",
    "mkdocs serve -f docs/mkdocs.yml": "a web server that runs until stopped; its build is run",
}


def documented_commands() -> set[str]:
    """Every command the two pages show: the lines of their bash blocks and the inline code
    that starts like a command."""
    found = set()
    for page in PAGES:
        text = (Path(__file__).resolve().parents[2] / page).read_text()
        for block in re.findall(r"```bash\n(.*?)```", text, re.S):
            found |= {ln.split("#")[0].strip() for ln in block.splitlines()} - {""}
        inline = re.sub(r"```.*?```", "", text, flags=re.S)
        found |= {s for s in re.findall(r"`([^`\n]+)`", inline) if s.startswith(COMMAND_START)}
    return found


def measured_files(work: Path) -> dict[str, str]:
    """Every metrics file under results/ (current links and kept measurements) -> sha256."""
    return {
        str(p.relative_to(work)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in (work / "results").rglob("metrics.jsonl")
    }


def kept_measurements(files: dict[str, str]) -> dict[str, str]:
    """The kept measurements among metrics files (the current link of a re-measured cell
    changes; every measurement it pointed at stays, unchanged)."""
    return {path: digest for path, digest in files.items() if "/measurements/" in path}
