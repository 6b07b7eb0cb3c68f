"""Stage a dataset to node-local storage (e.g. ``$TMPDIR``) once per node, timed.

:func:`stage` copies a dataset root's files (``dest_root`` may name variables such as
``$TMPDIR``, expanded on the node) (only those its format reads, see
:func:`dataset_files`) to ``<dest_root>/dlscale-data-<name>-<fingerprint>/``. The fingerprint
hashes the source path and every file's relative path, size and modification time, so a
changed dataset stages to a new folder and an unchanged one is reused.

Once per node: every rank may call it; the first to create the lock file
``<target>.lock`` (``O_CREAT | O_EXCL``: atomic on a local file system) copies into
``<target>.tmp-<pid>`` and renames that to ``<target>`` (atomic: a reader sees all or nothing),
the others wait for ``<target>`` to appear. A lock whose holder died (same host, pid gone) is
taken over. A staged copy is reused when its manifest matches the source (every file present
with its size).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import time
from dataclasses import replace
from pathlib import Path

from dlscale.data import (
    CIFAR_META,
    SPLITS,
    WEBDATASET_CLASSES,
    DatasetInfo,
    cifar_files,
    image_folder_files,
    webdataset_shards,
)

__all__ = ["dataset_files", "node_path", "stage", "staged_path", "MANIFEST"]

#: Written last into a staged copy: relative path -> size of every file.
MANIFEST = "dlscale-staged.json"
#: How long a waiting rank waits for another rank's copy before giving up.
WAIT_TIMEOUT_S = 3600.0
POLL_S = 0.2


def dataset_files(info: DatasetInfo) -> list[Path]:
    """The files of ``info``'s root that its format reads, relative to the root, sorted."""
    root = Path(info.path)
    files: list[Path] = []
    for split in SPLITS:
        if info.format == "cifar_binary":
            files += cifar_files(root, split)
        elif info.format == "webdataset":
            files += webdataset_shards(root, split)
        else:
            files += [p for p, _ in image_folder_files(root, split, info.class_names or None)[1]]
    extra = {"cifar_binary": CIFAR_META, "webdataset": WEBDATASET_CLASSES}.get(info.format)
    if extra and (root / extra).is_file():
        files.append(root / extra)
    return sorted(p.relative_to(root) for p in files)


def _manifest(root: Path, files: list[Path]) -> dict[str, int]:
    return {str(f): (root / f).stat().st_size for f in files}


def node_path(dest_root: str | os.PathLike) -> Path:
    """``dest_root`` with ``$VARIABLES`` and ``~`` expanded on this node (a hardware entry can
    say ``$TMPDIR``, which each node resolves for itself); an unset variable is refused."""
    text = os.path.expanduser(os.path.expandvars(os.fspath(dest_root)))
    if "$" in text:
        raise ValueError(f"staging folder {os.fspath(dest_root)!r}: a variable is not set here")
    return Path(text)


def staged_path(info: DatasetInfo, dest_root: str | os.PathLike) -> Path:
    """Where :func:`stage` puts ``info``'s copy under ``dest_root``."""
    root = Path(info.path)
    h = hashlib.sha256(str(root).encode())
    for f in dataset_files(info):
        st = (root / f).stat()
        h.update(f"\0{f}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    return node_path(dest_root) / f"dlscale-data-{root.name}-{h.hexdigest()[:16]}"


def _complete(target: Path, manifest: dict[str, int]) -> bool:
    try:
        recorded = json.loads((target / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    if recorded != manifest:
        return False
    return all(
        (target / f).is_file() and (target / f).stat().st_size == n for f, n in manifest.items()
    )


def _holder_alive(lock: Path) -> bool:
    """False when the lock names a process of this host that no longer exists."""
    try:
        host, pid = lock.read_text().split()
        pid = int(pid)
    except (OSError, ValueError):
        return True  # being written, or unreadable: assume alive
    if host != socket.gethostname():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _copy(source: Path, files: list[Path], manifest: dict[str, int], target: Path) -> int:
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    copied = 0
    for f in files:
        (tmp / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / f, tmp / f)
        copied += (tmp / f).stat().st_size
    (tmp / MANIFEST).write_text(json.dumps(manifest, sort_keys=True))
    shutil.rmtree(target, ignore_errors=True)  # an incomplete or stale copy
    os.rename(tmp, target)
    return copied


def stage(
    info: DatasetInfo,
    dest_root: str | os.PathLike,
    timeout_s: float = WAIT_TIMEOUT_S,
) -> tuple[DatasetInfo, float, int]:
    """Copy ``info``'s dataset under ``dest_root`` once per node and return
    ``(info of the staged copy, seconds this call took, bytes this call copied)``.

    The bytes are 0 when the copy was already there (reused) or another rank made it (this
    call waited: its seconds are the wait). Raises TimeoutError when another rank's copy does
    not appear within ``timeout_s``.
    """
    start = time.perf_counter()
    source = Path(info.path)
    dest_root = node_path(dest_root)
    dest_root.mkdir(parents=True, exist_ok=True)
    files = dataset_files(info)
    manifest = _manifest(source, files)
    target = staged_path(info, dest_root)
    lock = target.with_name(target.name + ".lock")
    copied = 0
    while not _complete(target, manifest):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            if not _holder_alive(lock):
                lock.unlink(missing_ok=True)  # its holder died: take over
                continue
            if time.perf_counter() - start > timeout_s:
                raise TimeoutError(
                    f"staging {source} to {target}: another rank holds {lock} "
                    f"and its copy did not appear within {timeout_s:.0f} s"
                ) from None
            time.sleep(POLL_S)
            continue
        try:
            os.write(fd, f"{socket.gethostname()} {os.getpid()}".encode())
            os.close(fd)
            if not _complete(target, manifest):  # nobody finished while we took the lock
                copied = _copy(source, files, manifest, target)
        finally:
            lock.unlink(missing_ok=True)
    return replace(info, path=str(target)), time.perf_counter() - start, copied
