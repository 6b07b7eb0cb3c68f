"""Whether an environment's build of a framework drives CUDA, read from its installed files on
the login node (nothing imported, no GPU needed). Each framework record names its probe
(dlscale.registry.frameworks.Framework.cuda_probe); dlscale.workflow.capability runs them."""

from __future__ import annotations

import mmap
import re
from pathlib import Path


def site_packages(env_dir: Path) -> Path | None:
    """The venv's site-packages folder (lib/python3.X/site-packages), or None."""
    found = sorted(Path(env_dir).glob("lib/python3*/site-packages"))
    return found[-1] if found else None


def _torch_version_cuda(sp: Path) -> str | None:
    """torch/version.py's `cuda` value as written ("13.0", "None", ...); None without torch."""
    version = sp / "torch" / "version.py"
    if not version.exists():
        return None
    m = re.search(r"^cuda\s*(?::[^=\n]*)?=\s*(.+)$", version.read_text(), re.M)
    return m.group(1).strip().strip("'\"") if m else "None"


def torch_cuda(sp: Path) -> tuple[bool, str]:
    value = _torch_version_cuda(sp)
    if value is None:
        return False, "torch is not installed"
    if value in ("None", ""):
        return False, "torch is a CPU build (torch.version.cuda is None)"
    return True, f"torch built with CUDA {value}"


def tensorflow_cuda(sp: Path) -> tuple[bool, str]:
    info = sp / "tensorflow" / "python" / "platform" / "build_info.py"
    if not info.exists():
        return False, "tensorflow is not installed"
    if re.search(r"['\"]is_cuda_build['\"]\s*[:,]\s*True", info.read_text()):
        # PyPI's Linux wheel is a CUDA build that loads CUDA from pip's nvidia packages (the
        # `and-cuda` extra); without them it sees 0 GPUs
        if sorted(sp.glob("nvidia_cudnn_cu*.dist-info")):
            return True, "tensorflow built with CUDA, its CUDA libraries from tensorflow[and-cuda]"
        return False, (
            "tensorflow is a CUDA build, but its CUDA libraries (tensorflow[and-cuda]: "
            "nvidia-cudnn-cu12, nvidia-cublas-cu12, ...) are not installed: it would see 0 GPUs"
        )
    return False, "tensorflow is not built with CUDA (is_cuda_build False)"


def _file_mentions(path: Path, needle: bytes) -> bool:
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as m:
        return m.find(needle) >= 0


def horovod_cuda(sp: Path) -> tuple[bool, str]:
    ok, torch_says = torch_cuda(sp)
    if not ok:
        return False, torch_says
    libs = sorted((sp / "horovod" / "torch").glob("mpi_lib_v2*.so"))
    if not libs:
        return False, "horovod's torch extension is not installed"
    if not _file_mentions(libs[0], b"ncclAllReduce"):
        return False, "horovod is built without NCCL (gloo only: no GPU operations)"
    return True, f"horovod built with NCCL; {torch_says}"


def mxnet_cuda(sp: Path) -> tuple[bool, str]:
    cuda = sorted(sp.glob("mxnet_cu*.dist-info"))
    if cuda:
        return True, f"MXNet CUDA build {cuda[0].name.split('-')[0].replace('_', '-')}"
    if sorted(sp.glob("mxnet-*.dist-info")):
        return False, "mxnet is the CPU build (the `mxnet` wheel, not mxnet-cuXXX)"
    return False, "mxnet is not installed"


def built_cuda_version(sp: Path) -> str | None:
    """The CUDA version an environment's framework build was made for, read from its files
    (torch/version.py's `cuda`, TensorFlow's build_info `cuda_version`, MXNet's mxnet-cuXYZ
    distribution); None for a CPU build or one that does not say."""
    value = _torch_version_cuda(sp)
    if value is not None:
        return value if re.fullmatch(r"[0-9]+(\.[0-9]+)*", value) else None
    info = sp / "tensorflow" / "python" / "platform" / "build_info.py"
    if info.exists():
        m = re.search(r"['\"]cuda_version['\"]\s*[:,]\s*['\"]([0-9.]+)['\"]", info.read_text())
        return ".".join(m.group(1).split(".")[:2]) if m else None
    cuda = sorted(sp.glob("mxnet_cu*.dist-info"))
    if cuda:
        digits = cuda[0].name.split("-")[0].removeprefix("mxnet_cu")
        return f"{digits[:-1]}.{digits[-1]}" if digits.isdigit() and len(digits) >= 2 else None
    return None
