"""Hostile input beyond the bad-input corpus: Slurm arguments cannot be altered by hardware entries,
the launcher must match the executor, provenance names the project's own commit, metrics files
honour the umask, and the end-of-run message keeps cells apart from report steps."""

from __future__ import annotations

import os
import shlex
import subprocess

import pytest

from dlscale.outputs.latex_text import tex_escape
from dlscale.rank.provenance import NOT_A_CHECKOUT, git_commit, sources_hash
from dlscale.store.metrics import current_umask
from dlscale.study.matrix_checks import launcher_problem
from dlscale.study.resources import class_resources, slurm_extra_args
from dlscale.workflow.finalize import status_message

from helpers.cells import plugin_sbatch

HW = {
    "device": "cuda",
    "gpus_per_node": 4,
    "gpu_request": "gres",
    "gpu_type": "a100",
    "constraint": None,
    "exclusive": True,
    "partition": "gpu-a100",
    "cpus_per_rank": 8,
    "mem_mb_per_rank": 4000,
    "runtime_min": 30,
}


@pytest.mark.parametrize(
    "constraint",
    ["a|b", "a&b", "[rack1|rack2]*2", "gpu&(a|b)", "x;reboot", "$(id)", "a --wrap=id", "a'b\nc"],
)
@pytest.mark.parametrize("gpu_request", ["gres", "gpus"])
def test_a_constraint_is_one_argument_of_the_plugins_sbatch(constraint, gpu_request):
    """Whatever a constraint holds (the schema refuses the last four before this point), the
    shell that runs the Slurm plugin's sbatch line sees it as one argument, never as a command
    or another flag: it is the plugin's `constraint` resource (which the plugin quotes), and the
    flags dlscale adds itself (slurm_extra) are quoted one by one."""
    hw = {**HW, "constraint": constraint, "gpu_request": gpu_request}
    threads, res = class_resources({"ranks_per_node": 1}, hw, 2)
    assert shlex.split(res["slurm_extra"]) == slurm_extra_args(hw, 4)
    line = plugin_sbatch(res, threads)
    argv = shlex.split(line)
    assert argv[argv.index("-C") + 1] == constraint
    assert argv.count("-C") == 1 and not any(a.startswith("--wrap") for a in argv)
    gpus = "--gres=gpu:a100:4" if gpu_request == "gres" else "--gpus-per-node=a100:4"
    assert gpus in argv and "--exclusive" in argv and "--ntasks-per-node=4" in argv
    # the shell that runs the line gets the same arguments (printf prints one per line)
    out = subprocess.run(
        f"printf '%s\\n' {line.removeprefix('sbatch ')}",
        shell=True,
        capture_output=True,
        text=True,
    )
    assert out.stdout.split("\n")[:-1] == "\n".join(argv[1:]).split("\n")


def test_launcher_must_match_executor():
    assert "Add launcher=srun" in launcher_problem("slurm", "local", in_allocation=False)
    assert "outside any Slurm allocation" in launcher_problem("local", "srun", in_allocation=False)
    assert launcher_problem("local", "srun", in_allocation=True) is None
    assert launcher_problem("slurm", "srun", in_allocation=False) is None
    assert launcher_problem("local", "local", in_allocation=False) is None
    assert launcher_problem("dryrun", "local", in_allocation=False) is None


def test_config_hash_includes_the_launcher(root, base_config):
    from dlscale.study.matrix import load_study

    a = load_study(dict(base_config), root)
    b = load_study({**base_config, "launcher": "srun"}, root)
    assert a.config_hash != b.config_hash
    assert a.cells[0].config_hash != b.cells[0].config_hash


def _project(path):
    for part in ("Snakefile", "rules/x.smk", "scripts/dlscale/a.py", "envs/pytorch.txt"):
        (path / part).parent.mkdir(parents=True, exist_ok=True)
        (path / part).write_text(part)
    return path


def test_provenance_outside_a_checkout_is_a_sources_hash(tmp_path):
    project = _project(tmp_path / "p")
    got = git_commit(project)
    assert got == f"{NOT_A_CHECKOUT} (sources sha256:{sources_hash(project)})"
    (project / "rules" / "x.smk").write_text("changed")
    assert git_commit(project) != got


def test_provenance_ignores_an_enclosing_repository(tmp_path):
    outer = tmp_path / "outer"
    outer.mkdir()
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    subprocess.run(["git", "init", "-q", str(outer)], check=True, env=env)
    (outer / "f").write_text("x")
    subprocess.run(["git", "-C", str(outer), "add", "f"], check=True, env=env)
    subprocess.run(["git", "-C", str(outer), "commit", "-qm", "x"], check=True, env=env)
    project = _project(outer / "dlscale")
    assert git_commit(project).startswith(NOT_A_CHECKOUT)
    subprocess.run(["git", "init", "-q", str(project)], check=True, env=env)
    subprocess.run(["git", "-C", str(project), "add", "-A"], check=True, env=env)
    subprocess.run(["git", "-C", str(project), "commit", "-qm", "p"], check=True, env=env)
    head = subprocess.run(
        ["git", "-C", str(project), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    assert git_commit(project) == head


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077])
def test_metrics_files_honour_the_umask(tmp_path, mask):
    from dlscale.store import metrics

    old = os.umask(mask)
    try:
        assert current_umask() == mask
        path = tmp_path / "metrics.jsonl"
        original = metrics.validate_records
        metrics.validate_records = lambda records, where: None
        try:
            metrics.write_atomic(path, [{"x": 1}])
        finally:
            metrics.validate_records = original
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask


OUT = {"pdf": "results/demo/report/report.pdf", "status": "results/demo/tables/status.csv"}


def test_message_keeps_cells_apart_from_report_steps():
    done = status_message(
        measured=12, failed=0, missing=0, n_planned=12, out=OUT, pdf_problem="no TeX"
    )
    assert "cells measured: all 12 of 12" in done and "Report steps failed" in done
    assert "incomplete" not in done and "no cell is measured again" in done
    part = status_message(measured=10, failed=1, missing=1, n_planned=12, out=OUT)
    assert "study incomplete: cells measured: 10 of 12; 1 failed, 1 missing" in part


def test_title_specials_are_escaped():
    assert tex_escape("{word} 100% & $x_1$ é") == r"\{word\} 100\% \& \$x\_1\$ é"
