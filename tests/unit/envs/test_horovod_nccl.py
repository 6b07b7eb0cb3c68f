"""Horovod with NCCL that builds: scripts/build-horovod.sh --cuda gives Horovod's CMake
a folder inside the environment holding NCCL under the names its FindNCCL.cmake searches
(nccl.h, libnccl.so; pip's nvidia-nccl ships libnccl.so.2 only), checked by running Horovod's own
FindNCCL.cmake (from the pinned sdist) with CMake; and a CUDA toolkit whose major is not torch's
is refused before the build, with the reason."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "build-horovod.sh"
HOROVOD = ROOT / ".venvs" / "horovod"


def _need(path: Path, what: str) -> None:
    if not path.exists():
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but {what} is missing: {path} (scripts/setup.sh makes it)")
        pytest.skip(f"{what} is missing: {path} (scripts/setup.sh makes it)")


@pytest.fixture()
def venv(tmp_path):
    """A throwaway venv that imports the built Horovod environment's packages (a .pth file) so
    the script's checks run without touching the shared .venvs/horovod; a package of its own
    placed in it shadows the shared one (its site-packages come first)."""
    _need(HOROVOD / ".dlscale-setup", "the Horovod environment")
    env = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    shared = next((HOROVOD / "lib").glob("python3*/site-packages"))
    own = next((env / "lib").glob("python3*/site-packages"))
    (own / "shared-horovod.pth").write_text(f"{shared}\n")
    return env, own


def pip_nccl(root: Path) -> Path:
    """NCCL laid out as pip's nvidia-nccl-cu12 wheel lays it out: include/nccl.h and
    lib/libnccl.so.2, no libnccl.so."""
    (root / "include").mkdir(parents=True)
    (root / "lib").mkdir()
    (root / "include" / "nccl.h").write_text(
        "#define NCCL_MAJOR 2\n#define NCCL_MINOR 28\n#define NCCL_PATCH 9\n"
    )
    (root / "lib" / "libnccl.so.2").write_bytes(b"\x7fELF stand-in")
    return root


def run(args, env_vars, timeout=120):
    env = {**os.environ, **env_vars}
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=timeout
    )


def test_horovods_own_findnccl_finds_the_header_and_library_under_its_names(venv, tmp_path):
    env, _ = venv
    nccl = pip_nccl(tmp_path / "nccl")
    line = run(["--cuda", "--print-build-env", str(env)], {"NCCL_HOME": str(nccl)})
    assert line.returncode == 0, line.stderr
    switches = dict(kv.split("=", 1) for kv in line.stdout.split())
    home = Path(switches["HOROVOD_NCCL_HOME"])
    assert home == env / ".horovod-nccl"  # inside the environment
    assert (home / "lib" / "libnccl.so").resolve() == (nccl / "lib" / "libnccl.so.2").resolve()
    assert (home / "include" / "nccl.h").resolve() == (nccl / "include" / "nccl.h").resolve()

    # Horovod's FindNCCL.cmake, from the pinned sdist the build uses, run by CMake itself
    cache = Path(os.environ.get("DLSCALE_CACHE_DIR", Path.home() / ".cache" / "dlscale"))
    sdist = cache / "sdist" / "horovod-0.28.1.tar.gz"
    _need(sdist, "Horovod's sdist in the build cache")
    modules = tmp_path / "modules"
    modules.mkdir()
    with tarfile.open(sdist) as tar:
        member = next(
            m for m in tar.getmembers() if m.name.endswith("cmake/Modules/FindNCCL.cmake")
        )
        (modules / "FindNCCL.cmake").write_bytes(tar.extractfile(member).read())
    project = tmp_path / "project"
    project.mkdir()
    (project / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.13)\nproject(findnccl NONE)\n"
        f'list(APPEND CMAKE_MODULE_PATH "{modules}")\n'
        "find_package(NCCL REQUIRED)\n"
        'message(STATUS "FOUND ${NCCL_INCLUDE_DIRS} ${NCCL_LIBRARIES} ${NCCL_MAJOR_VERSION}")\n'
    )

    def configure(build: str, env: dict) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["cmake", "-S", str(project), "-B", str(tmp_path / build)],
            capture_output=True,
            text=True,
            env={**os.environ, **env},
            timeout=120,
        )

    found = configure("build", switches)
    assert found.returncode == 0, found.stdout + found.stderr
    assert f"FOUND {home / 'include'} {home / 'lib' / 'libnccl.so'} 2" in found.stdout

    # the same layout without the link folder: CMake does not find pip's libnccl.so.2
    bare = {**switches, "HOROVOD_NCCL_HOME": str(nccl)}
    missing = configure("build2", bare)
    assert missing.returncode != 0 and "NCCL_LIBRARY" in missing.stdout + missing.stderr


def fake_nvcc(root: Path, release: str) -> Path:
    (root / "bin").mkdir(parents=True)
    nvcc = root / "bin" / "nvcc"
    nvcc.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.1'\n")
    nvcc.chmod(0o755)
    return root


def test_a_toolkit_of_another_cuda_major_than_torch_is_refused_before_the_build(venv, tmp_path):
    env, own = venv
    nccl = pip_nccl(tmp_path / "nccl")
    cuda12 = fake_nvcc(tmp_path / "cuda-12.4", "12.4")
    # the shared Horovod environment's torch is the CPU build: refused, naming what is needed
    cpu = run(["--cuda", str(env)], {"NCCL_HOME": str(nccl), "CUDA_HOME": str(cuda12)})
    assert cpu.returncode == 1
    assert "is a CPU build (torch.version.cuda is None)" in cpu.stderr
    # a torch built with CUDA 13.0 (shadowing the shared one) against a 12.4 toolkit
    (own / "torch").mkdir()
    (own / "torch" / "__init__.py").write_text(
        "__version__ = '2.13.0'\nclass version:\n    cuda = '13.0'\n"
    )
    mismatch = run(["--cuda", str(env)], {"NCCL_HOME": str(nccl), "CUDA_HOME": str(cuda12)})
    assert mismatch.returncode == 1
    assert "CUDA_HOME's toolkit is CUDA 12.4 and torch" in mismatch.stderr
    assert "is built with CUDA 13.0: they must share a major" in mismatch.stderr
    # no nvcc where CUDA_HOME points: named before anything is built
    no_nvcc = run(["--cuda", str(env)], {"NCCL_HOME": str(nccl), "CUDA_HOME": str(tmp_path / "x")})
    assert no_nvcc.returncode == 1
    assert f"no nvcc in {tmp_path / 'x'}/bin: set CUDA_HOME" in no_nvcc.stderr
    # no NCCL where NCCL_HOME points: named before anything is built
    none = run(["--cuda", str(env)], {"NCCL_HOME": str(tmp_path / "no-nccl")})
    assert none.returncode == 1 and f"no NCCL in {tmp_path / 'no-nccl'}" in none.stderr
