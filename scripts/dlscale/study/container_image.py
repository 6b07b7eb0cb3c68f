"""A hardware entry's `container` (engine, image, python, binds, digest): its checks before any
job, the image's digest (the identity of the environment the ranks run in, as a lock file's hash
is a venv's), and what the launcher binds into it. The engines themselves, and the command line
each emits, are records in dlscale.registry.containers.

The digest is `sha256:<64 hex>`:
- of a registry reference pinned by digest (`...@sha256:<hex>`): that digest, read from the
  reference (a tag alone can move under the same name, and is refused);
- of an image file (SIF, SquashFS): the sha256 of the file;
- of an image directory (Charliecloud): the sha256 over every entry's relative path, type,
  permission bits and content (a file's sha256, a link's target), in path order; a file the
  reading user may not read counts by its size and modification time, and is named so.
`container.digest` states it where the login node cannot read the image (pyxis pulls on the
nodes); where it can, a stated digest must match. Files and directories are hashed once per
change: the digest is cached beside the user's pip and Snakemake caches, keyed by a stamp of
every entry's size, mode, inode and modification time.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from pathlib import Path

from dlscale.registry.containers import ENGINES
from dlscale.registry.launchers import on_slurm

PINNED = re.compile(r"@(sha256:[0-9a-f]{64})$")
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
CACHE_NAME = "image-digests.json"
CHUNK = 1 << 22


class ImageError(ValueError):
    """The image cannot be identified: the message names the key and the way out."""


def spec(entry: dict) -> dict | None:
    """The entry's container as a Cell carries it (engine, image, python, binds; the digest is
    added by environment_id's caller), or None without one."""
    c = entry.get("container")
    if not c:
        return None
    return {
        "engine": c["engine"],
        "image": c["image"],
        "python": c.get("python", "python3"),
        "binds": list(c.get("binds", [])),
    }


def _cache_file() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dlscale" / CACHE_NAME


def _stamp(path: Path) -> tuple[str, list[Path]]:
    """A cheap fingerprint of an image file or directory (every entry's relative path, mode,
    size, inode and modification time) and its entries in path order."""
    h = hashlib.sha256()
    entries = [path]
    if path.is_dir() and not path.is_symlink():
        entries = [path]
        for root, dirs, files in os.walk(path):
            dirs.sort()
            for name in sorted(dirs + files):
                entries.append(Path(root) / name)
        entries.sort()
    for p in entries:
        st = p.lstat()
        h.update(
            f"{p.relative_to(path)}\0{st.st_mode}\0{st.st_size}\0{st.st_ino}\0"
            f"{st.st_mtime_ns}\n".encode()
        )
    return h.hexdigest(), entries


def _file_sha256(p: Path) -> str:
    h = hashlib.sha256()
    with p.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def content_digest(path: Path, entries: list[Path] | None = None) -> str:
    """`sha256:<hex>` of an image file, or of an image directory's entries (module docstring)."""
    if not path.is_dir():
        return f"sha256:{_file_sha256(path)}"
    entries = entries if entries is not None else _stamp(path)[1]
    h = hashlib.sha256()
    for p in entries:
        st = p.lstat()
        rel = str(p.relative_to(path))
        mode = stat.S_IMODE(st.st_mode)
        if stat.S_ISLNK(st.st_mode):
            what = f"link\0{os.readlink(p)}"
        elif stat.S_ISDIR(st.st_mode):
            what = "dir"
        elif stat.S_ISREG(st.st_mode):
            try:
                what = f"file\0{_file_sha256(p)}"
            except PermissionError:  # e.g. the image's /etc/shadow, for a plain user
                what = f"unreadable\0{st.st_size}\0{st.st_mtime_ns}"
        else:
            what = f"special\0{stat.S_IFMT(st.st_mode)}\0{st.st_rdev}"
        h.update(f"{rel}\0{mode:o}\0{what}\n".encode())
    return f"sha256:{h.hexdigest()}"


def local_digest(path: Path) -> str:
    """content_digest of a local image, from the cache when its stamp is unchanged."""
    cache = _cache_file()
    key = str(path.resolve())
    stamp, entries = _stamp(path)
    try:
        known = json.loads(cache.read_text())
    except (OSError, ValueError):
        known = {}
    hit = known.get(key)
    if isinstance(hit, dict) and hit.get("stamp") == stamp:
        return hit["digest"]
    digest = content_digest(path, entries)
    known[key] = {"stamp": stamp, "digest": digest}
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(f".{CACHE_NAME}.{os.getpid()}")
        tmp.write_text(json.dumps(known, indent=1, sort_keys=True))
        os.replace(tmp, cache)
    except OSError:
        pass  # no cache: the digest is computed again next time
    return digest


def is_local(image: str) -> bool:
    return image.startswith("/")


def image_digest(key: str, container: dict) -> str:
    """The image's `sha256:<hex>` (module docstring); ImageError naming `<key>.container.*`
    when it cannot be known or a stated digest does not match."""
    image, stated = container["image"], container.get("digest")
    where = f"{key}.container"
    if is_local(image):
        path = Path(image)
        if not path.exists():
            if stated:
                return stated  # on the nodes only (e.g. a node-local SquashFS)
            raise ImageError(
                f"{where}.image: {image} does not exist here; build or copy the image, or, "
                "where only the nodes can read it, state its digest as container.digest "
                "(sha256:<64 hex>)"
            )
        try:
            digest = local_digest(path)
        except OSError as exc:
            raise ImageError(f"{where}.image: {image} cannot be read to compute its digest: {exc}")
    else:
        pinned = PINNED.search(image)
        if not pinned and not stated:
            raise ImageError(
                f"{where}.image: {image!r} names a tag, which can point at other contents "
                "later; pin it by digest (...@sha256:<64 hex>) or state container.digest, so "
                "the cells' environment identity is the image's content"
            )
        digest = pinned.group(1) if pinned else stated
    if stated and stated != digest:
        raise ImageError(
            f"{where}.digest: {stated} is not the image's digest ({digest} for {image}): the "
            "image changed, or the digest belongs to another image"
        )
    return digest


def environment_id(engine: str, digest: str) -> str:
    """A container cell's `environment` (the venv cells' is `<name>:<hash of requirements>`)."""
    return f"container-{engine}:{digest.removeprefix('sha256:')[:16]}"


def container_problems(key: str, entry: dict, launcher: str | None = None) -> list[str]:
    """What is wrong with an entry's container beyond its schema, before any job."""
    c = entry.get("container")
    if not isinstance(c, dict) or c.get("engine") not in ENGINES:
        return []  # absent, or the schema says what it must be
    engine, image = ENGINES[c["engine"]], c.get("image", "")
    problems = []
    if engine.needs_srun and launcher is not None and not on_slurm(launcher):
        problems.append(
            f"{key}.container.engine: {engine.name} starts containers only through srun (a "
            "Slurm plugin), and this study's launcher is local: use apptainer or "
            "charliecloud, or run the study on Slurm (launcher: srun)"
        )
    if c["engine"] == "pyxis" and not is_local(image) and "#" not in image and "/" in image:
        first = image.split("/", 1)[0]
        if "." in first or ":" in first:  # docker's REGISTRY/REPO, which enroot writes REGISTRY#
            problems.append(
                f"{key}.container.image: pyxis (enroot) separates the registry with '#': "
                f"{first}#{image.split('/', 1)[1]}"
            )
    if c["engine"] == "apptainer" and not is_local(image) and "://" not in image:
        problems.append(
            f"{key}.container.image: {image!r}: apptainer needs an absolute path or a URI "
            f"(docker://, oras://, library://); allowed: {engine.image_forms}"
        )
    return problems


def needed_binds(paths: list[str], container: dict) -> tuple[list[str], list[str]]:
    """(binds, problems): what the engine binds so the ranks see `paths` (the dlscale package,
    the cell's folder, its dataset) at the same paths, plus the site's `binds`. An engine that
    binds any path (apptainer, pyxis) binds each path; Charliecloud only binds onto mount points
    the image has, so each path must lie under one of the site's binds or /tmp."""
    engine = ENGINES[container["engine"]]
    site = list(container.get("binds", []))
    if engine.exact_binds:
        extra = [p for p in paths if not any(_under(p, b) for b in site)]
        return _dedupe(site + extra), []
    covering = site + list(engine.default_binds)
    problems = [
        f"{p} is under none of the binds {covering}: Charliecloud binds only onto directories "
        "the image has (ch-run -b). Add the file system it lies on (e.g. /"
        f"{Path(p).parts[1] if len(Path(p).parts) > 1 else ''}) to container.binds, with that "
        "directory created in the image"
        for p in paths
        if not any(_under(p, b) for b in covering)
    ]
    return site, problems


def _under(path: str, folder: str) -> bool:
    return os.path.commonpath([os.path.abspath(path), os.path.abspath(folder)]) == (
        os.path.abspath(folder)
    )


def _dedupe(binds: list[str]) -> list[str]:
    out = []
    for b in binds:
        if not any(_under(b, kept) for kept in out):
            out = [k for k in out if not _under(k, b)] + [b]
    return out


def image_mount_problems(key: str, container: dict) -> list[str]:
    """A Charliecloud image directory that the login node can read: each site bind needs its
    mount point in the image, and the interpreter must be there."""
    image = Path(container["image"])
    if container["engine"] != "charliecloud" or not image.is_dir():
        return []
    problems = [
        f"{key}.container.binds: {b} has no mount point in the image ({image}{b} is not a "
        f"directory): create it when building the image (mkdir -p {image}{b})"
        for b in container.get("binds", [])
        if not (image / b.lstrip("/")).is_dir()
    ]
    python = container.get("python", "python3")
    if python.startswith("/") and not os.path.lexists(image / python.lstrip("/")):
        problems.append(
            f"{key}.container.python: {python} is not in the image {image}; name the "
            "interpreter of the framework environment the image holds"
        )
    return problems


def image_environment_dir(container: dict) -> Path | None:
    """The folder of the framework environment inside a readable image directory (the prefix of
    its `python`: /opt/env/bin/python -> IMAGE/opt/env), what the login node's CUDA probe
    reads; None where the login node cannot read the image (a file or a registry reference:
    the entry's preflight checks the build inside the container, on a node)."""
    image, python = Path(container["image"]), container.get("python", "python3")
    if not image.is_dir() or not python.startswith("/"):
        return None
    return image / Path(python.lstrip("/")).parent.parent
