"""CUDA wheel lines chosen by the driver: an entry that states a driver which cannot
run PyPI's CUDA 13 torch gets PyTorch's newest line it runs (cu128, cu126), an environment of its
own with its own identity, installed from PyTorch's index (or a site's mirror). PyTorch's index
is not reachable from the project's machines: the resolution is checked against a local index
built here (PEP 503 pages with PEP 658 metadata files) whose stand-in wheels carry the pins of
envs/ and the two lines' torch builds, through pip itself with setup.sh's own index arguments."""

from __future__ import annotations

import hashlib
import json
import os
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
    # the line's index beside the user's pip configuration, whose index serves the rest
    assert registry_cli.pip_index("pytorch-cu128", {}) == [
        "--extra-index-url=https://download.pytorch.org/whl/cu128",
    ]
    mirror = {"DLSCALE_TORCH_INDEX": "https://mirror.site/torch/", "DLSCALE_PYPI_INDEX": "x"}
    assert registry_cli.pip_index("pytorch-cu126", mirror) == [
        "--extra-index-url=https://mirror.site/torch/cu126",
        "--index-url=x",
    ]
    assert registry_cli.pip_index("pytorch-cuda", {}) == []  # the configured index, as any env
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
    assert 'registry pip-index "$env"' in setup and '"${line_index[@]}"' in setup


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


def _wheel(folder: Path, name: str, version: str, files: dict[str, str] | None = None) -> None:
    """A stand-in wheel (metadata and `files` only) and its PEP 503 page entry with a PEP 658
    metadata file."""
    dist = re.sub(r"[-_.]+", "_", name)
    filename = f"{dist}-{version}-py3-none-any.whl"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    project = folder / re.sub(r"[-_.]+", "-", name).lower()
    project.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(project / filename, "w") as whl:
        for path, text in (files or {}).items():
            whl.writestr(path, text)
        whl.writestr(f"{dist}-{version}.dist-info/METADATA", metadata)
        whl.writestr(f"{dist}-{version}.dist-info/WHEEL", "Wheel-Version: 1.0\nTag: py3-none-any\n")
        whl.writestr(f"{dist}-{version}.dist-info/RECORD", "")
    (project / f"{filename}.metadata").write_text(metadata)
    digest = hashlib.sha256(metadata.encode()).hexdigest()
    page = project / "index.html"
    links = page.read_text() if page.exists() else ""
    links += f'<a href="{filename}" data-dist-info-metadata="sha256={digest}">{filename}</a>\n'
    page.write_text(links)


# what torch's wheels say of their build (dlscale.registry.cuda_probes reads it after install)
TORCH_FILES = {
    cuda: {"torch/version.py": f"cuda = {cuda!r}\n"} for cuda in ("13.0", "12.8", "12.6", None)
}


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    """PyPI stand-in with every pin of envs/pytorch-cuda.txt (its torch the CUDA 13 build, no
    label), and PyTorch's index with torch 2.13.0+cu128 under cu128/ and +cu126 under cu126/."""
    root = tmp_path_factory.mktemp("index")
    for name, version in _pins(ROOT / "envs" / "pytorch-cuda.txt").items():
        _wheel(root / "pypi", name, version, TORCH_FILES["13.0"] if name == "torch" else None)
    for line in ("cu128", "cu126"):
        torch = _pins(ROOT / "envs" / "pytorch-cuda.txt")["torch"]
        _wheel(root / line, "torch", f"{torch}+{line}", TORCH_FILES[f"{line[2:4]}.{line[4:]}"])
    return root


# pip as setup.sh runs it: the environment's own index arguments (registry pip-index) and the
# user's pip configuration, here only what `config` gives (PIP_* variables; PIP_CONFIG_FILE names
# a pip.conf), the machine's own pip configuration set aside
PIP_ISOLATED = {"PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": "", "PIP_NO_INPUT": "1"}


def _pip_env(index: Path, config: dict[str, str] | None) -> dict[str, str]:
    """The environment pip runs in: the user's `config`, by default the stand-in PyPI as the
    user's mirror (PIP_INDEX_URL)."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    mirror = {"PIP_INDEX_URL": (index / "pypi").as_uri()}
    return {**keep, **PIP_ISOLATED, **(mirror if config is None else config)}


def _resolve(
    env: str,
    index: Path,
    tmp_path: Path,
    torch_index: Path | None = None,
    config: dict[str, str] | None = None,
) -> dict:
    args = registry_cli.pip_index(env, {"DLSCALE_TORCH_INDEX": (torch_index or index).as_uri()})
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
         "--no-deps", "--quiet", "--report", str(report), *args,
         "-r", str(ROOT / "envs" / f"{env}.txt")],
        capture_output=True, text=True, timeout=300, env=_pip_env(index, config),
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


def test_the_users_pip_configuration_reaches_a_cuda_install(index, tmp_path):
    """setup.sh installs without --isolated: a site's mirror named in a pip.conf (or
    PIP_INDEX_URL, every test above) serves a CUDA line's packages beside the line's index."""
    conf = tmp_path / "pip.conf"
    conf.write_text(f"[global]\nindex-url = {(index / 'pypi').as_uri()}\n")
    got = _resolve("pytorch-cu126", index, tmp_path, config={"PIP_CONFIG_FILE": str(conf)})
    assert "error" not in got, got.get("error")
    assert got["torch"][0] == "2.13.0+cu126" and got["numpy"][1].startswith(
        (index / "pypi").as_uri()
    )


def test_a_cpu_wheel_in_the_way_is_refused_after_installing(index, tmp_path):
    """The protection --isolated gave, kept: a CPU wheel the user's configuration offers (here
    a find-links folder, as on this project's machines) wins pip's choice for pytorch-cuda, and
    the check setup.sh runs after installing refuses it; without it, PyPI's CUDA build passes."""
    wheels = tmp_path / "wheels"
    _wheel(wheels, "torch", "2.13.0+cpu", TORCH_FILES[None])
    check = [sys.executable, "-m", "dlscale.workflow.capability", "--framework", "pytorch"]
    for name, config, cuda in [
        ("cpu", {"PIP_FIND_LINKS": str(wheels / "torch")}, False),
        ("cuda", {}, True),
    ]:
        env = tmp_path / name
        pip_env = _pip_env(index, {"PIP_INDEX_URL": (index / "pypi").as_uri(), **config})
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--ignore-installed",
             "--prefix", str(env),
             *registry_cli.pip_index("pytorch-cuda"), "-r", str(ROOT / "envs/pytorch-cuda.txt")],
            env=pip_env, check=True, capture_output=True, timeout=300,
        )  # fmt: skip
        said = subprocess.run(
            [*check, "--env-dir", str(env), "--expect-cuda"], capture_output=True, text=True,
            env={**pip_env, "PYTHONPATH": str(ROOT / "scripts")},
        )  # fmt: skip
        assert (said.returncode == 0) is cuda, said.stdout
        assert ("torch is a CPU build" in said.stdout) is not cuda
