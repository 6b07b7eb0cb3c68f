"""A cell's Slurm job runs its launcher with no Snakemake inside the allocation.

The official Slurm executor plugin submits every job as `sbatch --wrap "<python> -m snakemake
...(slurm-jobstep executor)"`; that Snakemake parses the whole workflow and then starts a job
step, `srun -n1 <python> -m snakemake ...`, which parses it again and only then runs the rule's
shell command. Two Snakemake start-ups per cell: about 3 of the 4.2 s each trivial cell cost on
the local cluster (benchmarks/slurm_overhead.py).

Here the project's executor plugin (snakemake_executor_plugin_dlscale, `executor: dlscale` in
profiles/slurm: the official Slurm executor, subclassed) overrides, for cell jobs only, the one
string the plugin puts inside the job, `Executor.format_job_exec(job)`, by

    <python> -m dlscale.workflow.jobstep <payload>

where the payload (zlib + urlsafe base64 of JSON, so no character needs quoting inside the
plugin's `--wrap="..."`) carries the rule's shell command exactly as Snakemake formats it
(`job.shellcmd`: the launcher, its cell, its output, its log redirection), the job's output and
log files. In the job, `main` does what Snakemake's `Job.prepare` did for those files (removes a
stale output, creates the folders) and replaces itself with `bash -c "set -euo pipefail; <shell
command>"` (Snakemake's shell prefix): the job's exit status is the launcher's.

Everything else stays the plugin's: the sbatch line and its resources, job name and comment,
arrays (`--slurm-jobstep-array-execs`: the same per-task dispatch as the plugin's job step, read
here), status polling, cancellation, retries. Everything after the job stays the driver's
Snakemake, as for any remote job on a shared filesystem: output check with latency wait,
metadata, incomplete markers, cleanup of a failed job's outputs.

Left on the plugin's own path: group jobs, and runs that deploy software per rule
(`--sdm conda` / `apptainer`: Snakemake activates those in the job).
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import socket
import sys
import zlib

from dlscale.study.cell import CELL_RULE_PREFIXES

MODULE = "dlscale.workflow.jobstep"
ARRAY_OPTION = "--slurm-jobstep-array-execs"
# Snakemake's default shell prefix (snakemake.shell.shell._process_prefix): what the rule's
# command ran under before.
SHELL_PREFIX = "set -euo pipefail; "
# Set to 1 in the driver's environment to keep the plugin's own job command (two Snakemake
# start-ups per job): benchmarks/slurm_overhead.py --snakemake-in-job compares both.
IN_JOB_ENV = "DLSCALE_SNAKEMAKE_IN_JOB"


# -- in the driver ---------------------------------------------------------------------------
def encode(payload: dict) -> str:
    return base64.urlsafe_b64encode(zlib.compress(json.dumps(payload).encode(), 9)).decode()


def decode(text: str) -> dict:
    return json.loads(zlib.decompress(base64.urlsafe_b64decode(text.encode())))


def thin_eligible(job) -> bool:
    """A cell job whose whole work is its shell command (no group, shadow or benchmark)."""
    return (
        not job.is_group()
        and job.rule.name.startswith(CELL_RULE_PREFIXES)
        and job.shellcmd is not None
        and not job.rule.shadow_depth
        and not job.benchmark
    )


def payload_of(job) -> dict:
    """What a cell's job runs: its rule's shell command as Snakemake formats it, its output and
    log files (also a packed cell's entry in its pack's manifest: dlscale.workflow.packing)."""
    return {
        "rule": job.rule.name,
        "jobid": job.jobid,
        "shell": job.shellcmd,
        "output": [str(f) for f in job.output],
        "log": [str(f) for f in job.log],
    }


def job_exec(job, python: str = sys.executable) -> str:
    return f"{shlex.quote(python)} -m {MODULE} {encode(payload_of(job))}"


def route(workflow) -> tuple[bool, str]:
    """Whether this run's cell jobs take the thin command (`job_exec`), and why, for the driver's
    log. Decided once, when the executor is created: the deployment settings and the
    environment do not change during a run."""
    if os.environ.get(IN_JOB_ENV) == "1":
        return False, f"cells run through Snakemake inside their jobs ({IN_JOB_ENV}=1)"
    methods = {m.name.lower() for m in workflow.deployment_settings.deployment_method}
    if methods:
        return False, (
            f"cells run through Snakemake inside their jobs (software deployment "
            f"{', '.join(sorted(methods))} is activated there)"
        )
    return True, f"cells run their launcher directly inside their Slurm jobs ({MODULE})"


def command(job, thin: bool, plugin_command) -> str:
    """What a job's allocation runs: the thin command for a cell job of a thin run (`route`),
    else the plugin's own (`plugin_command(job)`, Snakemake with the slurm-jobstep executor)."""
    return job_exec(job) if thin and thin_eligible(job) else plugin_command(job)


# -- in the job ------------------------------------------------------------------------------
def array_task_payload(argv: list[str]) -> str | None:
    """This array task's payload, by the plugin's job-step rule: the chunk's first task
    (SLURM_ARRAY_TASK_MIN) runs the command's own payload, every other task the command the
    dispatch table holds for its index (zlib, hex, in base64 JSON). None outside an array."""
    table = None
    for i, arg in enumerate(argv):
        if arg.startswith(ARRAY_OPTION + "="):
            table = arg.split("=", 1)[1]
        elif arg == ARRAY_OPTION and i + 1 < len(argv):
            table = argv[i + 1]
    task = os.environ.get("SLURM_ARRAY_TASK_ID")
    if table is None or task is None or task == os.environ.get("SLURM_ARRAY_TASK_MIN"):
        return None
    execs = json.loads(base64.b64decode(table))
    if task not in execs:
        raise SystemExit(
            f"{MODULE}: array task {task} has no command in {ARRAY_OPTION} "
            f"(tasks {', '.join(sorted(execs, key=int))})"
        )
    command = zlib.decompress(bytes.fromhex(execs[task])).decode()
    words = shlex.split(command)
    return words[words.index(MODULE) + 1]


def prepare(payload: dict) -> None:
    """What Snakemake's Job.prepare did in the job for these files: a stale output is removed
    (a failed attempt must not leave an earlier file behind) and every folder exists."""
    for path in payload["output"]:
        if os.path.isfile(path) or os.path.islink(path):
            os.remove(path)
    for path in payload["output"] + payload["log"]:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0].startswith("-"):
        raise SystemExit(f"usage: python -m {MODULE} <payload> [{ARRAY_OPTION}=<table>]")
    payload = decode(array_task_payload(argv) or argv[0])
    prepare(payload)
    print(
        f"{MODULE}: rule {payload['rule']}, Snakemake job {payload['jobid']}, "
        f"Slurm job {os.environ.get('SLURM_JOB_ID')}"
        f"{'_' + os.environ['SLURM_ARRAY_TASK_ID'] if 'SLURM_ARRAY_TASK_ID' in os.environ else ''}"
        f" on {socket.gethostname()}:\n{payload['shell']}",
        flush=True,
    )
    os.execvp("bash", ["bash", "-c", SHELL_PREFIX + payload["shell"]])


if __name__ == "__main__":
    main()
