"""The preflight's result files (results/<study>/preflight/<entry>-<environment>-<key>.json):
written by the preflight job (dlscale.run.preflight_job), read by the driver that holds the cells
(dlscale.workflow.preflight) and by the report's Systems section (dlscale.outputs.report).

A result holds `passed`, every check (`name`, `ok`, `detail`, `fix`), the first failure
(`failed`), the Slurm job and host, the probe's nodes and ranks, the environment's CUDA build,
the GPUs and topology nvidia-smi showed, and the all-reduce measurement (bytes, ranks, n,
warm-up, median and range of the time, bus bandwidth).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from dlscale.registry.launchers import launcher, on_slurm

PREFLIGHT_DIR = "preflight"
RESULT_VERSION = 1


def write_result(path: Path, result: dict) -> None:
    """Atomically: a reader sees the whole result or none."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1, sort_keys=True))
    tmp.replace(path)


def read_result(path: Path) -> dict | None:
    try:
        result = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return result if isinstance(result, dict) and "passed" in result else None


def allreduce_text(allreduce: dict | None) -> str:
    if not allreduce:
        return ""
    return (
        f"all-reduce {allreduce['bytes'] / 2**20:g} MiB over {allreduce['ranks']} ranks: "
        f"{allreduce['busbw_gbps']:.2f} GB/s bus bandwidth (median of {allreduce['n']} after "
        f"{allreduce['warmup']} warm-up; {allreduce['min_s'] * 1e3:.2f}-"
        f"{allreduce['max_s'] * 1e3:.2f} ms)"
    )


def summary(result: dict) -> str:
    """One line: where, when, the verdict and what it saw."""
    where = f"{result['hardware']} / {result['environment']}"
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(result["finished_at"]))
    job = f"Slurm job {result.get('slurm_job')} on {result.get('host')}, {when}"
    if not result["passed"]:
        bad = result["failed"]
        return f"{where}: FAILED at '{bad['name']}' ({job}): {bad['detail']}. Fix: {bad['fix']}"
    seen = [c["detail"] for c in result["checks"] if c["name"] in ("GPU model", "driver")]
    seen += [c["detail"] for c in result["checks"] if c["name"].startswith("CUDA build")]
    bw = allreduce_text(result.get("allreduce"))
    return "; ".join(
        [f"{where}: passed ({job}, {result['nodes']} node(s), {result['ranks']} rank(s))"]
        + seen
        + ([bw] if bw else [])
    )


def result_for(folder: Path, hardware: str, environment_id: str) -> dict | None:
    """The newest result of a hardware entry and environment identity (a cell's `hardware` and
    `environment`), or None."""
    found = [
        r
        for r in map(read_result, sorted(Path(folder).glob(f"{hardware}-*.json")))
        if r and r.get("hardware") == hardware and r.get("environment_id") == environment_id
    ]
    return max(found, key=lambda r: r["finished_at"], default=None)


def report_lines(folder: Path, config: dict) -> list[str]:
    """What the report's Systems section says of the preflight of a study's run."""
    if not on_slurm(config.get("launcher")):
        return [
            f"Preflight: not run ({launcher(config.get('launcher')).name} launcher: the cells "
            "start at once, no queue wait)."
        ]
    if not config.get("preflight", True):
        return ["Preflight: skipped (--config preflight=False); no cell was checked before it ran."]
    results = [r for r in map(read_result, sorted(Path(folder).glob("*.json"))) if r]
    if not results:
        return ["Preflight: no result (no cell of this run was submitted)."]
    return [f"Preflight: {summary(r)}" for r in results]
