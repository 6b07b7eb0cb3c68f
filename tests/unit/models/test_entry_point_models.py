"""A user's package brings its model by entry point (config `models:`, source `entry_point`):
the example package (tests/fixtures/models/dlscale-example-models) installed by pip into an
environment of this test's own (helpers.model_package: a venv over the driver's
site-packages, never .venv itself), listed by `python -m dlscale.workflow.models_command
list`, used by a study (its cells name the package and its version, parameters as the
builder's model has them), and re-measured under a new version; a missing entry point and a
builder that cannot be imported refused when the study is parsed, naming the installed entry
points and the import error (both before torch starts in the probe)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
import yaml

from dlscale.models import zoo
from dlscale.study.config import ConfigError
from dlscale.study.matrix import load_study

from helpers.checkout import ROOT
from helpers.model_package import install, own_venv

TINY = yaml.safe_load((ROOT / "tests" / "fixtures" / "tiny.yaml").read_text())
# the example's parameters at width 8, 2 blocks: convs 3*8*9 + 8*16*9, batch norms 2*(8 + 16),
# head 16*10 + 10
PARAMS = 3 * 8 * 9 + 8 * 16 * 9 + 2 * (8 + 16) + 16 * 10 + 10


def study(models: dict) -> dict:
    config = copy.deepcopy(TINY)
    config.update(study="own_package", workloads=["throughput"], models=models)
    config["axes"]["model"] = list(models)
    return config


def test_a_package_model_by_entry_point(tmp_path):
    env = tmp_path / "my-models"
    python = own_venv(env)
    install(python, "0.1.0", tmp_path)
    listed = subprocess.run(
        [
            sys.executable,
            "-m",
            "dlscale.workflow.models_command",
            "list",
            "--environment",
            str(env),
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    assert "example_convnet    dlscale-example-models 0.1.0" in listed
    models = {
        "convnet": {
            "entry_point": "example_convnet",
            "environment": str(env),
            "kwargs": {"width": 8, "blocks": 2},
        }
    }
    try:
        first = load_study(study(models), ROOT).cells
        record = json.loads(first[0].model_source)
        assert (record["distribution"], record["version"]) == ("dlscale-example-models", "0.1.0")
        facts = record["facts"]
        assert facts["param_count"] == PARAMS and facts["fsdp_units"] == ["net.*"]
        assert first[0].environment.startswith("my-models:")
        # a new version: its cells get a new identity (re-measured; the old ones kept)
        install(python, "0.2.0", tmp_path)
        second = load_study(study(models), ROOT).cells
        assert json.loads(second[0].model_source)["version"] == "0.2.0"
        assert {c.config_hash for c in first}.isdisjoint({c.config_hash for c in second})
        # a missing entry point, and a builder that cannot be imported
        site = next((env / "lib").glob("python*/site-packages"))
        (site / "broken_models.py").write_text("import timm_not_installed\n")
        info = site / "broken_models-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-models\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text("[dlscale.models]\nbroken = broken_models:build\n")
        bad = {
            "missing": {"entry_point": "no_such_model", "environment": str(env)},
            "broken": {"entry_point": "broken", "environment": str(env)},
        }
        with pytest.raises(ConfigError) as refused:
            load_study(study(bad), ROOT)
        message = str(refused.value)
        assert "no entry point 'no_such_model'" in message
        assert "installed: broken, example_convnet" in message
        assert "cannot be imported: ModuleNotFoundError: No module named 'timm_not_installed'" in (
            message
        )
    finally:
        zoo.unregister_all()
