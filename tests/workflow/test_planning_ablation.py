"""benchmarks/planning.py --ablate on the workflow as it is: each ablated copy of rules/train.smk
still plans every cell (so the benchmark measures a dry run, not an error), has lost exactly
what it names, and a train.smk that no longer holds a removed line stops the ablation."""

from __future__ import annotations

import importlib.util
import re

import pytest

from conftest import ROOT, copy_workflow, snakemake

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
