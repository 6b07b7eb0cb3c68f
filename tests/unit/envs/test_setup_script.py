"""scripts/setup.sh's checks before it builds anything: the interpreter it is given
(--python / DLSCALE_PYTHON) must be Python >= pyproject's requires-python, and a wrong option
or interpreter stops it with exit 2 and a message naming the way out; the interpreter is
compared with the one each venv was built from as the interpreter says itself (a shim over a
private home included), which `--check` reports without building. Each case exits before any
venv is touched."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from helpers.plain_user import base_interpreter

ROOT = Path(__file__).resolve().parents[3]


def setup(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "scripts/setup.sh", *args],
        cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_pyproject_and_setup_ask_for_python_3_11():
    text = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^requires-python = ">=3.11"$', text, re.M)


def test_an_old_interpreter_is_refused_with_its_version_and_how_to_pick_another(tmp_path):
    old = tmp_path / "python3.10"  # the real interpreter, saying it is 3.10
    old.write_text(
        "#!/bin/sh\n"
        '[ "$1" = -c ] && exec python3 -c "import sys; '
        'sys.version_info = (3, 10, 12, \'final\', 0); exec(sys.argv[1])" "$2"\n'
        'exec python3 "$@"\n'
    )
    old.chmod(0o755)
    for proc in (setup("--python", str(old), "none"), setup("none", DLSCALE_PYTHON=str(old))):
        assert proc.returncode == 2, proc.stderr
        assert f"{old} is Python 3.10; dlscale needs Python >= 3.11" in proc.stderr
        assert "--python PATH or DLSCALE_PYTHON=PATH" in proc.stderr
        assert "module load python/3.11" in proc.stderr


def test_a_missing_interpreter_or_a_wrong_option_is_named():
    proc = setup("--python", "python2.7-nowhere", "none")
    assert proc.returncode == 2 and "no Python interpreter 'python2.7-nowhere'" in proc.stderr
    proc = setup("--sytem-packages")
    assert proc.returncode == 2
    assert "unknown option '--sytem-packages'; allowed: --system-packages" in proc.stderr


# ---- the interpreter as it says itself: shims, private homes, another interpreter ----------


def _pyenv_like(tmp_path: Path, interpreter: str) -> Path:
    """A PATH folder whose `python3` is a shim script, as pyenv's is, that execs `interpreter`
    through a home of mode 700 (~/.pyenv/versions/X/bin/python3 there)."""
    home = tmp_path / "home"
    versions = home / ".pyenv" / "versions" / "3.x" / "bin"
    versions.mkdir(parents=True)
    (versions / "python3").symlink_to(interpreter)
    home.chmod(0o700)
    shims = tmp_path / "shims"
    shims.mkdir()
    shim = shims / "python3"
    shim.write_text(f'#!/usr/bin/env bash\nexec "{versions / "python3"}" "$@"\n')
    shim.chmod(0o755)
    return shims


def test_a_pyenv_style_shim_finds_the_set_up_environments_up_to_date(tmp_path):
    """python3 on PATH is a shim script over an interpreter under a private home: set-up asks
    the interpreter which binary it runs, so the environments built from that binary are up to
    date (`--check`: nothing is built, exit 0), not rebuilt on every call."""
    shims = _pyenv_like(tmp_path, base_interpreter(str(ROOT / ".venv" / "bin" / "python")))
    path = f"{shims}{os.pathsep}{os.environ['PATH']}"
    proc = setup("--check", "none", PATH=path, DLSCALE_PYTHON="python3")
    assert proc.returncode == 0, proc.stderr
    assert ".venv is up to date" in proc.stderr
    assert "everything asked for is up to date" in proc.stderr
    assert "would build" not in proc.stderr


def test_another_interpreter_is_a_change_that_check_names_without_building(tmp_path):
    """A venv built from one interpreter is out of date for another: `--check` says what it
    would build, with both interpreters, exits 1 and touches nothing."""
    base = base_interpreter(str(ROOT / ".venv" / "bin" / "python"))
    other = next(
        (p for p in ("/usr/bin/python3", "/usr/local/bin/python3")
         if Path(p).exists() and base_interpreter(p) != base),
        None,
    )  # fmt: skip
    if other is None:  # only one interpreter here: a copy of it is another binary
        other = str(tmp_path / "python3")
        shutil.copy2(base, other)
    stamp = (ROOT / ".venv" / ".dlscale-setup").stat().st_mtime_ns
    proc = setup("--check", "--python", other, "none")
    assert proc.returncode == 1, proc.stderr
    assert f"would build .venv with {other} ({base_interpreter(other)}" in proc.stderr
    assert f"now: {base}" in proc.stderr
    assert "not up to date: .venv" in proc.stderr
    assert (ROOT / ".venv" / ".dlscale-setup").stat().st_mtime_ns == stamp
