"""The commands the workflow's messages print (dlscale.workflow.advice): the user's own command
line with the setting inside its one --config, read back with Snakemake's own parser."""

from __future__ import annotations

import os
import shlex

import pytest

from dlscale.workflow.advice import Invocation, with_config, with_launcher, with_target


@pytest.fixture(autouse=True)
def _in_the_checkout(root, monkeypatch):
    monkeypatch.chdir(root)  # the profiles are found as the user's command names them
    monkeypatch.delenv("SNAKEMAKE_PROFILE", raising=False)


def test_a_setting_joins_the_commands_one_config():
    run = Invocation.parse(["--profile", "profiles/local", "--config", "study_file=s.yaml"])
    assert run.executor == "local"
    assert run.with_config(remeasure=True) == (
        "snakemake --profile profiles/local --config study_file=s.yaml remeasure=True"
    )
    # a setting already given is replaced, not repeated
    assert Invocation.parse(["--config", "steps=2", "remeasure=False"]).with_config(
        remeasure=True
    ) == ("snakemake --config steps=2 remeasure=True")


def test_the_pdf_later_is_the_runs_own_command_with_the_pdf_first():
    """The no-TeX notice's command: the target before the options (after --config it
    would be read as an entry), the study file kept, a dry run's flag dropped."""
    pdf = "results/mine/report/report.pdf"
    run = Invocation.parse(["--profile", "profiles/slurm", "-n", "--config", "study_file=m.yaml"])
    assert run.with_target(pdf) == (
        f"snakemake {pdf} --profile profiles/slurm --config study_file=m.yaml"
    )
    forced = Invocation.parse(["--profile", "profiles/local", "--forcerun", "collect", "figure"])
    assert forced.with_target(pdf) == f"snakemake {pdf} --profile profiles/local"
    assert with_target(None, pdf) == (f"snakemake {pdf} with this run's --profile and --config")


def test_the_studys_launcher_is_the_command_with_its_profile_and_launcher():
    """A study measured with srun is measured again with the Slurm profile and launcher=srun:
    the run's own command with its profile (and executor) replaced and launcher=srun in its one
    --config, everything else kept; never the same command with remeasure=True."""
    cell = "results/tiny/runs/cpu/pytorch/cnn_small/weak/fp32/eager/n2/r1/metrics.jsonl"
    forced = Invocation.parse(["--profile", "profiles/local", "--forcerun", cell])
    assert forced.with_launcher("srun") == (
        f"snakemake --profile profiles/slurm --forcerun {cell} --config launcher=srun"
    )
    study = Invocation.parse(["-n", "--profile=profiles/local", "-C", "study_file=m.yaml"])
    assert study.with_launcher("srun", remeasure=True) == (
        "snakemake -n --profile profiles/slurm --config study_file=m.yaml launcher=srun "
        "remeasure=True"
    )
    bare = Invocation.parse(["--executor", "local", "--cores", "2"])
    assert bare.with_launcher("srun") == (
        "snakemake --profile profiles/slurm --cores 2 --config launcher=srun"
    )
    assert Invocation.parse(["--profile", "profiles/slurm"]).with_launcher("local") == (
        "snakemake --profile profiles/local --config launcher=local"
    )
    said = with_launcher(None, "srun")
    assert "--profile profiles/slurm" in said and "launcher=srun" in said


def test_the_profiles_config_list_is_kept_when_the_command_gives_none():
    """`--profile profiles/slurm` alone: Snakemake used the profile's `config:` (launcher=srun);
    the printed command names it, since a --config replaces that list."""
    run = Invocation.parse(["--profile", "profiles/slurm", "-n"])
    assert run.executor == "dlscale"  # the profile's executor, for a dry run too
    assert run.with_config(remeasure=True) == (
        "snakemake --profile profiles/slurm -n --config launcher=srun remeasure=True"
    )


@pytest.mark.parametrize(
    "tokens, merged",
    [
        (
            ["--config", "study_file=s.yaml", "--config", "remeasure=True"],
            "snakemake --config study_file=s.yaml remeasure=True",
        ),
        (
            ["-n", "--config=study_file=s.yaml", "-C", "remeasure=True", "steps=2"],
            "snakemake -n --config study_file=s.yaml remeasure=True steps=2",
        ),
        (
            ["target.md", "-Cstudy_file=s.yaml", "--cores", "1", "--config", "a=b"],
            "snakemake target.md --cores 1 --config study_file=s.yaml a=b",
        ),
    ],
)
def test_a_second_config_is_refused_with_the_merged_command(tokens, merged):
    message = Invocation.parse(tokens).repeated_options()
    assert message.startswith("--config was given 2 times; Snakemake keeps only the last one")
    assert message.endswith(f"Give them in one --config:\n  {merged}")


def test_a_second_configfile_is_refused_and_one_config_is_not(tmp_path):
    for name in ("a.yaml", "b.yaml"):
        (tmp_path / name).write_text("steps: 2\n")
    a, b = (str(tmp_path / n) for n in ("a.yaml", "b.yaml"))
    message = Invocation.parse(["--configfile", a, "--configfile", b]).repeated_options()
    assert f"--configfile {a} would be ignored" in message
    assert message.endswith(f"snakemake --configfile {a} {b}")
    assert (
        Invocation.parse(["--config", "a=1", "b=2", "--configfile", a]).repeated_options() is None
    )


def test_values_that_need_quoting_are_quoted():
    """A value with spaces and quotes comes back as the shell splits it: one token."""
    run = Invocation.parse(["--config", "report={'title': 'My study'}"])
    printed = run.with_config(remeasure=True)
    assert shlex.split(printed) == [
        "snakemake",
        "--config",
        "report={'title': 'My study'}",
        "remeasure=True",
    ]


def test_outside_the_snakemake_command_the_message_says_what_to_add(monkeypatch):
    monkeypatch.setattr("sys.argv", ["/usr/bin/python3", "-c", "..."])
    assert Invocation.current() is None
    assert with_config(None, remeasure=True).startswith(
        "your command with remeasure=True added to its one --config"
    )
    monkeypatch.setattr("sys.argv", [os.path.join("venv", "bin", "snakemake"), "-n"])
    assert Invocation.current().tokens == ("-n",)


def test_a_command_line_that_does_not_read_back_gives_no_command(monkeypatch):
    """A profile named relative to another folder (snakemake --directory ...): Snakemake's
    parser exits here; the workflow goes on and its messages say what to add."""
    monkeypatch.setattr("sys.argv", ["snakemake", "--profile", "no/such/profile"])
    assert Invocation.current() is None
