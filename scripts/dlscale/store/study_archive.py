"""One archive per study, with a checksum manifest, and the check that an archive matches it.

    python -m dlscale.store.study_archive create results/<study> [--output FILE] [--configfile F
    ...]
    python -m dlscale.store.study_archive verify FILE.tar.gz | DIR

`create` writes one gzipped tarball (default results/<study>/archive/<study>.tar.gz) holding,
under one top folder `dlscale-<study>/`:
- the study's configuration files (the --configfile files, config/hardware.yaml, the regression
  references config/references.yaml, the config schemas) and, from the workflow, the resolved
  configuration (`study-config.json`);
- the profiles (profiles/) and the environment lists (envs/);
- the whole study folder results/<study>/: every cell's metrics with every kept measurement
  (measurements/<time>-<job>/: metrics, the ranks' logs, the Slurm job), the launchers' logs,
  the package lists of the environments the ranks ran in (environments/), the tables, figures
  and report; the Slurm logs of the study's jobs (results/logs/slurm/, found by the job ids the
  cells recorded);
- ARCHIVE.json (format, study, workflow commit, file count) and MANIFEST.sha256: one
  `<sha256>  <path>` line per file, as `sha256sum` writes it (`sha256sum -c MANIFEST.sha256`
  in the extracted folder checks it too).
The tarball is deterministic (sorted members, fixed times, owners and modes, gzip without a
timestamp), so the same files give the same archive checksum; it is written beside the archive
as `<archive>.sha256`. That checksum names the study (README: citing a study).

`verify` recomputes every file's sha256 from a tarball or an extracted folder and reports files
changed, missing from or added to the manifest (exit status 1), and a `<archive>.sha256`
beside a tarball that does not match it.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import sys
import tarfile
from pathlib import Path

from dlscale.run.provenance import git_commit
from dlscale.study.cell import RANK_DIR, SLURM_JOB_FILE, SLURM_LOGS

FORMAT = "dlscale.studyarchive"
VERSION = 1
MANIFEST = "MANIFEST.sha256"
INFO = "ARCHIVE.json"
RESOLVED_CONFIG = "study-config.json"
ARCHIVE_DIR = "archive"  # in the study folder: where `create` writes by default (never archived)
ARCHIVE_LOG = "logs/study_archive.log"  # the workflow rule's own log (never archived)
# Beside the study: what makes it reproducible (relative to the workflow's root).
SHARED = ("config/hardware.yaml", "config/references.yaml", "config/schemas", "profiles", "envs")
_CHUNK = 1 << 20


class ArchiveError(RuntimeError):
    pass


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def default_output(study_dir: str | Path) -> Path:
    study_dir = Path(study_dir)
    return study_dir / ARCHIVE_DIR / f"{study_dir.name}.tar.gz"


def _files_under(path: Path):
    if path.is_file():
        yield path
    elif path.is_dir():
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for name in sorted(filenames):
                yield Path(dirpath) / name


def _study_jobs(study_dir: Path) -> set[str]:
    """The Slurm job ids (and array job_task ids) the study's cells recorded."""
    jobs = set()
    for path in study_dir.glob(f"runs/**/{SLURM_JOB_FILE}"):
        try:
            job = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if job.get("slurm_job_id"):
            jobs.add(str(job["slurm_job_id"]))
        if job.get("array_job_id") and job.get("array_task_id"):
            jobs.add(f"{job['array_job_id']}_{job['array_task_id']}")
    return jobs


def study_files(
    study_dir: str | Path, *, root: str | Path = ".", configfiles=(), exclude=()
) -> dict[str, Path]:
    """Archive path (relative to the top folder) -> file, for everything the archive holds
    besides ARCHIVE.json, the resolved configuration and the manifest."""
    root, study_dir = Path(root).resolve(), Path(study_dir).resolve()
    if not study_dir.is_dir():
        raise ArchiveError(f"{study_dir}: no such study folder")
    skip = {study_dir / ARCHIVE_DIR, study_dir / ARCHIVE_LOG, *(Path(e).resolve() for e in exclude)}
    files = {}

    def add(path: Path):
        path = path.resolve() if not path.is_symlink() else path.absolute()
        if any(path == s or s in path.parents for s in skip) or RANK_DIR in path.parts:
            return
        try:
            name = path.relative_to(root).as_posix()
        except ValueError:  # a config file outside the workflow's folder
            name = f"external/{path.name}"
        files[name] = path

    for config in configfiles:
        if not Path(config).is_file():
            raise ArchiveError(f"configuration file {config} not found")
        add(Path(config))
    for shared in SHARED:
        for path in _files_under(root / shared):
            add(path)
    for path in _files_under(study_dir):
        add(path)
    jobs = _study_jobs(study_dir)
    for path in _files_under(root / SLURM_LOGS):
        if path.stem in jobs or study_dir.name in path.relative_to(root / SLURM_LOGS).parts:
            add(path)
    return files


def _member(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, 0, 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def create(
    study_dir: str | Path,
    output: str | Path | None = None,
    *,
    root: str | Path = ".",
    configfiles=(),
    resolved_config: dict | None = None,
) -> tuple[Path, str]:
    """Write the study's archive and `<archive>.sha256`; returns (archive, its sha256)."""
    study_dir = Path(study_dir)
    study = study_dir.resolve().name
    output = Path(output) if output else default_output(study_dir)
    files = study_files(study_dir, root=root, configfiles=configfiles, exclude=[output])
    if not any(n.endswith("/metrics.jsonl") for n in files):
        raise ArchiveError(f"{study_dir}: no cell metrics to archive")
    extra = {
        INFO: json.dumps(
            {
                "format": FORMAT,
                "version": VERSION,
                "study": study,
                "git_commit": git_commit(str(root)),
                "files": len(files) + (2 if resolved_config is not None else 1),
            },
            indent=1,
            sort_keys=True,
        ).encode()
        + b"\n"
    }
    if resolved_config is not None:
        extra[RESOLVED_CONFIG] = (
            json.dumps(resolved_config, indent=1, sort_keys=True, default=str).encode() + b"\n"
        )
    digests = {name: sha256_file(path) for name, path in files.items()}
    digests.update({name: hashlib.sha256(data).hexdigest() for name, data in extra.items()})
    manifest = "".join(f"{digests[n]}  {n}\n" for n in sorted(digests)).encode()
    top = f"dlscale-{study}"
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as raw:
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
                with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
                    for name, data in [(MANIFEST, manifest), *sorted(extra.items())]:
                        tar.addfile(_member(f"{top}/{name}", len(data)), io.BytesIO(data))
                    for name in sorted(files):
                        path = files[name]
                        with open(path, "rb") as fh:
                            size = os.fstat(fh.fileno()).st_size
                            tar.addfile(_member(f"{top}/{name}", size), fh)
        os.replace(tmp, output)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    checksum = sha256_file(output)
    Path(f"{output}.sha256").write_text(f"{checksum}  {output.name}\n")
    return output, checksum


def create_logged(study_dir, output, log, **kwargs) -> tuple[Path, str]:
    """`create`, for the workflow's study_archive rule: the checksum line also into `log`."""
    archive, checksum = create(study_dir, output, **kwargs)
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    Path(log).write_text(f"{checksum}  {archive}\n")
    print(f"dlscale: study archive {archive}, sha256 {checksum}", file=sys.stderr)
    return archive, checksum


def _parse_manifest(text: str) -> dict[str, str]:
    out = {}
    for i, line in enumerate(text.splitlines(), 1):
        digest, sep, name = line.partition("  ")
        if not sep or len(digest) != 64:
            raise ArchiveError(f"{MANIFEST} line {i}: not `<sha256>  <path>`: {line!r}")
        out[name] = digest
    return out


def _compare(manifest: dict[str, str], found: dict[str, str]) -> list[str]:
    problems = [f"changed: {n}" for n in sorted(manifest) if n in found and found[n] != manifest[n]]
    problems += [f"missing: {n}" for n in sorted(set(manifest) - set(found))]
    problems += [f"not in the manifest: {n}" for n in sorted(set(found) - set(manifest))]
    return problems


def _verify_tar(path: Path) -> list[str]:
    found, manifest, problems = {}, None, []
    with tarfile.open(path, "r:*") as tar:
        for member in tar:
            top, _, name = member.name.partition("/")
            if not member.isfile():
                if not member.isdir():
                    problems.append(f"not a plain file: {member.name}")
                continue
            data = tar.extractfile(member)
            if name == MANIFEST:
                manifest = _parse_manifest(data.read().decode())
                continue
            digest = hashlib.sha256()
            for chunk in iter(lambda: data.read(_CHUNK), b""):
                digest.update(chunk)
            found[name] = digest.hexdigest()
    if manifest is None:
        raise ArchiveError(f"{path}: no {MANIFEST}")
    sidecar = Path(f"{path}.sha256")
    if sidecar.exists():
        recorded = sidecar.read_text().split()[0]
        if recorded != sha256_file(path):
            problems.append(f"the archive's checksum differs from {sidecar.name}")
    return problems + _compare(manifest, found)


def _verify_dir(path: Path) -> list[str]:
    if not (path / MANIFEST).exists():
        tops = [p for p in path.iterdir() if (p / MANIFEST).exists()] if path.is_dir() else []
        if len(tops) != 1:
            raise ArchiveError(f"{path}: no {MANIFEST} (in it or one folder below)")
        path = tops[0]
    manifest = _parse_manifest((path / MANIFEST).read_text())
    found = {
        p.relative_to(path).as_posix(): sha256_file(p)
        for p in _files_under(path)
        if p != path / MANIFEST
    }
    return _compare(manifest, found)


def verify(path: str | Path) -> list[str]:
    """Every difference between an archive (tarball or extracted folder) and its manifest."""
    path = Path(path)
    if not path.exists():
        raise ArchiveError(f"{path}: not found")
    return _verify_dir(path) if path.is_dir() else _verify_tar(path)


def _default_configfiles(root: str, study_dir: str) -> list[Path]:
    """config/config.yaml when it is this study's (its `study:` key names it), else nothing."""
    default = Path(root) / "config" / "config.yaml"
    try:
        import yaml

        named = (yaml.safe_load(default.read_text()) or {}).get("study")
    except (ImportError, OSError, ValueError):
        return []
    if named == Path(study_dir).resolve().name:
        return [default]
    print(
        f"dlscale.store.study_archive: {default} is study {named!r}, not this one; "
        "pass the study's "
        "configuration with --configfile (the archive holds the resolved configuration only "
        "when made by the workflow target)",
        file=sys.stderr,
    )
    return []


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m dlscale.store.study_archive",
        description="archive a study (one tarball with a checksum manifest) or verify one",
    )
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("create", help="write results/<study>/archive/<study>.tar.gz")
    c.add_argument("study_dir", help="the study's folder, results/<study>")
    c.add_argument("--output", help="the archive (default: <study_dir>/archive/<study>.tar.gz)")
    c.add_argument(
        "--configfile",
        action="append",
        default=[],
        help="the study's configuration file(s), as given to snakemake (repeatable; default: "
        "config/config.yaml when its `study:` names this study)",
    )
    c.add_argument("--root", default=".", help="the workflow's folder (default: .)")
    v = sub.add_parser("verify", help="check an archive (or an extracted one) against its manifest")
    v.add_argument("archive")
    args = p.parse_args(argv)
    try:
        if args.command == "create":
            configfiles = args.configfile or _default_configfiles(args.root, args.study_dir)
            out, checksum = create(
                args.study_dir, args.output, root=args.root, configfiles=configfiles
            )
            print(f"{checksum}  {out}")
            return 0
        problems = verify(args.archive)
    except (ArchiveError, OSError, tarfile.TarError) as exc:
        print(f"dlscale.store.study_archive: {exc}", file=sys.stderr)
        return 2
    for line in problems:
        print(line)
    if problems:
        print(f"{args.archive}: {len(problems)} difference(s) from its manifest", file=sys.stderr)
        return 1
    print(f"{args.archive}: every file matches its manifest")
    return 0


if __name__ == "__main__":
    sys.exit(main())
