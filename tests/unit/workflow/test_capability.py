"""Can a planned cell's environment drive its device? (dlscale.workflow.capability.)

The project's own environments (.venv, .venvs/*) are CPU builds on this machine: each is read
as it is and must be refused for a GPU cell with the command that builds the CUDA one. The CUDA
answers are read from site-packages folders laid out here the way each CUDA build installs
(the files the check reads, nothing else: no GPU and no CUDA download here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dlscale.study.cell import Cell
from dlscale.workflow.capability import cuda_build, environment_problems, main

from helpers.cells import cell_dict

ROOT = Path(__file__).resolve().parents[3]
PY = f"python{sys.version_info.major}.{sys.version_info.minor}"


def fake_env(tmp_path: Path, files: dict[str, str | bytes]) -> Path:
    """A venv folder whose site-packages holds `files` (relative path -> content)."""
    env = tmp_path / "env"
    sp = env / "lib" / PY / "site-packages"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").symlink_to(sys.executable)
    for rel, content in files.items():
        path = sp / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    sp.mkdir(parents=True, exist_ok=True)
    return env


TORCH_CUDA = {"torch/version.py": "__version__ = '2.13.0'\ncuda: Optional[str] = '13.0'\n"}
TORCH_CPU = {"torch/version.py": "__version__ = '2.13.0+cpu'\ncuda: Optional[str] = None\n"}
TF_CUDA = {
    "tensorflow/python/platform/build_info.py": (
        "build_info = {'cuda_version': '12.5.1', 'is_cuda_build': True, 'is_rocm_build': False}\n"
    )
}
CUDNN = {"nvidia_cudnn_cu12-9.3.0.75.dist-info/METADATA": "Name: nvidia-cudnn-cu12\n"}
HOROVOD_NCCL = {"horovod/torch/mpi_lib_v2.cpython-311-x86_64-linux-gnu.so": b"\0ncclAllReduce\0"}
HOROVOD_GLOO = {"horovod/torch/mpi_lib_v2.cpython-311-x86_64-linux-gnu.so": b"\0gloo::allreduce\0"}


# ------------------------------------------------------------- the project's real environments
def real_env(name: str | None) -> Path:
    env = ROOT / ".venv" if name is None else ROOT / ".venvs" / name
    if not (env / ".dlscale-setup").exists():  # written once setup.sh has built it
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but {env} is not built (scripts/setup.sh builds it)")
        pytest.skip(f"{env} is not built (scripts/setup.sh builds it; with CI set: a failure)")
    return env


@pytest.mark.parametrize(
    "framework, env, says",
    [
        ("pytorch", None, "torch is a CPU build (torch.version.cuda is None)"),
        ("tensorflow", "tensorflow", "its CUDA libraries (tensorflow[and-cuda]"),
        ("keras", "tensorflow", "its CUDA libraries (tensorflow[and-cuda]"),
        ("horovod", "horovod", "torch is a CPU build"),
        ("mxnet", "mxnet", "mxnet is the CPU build"),
    ],
)
def test_the_projects_cpu_environments_are_read_as_cpu_builds(framework, env, says):
    ok, detail = cuda_build(framework, real_env(env))
    assert not ok
    assert says in detail


# ------------------------------------------------------------------ each framework's CUDA build
@pytest.mark.parametrize(
    "framework, files, expected",
    [
        ("pytorch", TORCH_CUDA, (True, "torch built with CUDA 13.0")),
        ("pytorch", TORCH_CPU, (False, "torch is a CPU build")),
        ("pytorch", {}, (False, "torch is not installed")),
        ("tensorflow", {**TF_CUDA, **CUDNN}, (True, "from tensorflow[and-cuda]")),
        ("tensorflow", TF_CUDA, (False, "it would see 0 GPUs")),
        (
            "tensorflow",
            {"tensorflow/python/platform/build_info.py": "build_info = {'is_cuda_build': False}"},
            (False, "is_cuda_build False"),
        ),
        ("horovod", {**TORCH_CUDA, **HOROVOD_NCCL}, (True, "horovod built with NCCL")),
        ("horovod", {**TORCH_CUDA, **HOROVOD_GLOO}, (False, "built without NCCL (gloo only")),
        ("horovod", {**TORCH_CPU, **HOROVOD_NCCL}, (False, "torch is a CPU build")),
        ("horovod", TORCH_CUDA, (False, "horovod's torch extension is not installed")),
        (
            "mxnet",
            {"mxnet_cu117-1.9.1.dist-info/METADATA": "Name: mxnet-cu117\n"},
            (True, "MXNet CUDA build mxnet-cu117"),
        ),
        ("mxnet", {"mxnet-1.9.1.dist-info/METADATA": "Name: mxnet\n"}, (False, "CPU build")),
    ],
)
def test_cuda_builds_are_told_from_cpu_builds(tmp_path, framework, files, expected):
    ok, detail = cuda_build(framework, fake_env(tmp_path, files))
    assert ok is expected[0]
    assert expected[1] in detail


def test_a_folder_that_is_no_environment(tmp_path):
    ok, detail = cuda_build("pytorch", tmp_path)
    assert not ok and "is not a Python environment" in detail


def test_the_command_line_exits_1_only_when_cuda_is_expected(tmp_path, capsys):
    env = fake_env(tmp_path, TORCH_CPU)
    assert main(["--env-dir", str(env), "--framework", "pytorch"]) == 0
    assert main(["--env-dir", str(env), "--framework", "pytorch", "--expect-cuda"]) == 1
    said = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert said["cuda"] is False and "CPU build" in said["detail"]
    # the driver's .venv (setup.sh): a CPU build expected, a CUDA build refused
    assert main(["--env-dir", str(env), "--framework", "pytorch", "--expect-cpu"]) == 0
    cuda = fake_env(tmp_path / "cuda", TORCH_CUDA)
    assert main(["--env-dir", str(cuda), "--framework", "pytorch", "--expect-cpu"]) == 1


# --------------------------------------------------------------------- the planned cells' check
GPU = {"device": "cuda", "compute_capability": 8.0}


def cells(framework: str, hardware: str, n: int = 1) -> list[Cell]:
    """Cells of 1..n nodes on `hardware` (tests/helpers/cells.py's small cell, over srun)."""
    device = "cpu" if hardware == "cpu" else "cuda"
    return [
        Cell.from_dict(
            cell_dict(
                hardware=hardware,
                framework=framework,
                nodes=nodes,
                device=device,
                global_batch=4 * nodes,
                launcher="srun",
            )
        )
        for nodes in range(1, n + 1)
    ]


def test_gpu_cells_in_a_cpu_build_are_refused_with_the_setup_command(tmp_path):
    cpu_env = fake_env(tmp_path, TORCH_CPU)
    problems = environment_problems(
        cells("pytorch", "a100", 5), {"a100": GPU}, lambda name: cpu_env
    )
    assert len(problems) == 1
    text = problems[0]
    assert "5 cell(s) (" in text and ", and 2 more)" in text  # three named, the rest counted
    assert "of pytorch on 'a100' (device cuda) run in .venvs/pytorch-cuda" in text
    assert "torch is a CPU build" in text
    assert text.endswith("bash scripts/setup.sh pytorch-cuda")


def test_a_cuda_build_and_cpu_cells_pass(tmp_path):
    cuda_env = fake_env(tmp_path, TORCH_CUDA)
    hardware = {"a100": GPU, "cpu": {"device": "cpu"}}
    planned = cells("pytorch", "a100", 2) + cells("pytorch", "cpu", 2)
    assert environment_problems(planned, hardware, lambda name: cuda_env) == []
    # CPU cells of PyTorch run in the driver environment (name None), whatever its build
    asked = []
    environment_problems(cells("pytorch", "cpu"), hardware, lambda name: asked.append(name))
    assert asked == [None]


def test_a_missing_environment_is_named(tmp_path):
    problems = environment_problems(
        cells("mxnet", "cpu"), {"cpu": {"device": "cpu"}}, lambda name: tmp_path / name
    )
    assert problems == [
        f"1 cell(s) ({cells('mxnet', 'cpu')[0].path}) of mxnet run in .venvs/mxnet, which does "
        "not exist; build it with: bash scripts/setup.sh mxnet"
    ]


def test_mxnet_cannot_drive_hopper(tmp_path):
    env = fake_env(tmp_path, {"mxnet_cu117-1.9.1.dist-info/METADATA": "Name: mxnet-cu117\n"})
    hopper = {"h100": {"device": "cuda", "compute_capability": 9.0}}
    problems = environment_problems(cells("mxnet", "h100"), hopper, lambda name: env)
    assert len(problems) == 1
    assert "compute capability 9.0" in problems[0] and "mxnet-cu117" in problems[0]
    assert "config `exclude`" in problems[0]
    ampere = {"a100": {"device": "cuda", "compute_capability": 8.0}}
    assert environment_problems(cells("mxnet", "a100"), ampere, lambda name: env) == []


def test_container_routes_refuse_gpu_cells_and_take_cpu_cells(tmp_path):
    hardware = {"a100": GPU, "cpu": {"device": "cpu"}}
    problems = environment_problems(
        cells("tensorflow", "a100"), hardware, lambda name: None, route="conda"
    )
    assert len(problems) == 1
    assert "the conda route builds CPU environments only" in problems[0]
    assert "bash scripts/setup.sh tensorflow-cuda" in problems[0]
    assert environment_problems(cells("tensorflow", "cpu"), hardware, None, route="conda") == []


def test_setup_refuses_an_unknown_environment_with_the_allowed_names():
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "setup.sh"), "pytorch"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    for name in ("tensorflow", "horovod", "mxnet", "pytorch-cuda", "mxnet-cuda"):
        assert name in proc.stderr


def test_horovod_cuda_build_uses_nccl_and_the_sites_cuda(tmp_path):
    """scripts/build-horovod.sh --cuda: NCCL for the GPU collectives, linked from the venv's own
    nvidia-nccl (torch's CUDA build) or NCCL_HOME, and the site's CUDA toolkit (CUDA_HOME);
    without NCCL it stops before building, naming what is missing."""
    venv = real_env("horovod")
    script = ROOT / "scripts" / "build-horovod.sh"
    env = dict(os.environ, CUDA_HOME=str(tmp_path / "cuda"))
    env.pop("NCCL_HOME", None)
    line = subprocess.run(
        ["bash", str(script), "--cuda", "--print-build-env", str(venv)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert line.returncode == 0, line.stderr
    switches = dict(kv.split("=", 1) for kv in line.stdout.split())
    assert switches["HOROVOD_GPU_OPERATIONS"] == "NCCL"
    assert switches["HOROVOD_CUDA_HOME"] == str(tmp_path / "cuda")
    # a folder inside the environment with NCCL under Horovod's names (envs/test_horovod_nccl)
    assert switches["HOROVOD_NCCL_HOME"] == str(venv / ".horovod-nccl")
    assert switches["HOROVOD_NCCL_LINK"] == "SHARED"
    assert switches["HOROVOD_WITH_GLOO"] == "1"
    build = subprocess.run(
        ["bash", str(script), "--cuda", str(venv)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert build.returncode == 1  # the CPU Horovod environment has no pip NCCL
    assert "no NCCL in " in build.stderr and "set NCCL_HOME" in build.stderr
    # with NCCL found, a missing nvcc is named next: tests/unit/envs/test_horovod_nccl.py (in a
    # throwaway venv, since the link folder is made inside the environment)


def test_the_workflow_refuses_gpu_cells_in_a_cpu_build_before_any_job(tmp_path, tiny_config):
    """A dry run of a study on a GPU entry whose .venvs/pytorch-cuda is a CPU build (here: the
    driver .venv itself) stops at parse time with the cells, the reason and the command; the
    same without the environment names the missing folder."""
    from helpers.checkout import copy_workflow, snakemake

    config = {**tiny_config, "axes": {**tiny_config["axes"], "hardware": ["a100"]}}
    work = copy_workflow(tmp_path, config)
    venvs = work / ".venvs"
    if venvs.is_symlink():
        venvs.unlink()
    venvs.mkdir()
    missing = snakemake(work, "-n", "--profile", "profiles/local")
    assert missing.returncode != 0
    said = missing.stdout + missing.stderr
    assert "of pytorch run in .venvs/pytorch-cuda, which does not exist" in said
    (venvs / "pytorch-cuda").symlink_to(ROOT / ".venv")
    proc = snakemake(work, "-n", "--profile", "profiles/local")
    assert proc.returncode != 0
    said = proc.stdout + proc.stderr
    assert "dlscale: 4 cell(s) (results/tiny/runs/a100/pytorch/cnn_small/" in said
    assert "of pytorch on 'a100' (device cuda) run in .venvs/pytorch-cuda" in said
    assert "torch is a CPU build (torch.version.cuda is None)" in said
    assert "Build the CUDA environment with: bash scripts/setup.sh pytorch-cuda" in said
    assert "No job was started." in said
    assert not (work / "results" / "tiny" / "runs").exists()


# ------------------------------------------------- the nodes' driver against the CUDA build (45)
R550 = {"device": "cuda", "compute_capability": 9.0, "nvidia_driver": "550.54.15"}


def test_an_r550_entry_runs_pytorch_in_the_cu128_line_and_names_what_is_missing(tmp_path):
    planned = cells("pytorch", "h100", 2)
    (text,) = environment_problems(planned, {"h100": R550}, lambda name: tmp_path / name)
    assert "of pytorch run in .venvs/pytorch-cu128, which does not exist" in text
    assert text.endswith("build it with: bash scripts/setup.sh pytorch-cu128")
    # the line's folder holding another build (PyPI's CUDA 13 torch): rebuild it
    cu130 = fake_env(tmp_path, TORCH_CUDA)
    (text,) = environment_problems(planned, {"h100": R550}, lambda name: cu130)
    assert "2 cell(s) (" in text and "of pytorch run in .venvs/pytorch-cu128" in text
    assert "a CUDA 13.0 build needs driver >= 580.65.06" in text and "run 550.54.15" in text
    assert "this environment is the cu128 line's: it holds another build" in text
    assert text.endswith("rebuild it with: bash scripts/setup.sh pytorch-cu128")


def test_a_build_no_line_of_which_runs_on_the_driver_is_refused_with_the_ways_out(tmp_path):
    cu130 = fake_env(tmp_path, TORCH_CUDA)
    hvd = fake_env(tmp_path / "hvd", {**TORCH_CUDA, **HOROVOD_NCCL})
    (text,) = environment_problems(cells("horovod", "h100"), {"h100": R550}, lambda n: hvd)
    assert "of horovod run in .venvs/horovod-cuda: a CUDA 13.0 build needs driver" in text
    assert "No CUDA line of horovod that dlscale sets up runs on that driver" in text
    assert "config `exclude`" in text and "cuda_forward_compat: true" in text
    r470 = {"h100": {"device": "cuda", "nvidia_driver": "470.82.01"}}  # CUDA 11 only
    (text,) = environment_problems(cells("pytorch", "h100"), r470, lambda n: cu130)
    assert "of pytorch run in .venvs/pytorch-cuda" in text
    assert "(lines: cu130, cu128, cu126)" in text
    # the same nodes stated as nvidia-smi's CUDA Version
    by_cuda = {"h100": {"device": "cuda", "max_cuda": "11.4"}}
    (text,) = environment_problems(cells("pytorch", "h100"), by_cuda, lambda n: cu130)
    assert "needs a CUDA 13.x driver, and the nodes support CUDA 11.4 at most" in text


def test_a_cuda_12_line_runs_on_r550_and_r580_runs_either(tmp_path):
    cu128 = fake_env(
        tmp_path, {"torch/version.py": "__version__ = '2.13.0+cu128'\ncuda = '12.8'\n"}
    )
    assert environment_problems(cells("pytorch", "h100"), {"h100": R550}, lambda n: cu128) == []
    cu130 = fake_env(tmp_path / "b", TORCH_CUDA)
    r580 = {"h100": {**R550, "nvidia_driver": "580.95.05"}}
    assert environment_problems(cells("pytorch", "h100"), r580, lambda n: cu130) == []
    compat = {"h100": {**R550, "cuda_forward_compat": True}}
    assert environment_problems(cells("pytorch", "h100"), compat, lambda n: cu130) == []
    unstated = {"h100": GPU}  # no driver stated: nothing known to check
    assert environment_problems(cells("pytorch", "h100"), unstated, lambda n: cu130) == []


def test_tensorflow_and_mxnet_builds_are_read_for_their_cuda_version(tmp_path):
    from dlscale.registry.cuda_probes import built_cuda_version

    tf = fake_env(tmp_path, {**TF_CUDA, **CUDNN})
    sp = next(tf.glob("lib/*/site-packages"))
    assert built_cuda_version(sp) == "12.5"
    old = {"a100": {"device": "cuda", "nvidia_driver": "470.82.01"}}  # a CUDA 11 driver
    (text,) = environment_problems(cells("tensorflow", "a100"), old, lambda n: tf)
    assert "a CUDA 12.5 build needs driver >= 525.60.13" in text
    assert "No CUDA line of tensorflow that dlscale sets up runs on that driver" in text
    mx = fake_env(tmp_path / "m", {"mxnet_cu117-1.9.1.dist-info/METADATA": "Name: mxnet-cu117\n"})
    assert built_cuda_version(next(mx.glob("lib/*/site-packages"))) == "11.7"
    assert environment_problems(cells("mxnet", "a100"), old, lambda n: mx) == []


def test_tensorflow_on_hopper_needs_a_driver_that_jits_its_ptx(tmp_path):
    """TensorFlow's CUDA 12.5 build has no Hopper machine code: on compute capability 9.0 the
    driver JITs its PTX, which minor version compatibility does not cover: R550 (CUDA 12.4) is
    refused, R560 (12.6) runs it, and on an A100 (8.0) R550 runs it."""
    tf = fake_env(tmp_path, {**TF_CUDA, **CUDNN})
    hopper = {"device": "cuda", "compute_capability": 9.0, "nvidia_driver": "550.54.15"}
    (text,) = environment_problems(cells("keras", "h100"), {"h100": hopper}, lambda n: tf)
    assert "targets end at compute_90 PTX" in text
    assert "the driver must support CUDA 12.5 in full" in text
    assert "the nodes' driver supports CUDA 12.4, below the build's 12.5" in text
    assert "config `exclude`" in text
    newer = {"h100": {**hopper, "nvidia_driver": "560.35.03"}}
    assert environment_problems(cells("tensorflow", "h100"), newer, lambda n: tf) == []
    ampere = {"a100": {**hopper, "compute_capability": 8.0}}
    assert environment_problems(cells("tensorflow", "a100"), ampere, lambda n: tf) == []
    by_cuda = {"h100": {"device": "cuda", "compute_capability": 9.0, "max_cuda": "12.4"}}
    assert environment_problems(cells("tensorflow", "h100"), by_cuda, lambda n: tf)
