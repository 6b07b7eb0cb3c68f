"""A script's files and their content hash (dlscale.study.script_workload): a path the study
names, resolved and kept inside the checkout where relative, and the files hashed with the
script (its folder, or the `files` it lists), whose sha256 is part of each of its cells'
identity."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

# The files hashed with a script: at most this many, and this many bytes in all (`files` names
# fewer where the script's folder holds more).
MAX_FILES, MAX_FILES_BYTES = 2000, 256 * 1024 * 1024
SKIPPED_DIRS = ("__pycache__",)  # never hashed, nor hidden folders (.git, ...)


def resolve_path(key: str, path, workflow_dir: Path, *, kind: str) -> tuple[Path | None, str]:
    """(the resolved path, problem or ''): a relative path must stay inside the checkout (the
    workflow's folder) once `..` and links are resolved; an absolute one may lie anywhere.
    `kind`: "file" or "any" (a file or a folder)."""
    if not isinstance(path, str) or not path.strip() or "\x00" in path:
        return None, f"{key}: a path (relative to the checkout, or absolute)"
    given = Path(path)
    full = given if given.is_absolute() else workflow_dir / given
    try:
        real = full.resolve(strict=True)
    except (OSError, RuntimeError):
        return None, f"{key}: {path!r} does not exist ({full})"
    if not given.is_absolute():
        root = workflow_dir.resolve()
        if real != root and root not in real.parents:
            return None, (
                f"{key}: {path!r} lies outside the checkout ({root}) once resolved ({real}); "
                "a relative path stays inside it: give a path outside as an absolute one"
            )
    if kind == "file" and not real.is_file():
        return None, f"{key}: {path!r} is not a regular file"
    if not (real.is_file() or real.is_dir()):
        return None, f"{key}: {path!r} is neither a file nor a folder"
    return real, ""


def _folder_files(folder: Path) -> list[Path]:
    out = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIPPED_DIRS)
        out += [Path(root) / n for n in sorted(names) if not n.startswith(".")]
        if len(out) > MAX_FILES:
            break
    return out


def hashed_files(key: str, script: Path, files: list[Path]) -> tuple[list[Path], str]:
    """(the files hashed with the script, problem or ''): the script, then every regular file
    of `files` (folders walked, hidden entries and __pycache__ left out), each once, at most
    MAX_FILES files and MAX_FILES_BYTES bytes."""
    seen, out, total = set(), [], 0
    for path in [script, *files]:
        for f in _folder_files(path) if path.is_dir() else [path]:
            real = f.resolve()
            if real in seen or not real.is_file():
                continue
            seen.add(real)
            out.append(f)
            total += real.stat().st_size
            if len(out) > MAX_FILES or total > MAX_FILES_BYTES:
                return [], (
                    f"{key}: more than {MAX_FILES} files or {MAX_FILES_BYTES >> 20} MiB to hash "
                    f"(under {path}); list the files and folders the script reads under `files`"
                )
    return out, ""


def content_hash(script: Path, files: list[Path]) -> str:
    """sha256 over each file's path (relative to the script's folder where it lies there) and
    bytes, in order: the script's content identity."""
    digest = hashlib.sha256()
    base = script.parent
    for f in files:
        try:
            name = f.relative_to(base).as_posix()
        except ValueError:
            name = f.as_posix()
        digest.update(name.encode() + b"\0")
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
        digest.update(b"\0")
    return digest.hexdigest()
