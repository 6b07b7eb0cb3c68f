"""Shared fixtures: the repository root, valid configs, and a private copy of the workflow; the
groups the test command runs in parallel (pytest-xdist, see pytest_collection_modifyitems)."""

from __future__ import annotations

import ast
import functools
import inspect
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from helpers import durations as durations_of_tests
from helpers import run_names
from helpers.checkout import DOWN, ROOT, UP

# Plain functions and constants the tests share live in tests/helpers/ (a test imports them from
# there, never from this file: tests/unit/test_shared_helpers.py); this file holds the fixtures
# and the run's hooks.


# ---- parallel groups (scripts/test.sh: `pytest -n N` on pytest-xdist workers) ----------------
# The scheduler below runs each group on one worker, in one process, so a fixture shared by a
# group is built once, and hands the groups out largest first, the Slurm group before all:
#   - "slurm", "slurm-b" and "slurm-bind": the tests under tests/slurm/, split between local
#     Slurm clusters that run side by side (SLURM_CLUSTERS: each its own state dir and ports; the
#     host's munged is shared). A group's tests change their cluster (a node DOWN, slurmctld
#     restarted, accounting switched on), so they run one after another on one worker, which
#     starts that cluster once and stops it once; the groups run at once, the two long ones
#     (LONG_GROUPS) handed out first ("slurm-bind" is a short one, GPU binding over a fake
#     GPU/NUMA topology, whose module stops its cluster as soon as it is done);
#   - the tests of a module that use a module- or session-scoped fixture it defines (the tiny
#     study run to the PDF and read by many tests, a model built once), directly or through
#     another of its fixtures: together, so the fixture is built on one worker only and never
#     twice at the same time (the module's other tests are free);
#   - every other test on its own, wherever a worker is free.
# (pytest-xdist's own `--dist loadgroup` marks do not group under pytest 9.2: xdist 3.8.0 renames
# `item._nodeid`, which pytest 9 no longer reads, so the groups are given by the scheduler.)
# pytest_collection_modifyitems checks, from the fixtures each test really uses, that the groups
# cover every test that needs one, so a new test cannot slip out of its group unnoticed.
# Outputs never collide: each worker has its own basetemp (tmp_path, tmp_path_factory).
TESTS = Path(__file__).resolve().parent
SLURM_TESTS = "tests/slurm/"
_SHARED_FIXTURE = re.compile(r"fixture\(\s*scope=[\"'](module|package|session)[\"']")

# The run's local clusters (scripts/slurm/cluster-up.sh reads the variables cluster_env gives):
# each its own state folder and ports, named after the run (tests/helpers/run_names.py), so a
# second run of the suite on the machine never adopts or stops them; none writes the machine's
# /etc/slurm/slurm.conf (every command reaches its cluster through SLURM_CONF). The modules on
# the second one are chosen so the two long groups take about as long (the run prints each
# group's time).
SLURM_CLUSTERS = {
    "slurm": {"index": 0, "up_args": ["--no-system-conf"]},
    "slurm-b": {"index": 1, "up_args": ["--no-system-conf"]},
    # GPU binding over a fake topology (tests/slurm/test_gpu_topology.py, seconds): task/affinity,
    # 2 CPUs per node that are 2 NUMA nodes, 4 fake GPUs per node 2 next to each
    "slurm-bind": {
        "index": 2,
        "up_args": [
            "--no-system-conf",
            "--task-affinity",
            "--cpus-per-node",
            "2",
            "--gpus-per-node",
            "4",
            "--oversubscribe",
        ],
    },
}
LONG_GROUPS = ("slurm", "slurm-b")  # about 10 min each: handed out before everything else
# (the faults, the lost driver and the preflight beside the frameworks, the workflow, GPU
# binding and parallelism: about 10 min each under the test command's load)
SLURM_B_MODULES = {"test_faults.py", "test_lost_driver.py", "test_slurm_preflight.py"}
# the cluster with a fake GPU/NUMA topology, short: the packed study (about 70 s) and the login
# node's walk (a plain user's study measured on it) run there too, beside the long groups
SLURM_BIND_MODULES = {"test_gpu_topology.py", "test_packing.py", "test_login_node.py"}
# Modules outside tests/slurm/ whose tests use a cluster (and so join its group): the login
# node's walk, a plain user's study measured on the short cluster's nodes
CLUSTER_MODULES_ELSEWHERE = {"tests/workflow/test_login_node.py"}


def slurm_group(path: str) -> str:
    """The cluster group of a test module under tests/slurm/."""
    name = Path(path).name
    if name in SLURM_BIND_MODULES:
        return "slurm-bind"
    return "slurm-b" if name in SLURM_B_MODULES else "slurm"


def xdist_scope(nodeid: str) -> str:
    """The group of a test, from its id alone (what the xdist controller knows)."""
    path = nodeid.split("::", 1)[0]
    if path.startswith(SLURM_TESTS) or path in CLUSTER_MODULES_ELSEWHERE:
        return slurm_group(path)
    function = nodeid.split("::")[-1].split("[", 1)[0]
    if function in _tests_sharing_a_fixture(path):
        return path
    return nodeid


@functools.cache
def _tests_sharing_a_fixture(path: str) -> frozenset[str]:
    """The test functions of a module that use one of its shared fixtures (module-, package-
    or session-scoped, declared in the module), directly or through another of its fixtures,
    read from the module's source: they run on one worker, the module's other tests
    anywhere. An autouse shared fixture holds every test of the module."""
    try:
        text = (ROOT / path).read_text()
    except OSError:
        return frozenset()
    if not _SHARED_FIXTURE.search(text):
        return frozenset()
    fixtures: dict[str, set[str]] = {}  # fixture -> the fixtures it takes
    shared, tests, autouse = set(), {}, False
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        params = {a.arg for a in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]}
        fixture = next((d for d in node.decorator_list if "fixture" in ast.unparse(d)), None)
        if fixture is not None:
            fixtures[node.name] = params
            source = ast.unparse(fixture)
            if _SHARED_FIXTURE.search(source.replace("'", '"')):
                shared.add(node.name)
                autouse = autouse or "autouse=True" in source
        elif node.name.startswith("test"):
            tests[node.name] = params
    if autouse:
        return frozenset(tests)
    grew = True
    while grew:  # a fixture that takes a shared one is shared too
        grew = False
        for name, params in fixtures.items():
            if name not in shared and params & shared:
                shared.add(name)
                grew = True
    return frozenset(name for name, params in tests.items() if params & shared)


def _own_fixture(fixturedef) -> bool:
    """A fixture defined in this test suite (not pytest's own, e.g. tmp_path_factory)."""
    try:
        source = Path(inspect.getsourcefile(fixturedef.func) or "").resolve()
    except TypeError:
        return False
    return TESTS in source.parents


def _needed_group(item: pytest.Item) -> str | None:
    """The group a test needs, from the marks and fixtures it really uses."""
    if item.get_closest_marker("slurm") or "cluster" in item.fixturenames:
        return slurm_group(item.nodeid.split("::", 1)[0])
    for name in item.fixturenames:
        for fixturedef in item._fixtureinfo.name2fixturedefs.get(name, ()):
            if fixturedef.scope in ("module", "package", "session") and _own_fixture(fixturedef):
                return item.nodeid.split("::", 1)[0]
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        needed = _needed_group(item)
        if needed and xdist_scope(item.nodeid) != needed:
            raise pytest.UsageError(
                f"{item.nodeid} needs the parallel group {needed!r} (a Slurm test belongs "
                f"under {SLURM_TESTS}, its cluster by SLURM_B_MODULES and SLURM_BIND_MODULES; "
                "a shared fixture is "
                "declared `@pytest.fixture(scope=...)` in the test's own module and taken as a "
                "parameter by the test or by a fixture it takes): see "
                "tests/conftest.py"
            )


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid)

        def _assign_work_unit(self, node) -> None:
            # the two long cluster groups start first, then every other work unit (a group of
            # several tests, one worker each, or a single test) longest expected first, from a
            # measured run's durations (tests/helpers/durations.py), so the last work handed
            # out is the shortest and the workers end together
            if not getattr(self, "_ordered", False):
                order = durations_of_tests.work_order(
                    self.workqueue, LONG_GROUPS, durations_of_tests.load()
                )
                for unit in order:
                    self.workqueue.move_to_end(unit)
                self._ordered = True
            super()._assign_work_unit(node)

    return GroupScheduling(config, log)


@pytest.fixture
def root() -> Path:
    return ROOT


@pytest.fixture
def base_config() -> dict:
    with open(ROOT / "config" / "config.yaml") as fh:
        return yaml.safe_load(fh)


@pytest.fixture
def tiny_config() -> dict:
    with open(ROOT / "tests" / "fixtures" / "tiny.yaml") as fh:
        return yaml.safe_load(fh)


# ---- the project's local Slurm clusters (scripts/slurm/cluster-up.sh): each started once for
# its group's tests (SLURM_CLUSTERS), stopped at the end if the tests started it. A module's
# tests talk to its cluster through SLURM_CONF and DLSCALE_SLURM_DIR in this process's
# environment, which every command they start inherits. Under CI=true these tests never skip.
def cluster_env(group: str) -> dict[str, str]:
    """The variables that name a group's cluster of this run: its state folder, its ports, its
    nodes' network (each node a host of its own) and its slurm.conf."""
    state = run_names.run_path(group)
    index = SLURM_CLUSTERS[group]["index"]
    return {
        "DLSCALE_SLURM_DIR": str(state),
        **run_names.cluster_ports(index),
        **run_names.cluster_network(index),
        "SLURM_CONF": f"{state}/etc/slurm.conf",
    }


def stop_cluster(state_dir: Path | str) -> None:
    """Stop the cluster whose state is in `state_dir` and remove the folder (cluster-down.sh
    --purge)."""
    env = dict(os.environ, DLSCALE_SLURM_DIR=str(state_dir))
    env["SLURM_CONF"] = f"{state_dir}/etc/slurm.conf"
    subprocess.run(
        ["bash", str(DOWN), "--purge", "--quiet"], capture_output=True, timeout=300, env=env
    )


def _cluster_running() -> bool:
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-o", "%D %t"], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and "idle" in out.stdout


_STARTED: list[str] = []  # the groups whose cluster this process started


@pytest.fixture(scope="session")
def _clusters_stopped_at_the_end():
    yield
    for group in _STARTED:
        stop_cluster(cluster_env(group)["DLSCALE_SLURM_DIR"])


@pytest.fixture(scope="module")
def cluster(request, _clusters_stopped_at_the_end):
    """The module's group's cluster of this run, started by the first module of the group and
    stopped when the run's session ends (a module never stops it: the next module of the group
    would start it again)."""
    if os.geteuid() != 0 and not os.environ.get("CI"):
        pytest.skip("the local Slurm cluster needs root (apt, daemons); CI runs these tests")
    group = slurm_group(request.module.__file__)
    os.environ.update(cluster_env(group))
    if group not in _STARTED or not _cluster_running():
        up = subprocess.run(
            ["bash", str(UP), "--nodes", "2", *SLURM_CLUSTERS[group]["up_args"]],
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        if group not in _STARTED:
            _STARTED.append(group)
    assert _cluster_running()
    yield group


# ---- the run as a whole: its own names, each group's time, what it leaves behind ------------
# The controller (or the one process under DLSCALE_TEST_WORKERS=0) claims the run's slot before
# any worker starts (tests/helpers/run_names.py); an earlier run that died in the same slot left
# its clusters and folders, which are stopped and removed first. At the end it prints each
# group's time (the sum of its tests' durations, and from its first test's start to its last
# test's end) and lists anything the run left behind, which fails the run.
GROUP_TIMES_SHOWN = 12


def _is_controller(config) -> bool:
    return not hasattr(config, "workerinput")


# The tests' folders (tmp_path) are the studies' checkouts, which a cluster's nodes must see: on
# the machine's shared disk, not /tmp, which each node of a local cluster has of its own (a
# --basetemp or PYTEST_DEBUG_TEMPROOT given to the run wins).
SHARED_TEMPROOT = "/var/tmp"


def pytest_configure(config):
    if not _is_controller(config):
        return
    if not config.option.basetemp:
        os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", SHARED_TEMPROOT)
    name = run_names.claim()
    global _GROUP_TIME_LOG
    _GROUP_TIME_LOG = {}
    if not run_names.owns_slot():  # a pytest inside a test: its parent's run
        return
    for stale in run_names.stop_processes(name):
        print(f"stopped, left by an earlier run in slot {name}: {stale}", file=sys.stderr)
    for stale in run_names.run_folders(name):
        folder = stale.split(" ", 1)[1]
        if Path(folder, "etc", "slurm.conf").exists():
            stop_cluster(folder)
    run_names.remove_run_folders(name)
    for gone in run_names.remove_networks(name):
        print(f"removed, left by an earlier run in slot {name}: {gone}", file=sys.stderr)


_GROUP_TIME_LOG: dict | None = None  # the controller's: group -> seconds, first start, last end
_LEFT_BEHIND = pytest.StashKey[list]()
_TAIL = pytest.StashKey[tuple]()


def _group_label(nodeid: str) -> str:
    """A test's group as the summary names it: a cluster group or a shared-fixture module by
    its name, every other test under its module's folder."""
    scope = xdist_scope(nodeid)
    if scope != nodeid:
        return scope
    return str(Path(nodeid.split("::", 1)[0]).parent) + "/ (ungrouped)"


_CPU_MARK = pytest.StashKey[float]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Each phase's CPU seconds (the worker and the children it waited for), for the timeline."""
    outcome = yield
    now = _cpu_seconds()
    report = outcome.get_result()
    report.user_properties.append(("cpu_s", round(now - item.stash.get(_CPU_MARK, now), 2)))
    item.stash[_CPU_MARK] = now


def pytest_runtest_setup(item):
    item.stash[_CPU_MARK] = _cpu_seconds()


def _cpu_seconds() -> float:
    import resource

    own, children = (
        resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


_TIMELINE: list[dict] = []  # the controller's: one entry per test phase, written at the end


def pytest_runtest_logreport(report):
    if _GROUP_TIME_LOG is None:  # a worker: its reports reach the controller
        return
    _TIMELINE.append(
        {
            "test": report.nodeid,
            "when": report.when,
            "worker": getattr(getattr(report, "node", None), "gateway", None)
            and report.node.gateway.id,
            "start": report.start,
            "stop": report.stop,
            "cpu_s": dict(report.user_properties).get("cpu_s"),
        }
    )
    times = _GROUP_TIME_LOG.setdefault(
        _group_label(report.nodeid), {"seconds": 0.0, "start": report.start, "stop": report.stop}
    )
    times["seconds"] += report.duration
    times["start"] = min(times["start"], report.start)
    times["stop"] = max(times["stop"], report.stop)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    config = session.config
    if not _is_controller(config) or not run_names.owns_slot():
        return
    if os.environ.get("DLSCALE_TEST_TIMELINE"):  # where each test ran, when, and its CPU
        Path(os.environ["DLSCALE_TEST_TIMELINE"]).write_text(json.dumps(_TIMELINE, indent=0))
    ended = max((phase["stop"] for phase in _TIMELINE), default=None)
    checked = time.time()
    left = run_names.leftovers(run_names.run_name())
    config.stash[_LEFT_BEHIND] = left
    # the run's tail: from its last test's end to the workers' exit, and the check itself
    config.stash[_TAIL] = (checked - ended if ended else None, time.time() - checked)
    if left and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, config):
    if not _is_controller(config):
        return
    write = terminalreporter.write_line
    times = _GROUP_TIME_LOG or {}
    if times:
        terminalreporter.section("each group's time (tests' durations; first start to last end)")
        ranked = sorted(times.items(), key=lambda kv: kv[1]["seconds"], reverse=True)
        for label, t in ranked[:GROUP_TIMES_SHOWN]:
            write(f"{t['seconds']:8.1f} s  {t['stop'] - t['start']:8.1f} s wall  {label}")
    if not run_names.owns_slot():
        return
    left = config.stash.get(_LEFT_BEHIND, [])
    name = os.environ.get(run_names.RUN_VARIABLE, "?")
    terminalreporter.section(f"left behind by run {name}")
    for line in left:
        write(line, red=True)
    if not left:
        write("nothing: no process, folder, network namespace or bridge of the run remains")
    workers, check = config.stash.get(_TAIL, (None, 0.0))
    if workers is not None:
        write(f"(the workers exited {workers:.1f} s after the last test; this check {check:.1f} s)")
