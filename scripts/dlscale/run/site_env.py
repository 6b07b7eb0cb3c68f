"""The environment a cell's ranks start with: the job's environment, the hardware entry's
`modules` loaded through the site's `module` command, then its `env` variables on top.

`job_environment` is the one function that resolves it (the launcher, dlscale.run.launch, calls
it once per cell before any rank starts). Modules load in ONE `bash --noprofile --norc`
process, which sources the site's module initialisation (MODULE_INITS: Lmod or Environment
Modules, as a batch job must, since a non-interactive shell reads no profile), runs
`module load` once per name, the names passed as arguments and never as shell text, then
`module list`, and prints its environment with `env -0`. With no modules no process runs.
`env` values are literal: no expansion, no shell.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from dlscale.study.env_names import env_name_problem

# Where the module command is initialised, first found first. The job's own environment names
# the module system it was set up with (Lmod: LMOD_PKG; both: MODULESHOME); otherwise the site's
# profile scripts, which also set the default MODULEPATH (Debian's lmod: /etc/lmod/modulespath),
# before the bare init scripts, which define `module` only.
MODULE_INITS = (
    "$LMOD_PKG/init/bash",
    "$MODULESHOME/init/bash",
    "/etc/profile.d/lmod.sh",
    "/etc/profile.d/modules.sh",
    "/usr/share/lmod/lmod/init/bash",
    "/usr/share/Modules/init/bash",
)
# Startup files a non-interactive bash would read: left out, so only the init script runs.
STARTUP_VARIABLES = ("BASH_ENV", "ENV")
# What bash itself changes in its environment: kept as the job had them.
SHELL_OWN = ("_", "SHLVL", "PWD", "OLDPWD")
# A module system on a slow shared file system takes seconds; this bounds a hung one.
MODULE_TIMEOUT_S = 300
STDERR_LINES = 20  # of the module command's message in an error
# The module systems' own bookkeeping (Lmod's module table and reference counts, exported shell
# functions): in the ranks' environment, but not what a rank records.
MODULE_INTERNALS = ("_ModuleTable", "__LMOD_REF_COUNT", "BASH_FUNC_", "__MODULES_")

# $1: the init script; the rest: module names (arguments, never shell text). The init's own
# output goes to stderr; stdout carries `module list` then NUL then `env -0`.
_SCRIPT = r"""
init=$1; shift
. "$init" >&2 || { echo "sourcing $init failed" >&2; exit 3; }
type module >/dev/null 2>&1 || { echo "$init defines no module command" >&2; exit 3; }
for name in "$@"; do
    module load "$name" >&2 || { printf '%s' "$name"; exit 4; }
done
listing=$(module list 2>&1)
printf '%s\0' "$listing"
exec env -0
"""


class SiteEnvError(RuntimeError):
    """The hardware entry's modules cannot be loaded (or its env cannot be set)."""


@dataclass(frozen=True)
class SiteEnv:
    """The ranks' environment and how it came about."""

    environment: dict[str, str]  # the full environment the ranks start with
    modules: tuple[str, ...] = ()  # what the entry asked to load
    module_list: str | None = None  # `module list` after loading; None: no modules
    module_init: str | None = None  # the init script sourced; None: no modules
    module_vars: tuple[str, ...] = ()  # variables the modules set, changed or removed
    env: tuple[str, ...] = ()  # the entry's env names

    def record(self) -> dict:
        """What each rank records of it (dlscale.rank.provenance.site_environment reads it
        back and adds the values it sees)."""
        return {
            "modules": list(self.modules),
            "module_list": self.module_list,
            "module_init": self.module_init,
            "module_vars": list(self.module_vars),
            "env": list(self.env),
        }


def module_init(base: Mapping[str, str]) -> str | None:
    """The first of MODULE_INITS that exists ($VARIABLES from `base`; an unset one skips its
    line), or None."""
    for template in MODULE_INITS:
        variable = template[1:].split("/", 1)[0] if template.startswith("$") else None
        if variable is not None and not base.get(variable):
            continue
        path = template.replace(f"${variable}", base[variable]) if variable else template
        if Path(path).is_file():
            return path
    return None


def _tail(text: str) -> str:
    return "\n".join(text.strip().splitlines()[-STDERR_LINES:]) or "(no message)"


def _load_modules(modules: list[str], base: Mapping[str, str]) -> tuple[dict, str, str]:
    """(environment after `module load`, `module list`, init script) from one bash process."""
    init = module_init(base)
    if init is None:
        raise SiteEnvError(
            f"modules {modules}: no module command to load them: none of "
            f"{', '.join(MODULE_INITS)} exists on {os.uname().nodename}; install Lmod or "
            "Environment Modules, or drop `modules` from the hardware entry"
        )
    shell_env = {k: v for k, v in base.items() if k not in STARTUP_VARIABLES}
    try:
        proc = subprocess.run(
            ["bash", "--noprofile", "--norc", "-c", _SCRIPT, "dlscale-modules", init, *modules],
            env=shell_env,
            capture_output=True,
            timeout=MODULE_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as exc:
        raise SiteEnvError(
            f"modules {modules}: the module command ({init}) did not finish in {MODULE_TIMEOUT_S} s"
        ) from exc
    err = proc.stderr.decode(errors="replace")
    if proc.returncode == 4:
        name = proc.stdout.decode(errors="replace")
        raise SiteEnvError(f"module {name!r} did not load (module command: {init}):\n{_tail(err)}")
    if proc.returncode != 0:
        raise SiteEnvError(
            f"modules {modules}: the module command ({init}) failed with exit code "
            f"{proc.returncode}:\n{_tail(err)}"
        )
    listing, _, dump = proc.stdout.partition(b"\0")
    environment = {}
    for entry in dump.split(b"\0"):
        name, sep, value = entry.decode(errors="surrogateescape").partition("=")
        if sep:
            environment[name] = value
    for name in (*SHELL_OWN, *STARTUP_VARIABLES):
        environment.pop(name, None)
        if name in base:
            environment[name] = base[name]
    return environment, listing.decode(errors="replace").strip(), init


def job_environment(
    modules: list[str], env: dict[str, str], base: Mapping[str, str] = os.environ
) -> SiteEnv:
    """The environment of a cell's ranks: `base` (the job's), `modules` loaded through the site's
    module command (none: no process runs), then `env` on top. Raises SiteEnvError naming the
    module and the module command's own message when one does not load, or when modules are
    asked for and no module command can be initialised."""
    for name in env:
        why = env_name_problem(name)
        if why:
            raise SiteEnvError(f"env.{name}: {why}")
    modules = list(modules)
    if modules:
        environment, listing, init = _load_modules(modules, base)
    else:
        environment, listing, init = dict(base), None, None
    changed = sorted(k for k in set(base) | set(environment) if base.get(k) != environment.get(k))
    environment.update(env)
    return SiteEnv(
        environment=environment,
        modules=tuple(modules),
        module_list=listing,
        module_init=init,
        module_vars=tuple(k for k in changed if not k.startswith(MODULE_INTERNALS)),
        env=tuple(sorted(env)),
    )
