"""A target typed after `--config` (dlscale.workflow.config_option): the `snakemake` command
refuses it in one line that shows the working order, before any work, never with a traceback;
the printed command, and every other place Snakemake takes a target, read it as a target."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dlscale.workflow.config_option import refusal, working_order

ROOT = Path(__file__).resolve().parents[3]
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    """A folder with the local profile, as the command finds it (no workflow: a refusal reads
    none)."""
    shutil.copytree(ROOT / "profiles/local", tmp_path / "profiles/local")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def parsed(tokens: list[str]):
    """What Snakemake's own parser reads from `tokens` (the profile applied): targets, config."""
    from snakemake.cli import parse_args

    _, args = parse_args(tokens)
    return list(args.targets), list(args.config or ())


def test_a_target_after_config_is_refused_in_one_line_with_the_working_order(checkout):
    command = "--profile profiles/local --config study_file=x.yaml check"
    env = dict(os.environ, PATH=f"{Path(SNAKEMAKE).parent}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run(
        ["snakemake", *shlex.split(command)], cwd=checkout, env=env, capture_output=True, text=True
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "Traceback" not in out, out
    (error,) = [line for line in out.splitlines() if line.strip()][1:]  # after the profile line
    works = "snakemake check --profile profiles/local --config study_file=x.yaml"
    assert error.startswith("Error: `check` after --config is not a KEY=VALUE setting"), error
    assert error.endswith(f"name targets before --config: {works} (nothing was run)"), error
    assert sorted(p.name for p in checkout.iterdir()) == ["profiles"]  # nothing was written
    # the printed command: the target is a target, the setting a setting
    assert parsed(shlex.split(works)[1:]) == (["check"], ["study_file=x.yaml"])


@pytest.mark.parametrize(
    "tokens, target",
    [
        ("check --profile profiles/local --config study_file=x.yaml", "check"),
        ("--profile profiles/local check --config study_file=x.yaml", "check"),
        ("--profile profiles/local --config study_file=x.yaml -- check", "check"),
        ("study_archive --profile profiles/local --config study_file=x.yaml", "study_archive"),
    ],
)
def test_targets_work_wherever_snakemake_takes_them(checkout, tokens, target):
    assert parsed(shlex.split(tokens)) == ([target], ["study_file=x.yaml"])


@pytest.mark.parametrize(
    "typed, moved, works",
    [
        # every word that is not KEY=VALUE moves first; the other entries stay in their --config
        (
            "--profile profiles/slurm --config study_file=x.yaml check study_archive pack=10",
            ["check", "study_archive"],
            "check study_archive --profile profiles/slurm --config study_file=x.yaml pack=10",
        ),
        # a --config of targets only is dropped: an empty one would replace the profile's list
        (
            "--profile profiles/local --config check -n",
            ["check"],
            "check --profile profiles/local -n",
        ),
        (
            "-C study_file=x.yaml results/a/compare/b/summary.md",
            ["results/a/compare/b/summary.md"],
            "results/a/compare/b/summary.md -C study_file=x.yaml",
        ),
    ],
)
def test_the_working_order_moves_the_targets_first(typed, moved, works):
    assert working_order(shlex.split(typed)) == (moved, shlex.split(works))
    line = refusal(moved[:1], ["snakemake", *shlex.split(typed)])
    assert line.startswith(", ".join(f"`{w}`" for w in moved) + " after --config")
    assert line.endswith(f"name targets before --config: snakemake {works} (nothing was run)")
    assert "\n" not in line


def test_outside_the_snakemake_command_the_refusal_says_where_targets_go():
    line = refusal(["check"], ["python", "-c", "..."])
    assert line == (
        "`check` after --config is not a KEY=VALUE setting: Snakemake reads every word after "
        "--config up to the next option as a setting, so a target there is not run; name "
        "targets before --config (or after `--`). Nothing was run."
    )
