"""A hardware entry's modules and env (dlscale.run.site_env.job_environment): modules load
through a real Lmod (Debian's package, which scripts/setup.sh and scripts/slurm/cluster-up.sh
install) from a modulefile written here, the names reach `module load` as arguments, never as
shell text, a module that does not load fails with Lmod's own message, and env goes on top.
Without Lmod these tests skip, except under CI, where they fail."""

from __future__ import annotations

import json

import pytest

from dlscale.run import site_env
from dlscale.run.site_env import SiteEnvError, job_environment
from dlscale.study.cell import FAILURE_FILE

from helpers.cells import cell_dict, launch_cell
from helpers.lmod import needs_lmod, write_testmod


@pytest.fixture
def lmod_job(tmp_path):
    """A batch job's environment as a site's would be: no module command initialised (the
    non-login shell read no profile), MODULEPATH naming the test's tree, a BASH_ENV that would
    fail any shell that read it; and the marker folder."""
    needs_lmod()
    tree, marker = write_testmod(tmp_path)
    startup = tmp_path / "startup.sh"
    startup.write_text("echo startup file read >&2; exit 7\n")
    base = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "MODULEPATH": str(tree),
        "BASH_ENV": str(startup),
    }
    return base, marker


def test_modules_load_through_lmod_and_env_goes_on_top(lmod_job):
    base, marker = lmod_job
    site = job_environment(["testmod"], {"NCCL_SOCKET_IFNAME": "lo"}, base)
    env = site.environment
    assert env["PATH"].split(":")[0] == str(marker)  # the module's prepend_path
    assert env["DLSCALE_TESTMOD"] == "loaded" and env["NCCL_SOCKET_IFNAME"] == "lo"
    assert env["LOADEDMODULES"] == "testmod/1.0"
    assert "testmod/1.0" in site.module_list and site.module_init.endswith("lmod.sh")
    # what a rank records: the variables the module command changed, not Lmod's own tables
    assert {"PATH", "DLSCALE_TESTMOD", "LOADEDMODULES"} <= set(site.module_vars)
    assert not [v for v in site.module_vars if v.startswith(("_ModuleTable", "__LMOD"))]
    assert site.record()["env"] == ["NCCL_SOCKET_IFNAME"]
    # the job's startup file was not read (it exits 7), and the ranks keep it as the job had it
    assert env["BASH_ENV"] == base["BASH_ENV"] and "SHLVL" not in env
    assert base["PATH"] == "/usr/bin:/bin"  # the job's environment is not changed


def test_a_module_that_does_not_load_is_named_with_lmods_message(lmod_job):
    base, _ = lmod_job
    with pytest.raises(SiteEnvError, match="module 'nosuch/1.0' did not load") as info:
        job_environment(["testmod", "nosuch/1.0"], {}, base)
    assert "unknown" in str(info.value)  # Lmod's own words: "module(s) are unknown"


def test_a_module_name_is_an_argument_never_shell_text(lmod_job, tmp_path):
    base, _ = lmod_job
    pwned = tmp_path / "pwned"
    with pytest.raises(SiteEnvError, match="did not load"):
        job_environment([f"testmod; touch {pwned}", f"$(touch {pwned})"], {}, base)
    assert not pwned.exists()


def test_a_cell_whose_module_does_not_load_fails_before_any_rank(lmod_job, tmp_path, monkeypatch):
    """The launcher resolves the environment once, before starting ranks: a module that does
    not load fails the cell with the module's name in failure.json, and no rank ran."""
    base, _ = lmod_job
    for name, value in base.items():
        monkeypatch.setenv(name, value)
    code, out = launch_cell(tmp_path, cell_dict(modules=["nosuch/2.0"]))
    assert code == 1 and not out.exists()
    failure = json.loads((out.parent / FAILURE_FILE).read_text())
    assert "module 'nosuch/2.0' did not load" in failure["reason"]
    assert not list(out.parent.glob(".ranks/rank*.log"))


def test_no_modules_runs_no_process(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("no process without modules")

    monkeypatch.setattr(site_env.subprocess, "run", refuse)
    site = job_environment([], {"NCCL_IB_HCA": "mlx5"}, {"PATH": "/bin"})
    assert site.environment == {"PATH": "/bin", "NCCL_IB_HCA": "mlx5"}
    assert site.module_list is None and site.module_vars == ()


def test_modules_without_a_module_command_fail_clearly(monkeypatch):
    monkeypatch.setattr(site_env, "MODULE_INITS", ("$LMOD_PKG/init/bash", "/nonexistent/init"))
    with pytest.raises(SiteEnvError, match=r"modules \['cuda/12.4'\]: no module command"):
        job_environment(["cuda/12.4"], {}, {"PATH": "/bin"})


def test_a_name_the_project_sets_is_refused_here_too():
    with pytest.raises(SiteEnvError, match="env.MASTER_PORT: 'MASTER_PORT' is not allowed"):
        job_environment([], {"MASTER_PORT": "1"}, {})
