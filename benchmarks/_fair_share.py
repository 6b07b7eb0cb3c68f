"""The local cluster as benchmarks/packing.py uses it: its configuration checked (fair share or
FIFO), the study's and the competitor's users and accounts with equal shares, their recorded
usage reset and read back (sshare), and the queue (squeue)."""

from __future__ import annotations

import os
import pwd
import subprocess
import time

BG_USER = "dlscale-bg"  # the competing workload's Linux user
STUDY_ACCOUNT, BG_ACCOUNT = "dlscale-study", "dlscale-others"


def sh(cmd: list[str], check: bool = True, **kw) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, **kw)
    if check and out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {out.returncode}: {out.stderr.strip()}")
    return out.stdout


def slurm_config() -> dict[str, str]:
    out = sh(["scontrol", "show", "config"])
    return {
        k.strip(): v.strip()
        for k, _, v in (ln.partition("=") for ln in out.splitlines() if "=" in ln)
    }


def cluster_ready(fifo_ok: bool) -> dict[str, str]:
    hint = (
        "start the benchmark's own cluster: DLSCALE_SLURM_DIR=/var/tmp/dlscale-slurm-pack ... "
        "bash scripts/slurm/cluster-up.sh --nodes 2 --no-system-conf --fairshare, then export "
        "SLURM_CONF=$DLSCALE_SLURM_DIR/etc/slurm.conf (this module's docstring)"
    )
    if not os.environ.get("SLURM_CONF"):
        raise SystemExit(f"SLURM_CONF is not set: {hint}")
    try:
        config = slurm_config()
    except (OSError, subprocess.SubprocessError, SystemExit) as exc:
        raise SystemExit(f"no Slurm controller answers ({exc}); {hint}") from None
    nodes = sh(["sinfo", "-h", "-N", "-o", "%N %t"]).split("\n")
    if not any("idle" in ln for ln in nodes):
        raise SystemExit(f"the cluster has no idle node (sinfo: {nodes}); {hint}")
    queued = sh(["squeue", "-h"]).strip()
    if queued:
        raise SystemExit(f"the cluster is busy; these jobs would distort the timing:\n{queued}")
    if config.get("PriorityType") != "priority/multifactor" and not fifo_ok:
        raise SystemExit(
            f"the cluster orders jobs by {config.get('PriorityType')} (FIFO): a study's jobs "
            "never wait behind a competitor's later ones, so packing cannot show its benefit. "
            f"Pass --fifo to measure it anyway, or {hint}"
        )
    if os.geteuid() != 0:
        raise SystemExit("run as root: the competitor is submitted as another user (runuser)")
    return config


def ensure_users() -> None:
    """The competitor's Linux user, and both users' accounts with equal shares."""
    try:
        pwd.getpwnam(BG_USER)
    except KeyError:
        sh(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", BG_USER])
    me = pwd.getpwuid(os.geteuid()).pw_name
    have = sh(["sacctmgr", "-n", "-P", "list", "account", "format=account"]).split()
    for account in (STUDY_ACCOUNT, BG_ACCOUNT):
        if account not in have:
            sh(["sacctmgr", "-i", "add", "account", account, "Fairshare=1"])
    for user, account in ((me, STUDY_ACCOUNT), (BG_USER, BG_ACCOUNT)):
        assoc = sh(["sacctmgr", "-n", "-P", "list", "assoc", f"user={user}", "format=account"])
        if account not in assoc.split():
            sh(["sacctmgr", "-i", "add", "user", user, f"account={account}"], check=False)
        sh(["sacctmgr", "-i", "modify", "user", user, "set", f"DefaultAccount={account}"], False)


def reset_usage() -> None:
    """Both users' recorded usage to 0: every run starts from the same fair-share priorities
    (named with the account: root also has the `root` account's association)."""
    me = pwd.getpwuid(os.geteuid()).pw_name
    for user, account in ((me, STUDY_ACCOUNT), (BG_USER, BG_ACCOUNT)):
        where = ["where", f"name={user}", f"account={account}"]
        sh(["sacctmgr", "-i", "modify", "user", *where, "set", "RawUsage=0"])
    deadline = time.monotonic() + 30
    while any(raw_usage().values()):  # slurmdbd passes the reset on to slurmctld
        if time.monotonic() > deadline:
            raise SystemExit(f"the usage reset did not reach slurmctld: {raw_usage()}")
        time.sleep(0.5)


def raw_usage() -> dict[str, float]:
    """Each user's recorded fair-share usage (sshare RawUsage) in the benchmark's accounts."""
    out = sh(["sshare", "-h", "-P", "-a", "-o", "Account,User,RawUsage,FairShare"], check=False)
    usage = {}
    for line in out.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) == 4 and parts[0] in (STUDY_ACCOUNT, BG_ACCOUNT) and parts[1]:
            usage[parts[1]] = float(parts[2] or 0)
    return usage


def wait_charged(timeout: float = 150) -> float:
    """Until slurmctld's fair share has recorded the competitor's use since the reset (its
    RawUsage > 0: the next PriorityCalcPeriod charges running jobs). Before that both users
    stand at 0, and Slurm's fair tree breaks that tie by the order of the accounts, not by
    anything either user did. Returns the seconds waited."""
    t0 = time.monotonic()
    while raw_usage().get(BG_USER, 0.0) <= 0:
        if time.monotonic() - t0 > timeout:
            raise SystemExit(f"sshare recorded no usage of {BG_USER} within {timeout:.0f} s")
        time.sleep(1)
    return time.monotonic() - t0


def queue(user: str | None = None) -> list[dict]:
    cmd = ["squeue", "-h", "-o", "%i|%u|%T"] + (["-u", user] if user else [])
    rows = [ln.split("|") for ln in sh(cmd, check=False).splitlines() if ln.strip()]
    return [{"id": r[0], "user": r[1], "state": r[2]} for r in rows if len(r) == 3]


def wait_empty(timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while queue():
        if time.monotonic() > deadline:
            raise SystemExit(f"the queue did not empty in {timeout:.0f} s: {queue()}")
        time.sleep(1)
