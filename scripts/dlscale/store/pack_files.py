"""A pack's files in its study folder (logs/packs/<pack>/): the manifest the driver writes
(dlscale.workflow.packing) and the state file per cell the pack runner writes
(dlscale.workflow.pack_runner), read by the driver, `dlscale status` and the cell table
(which cells ran beside which: dlscale.analysis.collect).
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

PACKS_DIR = Path("logs") / "packs"  # under the study folder
MANIFEST = "manifest.json"
# A cell's states in its pack once it ended (its state file's `state`; before: running).
FINAL_STATES = ("done", "failed", "timeout")


def pack_dir(study_dir: str | Path, pack_id: str) -> Path:
    return Path(study_dir) / PACKS_DIR / pack_id


def write_json(path: Path, record: dict) -> None:
    """A JSON file renamed into place whole (the driver reads it while the runner writes)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
    os.replace(tmp, path)


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_manifest(folder: Path) -> dict | None:
    return read_json(folder / MANIFEST)


def cell_state(folder: Path, slot: int) -> dict | None:
    """The runner's state of a pack's cell (`<slot>.json`), or None before it started."""
    return read_json(folder / f"{slot}.json")


def find_slot(study_dir: str | Path, cell_path: str, allocation: str) -> tuple[str, int] | None:
    """The pack and slot of a cell in the pack that allocation `allocation` runs (its
    manifest's `slurm_job_id`, written at submission), or None: that job is not a pack."""
    return _slots(*_manifests(study_dir)).get((str(allocation), cell_path))


def ran_beside(study_dir: str | Path, cell_path: str, allocation: str | None) -> list[str]:
    """The cells whose steps ran beside this cell's in its pack's allocation (its state file's
    `beside`, written by the runner when the cell ended), or [] for a cell measured alone."""
    found = find_slot(study_dir, cell_path, allocation) if allocation else None
    if found is None:
        return []
    state = cell_state(pack_dir(study_dir, found[0]), found[1]) or {}
    return list(state.get("beside") or [])


def _manifests(study_dir: str | Path) -> tuple[str, tuple]:
    """The study's manifests by path and modification time (the key of _slots' cache)."""
    root = Path(study_dir) / PACKS_DIR
    if not root.is_dir():
        return str(root), ()
    found = []
    for folder in sorted(root.iterdir()):
        try:
            found.append((folder.name, (folder / MANIFEST).stat().st_mtime_ns))
        except OSError:
            continue
    return str(root), tuple(found)


@functools.lru_cache(maxsize=8)
def _slots(root: str, manifests: tuple) -> dict[tuple[str, str], tuple[str, int]]:
    """(allocation, cell path) -> (pack, slot) over the manifests, read once while none changes
    (the cell table asks for every cell of a study, the driver at every status check)."""
    slots = {}
    for name, _ in manifests:
        manifest = read_manifest(Path(root) / name)
        if not manifest or manifest.get("slurm_job_id") is None:
            continue
        for cell in manifest["cells"]:
            slots[(str(manifest["slurm_job_id"]), cell["cell"])] = (manifest["pack"], cell["slot"])
    return slots
