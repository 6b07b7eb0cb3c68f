"""The file system under a SQLite file (dlscale.store.database): its type, from
/proc/self/mountinfo, and whether it is a network file system, on which SQLite's WAL is unsafe
and its own locks unreliable (the database then uses its rollback journal under a lock file)."""

from __future__ import annotations

import os
from pathlib import Path

# File system types on which SQLite's WAL is unsafe (its shared memory is not shared between
# hosts) and its own locks are unreliable.
NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "lustre",
        "gpfs",
        "beegfs",
        "ceph",
        "fuse.ceph",
        "glusterfs",
        "fuse.glusterfs",
        "fuse.sshfs",
        "9p",
        "afs",
        "ocfs2",
        "gfs2",
        "panfs",
        "wekafs",
    }
)


def filesystem_type(path: str | Path, mountinfo: str = "/proc/self/mountinfo") -> str:
    """The type of the file system `path` lies on (the longest mount point above it)."""
    target = os.path.realpath(path)
    best, kind = "", "unknown"
    try:
        lines = Path(mountinfo).read_text().splitlines()
    except OSError:
        return kind
    for line in lines:
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) < 5 or not right:
            continue
        mount = fields[4].replace("\\040", " ")
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best):
            best, kind = mount, right.split()[0]
    return kind


def network_filesystem(path: str | Path) -> str | None:
    """The network file system type under `path`, or None on a local one."""
    kind = filesystem_type(path)
    return kind if kind in NETWORK_FILESYSTEMS or kind.startswith("nfs") else None
