"""benchmarks/planning.py --ablate on the workflow as it is: each ablated copy of rules/train.smk
still plans every cell (so the benchmark measures a dry run, not an error), has lost exactly
what it names, and a train.smk that no longer holds a removed line stops the ablation."""

from __future__ import annotations

import importlib.util
import re

import pytest

from dlscale.study.matrix import load_study

from helpers.checkout import BIN, ROOT, copy_workflow, snakemake

pytestmark = pytest.mark.workflow


def _planning():
    spec = importlib.util.spec_from_file_location("planning", ROOT / "benchmarks" / "planning.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _train_jobs(text: str) -> int:
    """Train jobs in Snakemake's job-count table (`--quiet rules`)."""
    return sum(int(n) for n in re.findall(r"^(?:train|converge)_\S+\s+(\d+)$", text, re.M))


def test_every_ablation_still_plans_every_cell(tmp_path, base_config):
    planning = _planning()
    planned = {}
    for name in ["project", *planning.ABLATIONS]:
        (tmp_path / name).mkdir()
        work = copy_workflow(tmp_path / name, base_config)
        train = work / "rules" / "train.smk"
        if name != "project":
            planning.ablate(train, planning.ABLATIONS[name])
        text = train.read_text()
        assert ("log:" in text) == (name == "project"), name
        assert ("python=framework_python" in text) == (name != "no-log-params"), name
        proc = snakemake(work, "-n", "--cores", "1", "--quiet", "rules")
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        planned[name] = _train_jobs(proc.stdout + proc.stderr)
    assert planned["project"] > 0
    assert set(planned.values()) == {planned["project"]}, planned


def test_a_changed_train_rule_stops_the_ablation(tmp_path):
    planning = _planning()
    train = tmp_path / "train.smk"
    text = (ROOT / "rules" / "train.smk").read_text()
    train.write_text(text.replace("python=framework_python,", "python=other_python,"))
    with pytest.raises(SystemExit, match="python=framework_python"):
        planning.ablate(train, planning.ABLATIONS["no-log-params"])
    assert "log:" in train.read_text()  # nothing written when an edit fails


def _jobs_by_shape(jobs, cells: set) -> tuple[set, set]:
    """The cells a listing's jobs make, and every other job as (rule, inputs, outputs); a
    same-jobs bare's rule `<rule>_<k>` is read as <rule>."""
    made = {f for job in jobs if job.makes_only(cells) for f in job.output}
    others = {
        (re.sub(r"_\d+$", "", job.rule), frozenset(job.input), frozenset(job.output))
        for job in jobs
        if not job.makes_only(cells)
    }
    return made, others


def test_the_bare_baseline_plans_the_projects_jobs_with_the_same_files(tmp_path):
    """planning.py's baseline ("a bare Snakefile with the same number of jobs",
    docs/pages/decisions/dry-run-baseline.md): built from the project's own dry-run listing, it
    plans as many jobs as the project, the same cells, and every other job with the same input and
    output files, so the same files link them."""
    planning = _planning()
    common = planning.common
    work = common.bench_checkout(ROOT, tmp_path / "project", common.default_venvs(ROOT))
    cfg, config, _ = common.write_study(work, 60, max_nodes=4)
    study = load_study(config, work)
    paths = [c.path for c in study.cells]
    env = common.child_env(work, BIN / "snakemake")
    project = planning.snakemake_cmd(BIN / "snakemake", work / "Snakefile", cfg)
    (tmp_path / "logs").mkdir()
    snakefile, bare_cfg, run = planning.same_jobs_bare(
        project, paths, work, cfg, tmp_path / "bare", env, tmp_path / "logs"
    )
    listing = run.log.read_text()
    n_jobs = sum(common.job_stats(listing).values())
    bare = snakemake(snakefile.parent, "-n", "--cores", "1", "--configfile", str(bare_cfg))
    assert bare.returncode == 0, bare.stdout[-3000:] + bare.stderr[-3000:]

    project_jobs = planning.bare_files.planned_jobs(listing)
    bare_jobs = planning.bare_files.planned_jobs(bare.stdout + bare.stderr)
    assert n_jobs == len(project_jobs) == len(bare_jobs) > len(paths) + 2
    made, others = _jobs_by_shape(project_jobs, set(paths))
    bare_made, bare_others = _jobs_by_shape(bare_jobs, set(paths))
    assert made == bare_made == set(paths)
    assert others == bare_others
    assert {rule for rule, _, _ in others} >= {"all", "collect", "figure", "report_pdf"}
    assert all(job.rule == "train" for job in bare_jobs if job.makes_only(set(paths)))
