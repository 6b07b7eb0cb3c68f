"""This test run's own names, so two runs of the suite on one machine (two clones, or one clone
twice) never meet: each run claims a free slot under a lock held for its whole length, and
everything of its own on the machine is named after that slot: its local Slurm clusters' state
folders and ports, its plain users' homes and work folders.

The run's controller (the pytest process that scripts/test.sh starts) claims the slot before
any worker starts and passes it on in the environment (RUN_VARIABLE), which every worker and
every process a test starts inherits; `leftovers` finds, at the end, what the run left running
or on disk by that name.

Costly fixtures that depend only on their inputs (the container image, the package indexes) are
not the run's: they are shared by every run on the machine, keyed by a hash of their inputs and
built under `shared_lock`, once per machine.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

RUN_VARIABLE = "DLSCALE_TEST_RUN"
# slots: at most this many runs at once on one machine (each holds a lock file in SLOTS_DIR)
SLOTS = 8
SLOTS_DIR = Path("/var/tmp/dlscale-test-runs")
# a run's own folders: /var/tmp/dlscale-test-<run>-<part>
RUN_PREFIX = "/var/tmp/dlscale-test-"
# the fixtures every run shares, keyed by their inputs (container images, package indexes)
SHARED = Path("/var/tmp/dlscale-shared")

_held: list = []  # the claimed slot's open lock file, kept for the process' life


def claim() -> str:
    """Claim a free slot for this run (the controller, once) and export its name."""
    if os.environ.get(RUN_VARIABLE):
        return os.environ[RUN_VARIABLE]
    SLOTS_DIR.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(PermissionError):
        SLOTS_DIR.chmod(0o1777)
    for slot in range(SLOTS):
        fh = open(SLOTS_DIR / f"slot-{slot}.lock", "a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            continue
        _held.append(fh)
        name = f"r{slot}"
        os.environ[RUN_VARIABLE] = name
        return name
    raise RuntimeError(
        f"{SLOTS} test runs already hold every slot in {SLOTS_DIR}: wait for one to finish"
    )


def owns_slot() -> bool:
    """Whether this process claimed the run's slot (the run's first process), not inherited
    the name (a pytest a test starts runs inside its parent's run: it neither cleans the slot
    nor judges what is left behind, which is its parent's)."""
    return bool(_held)


def run_name() -> str:
    """The run's name (claimed by the controller; a process started outside a run claims)."""
    return os.environ.get(RUN_VARIABLE) or claim()


def slot() -> int:
    return int(run_name()[1:])


def run_path(part: str) -> Path:
    """A folder of this run's own on the machine, outside any user's home: a plain user
    reaches it, and no other run uses its name."""
    return Path(f"{RUN_PREFIX}{run_name()}-{part}")


# A cell's rendezvous port is seeded by its Slurm job id (dlscale.run.launchers.ports.port_block:
# 355 blocks at Linux's default ephemeral range): each cluster's job ids start JOB_IDS_APART from
# the next one's, so the clusters of two runs at once (CLUSTERS_PER_RUN each) seed different
# blocks for their first JOB_IDS_APART jobs, whatever they run at the same moment.
CLUSTERS_PER_RUN = 4
JOB_IDS_APART = 44  # 2 runs x 4 clusters x 44 = 352 <= 355 blocks


def cluster_ports(index: int) -> dict[str, str]:
    """The ports of the run's `index`-th local cluster (slurmctld, slurmdbd, MariaDB, the
    slurmds' first), apart from every other run's and cluster's and from the ephemeral range,
    and its first job id."""
    k = slot()
    ctld = 7000 + 100 * k + 10 * index
    return {
        "DLSCALE_SLURM_FIRST_JOB_ID": str(1 + (CLUSTERS_PER_RUN * k + index) * JOB_IDS_APART),
        "DLSCALE_SLURM_CTLD_PORT": str(ctld),
        "DLSCALE_SLURM_DBD_PORT": str(ctld + 2),
        "DLSCALE_SLURM_DB_PORT": str(3400 + 10 * k + index),
        "DLSCALE_SLURM_NODE_PORT_BASE": str(20000 + 1000 * k + 100 * index),
    }


# Each local cluster's nodes are hosts of their own (scripts/slurm/cluster-up.sh, separate hosts):
# a network named after the run (its bridge, namespaces and veths `dl<run>c<index>...`, the
# login side's hosts entries `nX.dl<run>c<index>`) on a /24 of its own in NETWORK_BASE.0.0/16.
NETWORK_BASE = "10.213"


def cluster_network(index: int) -> dict[str, str]:
    """The name and subnet of the run's `index`-th local cluster's network, apart from every
    other run's and cluster's."""
    if not 0 <= index < CLUSTERS_PER_RUN:
        raise ValueError(f"cluster index {index}: a run has {CLUSTERS_PER_RUN} clusters")
    return {
        "DLSCALE_SLURM_NET": f"dl{run_name()}c{index}",
        "DLSCALE_SLURM_SUBNET": f"{NETWORK_BASE}.{CLUSTERS_PER_RUN * slot() + index}",
    }


@contextlib.contextmanager
def shared_lock(name: str, timeout_s: float = 1800):
    """An exclusive lock on a shared fixture of the machine (`name` under SHARED), so two runs
    that want it at once build it once: the second waits, then finds it built."""
    SHARED.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(PermissionError):
        SHARED.chmod(0o755)
    with open(SHARED / f"{name}.lock", "a+") as fh:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{SHARED / name}: another run held its lock {timeout_s} s")
                time.sleep(1)
        try:
            yield SHARED / name
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# ---- what a run leaves behind -------------------------------------------------------------
# munged is the host's, shared by every local cluster on the machine (as apt and /etc/hosts
# are): a run's last cluster leaves it to the others, so it is not the run's leftover.
HOST_SHARED_PROCESSES = {"munged"}


def _environ(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return b""


def _command(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def _name(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _ancestors() -> set[str]:
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(str(pid))
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            pid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids


def run_processes(name: str) -> list[str]:
    """Processes that carry the run's name in their environment or its folders in their
    command line (daemons, ranks, drivers a test started), but this process and its parents."""
    marker = f"{RUN_VARIABLE}={name}".encode()
    folder = f"{RUN_PREFIX}{name}-"
    mine = _ancestors()
    found = []
    for entry in Path("/proc").iterdir():
        pid = entry.name
        if not pid.isdigit() or pid in mine or _name(pid) in HOST_SHARED_PROCESSES:
            continue
        command = _command(pid)
        if not command:  # a kernel thread, or gone
            continue
        if marker in _environ(pid).split(b"\0") or folder in command:
            found.append(f"process {pid}: {command[:160]}")
    return found


def run_folders(name: str) -> list[str]:
    prefix = Path(f"{RUN_PREFIX}{name}-")
    return sorted(f"folder {p}" for p in prefix.parent.glob(prefix.name + "*"))


def network_namespaces(name: str) -> list[str]:
    """Network namespaces and bridges named after the run (`ip netns`, `ip link`)."""
    out = []
    for command, what in ((["ip", "netns", "list"], "network namespace"),
                          (["ip", "-o", "link", "show"], "link")):  # fmt: skip
        if not shutil.which(command[0]):
            break
        listed = subprocess.run(command, capture_output=True, text=True).stdout
        out += [f"{what}: {line.strip()}" for line in listed.splitlines() if f"dl{name}" in line]
    return out


def remove_networks(name: str) -> list[str]:
    """Remove what is left of run `name`'s clusters' networks (a run that died before its
    clusters' cluster-down.sh: their namespaces, veths, bridges and this machine's hosts
    entries, all named `dl<run>c<index>...`) and say what. Root only; nothing without `ip`."""
    if not shutil.which("ip") or os.geteuid() != 0:
        return []
    gone = []
    prefix = re.compile(rf"^dl{re.escape(name)}c\d+(n\d+|br)(@|$)")
    for command, remove in ((["ip", "netns", "list"], ["ip", "netns", "del"]),
                            (["ip", "-o", "link", "show"], ["ip", "link", "del"])):  # fmt: skip
        listed = subprocess.run(command, capture_output=True, text=True).stdout
        for line in listed.splitlines():
            field = line.split(": ")[1] if command[1] == "-o" else line.split(" ")[0]
            if prefix.match(field):
                what = field.split("@")[0]
                subprocess.run([*remove, what], capture_output=True)
                gone.append(what)
    hosts = Path("/etc/hosts")
    with contextlib.suppress(OSError), open("/run/lock/dlscale-slurm-host.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # cluster-up.sh's lock on the machine's files
        lines = hosts.read_text().splitlines(keepends=True)
        kept = [line for line in lines if f"# dlscale-slurm dl{name}c" not in line]
        if len(kept) != len(lines):
            hosts.write_text("".join(kept))
            gone.append("/etc/hosts entries")
    return gone


def database_servers(name: str) -> list[str]:
    """PostgreSQL servers of the run still running (scripts/postgres/up.sh in one of its
    folders: the postmaster.pid of a data folder, its pid alive), with their socket."""
    out = []
    for pidfile in Path(RUN_PREFIX).parent.glob(
        f"{Path(RUN_PREFIX).name}{name}-*/data/postmaster.pid"
    ):
        try:
            lines = pidfile.read_text().splitlines()
            pid = int(lines[0])
        except (OSError, ValueError, IndexError):
            continue
        if Path(f"/proc/{pid}").exists():
            socket = lines[4] if len(lines) > 4 else "?"
            port = lines[3] if len(lines) > 3 else "?"
            out.append(
                f"database server: PostgreSQL pid {pid}, data {pidfile.parent}, socket "
                f"{socket}/.s.PGSQL.{port}"
            )
    return out


def leftovers(name: str, settle_s: float = 15.0) -> list[str]:
    """What the run left behind: processes, folders, database servers, network namespaces
    and bridges named after it (waiting up to `settle_s` for processes that are on their way
    out)."""
    deadline = time.monotonic() + settle_s
    while run_processes(name) and time.monotonic() < deadline:
        time.sleep(0.5)
    return (
        database_servers(name) + run_processes(name) + run_folders(name) + network_namespaces(name)
    )


def remove_run_folders(name: str) -> None:
    prefix = Path(f"{RUN_PREFIX}{name}-")
    for path in prefix.parent.glob(prefix.name + "*"):
        shutil.rmtree(path, ignore_errors=True)


def stop_processes(name: str) -> list[str]:
    """Kill the processes of run `name` (a run that ended in this slot and left them: the slot's
    lock says no live run holds the name) and say which."""
    found = run_processes(name)
    for line in found:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(line.split()[1].rstrip(":")), 9)
    return found
