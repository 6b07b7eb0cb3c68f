"""The rule that writes the shipped digits (rules/data.smk) in a copy of the workflow: every
format written once and valid, a job reading them through `shipped_data()` not re-run when the
data are rewritten or touched (ancient), nothing re-written when up to date."""

from __future__ import annotations

import os

import pytest

from dlscale.data import FORMATS, inspect_dataset

from helpers.checkout import copy_workflow, snakemake

pytestmark = pytest.mark.workflow

CONSUMER = """

rule read_digits:
    input:
        shipped_data("webdataset"),
    output:
        "results/data/read.txt",
    shell:
        "ls {input} > {output}"
"""


def test_shipped_digits_rule(tmp_path, base_config):
    work = copy_workflow(tmp_path, base_config)
    with open(work / "Snakefile", "a") as fh:
        fh.write(CONSUMER)
    targets = [f"results/data/digits/{f}" for f in FORMATS] + ["results/data/read.txt"]
    proc = snakemake(work, "--profile", "profiles/local", *targets)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for fmt in FORMATS:
        info = inspect_dataset(work / "results" / "data" / "digits" / fmt, fmt)
        assert (info.train_samples, info.val_samples, info.num_classes) == (1438, 359, 10)
        assert (work / "results" / "data" / "logs" / f"digits_{fmt}.log").is_file()
    assert "train-000000.tar" in (work / "results" / "data" / "read.txt").read_text()

    # newer data files (a rewrite, a copy) do not re-run what reads them
    shards = work / "results" / "data" / "digits" / "webdataset"
    for f in [shards, *shards.iterdir()]:
        os.utime(f)
    proc = snakemake(work, "--profile", "profiles/local", *targets)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Nothing to be done" in proc.stdout + proc.stderr, proc.stdout[-3000:]
