"""The complete H100 site entry that docs/pages/gpu.md prints (section 7) is what a site can
write in config/hardware.yaml alone: it validates as printed, a 2-node study plans on it, and the
cell job's sbatch flags and the ranks' srun command carry each part (driver, modules, env,
container, binding, the site's own options), built by the production functions."""

from __future__ import annotations

import re

import pytest
import yaml

from dlscale.run.launchers import launcher_base
from dlscale.run.launchers import srun as srun_launcher
from dlscale.study.config import apply_defaults, load_schema
from dlscale.study.hardware import validate_hardware
from dlscale.study.matrix import build_matrix
from dlscale.study.resources import class_resources

from helpers.checkout import ROOT

MARK = "<!-- site-entry:h100 -->"


@pytest.fixture(scope="module")
def entry() -> dict:
    text = (ROOT / "docs" / "pages" / "gpu.md").read_text()
    block = re.search(re.escape(MARK) + r"\n```yaml\n(.*?)```", text, re.S)
    assert block, f"docs/pages/gpu.md has no {MARK} yaml block"
    return yaml.safe_load(block.group(1))


def test_the_documented_h100_entry_validates_and_plans(entry, tmp_path):
    hw = yaml.safe_load((ROOT / "config" / "hardware.yaml").read_text())
    hw.update(entry)
    hw = validate_hardware(hw, load_schema(ROOT / "config" / "schemas" / "hardware.schema.json"))
    config = yaml.safe_load((ROOT / "tests" / "fixtures" / "tiny.yaml").read_text())
    config.update(launcher="srun", workloads=["throughput"])
    config["axes"]["hardware"] = ["h100"]
    schema = load_schema(ROOT / "config" / "schemas" / "config.schema.json")
    study = build_matrix(apply_defaults(schema, config), hw)
    cell = next(c for c in study.cells if c.nodes == 2)
    digest = entry["h100"]["container"]["image"].rsplit("@", 1)[1]
    assert cell.environment == f"container-pyxis:{digest[7:23]}"
    assert cell.modules == ("slurm-pmix/4.2",) and dict(cell.env)["NCCL_IB_HCA"] == "mlx5"
    # the cell job: GRES per node, exclusive, the site's sbatch option
    _, res = class_resources(study.config, hw["h100"], 2)
    assert res["gres"] == "gpu:h100:4" and res["slurm_partition"] == "gpu-h100"
    assert "--switches=1@10:00" in res["slurm_extra"] and "--exclusive" in res["slurm_extra"]
    # the ranks' step: the site's srun option, pyxis's options, the binding, then the rank
    rank_dir = tmp_path / "cell" / ".ranks"
    rank_dir.mkdir(parents=True)
    env = {}
    options, argv = launcher_base.in_container(
        cell, ["python", "-m", "dlscale.run.train"], rank_dir, env
    )
    cmd = srun_launcher.srun_command(cell, argv, rank_dir, False, options)
    assert cmd[1] == "--mpi=pmix"
    assert f"--container-image={entry['h100']['container']['image']}" in cmd
    assert any(a.startswith("--container-mounts=/scratch,") for a in cmd)
    assert "--gpu-bind=closest" in cmd
    assert cmd[-3:] == ["/usr/bin/python", "-m", "dlscale.run.train"]
