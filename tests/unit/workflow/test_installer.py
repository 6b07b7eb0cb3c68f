"""uv as pip's stand-in for the driver's .venv (dlscale.workflow.installer, scripts/setup.sh):
pip's configuration reaches uv whole, or the set-up installs with pip; and a set-up with
nothing to do stays a no-op (no installer, no venv touched, well under a second of its own)."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dlscale.workflow.installer import (
    NOT_COMPILED,
    Untranslatable,
    compile_command,
    compiles,
    effective,
    pip_settings,
    translate,
)

ROOT = Path(__file__).resolve().parents[3]
ENVS = sorted((ROOT / "envs").glob("*.txt"))  # the set-up reads several

# `pip config list` as this kind of machine prints it: a find-links folder of CPU wheels, extra
# local indexes, a constraints file and a certificate bundle, from files and PIP_* variables
LISTING = """global.cert='/etc/ssl/certs/ca-certificates.crt'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/opt/wheels'
download.index-url='https://elsewhere.example/simple'
:env:.default-timeout='180'
:env:.disable-pip-version-check='1'
:env:.find-links='/opt/wheels'
"""


def test_pip_settings_follow_pips_precedence():
    listing = (
        "global.index-url='https://global.example/simple'\n"
        "install.index-url='https://install.example/simple'\n"
        "global.find-links='/a /b'\n"
        ":env:.find-links=''\n"  # PIP_FIND_LINKS= (empty) drops the files' folders
        "wheel.index-url='https://wheel.example/simple'\n"  # another command's
    )
    got = effective(listing)
    assert got == {"index-url": "https://install.example/simple", "find-links": ""}
    args, env = translate(got)
    assert "--find-links" not in args and args[-2:] == ["--index-url", got["index-url"]]


def test_this_machines_configuration_translates_to_the_same_indexes():
    args, env = translate(effective(LISTING))
    pairs = list(zip(args, args[1:]))  # each flag beside the value after it
    # pip's rule over several indexes (the best version anywhere), uv's own configuration aside
    assert args[:2] == ["--index-strategy", "unsafe-best-match"]
    assert "--no-config" in args
    assert ("--find-links", "/opt/wheels") in pairs  # the CPU torch wheel
    assert ("--constraints", "/etc/xdg/pip/constraints.txt") in pairs
    extras = [v for k, v in pairs if k == "--extra-index-url"]
    assert extras == ["file:///opt/pypi/simple", "file:///opt/pypi-more/simple"]
    assert "--index-url" not in args  # pip's default index is uv's; `download.` is not install's
    assert env == {"SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt", "UV_HTTP_TIMEOUT": "180"}


def test_a_command_lines_index_replaces_the_configured_one_only():
    settings = {**effective(LISTING), "index-url": "https://mirror.example/simple"}
    args, _ = translate(settings, index_url="https://download.pytorch.org/whl/cpu")
    assert args.count("--index-url") == 1 and args[-1] == "https://download.pytorch.org/whl/cpu"
    assert "--extra-index-url" in args and "--find-links" in args  # kept, as pip keeps them


@pytest.mark.parametrize(
    "setting, expected",
    [
        ({"no-index": "true"}, ["--no-index"]),
        ({"no-cache-dir": "false"}, ["--no-cache"]),  # pip: any value turns its cache off
        ({"trusted-host": "a.example b.example"}, ["--allow-insecure-host", "a.example"]),
        ({"only-binary": ":all:"}, ["--only-binary", ":all:"]),
    ],
)
def test_settings_that_shape_the_install_reach_uv(setting, expected):
    args, _ = translate(setting)
    assert all(a in args for a in expected), args


def test_compiled_as_pip_compiles_but_the_packages_test_suites(tmp_path):
    assert compiles({}) and compiles({"compile": "yes"}) and compiles({"no-compile": "0"})
    assert not compiles({"no-compile": "1"}) and not compiles({"compile": "false"})
    venv = tmp_path / "v"
    (venv / "lib/python3.11/site-packages").mkdir(parents=True)
    cmd = compile_command(venv)
    assert cmd[:3] == [str(venv / "bin/python"), "-m", "compileall"]
    assert cmd[-1] == str(venv / "lib/python3.11/site-packages")
    left_out = re.compile(NOT_COMPILED)
    assert left_out.search("/v/site-packages/pandas/tests/frame/test_api.py")
    assert left_out.search("/v/site-packages/scipy/linalg/test/x.py")
    for kept in ("/v/site-packages/_pytest/main.py", "/v/site-packages/torch/testing/_c.py"):
        assert not left_out.search(kept)


@pytest.mark.parametrize("key", ["prefer-binary", "keyring-provider", "use-feature", "user"])
def test_a_setting_uv_cannot_follow_means_pip(key):
    with pytest.raises(Untranslatable, match=key):
        translate({key: "1"})


def test_the_real_pip_is_read(tmp_path, monkeypatch):
    """This venv's pip, with a configuration file and a PIP_* variable of the test's own."""
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nextra-index-url = file:///x/simple\n[install]\nno-compile = yes\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    monkeypatch.setenv("PIP_FIND_LINKS", "/wheels/here")
    got = pip_settings()
    assert got["extra-index-url"] == "file:///x/simple" and got["find-links"] == "/wheels/here"
    assert got["no-compile"] == "yes"


def test_a_pip_conf_of_the_interpreters_own_means_pip(monkeypatch, tmp_path):
    """pip reads <prefix>/pip.conf of the interpreter it runs in: the set-up's interpreter reads
    it, the venv's pip would not, so the translation of this interpreter's view is refused."""
    (tmp_path / "pip.conf").write_text("[global]\nindex-url = https://only.here/simple\n")
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    with pytest.raises(Untranslatable, match="pip.conf"):
        pip_settings()


def test_setup_with_nothing_to_do_stays_a_no_op(tmp_path):
    """setup.sh in a copy whose .venv is up to date (its stamp matches the inputs, its
    interpreter is the one asked for): it says so, installs nothing (no pip, no uv, not even
    the installer's check) and leaves the venv as it was."""
    for part in ("scripts/setup.sh", "pyproject.toml", *(p.relative_to(ROOT) for p in ENVS)):
        (tmp_path / part).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / part).write_bytes((ROOT / part).read_bytes())
    (tmp_path / "scripts/dlscale").symlink_to(ROOT / "scripts/dlscale")
    venv = tmp_path / ".venv"
    base = os.path.realpath(sys._base_executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True)
    # the driver line reads the versions from the dist-info folders, no interpreter
    purelib = next((venv / "lib").glob("python*/site-packages"))
    for info in ("snakemake-9.27.1.dist-info", "torch-2.13.0+cpu.dist-info"):
        (purelib / info).mkdir()
    inputs = b"".join(
        (tmp_path / p).read_bytes()
        for p in ("envs/workflow.txt", "envs/pytorch.txt", "pyproject.toml")
    )
    (venv / ".dlscale-setup").write_text(hashlib.sha256(inputs).hexdigest() + "\n")
    before = sorted((p, p.stat().st_mtime_ns) for p in venv.rglob("*"))
    env = {k: v for k, v in os.environ.items() if k != "DLSCALE_DRIVER_TORCH_INDEX"}
    # no index at all: a set-up that did mean to install would fail at once, not download
    env.update(PIP_NO_INDEX="1", PIP_FIND_LINKS="", DLSCALE_INSTALLER="uv")
    # every command set-up runs, traced (bash's xtrace into a file of the test's own)
    trace, rc = tmp_path / "trace", tmp_path / "trace.rc"
    rc.write_text(f'exec {{fd}}>>"{trace}"; BASH_XTRACEFD=$fd; set -x\n')
    env.update(BASH_ENV=str(rc))
    start = time.monotonic()
    proc = subprocess.run(
        ["bash", "scripts/setup.sh", "--python", base, "none"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    seconds = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr
    assert ".venv is up to date" in proc.stderr
    assert "driver ready: snakemake 9.27.1, torch 2.13.0+cpu" in proc.stderr
    assert "building" not in proc.stderr and "installing with" not in proc.stderr
    assert sorted((p, p.stat().st_mtime_ns) for p in venv.rglob("*")) == before
    # the interpreters it starts: one look at the interpreter, one at the registry, one at the
    # venv's (which binary it was built from); the versions come from folder names
    commands = trace.read_text()
    assert commands.count("-m dlscale.registry") == 1, commands
    assert "importlib.metadata" not in commands and "dlscale.workflow.installer" not in commands
    assert seconds < 10, seconds  # ~0.3 s on an idle 2-core VM; a hang, not a slow host
