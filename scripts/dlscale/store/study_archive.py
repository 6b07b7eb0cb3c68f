"""One archive per study, with a checksum manifest, and the check that an archive matches it.

    python -m dlscale.store.study_archive create results/<study> [--output FILE]
        [--configfile F ...] [--config KEY=VALUE ...]
    python -m dlscale.store.study_archive verify FILE.tar.gz | DIR

`create` writes one gzipped tarball (default results/<study>/archive/<study>.tar.gz) holding,
under one top folder `dlscale-<study>/`:
- the study's configuration: the base config/config.yaml, the study file (`study_file`) and
  every --configfile file, the hardware file and the regression references it names, the config
  schemas; the command line's settings (`command-line.json`: the --configfile files in order, as
  archive paths, and the --config entries as Snakemake parsed them), and the configuration they
  resolve to (`study-config.json`), computed by `resolved_config` as the workflow computes it;
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
beside a tarball that does not match it; a tarball with a member that has no place in a study
archive (a link, a device file, a path outside its folder: `member_problem`) is refused before
anything is extracted (exit status 2); it also resolves the configuration again from the
archive's own files and command line (`rebuilt_config`) and reports any difference from
`study-config.json`, so an archive proves it reproduces the study's settings.
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

from dlscale.rank.provenance import git_commit
from dlscale.study.cell import RANK_DIR, SLURM_JOB_FILE, SLURM_LOGS

FORMAT = "dlscale.studyarchive"
VERSION = 1
MANIFEST = "MANIFEST.sha256"
INFO = "ARCHIVE.json"
RESOLVED_CONFIG = "study-config.json"
COMMAND_LINE = "command-line.json"
ARCHIVE_DIR = "archive"  # in the study folder: where `create` writes by default (never archived)
ARCHIVE_LOG = "logs/study_archive.log"  # the workflow rule's own log (never archived)
BASE_CONFIG = "config/config.yaml"  # every study's base (dlscale.study.matrix.DEFAULT_STUDY_FILE)
CONFIG_SCHEMA = "config/schemas/config.schema.json"
# Beside the study: what makes it reproducible (relative to the workflow's root); the hardware
# and references files a study names elsewhere are added from its resolved configuration.
SHARED = (
    BASE_CONFIG,
    "config/hardware.yaml",
    "config/references.yaml",
    "config/schemas",
    "profiles",
    "envs",
)
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


def archive_name(path: str | Path, root: str | Path) -> str:
    """A file's path in the archive: relative to the workflow's folder, or external/<name> for
    a file outside it (a study file kept elsewhere)."""
    path = Path(root) / path if not Path(path).is_absolute() else Path(path)
    path = path.resolve() if not path.is_symlink() else path.absolute()
    try:
        return path.relative_to(Path(root).resolve()).as_posix()
    except ValueError:
        return f"external/{path.name}"


def resolved_config(root: str | Path, configfiles=(), config: dict | None = None) -> dict:
    """The study's configuration as the workflow resolves it (rules/common.smk): Snakemake's
    config (the --configfile files merged in order, then the --config entries `config`), read
    by dlscale.study.matrix.workflow_config over config/config.yaml and the study file, and
    validated with its defaults filled in (what the workflow's STUDY.config holds)."""
    from dlscale.study.config import load_config_file, load_schema, validate_config
    from dlscale.study.matrix import merge_config, workflow_config

    cli: dict = {}
    for path in configfiles:
        cli = merge_config(cli, load_config_file(path, source=f"--configfile {path}"))
    cli = merge_config(cli, dict(config or {}))
    return validate_config(
        workflow_config(cli, root, configfiles), load_schema(Path(root) / CONFIG_SCHEMA)
    )


def _jsonable(value) -> object:
    """`value` as its JSON file reads back (what study-config.json holds)."""
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def rebuilt_config(folder: str | Path) -> dict:
    """The configuration resolved again from an archive's own files (an extracted archive's
    top folder): its config/config.yaml, the --configfile files and the study file it holds,
    and the --config entries of command-line.json. It equals study-config.json when the archive
    reproduces the study's settings."""
    folder = Path(folder)
    command = json.loads((folder / COMMAND_LINE).read_text())
    config = dict(command["config"])
    if command.get("study_file"):  # read from the archive, reported as it was given
        config["study_file"] = str(folder / command["study_file"]["archived"])
    rebuilt = resolved_config(folder, [folder / n for n in command["configfiles"]], config)
    if command.get("study_file"):
        rebuilt["study_file"] = command["study_file"]["given"]
    return _jsonable(rebuilt)


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
        files[archive_name(path, root)] = path

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


def script_files(config: dict, root: str | Path) -> list[Path]:
    """The files of the study's scripts (dlscale.study.script_workload): each script and the
    files hashed with it, its configuration among them; none for a study without scripts."""
    from dlscale.study import script_workload

    if not script_workload.used(config):
        return []
    scripts, _ = script_workload.read_scripts(config, root)
    return [f for s in scripts.values() for f in script_workload.files_of(s, root)]


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
    config: dict | None = None,
) -> tuple[Path, str]:
    """Write the study's archive and `<archive>.sha256`; returns (archive, its sha256).
    `configfiles` and `config`: the study's --configfile files and --config entries, as the
    workflow was run (the workflow's study_archive rule passes its own)."""
    from dlscale.study.config import ConfigError

    study_dir = Path(study_dir)
    if not study_dir.is_dir():
        raise ArchiveError(f"{study_dir.resolve()}: no such study folder")
    study = study_dir.resolve().name
    output = Path(output) if output else default_output(study_dir)
    try:
        resolved = resolved_config(root, configfiles, config)
    except ConfigError as exc:
        raise ArchiveError(f"the study's configuration does not resolve: {exc}") from None
    if resolved["study"] != study:
        given = " ".join(f"--configfile {f}" for f in configfiles) + "".join(
            f" --config {k}={v}" for k, v in (config or {}).items()
        )
        raise ArchiveError(
            f"{study_dir} is study {study!r}, but {BASE_CONFIG}{' with ' + given if given else ''}"
            f" resolves to study {resolved['study']!r}: give the settings the study was run "
            "with (its study file: --configfile FILE, or --config study_file=FILE and any other "
            "--config entries), so the archive can reproduce them"
        )
    # the files the configuration names (a hardware or references file that does not exist is
    # not archived: the workflow reads neither for a study that does not use it)
    named = [resolved.get("study_file"), resolved["hardware_file"], resolved["references_file"]]
    named = [Path(root) / n for n in named if n and (Path(root) / n).is_file()]
    # a script workload's scripts and the files hashed with them (what its cells ran)
    named += script_files(resolved, root)
    files = study_files(study_dir, root=root, configfiles=[*configfiles, *named], exclude=[output])
    if not any(n.endswith("/metrics.jsonl") for n in files):
        raise ArchiveError(f"{study_dir}: no cell metrics to archive")
    command = {
        "configfiles": [archive_name(f, root) for f in configfiles],
        "config": _jsonable(dict(config or {})),
        "study_file": resolved.get("study_file")
        and {
            "given": resolved["study_file"],
            "archived": archive_name(resolved["study_file"], root),
        },
    }
    extra = {
        RESOLVED_CONFIG: json.dumps(_jsonable(resolved), indent=1, sort_keys=True).encode() + b"\n",
        COMMAND_LINE: json.dumps(command, indent=1, sort_keys=True).encode() + b"\n",
    }
    extra[INFO] = (
        json.dumps(
            {
                "format": FORMAT,
                "version": VERSION,
                "study": study,
                "git_commit": git_commit(str(root)),
                "files": len(files) + len(extra) + 1,
            },
            indent=1,
            sort_keys=True,
        ).encode()
        + b"\n"
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


def member_problem(member: tarfile.TarInfo) -> str | None:
    """Why `member` has no place in a study archive, or None. An archive holds regular files and
    folders only, each at a relative path that stays inside the folder it is extracted to: no
    absolute path, no `..`, no link (symbolic or hard), device, FIFO or other special file."""
    name = member.name
    if member.issym() or member.islnk():
        kind = "a symbolic link" if member.issym() else "a hard link"
        return f"{name!r} is {kind} to {member.linkname!r}"
    if member.isdev():
        return f"{name!r} is a device file or FIFO"
    if not member.isfile() and not member.isdir():
        return f"{name!r} is neither a regular file nor a folder"
    if name.startswith("/") or ".." in name.split("/"):
        return f"{name!r} is a path outside the folder it would be extracted to"
    return None


def _refuse_unsafe(members: list[tarfile.TarInfo], what: str) -> None:
    """ArchiveError naming the members that have no place in a study archive, if any."""
    refused = [p for p in map(member_problem, members) if p]
    if refused:
        more = f" (and {len(refused) - 5} more)" if len(refused) > 5 else ""
        raise ArchiveError(
            f"{what}: refused, not a study archive: {'; '.join(refused[:5])}{more}. A study "
            "archive holds only regular files and folders under one top folder; nothing was "
            "extracted"
        )


def extract_files(tar: tarfile.TarFile, members, folder: Path) -> None:
    """Write the regular files among `members` under `folder`, on every Python the project
    accepts: tarfile's extraction filters (`filter="data"`) need 3.11.4 or newer, and Debian
    12's python3 is 3.11.2. Every member is checked first (`member_problem`; ArchiveError
    before anything is written), then only each file's bytes are written, to a path inside
    `folder`: no link, device, owner, mode or time comes from the archive."""
    folder = Path(folder).resolve()
    members = list(members)
    _refuse_unsafe(members, tar.name or "the archive")
    targets = [(m, (folder / m.name).resolve()) for m in members if m.isfile()]
    outside = [m.name for m, target in targets if folder not in target.parents]
    if outside:
        raise ArchiveError(f"refused, paths outside {folder}: {outside}; nothing was extracted")
    for member, target in targets:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tar.extractfile(member) as data, open(target, "wb") as out:
            for chunk in iter(lambda: data.read(_CHUNK), b""):
                out.write(chunk)


def _verify_tar(path: Path) -> list[str]:
    found, manifest, problems = {}, None, []
    with tarfile.open(path, "r:*") as tar:
        members = tar.getmembers()
        _refuse_unsafe(members, str(path))
        for member in members:
            top, _, name = member.name.partition("/")
            if not member.isfile():
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
    problems = _compare(manifest, found)
    return problems + ([] if problems else config_problems(path))


def config_problems(folder: Path) -> list[str]:
    """Every difference between the configuration resolved again from an extracted archive's
    files (`rebuilt_config`) and the one it recorded (study-config.json)."""
    from dlscale.study.config import ConfigError

    if not (folder / COMMAND_LINE).is_file():  # made before archives held it: not a difference
        print(
            f"note: no {COMMAND_LINE} (an archive made before archives held the study's command "
            "line): its configuration was not rebuilt from its files",
            file=sys.stderr,
        )
        return []
    try:
        rebuilt = rebuilt_config(folder)
        recorded = json.loads((folder / RESOLVED_CONFIG).read_text())
    except (ConfigError, OSError, ValueError, KeyError) as exc:
        return [f"the configuration does not resolve from the archive's own files: {exc}"]
    return [
        f"configuration: {key} resolves to {rebuilt.get(key)!r} from the archive's files, "
        f"{RESOLVED_CONFIG} says {recorded.get(key)!r}"
        for key in sorted(set(rebuilt) | set(recorded))
        if rebuilt.get(key) != recorded.get(key)
    ]


def _tar_config_problems(path: Path) -> list[str]:
    """config_problems of a tarball: its files outside the study folder, extracted."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp, tarfile.open(path, "r:*") as tar:
        members = [
            m for m in tar.getmembers() if m.isfile() and m.name.split("/")[1:2] != ["results"]
        ]
        extract_files(tar, members, Path(tmp))
        tops = [p for p in Path(tmp).iterdir() if p.is_dir()]
        return config_problems(tops[0]) if len(tops) == 1 else ["no top folder"]


def verify(path: str | Path) -> list[str]:
    """Every difference between an archive (tarball or extracted folder) and its manifest, and
    between its recorded configuration and the one its own files resolve to."""
    path = Path(path)
    if not path.exists():
        raise ArchiveError(f"{path}: not found")
    if path.is_dir():
        return _verify_dir(path)
    problems = _verify_tar(path)
    return problems + ([] if problems else _tar_config_problems(path))


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
        help="the study's --configfile file(s), as given to snakemake (repeatable)",
    )
    c.add_argument(
        "--config",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="the study's --config entries, as given to snakemake (e.g. study_file=my-study.yaml)",
    )
    c.add_argument("--root", default=".", help="the workflow's folder (default: .)")
    v = sub.add_parser("verify", help="check an archive (or an extracted one) against its manifest")
    v.add_argument("archive")
    args = p.parse_args(argv)
    try:
        if args.command == "create":
            from snakemake.cli import parse_config  # --config read as Snakemake reads it

            out, checksum = create(
                args.study_dir,
                args.output,
                root=args.root,
                configfiles=args.configfile,
                config=parse_config(args.config),
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
        print(
            f"{args.archive}: {len(problems)} difference(s) from its manifest or its recorded "
            "configuration",
            file=sys.stderr,
        )
        return 1
    print(
        f"{args.archive}: every file matches its manifest, and its files resolve to its recorded "
        "configuration"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
