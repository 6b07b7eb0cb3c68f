"""Which NVIDIA driver runs which CUDA build: the driver table, kept as data with its source
(cuda_drivers.json, read with the standard library), and the questions the project asks of it.

A hardware entry states its nodes' driver (`nvidia_driver`, e.g. "550.54.15") or the highest CUDA
version it supports (`max_cuda`, e.g. "12.4"), both as `nvidia-smi` prints them, and may state
that the nodes carry NVIDIA's forward-compatibility package (`cuda_forward_compat`). The
capability check (dlscale.workflow.capability) refuses, at parse time, an environment whose CUDA
build the entry's driver cannot run, naming the lines that fit.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

TABLE_FILE = Path(__file__).with_name("cuda_drivers.json")


@functools.cache
def table() -> dict:
    return json.loads(TABLE_FILE.read_text())


def version_tuple(text: str) -> tuple[int, ...]:
    """ "550.54.15" -> (550, 54, 15); "12.4" -> (12, 4). A malformed value raises ValueError."""
    parts = str(text).strip().split(".")
    if not parts or not all(p.isdigit() for p in parts):
        raise ValueError(f"not a version: {text!r}")
    return tuple(int(p) for p in parts)


def minimum_driver(cuda: str) -> str | None:
    """The lowest driver that runs a CUDA `cuda` (e.g. "12.8") build through minor version
    compatibility; None for a major the table does not hold."""
    return table()["minor_version_compatibility"].get(str(version_tuple(cuda)[0]))


def highest_cuda_major(driver: str) -> int | None:
    """The highest CUDA major a driver runs (its minor version compatibility)."""
    fits = [
        int(major)
        for major, least in table()["minor_version_compatibility"].items()
        if version_tuple(driver) >= version_tuple(least)
    ]
    return max(fits, default=None)


def driver_runs(entry: dict, cuda: str) -> tuple[bool, str]:
    """(runs, why) for a CUDA `cuda` build on the nodes of a hardware entry, from what the
    entry states. An entry that states neither its driver nor its highest CUDA passes: nothing
    is known to check."""
    driver, max_cuda = entry.get("nvidia_driver"), entry.get("max_cuda")
    if entry.get("cuda_forward_compat"):
        return True, "the nodes carry CUDA's forward-compatibility package (cuda_forward_compat)"
    needed = minimum_driver(cuda)
    if driver is not None:
        if needed is None:
            return False, f"the driver table holds no CUDA {version_tuple(cuda)[0]}.x"
        if version_tuple(driver) >= version_tuple(needed):
            return True, f"driver {driver} >= {needed}, the minimum for CUDA {cuda}"
        return False, (
            f"a CUDA {cuda} build needs driver >= {needed} (CUDA minor version compatibility), "
            f"and the nodes run {driver}"
        )
    if max_cuda is not None:
        if version_tuple(cuda)[0] <= version_tuple(max_cuda)[0]:
            return True, f"CUDA {cuda} is within the nodes' CUDA {max_cuda} major"
        major = version_tuple(cuda)[0]
        why = f"a CUDA {cuda} build needs a CUDA {major}.x driver, and the nodes support CUDA "
        return False, why + f"{max_cuda} at most"
    return True, "the entry states no driver (nvidia_driver or max_cuda): not checked"


def driver_cuda(entry: dict) -> str | None:
    """The CUDA version the entry's driver supports in full (PTX JIT included): its max_cuda,
    else its driver branch's (branch_cuda); None where neither is known."""
    if entry.get("max_cuda") is not None:
        return str(entry["max_cuda"])
    driver = entry.get("nvidia_driver")
    if driver is None:
        return None
    return table()["branch_cuda"].get(str(version_tuple(driver)[0]))


def driver_jits(entry: dict, cuda: str) -> tuple[bool, str]:
    """(can, why) for a driver to JIT a CUDA `cuda` build's PTX (a build without machine code
    for the GPU): the driver's own CUDA version must be at least the build's. Passes where the
    nodes carry the forward-compatibility package or nothing is stated."""
    if entry.get("cuda_forward_compat"):
        return True, "forward-compatibility package"
    have = driver_cuda(entry)
    if have is None:
        return True, "the driver's CUDA version is not known: not checked"
    if version_tuple(have)[:2] >= version_tuple(cuda)[:2]:
        return True, f"the driver supports CUDA {have} >= {cuda}"
    return False, f"the nodes' driver supports CUDA {have}, below the build's {cuda}"


def fitting_lines(entry: dict) -> list[str]:
    """PyTorch's CUDA lines (cu126, ...) the entry's driver runs, newest first."""
    lines = table()["pytorch_lines"]
    fit = [name for name, cuda in lines.items() if driver_runs(entry, cuda)[0]]
    return sorted(fit, key=lambda n: version_tuple(lines[n]), reverse=True)
