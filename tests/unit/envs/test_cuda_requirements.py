"""The CUDA environments resolve on PyPI to CUDA builds. Their wheels are GBs, so
pip resolves each envs/*-cuda.txt as scripts/setup.sh installs it (--isolated: PyPI only, no
local CPU wheel or constraint can stand in) with --dry-run, nothing installed. The index serves no
separate metadata files (PEP 658), so a plain --dry-run downloads every wheel in full (~2.5 GB an
environment; a CI run failed on a full disk and on an interrupted 423 MB download): pip's fast-deps
reads each wheel's METADATA with HTTP range requests instead (12.7 MB for pytorch-cuda, the same 38
names, versions and URLs as the full download; pip falls back to the full wheel where a server has
no range support). Needs PyPI (CI has it); skipped offline outside CI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _pypi_reachable() -> bool:
    try:
        urllib.request.urlopen("https://pypi.org/simple/pip/", timeout=10).close()
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def resolve():
    if not os.environ.get("CI") and not _pypi_reachable():
        pytest.skip("PyPI is not reachable (CI runs this test)")
    cwd = ROOT / "envs"

    def run(env: str, tmp: Path) -> dict[str, tuple[str, str]]:
        report = tmp / f"{env}.json"
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--isolated",
                "--dry-run",
                "--use-feature=fast-deps",
                "--ignore-installed",
                "--only-binary=:all:",
                "--quiet",
                "--report",
                str(report),
                "-r",
                f"{env}.txt",
            ],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=600,
            env=dict(os.environ, PIP_CONFIG_FILE=os.devnull),
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return {
            item["metadata"]["name"].lower().replace("_", "-"): (
                item["metadata"]["version"],
                item["download_info"]["url"],
            )
            for item in json.loads(report.read_text())["install"]
        }

    return run


def nvidia(resolved: dict, suffix: str) -> list[str]:
    return sorted(n for n in resolved if n.startswith("nvidia-") and n.endswith(suffix))


def test_pytorch_cuda_resolves_to_the_cuda_build(resolve, tmp_path):
    resolved = resolve("pytorch-cuda", tmp_path)
    version, url = resolved["torch"]
    assert version == "2.13.0" and url.startswith("https://files.pythonhosted.org/"), url
    assert "nvidia-nccl-cu13" in resolved and "nvidia-cudnn-cu13" in resolved, sorted(resolved)
    assert resolved["nvidia-ml-py"][0] == "13.615.71"
    assert all(u.startswith("https://") for _, u in resolved.values())  # nothing local


def test_tensorflow_cuda_brings_its_cuda_libraries(resolve, tmp_path):
    resolved = resolve("tensorflow-cuda", tmp_path)
    assert resolved["tensorflow"][0] == "2.21.0"
    libraries = nvidia(resolved, "-cu12")
    assert "nvidia-cudnn-cu12" in libraries and "nvidia-cublas-cu12" in libraries, libraries


def test_horovod_cuda_has_torch_with_nccl(resolve, tmp_path):
    resolved = resolve("horovod-cuda", tmp_path)
    assert resolved["torch"][0] == "2.13.0"
    assert "nvidia-nccl-cu13" in resolved  # the NCCL scripts/build-horovod.sh --cuda links


def test_mxnet_cuda_is_the_cuda_117_build(resolve, tmp_path):
    resolved = resolve("mxnet-cuda", tmp_path)
    assert resolved["mxnet-cu117"][0] == "1.9.1"
    assert "mxnet" not in resolved  # the CPU build is not pulled in beside it
