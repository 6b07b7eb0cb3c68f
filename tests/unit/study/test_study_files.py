"""A study runs only what it names: a study file (`--config study_file=...` or a --configfile)
takes no `workloads` from config/config.yaml, so one that names only its own hardware and models
measures throughput only; one that lists convergence takes the convergence keys it leaves out
from config/config.yaml and the run says which; a study without throughput cells has no default
plan jobs (dlscale.study.matrix.workflow_settings, inherited_notice, Study.throughput_models)."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

from dlscale.decisions.plan_jobs import NOTHING_TO_PLAN, PlanError, jobs_from_config, plan_problems
from dlscale.decisions.planner import plan_from_config
from dlscale.study.matrix import inherited_notice, load_workflow_study
from dlscale.study.partitions import partitions_from_hardware


def study_file(tmp_path, name: str, **keys) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"study": name, **keys}))
    return str(path)


def test_a_study_file_that_names_no_workloads_measures_throughput_only(root, tmp_path):
    """The user's first study names its hardware and model: no convergence cells on an entry it
    never named (before: config/config.yaml's 4 convergence cells on `cpu`), nothing said."""
    mine = study_file(tmp_path, "mine", axes={"hardware": ["cpu"], "model": ["cnn_small"]})
    study = load_workflow_study({"study_file": mine}, root)
    assert study.config["workloads"] == ["throughput"]
    assert study.cells_of("convergence") == [] and len(study.cells) == len(
        study.cells_of("throughput")
    )
    assert {c.model for c in study.cells} == {"cnn_small"}
    assert inherited_notice(study) is None
    # the same file given with Snakemake's --configfile (its keys are in Snakemake's config)
    given = yaml.safe_load(open(mine))
    assert load_workflow_study(given, root, [mine]).cells_of("convergence") == []
    # the default study (config/config.yaml, no study file) keeps both workloads
    demo = load_workflow_study({}, root)
    assert len(demo.cells_of("convergence")) == 4 and demo.inherited == ()


def test_a_study_that_lists_convergence_is_told_what_it_took_from_the_default(root, tmp_path):
    own = {"target_accuracy": 0.5, "axes": {"hardware": ["cpu"], "nodes": [1]}}
    mine = study_file(tmp_path, "conv", workloads=["convergence"], convergence=own)
    study = load_workflow_study({"study_file": mine}, root)
    assert study.cells_of("throughput") == [] and study.cells_of("convergence")
    assert "convergence.target_accuracy" not in study.inherited
    assert "convergence.axes.nodes" not in study.inherited
    assert {"convergence.dataset", "convergence.axes.policy"} <= set(study.inherited)
    notice = inherited_notice(study)
    assert f"study 'conv' ({mine})" in notice and "config/config.yaml" in notice
    assert (
        "dataset" in notice and "target_accuracy" not in notice and f"Set them in {mine}" in notice
    )
    # a section stated in full takes nothing (config/studies/frameworks.yaml)
    frameworks = load_workflow_study({"study_file": "config/studies/frameworks.yaml"}, root)
    assert frameworks.inherited == () and inherited_notice(frameworks) is None


def test_a_study_without_throughput_cells_has_no_default_plan_jobs(root, tmp_path):
    """Before: the default jobs were axes.model (taken from config/config.yaml), and the dry run
    refused the study ("plan: job 'cnn_small': no measured series ...")."""
    mine = study_file(tmp_path, "conv", workloads=["convergence"])
    study = load_workflow_study({"study_file": mine}, root)
    assert study.config["axes"]["model"] and study.throughput_models() == []
    plan = study.config["plan"]
    assert jobs_from_config(plan, study.throughput_models()) == []
    partitions = partitions_from_hardware(study.hardware)
    assert (
        plan_problems(plan, study.throughput_models(), study.cells_of("throughput"), partitions)
        == []
    )
    with pytest.raises(PlanError, match="nothing to plan"):
        plan_from_config(pd.DataFrame(), plan, study.hardware, study.throughput_models())
    assert "no throughput cells" in NOTHING_TO_PLAN
    # a throughput study plans its throughput models, in axes.model's order
    demo = load_workflow_study({}, root)
    assert demo.throughput_models() == ["cnn_small", "gpt2_tiny"]
    # jobs the study names are still checked: a model without throughput cells is refused
    named = {**plan, "jobs": [{"model": "cnn_small", "samples": 1000}]}
    assert plan_problems(named, [], study.cells_of("throughput"), partitions)
