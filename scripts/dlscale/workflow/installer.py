"""uv as pip's stand-in for the driver's .venv (scripts/setup.sh): the same packages, faster.

Run with the interpreter the venv is built from, before the venv exists (the venv is then made
without pip of its own: uv installs pip into it with the rest, as pip upgrades itself):
`python -m dlscale.workflow.installer check` exits 0 when every setting of pip's configuration
(pip.conf files, PIP_* variables: `pip config list` of this interpreter's pip, which reads the
same files as the venv's would, unless this interpreter's prefix has a pip.conf of its own) has
a uv equivalent, else 3 with the reason (the set-up then installs with pip).
`python -m dlscale.workflow.installer install --venv DIR --uv UV [--index-url URL] -- ARGS...`
runs `uv pip install ARGS` into DIR with pip's configuration translated, so uv resolves as pip
does: the same indexes (index-url, extra-index-url, find-links, no-index; the best version over
all of them, pip's rule: --index-strategy unsafe-best-match), the same constraints, certificates,
proxy and binary rules; uv's own configuration files and UV_* variables (but its cache folder)
play no part. `--index-url` is a command line's index (DLSCALE_DRIVER_TORCH_INDEX), which
replaces the configured one as it does for pip.
`python -m dlscale.workflow.installer compile --venv DIR` byte-compiles DIR's site-packages as
pip's install does (none where pip's configuration says no-compile), but the packages' own test
suites (`tests/`, `test/` folders: about a third of the files, which nothing imports at run time;
compiling is most of an install's time).

Standard library only: the set-up runs it with the interpreter it was given.
"""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
from pathlib import Path

# pip's sections that apply to `pip install`, lowest precedence first (pip's own order: the
# global section, the command's, then PIP_* variables)
SECTIONS = ("global", "install", ":env:")
# settings that change nothing of what gets installed
NO_EFFECT = {
    "disable-pip-version-check",
    "no-input",
    "progress-bar",
    "root-user-action",
    "quiet",
    "verbose",
    "log",
    "no-color",
    "require-virtualenv",
    "exists-action",
    "cache-dir",
    "retries",
    "break-system-packages",
    "no-python-version-warning",
    "use-pep517",
    "config-file",
    "no-warn-script-location",
    "no-warn-conflicts",
    "index",
    "format",
}
# list settings: pip splits a configured value on whitespace
LISTS = {
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraints",
    "trusted-host": "--allow-insecure-host",
}
TRUE = {"1", "true", "yes", "on", "y", "t"}


class Untranslatable(ValueError):
    """A pip setting with no uv equivalent: the set-up installs with pip."""


def pip_settings() -> dict[str, str]:
    """The settings pip applies to `pip install` (`pip config list` of this interpreter's pip),
    one value per key after pip's precedence; Untranslatable where this interpreter's own
    prefix holds a pip.conf (a venv's pip would not read it)."""
    if (Path(sys.prefix) / "pip.conf").exists():
        raise Untranslatable(f"{Path(sys.prefix) / 'pip.conf'} applies to this interpreter only")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"],
        capture_output=True,
        text=True,
        check=True,
    )
    return effective(proc.stdout)


def compiles(settings: dict[str, str]) -> bool:
    """Whether pip would byte-compile what it installs (it does unless told not to)."""
    if "no-compile" in settings:
        return settings["no-compile"].strip().lower() not in TRUE
    return settings.get("compile", "yes").strip().lower() in TRUE


# the packages' own test suites: not compiled (compileall -x, a regular expression on the path)
NOT_COMPILED = r"/tests?/"


def compile_command(venv: Path) -> list[str]:
    """compileall over the venv's site-packages (with its own interpreter: its version's .pyc),
    in parallel, the test suites left out."""
    python = str(venv / "bin/python")
    return [python, "-m", "compileall", "-q", "-j0", "-x", NOT_COMPILED, *site_packages(venv)]


def site_packages(venv: Path) -> list[str]:
    return sorted({str(p) for p in venv.glob("lib*/python*/site-packages")})


def effective(listing: str) -> dict[str, str]:
    """`pip config list` output (section.key='value' lines) -> {key: value} for `pip install`."""
    found: dict[str, dict[str, str]] = {s: {} for s in SECTIONS}
    for line in listing.splitlines():
        name, sep, value = line.partition("=")
        if not sep or "." not in name:
            continue
        section, key = name.rsplit(".", 1) if name.startswith(":env:") else name.split(".", 1)
        if section in found:
            found[section][key] = ast.literal_eval(value)
    merged: dict[str, str] = {}
    for section in SECTIONS:
        merged.update(found[section])
    # pip's aliases: one setting, two names
    if "default-timeout" in merged:
        merged.setdefault("timeout", merged.pop("default-timeout"))
    return merged


def translate(settings: dict[str, str], index_url: str | None = None) -> tuple[list, dict]:
    """(uv pip install arguments, environment variables) that make uv install as pip does with
    `settings`; Untranslatable for a setting uv cannot follow."""
    args = ["--index-strategy", "unsafe-best-match", "--no-config"]
    env = {}
    for key, value in sorted(settings.items()):
        if key in NO_EFFECT:
            continue
        if key in LISTS:
            for item in value.split():
                args += [LISTS[key], item]
        elif key == "index-url":
            if index_url is None:
                args += ["--index-url", value]
        elif key == "no-index":
            if value.strip().lower() in TRUE:
                args.append("--no-index")
        elif key == "no-cache-dir":  # pip: any value turns its cache off
            args.append("--no-cache")
        elif key in ("compile", "no-compile"):
            pass  # the compile step's (compiles)
        elif key == "pre":
            if value.strip().lower() in TRUE:
                args += ["--prerelease", "allow"]
        elif key in ("only-binary", "no-binary"):
            for item in value.split():
                args += [f"--{key}", item]
        elif key == "no-build-isolation":
            if value.strip().lower() in TRUE:
                args.append("--no-build-isolation")
        elif key == "cert":
            env["SSL_CERT_FILE"] = value
        elif key == "client-cert":
            env["SSL_CLIENT_CERT"] = value
        elif key == "proxy":
            if value:
                env["HTTP_PROXY"] = env["HTTPS_PROXY"] = value
        elif key == "timeout":
            env["UV_HTTP_TIMEOUT"] = str(int(float(value)))
        else:
            raise Untranslatable(f"pip's setting '{key}' has no uv equivalent here")
    if index_url is not None:
        args += ["--index-url", index_url]
    return args, env


def uv_environment(environ=os.environ) -> dict[str, str]:
    """The environment uv runs in: the caller's without UV_* variables (pip's configuration
    alone decides), but uv's cache folder."""
    return {k: v for k, v in environ.items() if not k.startswith("UV_") or k == "UV_CACHE_DIR"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dlscale-installer", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("check", help="exit 0 when uv can follow pip's configuration")
    install = sub.add_parser("install", help="uv pip install ARGS into --venv, as pip would")
    install.add_argument("--venv", type=Path, required=True)
    install.add_argument("--uv", required=True, help="the uv executable")
    install.add_argument("--index-url", help="a command line's index (replaces pip's)")
    install.add_argument("args", nargs=argparse.REMAINDER)
    compile_ = sub.add_parser("compile", help="byte-compile --venv's site-packages as pip does")
    compile_.add_argument("--venv", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        settings = pip_settings()
        flags, env = translate(settings, getattr(args, "index_url", None))
    except Untranslatable as exc:
        print(exc, file=sys.stderr)
        return 3
    except (subprocess.CalledProcessError, OSError, ValueError, SyntaxError) as exc:
        print(f"pip's configuration could not be read ({exc})", file=sys.stderr)
        return 3
    if args.command == "check":
        return 0
    if args.command == "compile":
        if compiles(settings):
            # a file that does not compile (a package's Python 2 example) fails where it is
            # imported, as after pip's install, not here
            subprocess.run(compile_command(args.venv), stdout=subprocess.DEVNULL)
        return 0
    extra = args.args[1:] if args.args[:1] == ["--"] else args.args
    cmd = [args.uv, "pip", "install", "--quiet", "--python", str(args.venv / "bin/python")]
    return subprocess.run([*cmd, *flags, *extra], env={**uv_environment(), **env}).returncode


if __name__ == "__main__":
    sys.exit(main())
