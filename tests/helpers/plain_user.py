"""Plain users for the tests that run as one (no root): a user of this run's own, with a private
home named after the run, and a driver environment that user can really run.

The tests' own `.venv` is root's: its interpreter may live where a plain user cannot reach it,
as on a machine whose `python3` is pyenv's shim over an interpreter under `/root` (mode 700).
`driver_for` asks the user (it runs the interpreter as that user): where the user can run the
`.venv`'s interpreter, the tests' `.venv` serves; where not, a driver environment built from an
interpreter outside any private home (Debian's /usr/bin/python3), with the packages of
envs/workflow.txt and envs/pytorch.txt, shared by every run on the machine under a hash of those
inputs (built once, under a lock). The checkout's own package reaches it through PYTHONPATH, so
it serves every clone.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from helpers import run_names

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
DRIVER_INPUTS = ("envs/workflow.txt", "envs/pytorch.txt")
# interpreters outside any user's home, in order of preference
SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")


@dataclass(frozen=True)
class PlainUser:
    name: str
    uid: int
    home: Path

    def env(self, **extra: str) -> list[str]:
        """`env -i` arguments: the user's own variables and `extra`."""
        base = {"HOME": str(self.home), "USER": self.name, "LOGNAME": self.name}
        base["LANG"] = "C.UTF-8"
        base[run_names.RUN_VARIABLE] = run_names.run_name()  # what it starts is the run's
        return ["env", "-i", *(f"{k}={v}" for k, v in {**base, **extra}.items())]

    def run(self, cwd: Path, env: dict[str, str], *command: str, timeout: int = 900):
        """`command` as the user, in `cwd`, with only the user's variables and `env`."""
        return subprocess.run(
            ["runuser", "-u", self.name, "--", *self.env(**env), *command],
            cwd=cwd, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip


def plain_user(base: str) -> PlainUser:
    """The run's own user `<base>-<run>` (created once per machine and kept), with a fresh,
    private home named after the run (removed with the run's folders: `remove_home`)."""
    name = f"{base}-{run_names.run_name()}"
    home = run_names.run_path(f"home-{base}")
    if subprocess.run(["id", "-u", name], capture_output=True).returncode:
        subprocess.run(
            ["useradd", "--no-create-home", "--home-dir", str(home), "--shell", "/bin/bash", name],
            check=True,
        )
    else:
        subprocess.run(["usermod", "--home", str(home), name], check=True, capture_output=True)
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    uid = int(subprocess.run(["id", "-u", name], capture_output=True, text=True).stdout)
    os.chown(home, uid, uid)
    home.chmod(0o700)
    return PlainUser(name, uid, home)


def remove_home(user: PlainUser) -> None:
    shutil.rmtree(user.home, ignore_errors=True)


def can_run(user: PlainUser, python: str) -> bool:
    """Whether `user` can start `python` (asked as the user: permissions, ACLs, mounts)."""
    probe = subprocess.run(
        ["runuser", "-u", user.name, "--", *user.env(), python, "-c", "pass"],
        capture_output=True,
        cwd="/",
    )
    return probe.returncode == 0


def base_interpreter(python: Path | str) -> str:
    """The binary behind `python` (a venv's, a shim's), as the interpreter says."""
    return subprocess.run(
        [str(python), "-c", "import os, sys; print(os.path.realpath(sys._base_executable))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip


@dataclass(frozen=True)
class Driver:
    python: Path  # the interpreter to run Snakemake with (`python -m snakemake`)
    why: str  # which environment, and why that one

    def env(self) -> dict[str, str]:
        """PATH and PYTHONPATH for the user: the environment's bin first, the checkout's
        package (and its Snakemake executor plugin) importable."""
        return {
            "PATH": f"{self.python.parent}:/usr/local/bin:/usr/bin:/bin",
            "PYTHONPATH": str(ROOT / "scripts"),
        }


def driver_for(user: PlainUser) -> Driver:
    """A driver environment `user` can run: the tests' .venv where the user can run its
    interpreter, else a shared one built from an interpreter outside any private home."""
    venv_python = BIN / "python"
    base = base_interpreter(venv_python)
    if can_run(user, str(venv_python)):
        return Driver(venv_python, f"the tests' .venv: {user.name} can run its {base}")
    for candidate in SYSTEM_PYTHONS:
        if Path(candidate).exists() and can_run(user, candidate):
            python = shared_driver(candidate)
            why = (
                f"{user.name} cannot run the tests' .venv (its interpreter {base} lies where "
                f"the user cannot reach it): a driver environment of {candidate}, shared by "
                f"content hash ({python.parent.parent})"
            )
            return Driver(python, why)
    raise AssertionError(
        f"{user.name} can run neither the tests' .venv ({base}) nor any of {SYSTEM_PYTHONS}: "
        "install Debian's python3 and python3-venv (bash scripts/setup.sh --system-packages)"
    )


def shared_driver(interpreter: str) -> Path:
    """The driver environment of `interpreter` (envs/workflow.txt and envs/pytorch.txt, pip's
    configuration as the tests have it), built once per machine under a lock, keyed by its
    inputs and the interpreter; its python."""
    key = hashlib.sha256(
        b"".join((ROOT / p).read_bytes() for p in DRIVER_INPUTS)
        + base_interpreter(interpreter).encode()
    ).hexdigest()[:12]
    with run_names.shared_lock(f"driver-{key}") as folder:
        python = folder / "bin" / "python"
        if not (folder / "ready").exists():
            shutil.rmtree(folder, ignore_errors=True)
            subprocess.run([interpreter, "-m", "venv", str(folder)], check=True)
            pip = [str(python), "-m", "pip", "install", "--quiet"]
            # a new venv's bundled pip crashes byte-compiling the pinned torch wheel
            subprocess.run([*pip, "--upgrade", "pip>=24"], check=True, timeout=900)
            requirements = [a for p in DRIVER_INPUTS for a in ("-r", str(ROOT / p))]
            subprocess.run([*pip, *requirements], check=True, timeout=1800)
            for part in [folder, *folder.rglob("*")]:  # readable by every user
                if not part.is_symlink():
                    part.chmod(part.stat().st_mode | (0o055 if part.is_dir() else 0o044))
            (folder / "ready").touch()
        return python
