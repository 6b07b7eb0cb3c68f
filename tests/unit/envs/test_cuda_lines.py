"""CUDA wheel lines chosen by the driver (issue 45): an entry that states a driver which cannot
run PyPI's CUDA 13 torch gets PyTorch's newest line it runs (cu128, cu126), an environment of its
own with its own identity, installed from PyTorch's index (or a site's mirror). PyTorch's index
is not reachable from the project's machines: the resolution is checked against a local index
built here (PEP 503 pages with PEP 658 metadata files) whose stand-in wheels carry the pins of
envs/ and the two lines' torch builds, through pip itself with setup.sh's own index arguments."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from dlscale.registry import __main__ as registry_cli
from dlscale.registry.frameworks import FRAMEWORKS, environments
from dlscale.study.matrix import load_study, workflow_config

ROOT = Path(__file__).resolve().parents[3]
PYTORCH = FRAMEWORKS["pytorch"]


@pytest.mark.parametrize(
    ("stated", "environment"),
    [
        ({"nvidia_driver": "550.54.15"}, "pytorch-cu128"),  # R550: CUDA 12.x, not 13
        ({"nvidia_driver": "535.183.01"}, "pytorch-cu128"),  # R535 LTSB
        ({"max_cuda": "12.2"}, "pytorch-cu128"),  # nvidia-smi's "CUDA Version" only
        ({"nvidia_driver": "580.65.06"}, "pytorch-cuda"),  # R580 runs PyPI's CUDA 13 build
        ({}, "pytorch-cuda"),  # nothing stated: as before, and so the same identity
        ({"nvidia_driver": "470.82.01"}, "pytorch-cuda"),  # no line fits: the check refuses
        ({"nvidia_driver": "550.54.15", "cuda_forward_compat": True}, "pytorch-cuda"),
    ],
)
def test_the_driver_chooses_the_line(stated, environment):
    entry = {"device": "cuda", **stated}
    assert PYTORCH.environment_for("cuda", entry) == environment
    assert PYTORCH.environment_for("cpu", entry) is None  # CPU cells: the driver's .venv
    assert FRAMEWORKS["horovod"].environment_for("cuda", entry) == "horovod-cuda"  # no lines


def test_each_line_is_an_environment_of_its_own_with_its_own_identity(tmp_path):
    assert environments("cuda")[-2:] == ["pytorch-cu128", "pytorch-cu126"]
    text = (ROOT / "config" / "hardware.yaml").read_text()
    r550 = text.replace(
        "  device_model: NVIDIA H100 80GB HBM3\n",
        '  device_model: NVIDIA H100 80GB HBM3\n  nvidia_driver: "550.54.15"\n',
    )
    (tmp_path / "hw.yaml").write_text(r550)
    axes = {"framework": ["pytorch"], "hardware": ["h100"], "nodes": [1]}
    config = {"axes": axes, "workloads": ["throughput"]}
    default = load_study(workflow_config(config, ROOT), ROOT)
    lined = load_study(
        workflow_config({**config, "hardware_file": str(tmp_path / "hw.yaml")}, ROOT), ROOT
    )
    assert {c.environment.split(":")[0] for c in default.cells} == {"pytorch-cuda"}
    assert {c.environment.split(":")[0] for c in lined.cells} == {"pytorch-cu128"}
    # same path, another identity: a cell measured in the CUDA 13 build is not this one
    assert [c.path for c in default.cells] == [c.path for c in lined.cells]
    assert all(a.config_hash != b.config_hash for a, b in zip(default.cells, lined.cells))


def test_setup_installs_a_line_from_pytorchs_index_or_the_sites_mirror():
    assert registry_cli.pip_index("pytorch-cu128", {}) == [
        "--index-url=https://download.pytorch.org/whl/cu128",
        "--extra-index-url=https://pypi.org/simple",
    ]
    mirror = {"DLSCALE_TORCH_INDEX": "https://mirror.site/torch/", "DLSCALE_PYPI_INDEX": "x"}
    assert registry_cli.pip_index("pytorch-cu126", mirror)[0] == (
        "--index-url=https://mirror.site/torch/cu126"
    )
    assert registry_cli.pip_index("pytorch-cuda", {}) == []  # PyPI only, as before
    # what setup.sh reads: nothing at all (not an empty line) for every other environment, so
    # they keep their pip settings (an empty line once made setup.sh install horovod --isolated,
    # which ignored the local CPU torch wheel and pulled PyPI's CUDA 13 torch)
    for env in ["tensorflow", "horovod", "mxnet", "pytorch-cuda", "horovod-cuda", "pytorch-cu128"]:
        out = subprocess.run(
            [sys.executable, "-S", "-m", "dlscale.registry", "pip-index", env],
            cwd=ROOT, env={"PYTHONPATH": str(ROOT / "scripts")}, capture_output=True, text=True,
            check=True,
        ).stdout  # fmt: skip
        assert out == (
            "" if env != "pytorch-cu128" else "\n".join(registry_cli.pip_index(env)) + "\n"
        )
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert 'registry_pip_index "$env"' in setup and '"${line_index[@]}"' in setup


# ---- the local index -----------------------------------------------------------------------
def _pins(path: Path) -> dict[str, str]:
    """name -> version of every `name==version` in a requirements file and its -r includes."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("-r "):
            out |= _pins(path.parent / line[3:].strip())
        elif "==" in line:
            name, version = line.split("==")
            out[name.strip().lower()] = version.strip()
    return out


def _wheel(folder: Path, name: str, version: str) -> None:
    """A stand-in wheel (metadata only) and its PEP 503 page entry with a PEP 658 metadata file."""
    dist = re.sub(r"[-_.]+", "_", name)
    filename = f"{dist}-{version}-py3-none-any.whl"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    project = folder / re.sub(r"[-_.]+", "-", name).lower()
    project.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(project / filename, "w") as whl:
        whl.writestr(f"{dist}-{version}.dist-info/METADATA", metadata)
        whl.writestr(f"{dist}-{version}.dist-info/WHEEL", "Wheel-Version: 1.0\nTag: py3-none-any\n")
        whl.writestr(f"{dist}-{version}.dist-info/RECORD", "")
    (project / f"{filename}.metadata").write_text(metadata)
    digest = hashlib.sha256(metadata.encode()).hexdigest()
    page = project / "index.html"
    links = page.read_text() if page.exists() else ""
    links += f'<a href="{filename}" data-dist-info-metadata="sha256={digest}">{filename}</a>\n'
    page.write_text(links)


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    """PyPI stand-in with every pin of envs/pytorch-cuda.txt (its torch the CUDA 13 build, no
    label), and PyTorch's index with torch 2.13.0+cu128 under cu128/ and +cu126 under cu126/."""
    root = tmp_path_factory.mktemp("index")
    for name, version in _pins(ROOT / "envs" / "pytorch-cuda.txt").items():
        _wheel(root / "pypi", name, version)
    for line in ("cu128", "cu126"):
        _wheel(root / line, "torch", f"{_pins(ROOT / 'envs' / 'pytorch-cuda.txt')['torch']}+{line}")
    return root


def _resolve(env: str, index: Path, tmp_path: Path, torch_index: Path | None = None) -> dict:
    args = registry_cli.pip_index(
        env,
        {
            "DLSCALE_TORCH_INDEX": (torch_index or index).as_uri(),
            "DLSCALE_PYPI_INDEX": (index / "pypi").as_uri(),
        },
    ) or [f"--index-url={(index / 'pypi').as_uri()}"]
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--isolated", "--ignore-installed",
         "--no-deps", "--quiet", "--report", str(report), *args,
         "-r", str(ROOT / "envs" / f"{env}.txt")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if proc.returncode:
        return {"error": proc.stderr}
    items = json.loads(report.read_text())["install"]
    return {
        i["metadata"]["name"].lower(): (i["metadata"]["version"], i["download_info"]["url"])
        for i in items
    }


@pytest.mark.parametrize("line", ["cu128", "cu126"])
def test_a_lines_pins_resolve_against_its_index(index, tmp_path, line):
    got = _resolve(f"pytorch-{line}", index, tmp_path)
    assert "error" not in got, got.get("error")
    version, url = got["torch"]
    assert version == f"2.13.0+{line}" and f"/{line}/torch/" in url  # the line's index
    rest = {k: v for k, v in got.items() if k != "torch"}
    pins = _pins(ROOT / "envs" / "pytorch-cuda.txt")
    assert {k: v[0] for k, v in rest.items()} == {k: v for k, v in pins.items() if k != "torch"}
    assert all("/pypi/" in url for _, url in rest.values())


def test_a_line_does_not_resolve_from_another_lines_index_and_pypi_keeps_cuda_13(index, tmp_path):
    wrong = _resolve("pytorch-cu128", index, tmp_path, torch_index=index / "elsewhere")
    assert "error" in wrong and "torch==2.13.0+cu128" in wrong["error"]
    plain = _resolve("pytorch-cuda", index, tmp_path)
    assert plain["torch"][0] == "2.13.0" and "/pypi/" in plain["torch"][1]
