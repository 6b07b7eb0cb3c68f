"""Charliecloud for real, as a plain user, on the local cluster: an image built from Debian's
debootstrap (--variant=minbase) with the PyTorch environment of envs/pytorch.txt
(scripts/build-image.sh, once per machine, then cached), named by a hardware entry's
`container:`; a user without root runs the tiny study with snakemake --profile profiles/slurm.
The container entry's preflight and cells run their ranks inside the image (ch-run from Debian's
charliecloud-runtime), the venv entry's beside them, and both give the same metrics columns."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from dlscale.store.preflight_results import read_result
from dlscale.study.container_image import local_digest

from helpers import run_names
from helpers.checkout import ROOT, copy_workflow
from helpers.plain_user import driver_for, plain_user, remove_home

pytestmark = [pytest.mark.slurm, pytest.mark.workflow]

USER = "dlscale-ch"  # the run's own user is dlscale-ch-<run> (helpers.plain_user)
IMAGES = Path("/var/tmp/dlscale-images")  # shared by every run on this machine, keyed, locked
IMAGE_PYTHON = "/opt/dlscale/pytorch/bin/python"


def _top(path: Path) -> str:
    return "/" + path.resolve().parts[1]


@pytest.fixture(scope="module")
def image() -> Path:
    if not shutil.which("ch-run") or not shutil.which("debootstrap"):
        pytest.fail("ch-run or debootstrap missing: bash scripts/setup.sh --system-packages")
    # the checkout's file system needs a mount point in the image (ch-run binds onto existing
    # directories only); /tmp and /var/tmp are in every Debian image
    mounts = [] if _top(ROOT) in ("/tmp", "/var") else ["--mount-point", _top(ROOT)]
    build = subprocess.run(
        ["bash", str(ROOT / "scripts" / "build-image.sh"), str(IMAGES), *mounts],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    return Path(build.stdout.strip().splitlines()[-1])


def found(record, key: str):
    """The first value of `key` anywhere in a nested record."""
    if isinstance(record, dict):
        if key in record:
            return record[key]
        record = list(record.values())
    if isinstance(record, list):
        for value in record:
            hit = found(value, key)
            if hit is not None:
                return hit
    return None


def test_a_plain_user_runs_cells_in_a_charliecloud_image_with_the_venv_cells_columns(
    cluster, image
):
    user = plain_user(USER)
    driver = driver_for(user)
    print(f"driver environment: {driver.why}")
    work = run_names.run_path("containers")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    tiny = yaml.safe_load((ROOT / "tests" / "fixtures" / "tiny.yaml").read_text())
    tiny["workloads"] = ["throughput"]
    tiny["axes"]["hardware"] = ["cpu", "boxed"]
    copy_workflow(work, tiny)
    site = work / "config" / "hardware.yaml"
    entries = yaml.safe_load(site.read_text())
    binds = sorted({"/var/tmp", _top(ROOT)} - {"/tmp"})
    entries["boxed"] = {
        **entries["cpu"],
        "description": "CPU nodes, ranks in a Charliecloud image",
        "container": {
            "engine": "charliecloud",
            "image": str(image),
            "python": IMAGE_PYTHON,
            "binds": binds,
        },
    }
    site.write_text(yaml.safe_dump(entries))
    subprocess.run(["chown", "-R", f"{user.name}:{user.name}", str(work)], check=True)
    env = {**driver.env(), "SLURM_CONF": os.environ["SLURM_CONF"]}
    # the cells only (their preflights included): the report's rules are the venv route's
    cell = "pytorch/cnn_small/weak/fp32/eager/n{}/r1/metrics.jsonl"
    runs = work / "results" / "tiny" / "runs"
    cells = {hw: [runs / hw / cell.format(n) for n in (1, 2)] for hw in ("cpu", "boxed")}
    targets = [str(p.relative_to(work)) for paths in cells.values() for p in paths]
    try:
        proc = user.run(
            work, env, str(driver.python), "-m", "snakemake", "--profile", "profiles/slurm",
            *targets, timeout=600,
        )  # fmt: skip
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-4000:]
        assert all(p.exists() for paths in cells.values() for p in paths), cells

        def records(path: Path) -> list[dict]:
            return [json.loads(line) for line in path.read_text().splitlines()]

        def columns(path: Path) -> dict[str, set[str]]:
            """Each record kind's keys, with its value's keys where it is a mapping."""
            out: dict[str, set[str]] = {}
            for r in records(path):
                keys = out.setdefault(r["event"], set())
                keys |= set(r)
                if isinstance(r.get("value"), dict):
                    keys |= {f"value.{k}" for k in r["value"]}
            return out

        # the same columns, cell by cell (1 node and 2 nodes)
        for venv_cell, boxed_cell in zip(cells["cpu"], cells["boxed"], strict=True):
            assert columns(boxed_cell) == columns(venv_cell)
        digest = local_digest(image)  # root's view; the user's cache computed the same
        for path in cells["boxed"]:
            recs = records(path)
            start = next(r for r in recs if r["event"] == "run_start")["value"]
            assert start["cell"]["environment"] == f"container-charliecloud:{digest[7:23]}"
            assert start["cell"]["container"]["image"] == str(image)
            ranks = [r["value"] for r in recs if r["event"] == "rank_start"]
            # every rank's interpreter was the image's
            assert ranks and {found(r, "executable") for r in ranks} == {IMAGE_PYTHON}
        for path in cells["cpu"]:
            start = next(r for r in records(path) if r["event"] == "run_start")["value"]
            assert start["cell"]["environment"].startswith("pytorch:")
            assert "container" not in start["cell"]
        # the entry's preflight ran its ranks inside the same image
        results = [r for r in map(read_result, work.glob("results/tiny/preflight/*.json")) if r]
        boxed = next(r for r in results if r["hardware"] == "boxed")
        assert boxed["passed"], boxed
        assert {b["prefix"] for b in boxed["container"]["ranks"]} == {
            str(Path(IMAGE_PYTHON).parent.parent)
        }
        plain = next(r for r in results if r["hardware"] == "cpu")
        assert plain["passed"] and "container" not in plain
    finally:  # nothing of the run's is left behind, on success or failure
        shutil.rmtree(work, ignore_errors=True)
        remove_home(user)
