"""The study archive (dlscale.store.study_archive): what it holds, round trip, a changed file
found."""

from __future__ import annotations

import copy
import hashlib
import io
import json
import os
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

import pytest

from dlscale.store import study_archive as studyarchive

ROOT = Path(__file__).resolve().parents[3]
CELL = "results/s1/runs/cpu/pytorch/cnn_small/weak/fp32/eager/n1/r1"


def workflow_tree(root: Path) -> Path:
    """A workflow folder with one measured study (s1), a second study and Slurm logs."""
    files = {
        "config/config.yaml": "study: s1\n",
        "config/hardware.yaml": "cpu: {}\n",
        # the real schema: the archive resolves the study's configuration as the workflow does
        "config/schemas/config.schema.json": (ROOT / studyarchive.CONFIG_SCHEMA).read_text(),
        "profiles/local/config.yaml": "cores: 1\n",
        "envs/pytorch.txt": "torch==2.13.0\n",
        f"{CELL}/measurements/20260101T000000Z-job7/metrics.jsonl": '{"m": 1}\n',
        f"{CELL}/measurements/20260101T000000Z-job7/rank0.log": "log\n",
        f"{CELL}/measurements/20250101T000000Z-job3/metrics.jsonl": '{"m": 0}\n',
        f"{CELL}/metrics.jsonl": '{"m": 1}\n',
        f"{CELL}/slurm_job.json": json.dumps({"slurm_job_id": "7"}),
        f"{CELL}/.ranks/rank0.jsonl": "transient\n",
        "results/s1/environments/abc.txt": "torch==2.13.0\n",
        "results/s1/tables/cells.csv": "a,b\n1,2\n",
        "results/s1/report/report.pdf": "%PDF\n",
        "results/s1/logs/train/x.log": "train\n",
        "results/s1/logs/study_archive.log": "the archive's own log\n",
        "results/other/tables/cells.csv": "other study\n",
        "results/logs/slurm/rule_train_cpu_n1/7.log": "slurm job 7\n",
        "results/logs/slurm/rule_train_cpu_n1/8.log": "another study's job\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root / "results/s1"


def extracted_archive(tmp_path: Path) -> tuple[Path, Path]:
    """The workflow tree's study archived and extracted: the archive and its top folder."""
    archive, _ = studyarchive.create(workflow_tree(tmp_path), root=tmp_path)
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "x", filter="data")
    return archive, tmp_path / "x" / "dlscale-s1"


def test_archive_holds_the_study_and_round_trips(tmp_path):
    study = workflow_tree(tmp_path)
    archive, checksum = studyarchive.create(study, root=tmp_path)
    assert archive == study / "archive" / "s1.tar.gz"
    assert Path(f"{archive}.sha256").read_text() == f"{checksum}  s1.tar.gz\n"
    with tarfile.open(archive) as tar:
        names = {m.name.removeprefix("dlscale-s1/") for m in tar}
    assert {
        "MANIFEST.sha256",
        "ARCHIVE.json",
        "study-config.json",
        "command-line.json",
        "config/config.yaml",
        "config/hardware.yaml",
        "config/schemas/config.schema.json",
        "profiles/local/config.yaml",
        "envs/pytorch.txt",
        f"{CELL}/metrics.jsonl",
        f"{CELL}/measurements/20260101T000000Z-job7/metrics.jsonl",
        f"{CELL}/measurements/20250101T000000Z-job3/metrics.jsonl",  # earlier ones too
        f"{CELL}/measurements/20260101T000000Z-job7/rank0.log",
        "results/s1/environments/abc.txt",
        "results/s1/tables/cells.csv",
        "results/s1/report/report.pdf",
        "results/s1/logs/train/x.log",
        "results/logs/slurm/rule_train_cpu_n1/7.log",  # the study's job only
    } <= names
    assert not any(".ranks" in n or "other" in n or n.endswith("8.log") for n in names)
    assert "results/s1/logs/study_archive.log" not in names
    assert not any("/archive/" in n for n in names)
    assert studyarchive.verify(archive) == []
    # the same files give the same archive, byte for byte
    again, checksum2 = studyarchive.create(study, root=tmp_path)
    assert checksum2 == checksum
    # extracted, it verifies too (the folder or its parent)
    out = tmp_path / "x"
    with tarfile.open(archive) as tar:
        tar.extractall(out, filter="data")
    assert studyarchive.verify(out) == [] and studyarchive.verify(out / "dlscale-s1") == []
    manifest = (out / "dlscale-s1" / "MANIFEST.sha256").read_text()
    sums = subprocess.run(["sha256sum", "-c", "--quiet", "MANIFEST.sha256"], cwd=out / "dlscale-s1")
    assert sums.returncode == 0, manifest


def test_a_changed_missing_or_added_file_is_found(tmp_path):
    archive, top = extracted_archive(tmp_path)
    (top / CELL / "metrics.jsonl").write_text('{"m": 2}\n')
    (top / "results/s1/tables/cells.csv").unlink()
    (top / "results/s1/extra.txt").write_text("added\n")
    assert studyarchive.verify(top) == [
        f"changed: {CELL}/metrics.jsonl",
        "missing: results/s1/tables/cells.csv",
        "not in the manifest: results/s1/extra.txt",
    ]
    # a tarball rebuilt with one changed member: the manifest no longer matches it
    forged = tmp_path / "forged.tar.gz"
    with tarfile.open(forged, "w:gz") as tar:
        tar.add(top, arcname="dlscale-s1")
    problems = studyarchive.verify(forged)
    assert f"changed: {CELL}/metrics.jsonl" in problems
    # an archive whose bytes are not the ones its checksum file names is reported
    Path(f"{archive}.sha256").write_text(f"{'0' * 64}  s1.tar.gz\n")
    assert studyarchive.verify(archive) == ["the archive's checksum differs from s1.tar.gz.sha256"]


def test_cli_create_and_verify(tmp_path):
    study = workflow_tree(tmp_path)
    run = [sys.executable, "-m", "dlscale.store.study_archive"]
    made = subprocess.run(
        [*run, "create", str(study), "--root", str(tmp_path)], capture_output=True, text=True
    )
    assert made.returncode == 0, made.stderr
    checksum, path = made.stdout.split()
    assert Path(path).exists() and len(checksum) == 64
    with tarfile.open(path) as tar:  # config/config.yaml names s1: archived by default
        assert "dlscale-s1/config/config.yaml" in tar.getnames()
    ok = subprocess.run([*run, "verify", path], capture_output=True, text=True)
    assert ok.returncode == 0 and "every file matches" in ok.stdout
    out = tmp_path / "x"
    with tarfile.open(path) as tar:
        tar.extractall(out, filter="data")
    (out / "dlscale-s1/config/hardware.yaml").write_text("cpu: {changed: 1}\n")
    bad = subprocess.run([*run, "verify", str(out)], capture_output=True, text=True)
    assert bad.returncode == 1 and "changed: config/hardware.yaml" in bad.stdout
    none = subprocess.run([*run, "create", str(tmp_path / "nope")], capture_output=True, text=True)
    assert none.returncode == 2 and "no such study folder" in none.stderr


def test_an_archive_rebuilds_the_resolved_configuration_from_its_own_files(tmp_path):
    """Base config, a study file outside the checkout, a --configfile and --config
    entries: the archive holds each, and its files alone resolve to the recorded configuration
    (study-config.json); a study file changed after the fact is found, by the manifest and by
    the rebuild."""
    root = tmp_path / "checkout"
    study = workflow_tree(root)
    elsewhere = tmp_path / "home" / "my-study.yaml"  # outside the checkout
    elsewhere.parent.mkdir()
    elsewhere.write_text("study: s1\nsteps: 7\nper_rank_batch: 4\n")
    extra = root / "extra.yaml"
    extra.write_text("warmup_steps: 3\n")
    config = {"study_file": str(elsewhere), "max_cells": 500, "report": {"title": "T"}}
    original = studyarchive.resolved_config(root, [extra], config)
    assert (original["steps"], original["warmup_steps"], original["max_cells"]) == (7, 3, 500)
    archive, _ = studyarchive.create(study, root=root, configfiles=[extra], config=config)
    out = tmp_path / "x"
    with tarfile.open(archive) as tar:
        names = {n.removeprefix("dlscale-s1/") for n in tar.getnames()}
        tar.extractall(out, filter="data")
    assert {"config/config.yaml", "external/my-study.yaml", "extra.yaml"} <= names
    top = out / "dlscale-s1"
    recorded = json.loads((top / "study-config.json").read_text())
    assert recorded == json.loads(json.dumps(original, default=str))
    assert studyarchive.rebuilt_config(top) == recorded
    assert studyarchive.verify(archive) == [] and studyarchive.verify(top) == []

    # the study file edited after the archive was made: the manifest and the rebuild both say so
    (top / "external/my-study.yaml").write_text("study: s1\nsteps: 8\nper_rank_batch: 4\n")
    assert studyarchive.verify(top) == ["changed: external/my-study.yaml"]
    assert studyarchive.config_problems(top) == [
        "configuration: steps resolves to 8 from the archive's files, study-config.json says 7"
    ]


def test_an_archive_of_another_study_than_its_settings_is_refused(tmp_path):
    """The base config names s1; archiving study s2 without its settings would hold a
    configuration that does not reproduce it: refused, nothing written."""
    workflow_tree(tmp_path)
    other = tmp_path / "results/s2"
    (other / "runs").mkdir(parents=True)
    (other / "runs/metrics.jsonl").write_text("{}\n")
    run = [sys.executable, "-m", "dlscale.store.study_archive", "create", str(other)]
    made = subprocess.run([*run, "--root", str(tmp_path)], capture_output=True, text=True)
    assert made.returncode == 2, made.stderr
    assert "resolves to study 's1'" in made.stderr and "--config study_file=FILE" in made.stderr
    assert not (other / "archive").exists()
    (tmp_path / "s2.yaml").write_text("study: s2\n")
    made = subprocess.run(
        [*run, "--root", str(tmp_path), "--config", f"study_file={tmp_path / 's2.yaml'}"],
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr
    with tarfile.open(made.stdout.split()[1]) as tar:
        command = json.load(tar.extractfile("dlscale-s2/command-line.json"))
    assert command["study_file"]["archived"] == "s2.yaml"


def test_an_archive_from_before_the_command_line_still_verifies(tmp_path, capsys):
    """Archives made before they held command-line.json: their files are checked as before, and
    the missing rebuild is a note, not a difference."""
    _, top = extracted_archive(tmp_path)
    (top / "command-line.json").unlink()
    manifest = top / "MANIFEST.sha256"
    lines = manifest.read_text().splitlines()
    manifest.write_text("".join(f"{ln}\n" for ln in lines if not ln.endswith("command-line.json")))
    assert studyarchive.verify(top) == []
    assert "note: no command-line.json" in capsys.readouterr().err


# The oldest Python the project accepts (pyproject: >=3.11) that is on the machine: Debian 12's
# python3 is 3.11.2, older than tarfile's extraction filters (3.11.4). Its stdlib with the
# checkout's package and the packages verify imports (yaml, jsonschema) from the tests' venv,
# built for CPython 3.11 as it is: nothing is installed for it.
OLD_PYTHON = "/usr/bin/python3"
BOTH_PYTHONS = [pytest.param(sys.executable, id="venv"), pytest.param(OLD_PYTHON, id="oldest")]


def python_env(python: str) -> dict[str, str]:
    if python == sys.executable:
        return dict(os.environ)
    if not Path(python).exists():
        if os.environ.get("CI"):
            pytest.fail(f"{python} (Debian's python3, the oldest accepted Python) is missing")
        pytest.skip(f"no {python} here (Debian's python3, the oldest accepted Python)")
    paths = [str(ROOT / "scripts"), sysconfig.get_paths()["purelib"]]
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}
    return dict(env, PYTHONPATH=os.pathsep.join(paths))


def test_verify_runs_on_the_oldest_python_the_project_accepts(tmp_path):
    """`python -m dlscale.store.study_archive verify` on Debian 12's 3.11.2 (no extraction
    filters there): the archive verifies, its configuration rebuilt from its own files."""
    env = python_env(OLD_PYTHON)
    probe = "import sys, tarfile; print(sys.version_info[:2], hasattr(tarfile, 'data_filter'))"
    seen = subprocess.run([OLD_PYTHON, "-c", probe], env=env, capture_output=True, text=True)
    assert seen.stdout.split() == ["(3,", "11)", "False"], seen.stdout + seen.stderr
    archive, _ = studyarchive.create(workflow_tree(tmp_path), root=tmp_path)
    run = [OLD_PYTHON, "-m", "dlscale.store.study_archive", "verify", str(archive)]
    ok = subprocess.run(run, env=env, capture_output=True, text=True, cwd=tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "every file matches its manifest, and its files resolve to" in ok.stdout
    # and a changed file is still a difference (exit 1), not a crash
    top = tmp_path / "x"
    with tarfile.open(archive) as tar:
        tar.extractall(top, filter="data")
    (top / f"dlscale-s1/{CELL}/metrics.jsonl").write_text('{"m": 2}\n')
    forged = tmp_path / "forged.tar.gz"
    with tarfile.open(forged, "w:gz") as tar:
        tar.add(top / "dlscale-s1", arcname="dlscale-s1")
    bad = subprocess.run([*run[:-1], str(forged)], env=env, capture_output=True, text=True)
    assert bad.returncode == 1 and f"changed: {CELL}/metrics.jsonl" in bad.stdout, bad.stderr


def forged_archives(good: Path, folder: Path) -> dict[str, tuple[Path, str]]:
    """The good archive with one member added that would reach outside the extraction folder:
    a path with `..` (listed in the manifest, so only the safety check stops it), a symbolic
    link out, a hard link out, a device file. Name -> (archive, the member's name)."""
    with tarfile.open(good) as tar:
        members = [(m, tar.extractfile(m).read() if m.isfile() else None) for m in tar]
    evil = b"written outside\n"
    cases = {}
    for case, kind, name in (
        ("dotdot", tarfile.REGTYPE, "dlscale-s1/../../evil.txt"),
        ("symlink", tarfile.SYMTYPE, "dlscale-s1/config/passwd"),
        ("hardlink", tarfile.LNKTYPE, "dlscale-s1/config/shadow"),
        ("device", tarfile.CHRTYPE, "dlscale-s1/config/null"),
    ):
        info = tarfile.TarInfo(name)
        info.type = kind
        if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
            info.linkname = "/etc/passwd" if kind == tarfile.SYMTYPE else "../../evil.txt"
        if kind == tarfile.CHRTYPE:
            info.devmajor, info.devminor = 1, 3
        path = folder / f"{case}.tar.gz"
        with tarfile.open(path, "w:gz") as tar:
            for member, data in members:
                if member.name.endswith("/MANIFEST.sha256") and kind == tarfile.REGTYPE:
                    line = f"{hashlib.sha256(evil).hexdigest()}  {name.partition('/')[2]}\n"
                    data += line.encode()
                    member = copy.copy(member)
                    member.size = len(data)
                tar.addfile(member, io.BytesIO(data) if data is not None else None)
            info.size = len(evil) if kind == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(evil) if kind == tarfile.REGTYPE else None)
        cases[case] = (path, name)
    return cases


# In the interpreter under test (argv: a folder, then the archives): verify each archive (the
# command's main) and extract it with extract_files into a fresh folder in the folder; what
# each did, and every path written there.
REFUSALS = """
import contextlib, io, json, sys, tarfile, tempfile
from pathlib import Path
from dlscale.store import study_archive as sa
found = {}
for path in sys.argv[2:]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = sa.main(["verify", path])
    dest = Path(tempfile.mkdtemp(dir=sys.argv[1]))
    try:
        with tarfile.open(path) as tar:
            sa.extract_files(tar, tar.getmembers(), dest / "x")
        extract = "extracted"
    except sa.ArchiveError as exc:
        extract = str(exc)
    written = sorted(str(p.relative_to(dest)) for p in dest.rglob("*"))
    found[path] = {"code": code, "stderr": err.getvalue(), "extract": extract, "written": written}
print(json.dumps(found))
"""


@pytest.mark.parametrize("python", BOTH_PYTHONS)
def test_an_archive_reaching_outside_its_folder_is_refused(tmp_path, python):
    """A `..` path, a link out (symbolic, hard) or a device file: verify refuses the archive
    (exit 2, naming the member) and extract_files writes nothing, on the venv's Python
    (extraction filters present) and on the oldest accepted one (none)."""
    env = python_env(python)
    good, _ = studyarchive.create(workflow_tree(tmp_path), root=tmp_path)
    cases = forged_archives(good, tmp_path)
    proc = subprocess.run(
        [python, "-c", REFUSALS, str(tmp_path), *(str(p) for p, _ in cases.values())],
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    for case, (path, name) in cases.items():
        seen = found[str(path)]
        assert seen["code"] == 2, (case, seen)
        assert "refused, not a study archive" in seen["stderr"] and repr(name) in seen["stderr"]
        assert "refused" in seen["extract"] and repr(name) in seen["extract"], (case, seen)
        assert seen["written"] == [], (case, seen)
