"""What the results database (dlscale.store.database) keeps of a result, as rows of its tables
(dlscale.store.results_schema): a measurement's row from its metrics records, with the cell's
identity hashes (`series`, `configuration`) and its software stack (`software`, `stack`); a
preflight result's row; a verdict table's rows."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from dlscale.store.results_schema import AXIS_COLUMNS, INT_COLUMNS, METRIC_COLUMNS, utc
from dlscale.study.cell import DERIVED, NOT_IDENTITY
from dlscale.study.protocol import CONVERGENCE, RANK_START, SUMMARY


def _sha16(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


# Fields of a cell's identity that are its software stack: `configuration` leaves them out,
# and the hardware entry's hash with them (it covers the entry's modules and variables).
SOFTWARE_FIELDS = ("environment", "modules", "env", "hardware_hash")
# What a cell's JSON holds that is no part of its identity (dlscale.study.cell.NOT_IDENTITY)
# and the fields derived from the others.
NOT_SERIES = (*NOT_IDENTITY, *DERIVED, "rep")


def identity_hashes(cell: dict) -> tuple[str, str]:
    """(series, configuration) of a cell's JSON: its identity without the repetition, and
    that without its software stack (SOFTWARE_FIELDS)."""
    identity = {k: v for k, v in cell.items() if k not in NOT_SERIES}
    setup = {k: v for k, v in identity.items() if k not in SOFTWARE_FIELDS}
    return _sha16(identity), _sha16(setup)


def software_stack(records: list[dict]) -> dict[str, str]:
    """What a measurement ran on, name -> version or value: dlscale's commit and version,
    Python and the libraries, the framework environment, modules and variables, the container,
    the hardware entry's hash, the framework build's CUDA, cuDNN and NCCL, the GPU driver,
    the OS, kernel, C library and Slurm of the first node, the device and the nodes. Only what
    was recorded (a file from before a probe lacks it)."""
    start = records[0]["value"]
    cell, prov = start["cell"], start["provenance"]
    system = (
        next((r["value"].get("system") for r in records if r["event"] == RANK_START), None) or {}
    )
    out: dict[str, str] = {
        "dlscale commit": prov.get("git_commit"),
        "dlscale": prov.get("dlscale_version"),
        "python": prov.get("python"),
        **{name: version for name, version in sorted((prov.get("libraries") or {}).items())},
        "environment": cell.get("environment"),
        "hardware entry": cell.get("hardware_hash"),
        "modules": " ".join(cell.get("modules") or []) or None,
        "env": " ".join(f"{k}={v}" for k, v in sorted((cell.get("env") or {}).items())) or None,
        "device": prov.get("device_model"),
        "nodes": " ".join(sorted(prov.get("hosts") or [])) or None,
    }
    box = cell.get("container") or {}
    if box:
        out["container"] = f"{box.get('image')}@{box.get('digest', 'no digest')}"
    build = system.get("framework_build") or {}
    if build.get("available"):
        out["framework build"] = build.get("version")
        for key, name in (("cuda_runtime", "CUDA"), ("cudnn", "cuDNN"), ("nccl", "NCCL")):
            out[name] = build.get(key)
    gpu = system.get("gpu") or {}
    if gpu.get("available"):
        out["GPU driver"] = " ".join(gpu.get("drivers") or []) or None
    osys = system.get("os") or {}
    if osys.get("available"):
        out.update(OS=osys.get("name"), kernel=osys.get("kernel"), libc=osys.get("libc"))
    slurm = system.get("slurm") or {}
    if slurm.get("available"):
        out["Slurm"] = slurm.get("version")
    return {k: str(v) for k, v in out.items() if v not in (None, "")}


# What of a software stack is left out of its hash (`stack`): the nodes name where a run ran,
# not what it ran; dlscale's own commit moves with every change to the checkout (a study
# measured while the harness was edited would be split into runs), while what the harness
# measures is in the cell's identity. Both stay in `software`, so what changed names them.
NOT_STACK = ("nodes", "dlscale commit")


def stack_hash(software: dict[str, str]) -> str:
    """The software stack's hash (`stack`): one run's measurements of a series share it."""
    return _sha16({k: v for k, v in software.items() if k not in NOT_STACK})


def measurement_row(records: list[dict], study: str, cell: str, measurement: str, sha: str):
    """The `measurements` row of one valid metrics file's records."""
    start = records[0]["value"]
    cellv, prov = start["cell"], start["provenance"]
    summary = next(r["value"] for r in reversed(records) if r["event"] == SUMMARY)
    outcome = next((r["value"] for r in records if r["event"] == CONVERGENCE), None)
    series, configuration = identity_hashes(cellv)
    software = software_stack(records)
    row = {
        "study": study,
        "cell": cell,
        "measurement": measurement,
        "metrics_sha256": sha,
        "workload": cellv.get("workload", "throughput"),
        **{c: str(cellv.get(c, "ddp" if c == "parallelism" else "")) for c in AXIS_COLUMNS},
        **{c: int(cellv.get(c, 1 if c != "rep" else 0)) for c in INT_COLUMNS if c != "world_size"},
        "world_size": int(cellv.get("world_size") or cellv["nodes"] * cellv["ranks_per_node"]),
        "series": series,
        "configuration": configuration,
        "cell_hash": str(cellv.get("config_hash") or start.get("config_hash") or ""),
        "environment": str(cellv.get("environment", "")),
        "launcher": str(cellv.get("launcher", prov.get("launcher", ""))),
        "measured_at": utc(records[0]["time"]),
        **{c: _number(summary.get(c)) for c in METRIC_COLUMNS if c != "time_to_accuracy_s"},
        "time_to_accuracy_s": _number((outcome or {}).get("time_to_accuracy_s")),
        "reached": None if outcome is None else bool(outcome.get("reached")),
        "competing": bool(summary.get("competing")),
        "git_commit": prov.get("git_commit"),
        "dlscale_version": prov.get("dlscale_version"),
        "slurm_job_id": None if prov.get("slurm_job_id") is None else str(prov["slurm_job_id"]),
        "hosts": " ".join(prov.get("hosts") or []),
        "device_model": prov.get("device_model"),
        "software": json.dumps(software, sort_keys=True),
        "stack": stack_hash(software),
        "cell_json": json.dumps(cellv, sort_keys=True),
        "summary_json": json.dumps(
            {"summary": summary, **({"convergence": outcome} if outcome else {})},
            sort_keys=True,
            default=str,
        ),
        "recorded_at": utc(),
    }
    return row


def _number(value) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def preflight_row(result: dict, study: str, result_file: str) -> dict:
    """The `preflights` row of one preflight result (its file's name `result_file`)."""
    failed = result.get("failed") or {}
    allreduce = result.get("allreduce") or {}
    return {
        "study": study,
        "result_file": result_file,
        "hardware": str(result.get("hardware", "")),
        "environment": result.get("environment"),
        "environment_id": result.get("environment_id"),
        "passed": bool(result.get("passed")),
        "failed_check": failed.get("name"),
        "finished_at": utc(float(result["finished_at"])),
        "slurm_job": None if result.get("slurm_job") is None else str(result["slurm_job"]),
        "host": result.get("host"),
        "nodes": result.get("nodes"),
        "ranks": result.get("ranks"),
        "busbw_gbps": _number(allreduce.get("busbw_gbps")),
        "result_json": json.dumps(result, sort_keys=True, default=str),
        "recorded_at": utc(),
    }


def _csv_rows(path: Path) -> list[dict]:
    import csv

    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _float(value) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number == number else None  # NaN: none


def verdict_rows(path: Path, study: str, source: str) -> list[dict]:
    """The `verdicts` rows of a verdict table, each with the table content's hash."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    rows = []
    for r in _csv_rows(path):
        rows.append(
            {
                "study": study,
                "source": source,
                "table_sha256": digest,
                "hardware": r.get("hardware", ""),
                "cell": r.get("cell") or r.get("series") or "",
                "metric": r.get("metric") or "throughput_samples_per_s",
                "verdict": r.get("verdict", ""),
                "measured": _float(r.get("measured")),
                "reference": _float(r.get("reference")),
                "low": _float(r.get("interval_low") or r.get("slowdown_low")),
                "high": _float(r.get("interval_high") or r.get("slowdown_high")),
                "n": int(_float(r.get("n")) or 0) or None,
                "detail": r.get("reason") or r.get("interval_vs_bounds") or r.get("margin"),
                "recorded_at": utc(),
            }
        )
    return rows
