"""scripts/setup.sh's checks before it builds anything (issue 44): the interpreter it is given
(--python / DLSCALE_PYTHON) must be Python >= pyproject's requires-python, and a wrong option
or interpreter stops it with exit 2 and a message naming the way out. Each case exits before any
venv is touched."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

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
