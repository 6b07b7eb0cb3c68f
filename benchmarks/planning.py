"""Planning at scale: the dry run of the project's workflow for a study of N cells against a bare
Snakefile with the same N outputs, side by side in one run.

    .venv/bin/python benchmarks/planning.py [--cells 1000,10000] [--rounds 3]
                                            [--workflow-dir DIR] [--workdir DIR] [--slurm-probe]

For each N: a study config of N cells (printed: the exact count dlscale plans and how it was
reached) in a copy of the workflow of --workflow-dir (default: this repository; an older checkout
such as a `git worktree` measures "before"; .venvs is linked from it, else from this repository),
and two bare Snakefiles. `bare`, the baseline of the goal ("a bare Snakefile with the same number of
jobs"): the project's own jobs, read from its dry-run listing (its untimed warm-up, `snakemake -n`
without --quiet): the N cells made by one wildcard rule, every other job (collect, each figure, the
report, ...) by a rule of its own naming the same input and output files, so the same files link the
same jobs; no params, resources, logs or conda (docs/pages/decisions/dry-run-baseline.md).
`bare-min`, the earlier baseline: the N cells, one rule aggregating all N like collect, rule all
(N + 2 jobs; the project's other jobs each read collect's tables, and Snakemake scans collect's N
inputs at each such read, which only `bare` pays too). All run `snakemake -n --cores 1 --quiet` with
the same flags (--configfile included), once untimed (the project's is the listing run above; each
checks that N train jobs, and for `bare` as many jobs as the project, are planned), then --rounds
times, alternating which goes first. Prints median/min/max/n of the wall time, the CPU time (user +
system, the less noisy figure on a shared machine) and the peak RSS of the snakemake process
(os.wait4 rusage of the child), the project/bare ratios and project/bare-min; and, timed inside this
process, dlscale's own parse step (dlscale.study.matrix.load_study of the generated config), its
share of the project's dry run; then the parse alone (`snakemake --list-rules`, alternating), which
every Slurm job's snakemake repeats before it runs its one cell.

Goal: wall-time ratio project/bare <= 1.2 at 10,000 cells.

--ablate adds two copies of the project that are not usable workflows, measured in the same
rounds, to show where the excess over bare lies: `no-log`, the train rules without
their `log:` (and its redirection), and `no-log-params`, also with literal strings for the two
params functions (the cell's JSON, the framework's interpreter). Every removed line is matched
exactly, so a change to rules/train.smk stops the ablation instead of measuring nothing.

Snakemake's Slurm executor plugin, imported by every snakemake run, asks `scontrol show config`
for MinJobAge at import: where slurmctld does not answer that costs ~9 s per run, the same in
both variants, depending on whether a cluster is up. By default the children get an `scontrol`
that fails at once (the plugin then skips the question); --slurm-probe keeps the real one.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bare as bare_files  # noqa: E402
import _common as common  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cells", default="1000,10000", help="comma-separated cell counts")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--workflow-dir",
        type=Path,
        default=common.REPO,
        help="the checkout to measure (default: this repository)",
    )
    p.add_argument(
        "--venvs",
        type=Path,
        default=None,
        help="framework environments to link as .venvs (default: the checkout's "
        ".venvs, else this repository's)",
    )
    p.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="where the copies go (default: a new directory under /var/tmp)",
    )
    p.add_argument(
        "--max-nodes", type=int, default=128, help="node counts are the powers of two up to this"
    )
    p.add_argument("--parse-repeats", type=int, default=5)
    p.add_argument("--snakemake", type=Path, default=common.REPO / ".venv" / "bin" / "snakemake")
    p.add_argument(
        "--slurm-probe",
        action="store_true",
        help="let the Slurm plugin query scontrol in every run (see above)",
    )
    p.add_argument(
        "--ablate",
        action="store_true",
        help="also time the project without the train rules' log, then also without their "
        "params functions (see above)",
    )
    a = p.parse_args()
    sizes = [int(x) for x in a.cells.split(",") if x]
    src, venvs, root, shim = common.start(a, "dlscale-planning-")
    from dlscale.study.matrix import load_study

    # `--quiet` alone (= progress, rules) skips the per-job lines; in Snakemake 9.27
    # `--quiet all` still formats and prints every job (resources, shell command)
    flags = ["-n", "--cores", "1", "--quiet"]
    for n in sizes:
        wf = common.bench_checkout(src, root / f"project-{n}", venvs)
        cfg, config, shape = common.write_study(wf, n, a.max_nodes)
        study = load_study(config, wf)
        common.cell_count_check(study, shape.cells)
        print(f"\n== {len(study.cells)} cells (asked for {n}): {common.describe(shape, config)}")
        print(f"   config {cfg}")

        # dlscale's own parse step, in this process
        parse, paths_t = [], []
        for _ in range(a.parse_repeats):
            t0 = time.perf_counter()
            s = load_study(config, wf)
            parse.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            paths = [c.path for c in s.cells]
            paths_t.append(time.perf_counter() - t0)

        env = common.child_env(wf, a.snakemake, shim)
        project = snakemake_cmd(a.snakemake, wf / "Snakefile", cfg)
        logs = root / f"logs-{n}"
        logs.mkdir(exist_ok=True)
        # the project's warm-up is the dry run whose listing the same-jobs bare is built from
        bare_snakefile, bare_cfg, listing = same_jobs_bare(
            project, paths, wf, cfg, root / f"bare-{n}", env, logs
        )
        n_jobs = sum(common.job_stats(listing.log.read_text()).values())
        min_snakefile, min_cfg = bare_files.write_bare(root / f"bare-min-{n}", paths, cfg)
        print(f"   {n_jobs} jobs planned; bare: the same jobs, bare-min: cells + collect + all")
        cmds = {
            "project": project,
            "bare": snakemake_cmd(a.snakemake, bare_snakefile, bare_cfg),
            "bare-min": snakemake_cmd(a.snakemake, min_snakefile, min_cfg),
        }
        if a.ablate:
            for name, edits in ABLATIONS.items():
                copy = root / f"{name}-{n}"  # the project copy, its study files included
                shutil.copytree(
                    wf, copy, symlinks=True, ignore=shutil.ignore_patterns(".snakemake")
                )
                ablate(copy / "rules" / "train.smk", edits)
                cmds[name] = snakemake_cmd(a.snakemake, copy / "Snakefile", cfg)
        for name, cmd in cmds.items():  # untimed warm-up; checks the planned train jobs
            run = listing if name == "project" else None
            run = run or common.run_child(
                cmd + ["-n", "--cores", "1", "--quiet", "rules"],
                root,
                env,
                logs / f"{name}-warmup.log",
            )
            common.check(run, f"{name} warm-up dry run")
            planned = common.train_jobs(run.log.read_text())
            if planned != len(study.cells):
                raise SystemExit(
                    f"{name}: planned {planned} train jobs, expected "
                    f"{len(study.cells)}; see {run.log}"
                )
            total = sum(common.job_stats(run.log.read_text()).values())
            if name != "bare-min" and total != n_jobs:
                raise SystemExit(f"{name}: planned {total} jobs, expected {n_jobs}; see {run.log}")
            print(f"   warm-up {name}: {planned} train jobs planned, {run.wall_s:.1f} s")

        def side_by_side(args, tag):
            """Project and bare with the same extra args, a.rounds rounds alternating."""

            def variant(name):
                def go(r):
                    run = common.run_child(
                        cmds[name] + args, root, env, logs / f"{name}-{tag}-{r}.log"
                    )
                    common.check(run, f"{name} {tag}")
                    return run

                return go

            return common.alternate(
                a.rounds,
                {name: variant(name) for name in cmds},
                on_run=lambda r, name, run: print(
                    f"     round {r + 1} {name:13s} {run.wall_s:6.2f} s {run.maxrss_mib:5.0f} MiB",
                    flush=True,
                ),
            )

        print(
            f"   dry run `snakemake {' '.join(flags)}` (same flags + --configfile for both), "
            f"{a.rounds} rounds alternating:"
        )
        results = side_by_side(flags, "dry-run")
        for line in common.report(results):
            print(line)
        pm = statistics.median(parse)
        project_med = statistics.median(r.wall_s for r in results["project"])
        bare_med = statistics.median(r.wall_s for r in results["bare"])
        print(
            f"  dlscale parse step load_study(config, workflow_dir), in-process: "
            f"{common.stats(parse, 's', '.3f')} = {pm / project_med:.1%} of the project's "
            f"dry run, {pm / max(project_med - bare_med, 1e-9):.1%} of its excess over bare"
        )
        print(
            f"  (+ Cell.path of every cell, the collect rule's input list: "
            f"{common.stats(paths_t, 's', '.3f')})"
        )
        # what every Slurm job pays again: its snakemake parses the whole workflow (one job's DAG
        # after that is small); `--list-rules` parses without building a DAG
        print(
            f"   parse only (`snakemake --list-rules`: what each Slurm job's snakemake parses "
            f"again), {a.rounds} rounds alternating:"
        )
        parsed = side_by_side(["--list-rules"], "parse")
        for line in common.report(parsed):
            print(line)
        print(
            f"  goal at 10,000 cells: wall ratio project/bare <= 1.20; here "
            f"{project_med / bare_med:.2f} at {len(study.cells)} cells"
            f"{'' if a.slurm_probe else ' (Slurm plugin probe skipped in both)'}",
            flush=True,
        )
    print(f"\nlogs and copies under {root}")


def snakemake_cmd(snakemake: Path, snakefile: Path, cfg: Path) -> list[str]:
    """snakemake on a workflow copy: its Snakefile, its folder as workdir, the study config."""
    return [
        str(snakemake),
        "-s",
        str(snakefile),
        "-d",
        str(snakefile.parent),
        "--configfile",
        str(cfg),
    ]


def same_jobs_bare(
    project: list[str], paths: list[str], wf: Path, cfg: Path, dest: Path, env: dict, logs: Path
) -> tuple[Path, Path, common.Run]:
    """The bare Snakefile with the project's jobs (benchmarks/_bare.SAME_JOBS_SNAKEFILE), read
    from the project's own dry-run listing (untimed; its run is returned too)."""
    run = common.run_child(project + ["-n", "--cores", "1"], wf, env, logs / "project-listing.log")
    common.check(run, "project dry run (per-job listing)")
    jobs = bare_files.planned_jobs(run.log.read_text())
    snakefile, bare_cfg = bare_files.write_same_jobs_bare(dest, paths, jobs, wf, cfg)
    return snakefile, bare_cfg, run


# --ablate: what each copy drops from rules/train.smk (old text -> new text, each matched once)
_NO_LOG = [
    (
        "        log:\n"
        "            train_log_pattern(_workload, _parallelism, _ranks is not None),\n",
        "",
    ),
    (' > {log:q} 2>&1"', '"'),
]
ABLATIONS = {
    "no-log": _NO_LOG,
    "no-log-params": [
        *_NO_LOG,
        ("cell=CELL_JSON[_workload],", "cell='cell',"),
        ("python=framework_python,", "python='python',"),
    ],
}


def ablate(train_smk: Path, edits: list[tuple[str, str]]) -> None:
    text = train_smk.read_text()
    for old, new in edits:
        if text.count(old) != 1:
            raise SystemExit(f"--ablate: {old!r} is not in {train_smk} exactly once")
        text = text.replace(old, new)
    train_smk.write_text(text)


if __name__ == "__main__":
    main()
