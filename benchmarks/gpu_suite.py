"""Every GPU check of the project in one call that fits a few minutes on one GPU.

    python benchmarks/gpu_suite.py OUT [--budget 300] [--device cuda|cpu] [--wheels DIR]
        [--steps a,b,c,d,e,f] [--rows compiled,...] [--estimates OLD/rows.jsonl ...]
        [--hardware KEY]

Runs, in this order, as much as fits in `--budget` seconds, one row per check:
  a. environment: the GPU (model, UUID, PCI bus id, memory, driver: dlscale.rank.node_probes'
     nvidia-smi section; clocks and power limit from NVML), CUDA, cuDNN and NCCL versions; the
     capability check (dlscale.workflow.capability on this torch, the device's sm_XY in the
     build's architectures) and the device choice (dlscale.rank.devices.pick_gpu, gpu_identity,
     the NVML board found by production's nvml_handle);
  b. fidelity: the project's one-rank cell (dlscale.run.launch) against the plain loop, through
     benchmarks/gpu_fidelity.py (its `harness` and `plain` sides: the engine of this step),
     ResNet-50 bf16 b256 and fp32 b32, eager rows then compiled rows, the sides alternating
     within a row; medians, ranges, n. Every process of the run shares one inductor cache
     (TORCHINDUCTOR_CACHE_DIR), so a compiled model is compiled once and loaded after;
  c. sync-free window: the production step (dlscale.frameworks.pytorch.Adapter) under the
     production timing loop (dlscale.rank.timing.run_timed) with
     torch.cuda.set_sync_debug_mode("error") over the timed steps and the production SyncAudit
     counting the host synchronisations inside the window (goal 0);
  d. energy: the production meter's board counter (dlscale.rank.energy, NVML total energy) over
     a window of >= 10 s against NVML power sampled over the same window by the same module
     (its sampled method), the difference in % (goal <= 5 %); telemetry: the rank's record
     (dlscale.rank.telemetry) of that window, every quantity non-empty;
  e. MFU: the largest decoder of the registry (llama3_1b where registered, else gpt2_124m), bf16,
     eager and compiled: FLOPs per token as the rank counts them (dlscale.models.flops through
     the adapter), tokens/s over the production window, MFU against the dense peak of the
     hardware entry whose device_model is this GPU (dlscale.analysis.mfu; --hardware KEY to
     name it);
  f. memory: the same model with parallelism fsdp at world size 1: the peak allocated over the
     timed window (peak statistics reset at its first step) and the state the adapter reports
     (parameters, gradients, optimizer state: memory_per_rank) against the predicted parts.

Each finished row is written at once to OUT/rows.jsonl (one JSON object per line) and
OUT/rows.md (the same rows as a Markdown table, rewritten whole from the JSON lines, by rename),
so a run killed from outside still leaves every row it finished (SIGTERM and SIGINT also kill
the suite's children). Before each row the suite compares its estimated cost (PRIOR_S; an
earlier run's measured seconds with --estimates; a fidelity row's own last repetition) with the
time left, less the cheapest row of every later step; a row that does not fit is written as
skipped with the estimate and the time left, and the child processes are killed at the budget
(a row cut there is written as skipped, never half). Rows that cannot run on the device are
skipped with the reason (GPU only). A row whose code raises is written as failed with the
error, and the suite exits 1. `--rows` keeps the rows of steps b-f whose names contain one of
its words (a rerun of what a first call skipped: `--rows compiled`).

Needs only this checkout and a CUDA PyTorch with numpy: steps c-f import neither Snakemake,
PyYAML nor jsonschema; the fidelity step's launcher validates the cell's metrics file with
jsonschema, the MFU row reads config/hardware.yaml with PyYAML, and steps a, d read NVML with
nvidia-ml-py: where they are missing, `--wheels DIR` installs them from the wheels in DIR into a
temporary folder for this run only (gpu_fidelity.provide_harness_packages; benchmarks/README.md
has the download command, about 1.5 MiB in all).

Where each part lives: this file is the runner (the steps' order, the budget, the child
process, the environment row a); the fidelity step (b) is benchmarks/gpu_fidelity.py; the
acceptance checks c-f, which the child runs, are tests/gpu/acceptance.py; what they share (the
rows' format, the plans, the estimates and targets) is benchmarks/_gpu_common.py, and the rows
on disk, the budget and the child's plan are benchmarks/_gpu_plan.py.

`--device cpu` is the CPU path the test command runs (tests/unit/benchmarks/test_gpu_suite.py): tiny
models (cnn_small, gpt2_tiny), fp32, eager; the GPU-only rows (the energy counter, compiled rows)
are written as skipped with the reason.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for _path in (REPO / "scripts", Path(__file__).resolve().parent, REPO / "tests" / "gpu"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import gpu_fidelity as fidelity  # noqa: E402 (the fidelity step's engine, beside this file)
from _gpu_common import (  # noqa: E402
    BREAK_ENV,
    FAILED,
    INDUCTOR_CACHE,
    MODES,
    OK,
    PLANS,
    PRIOR_S,
    RECORDED_RUNS,
    ROW_PREFIX,
    ROWS_FILE,
    SAFETY_S,
    SKIPPED,
    TABLE_FILE,
    Stopped,
    device_memory_bytes,
    does_not_fit,
    failed,
    kept_for_later,
    not_here,
    row_estimate,
    wanted,
)
from _gpu_plan import (  # noqa: E402
    Budget,
    Rows,
    child_rows,
    measured_estimates,
    recorded_fields,
)
from acceptance import child  # noqa: E402


# ---------------------------------------------------------------------------- a: environment
def environment(device: str) -> dict:
    """Step a: what runs here, the capability check and the device choice (production code)."""
    import torch

    from dlscale.rank import node_probes
    from dlscale.rank.devices import gpu_identity, nvml_handle, pick_gpu
    from dlscale.registry.frameworks import FRAMEWORKS

    site = Path(torch.__file__).resolve().parents[1]
    drives, says = FRAMEWORKS["pytorch"].cuda_probe(site)  # the capability check's own probe
    fields = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "cpu": node_probes.cpu_facts().get("model"),
        "capability_check": {"drives_cuda": drives, "says": says, "site_packages": str(site)},
    }
    if device != "cuda":
        fields["device_choice"] = "cpu: no GPU (--device cpu)"
        fields["gpu"] = "none: --device cpu"
        return {
            "fields": fields,
            "result": f"CPU {fields['cpu']}; torch {torch.__version__}; capability: {says}",
        }
    if not torch.cuda.is_available():
        raise RuntimeError(f"--device cuda, but torch sees no GPU ({says})")
    nccl = torch.cuda.nccl.version() if torch.distributed.is_nccl_available() else None
    fields["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl
    from dlscale.frameworks.torch_model import torch_gpu_identity

    ordinal = pick_gpu(0, 1, torch.cuda.device_count())
    gpu = gpu_identity(ordinal, **{k: v for k, v in torch_gpu_identity(ordinal).items() if v})
    major, minor = torch.cuda.get_device_capability(ordinal)
    arch = f"sm_{major}{minor}"
    limit = FRAMEWORKS["pytorch"].cuda_limit
    fields["device_choice"] = gpu
    fields["compute_capability"] = f"{major}.{minor}"
    fields["build_archs"] = torch.cuda.get_arch_list()
    fields["build_drives_device"] = arch in torch.cuda.get_arch_list() or any(
        a.startswith("compute_") and int(a.split("_")[1]) <= major * 10 + minor
        for a in torch.cuda.get_arch_list()
    )
    fields["framework_cuda_limit"] = limit
    fields["gpu"] = node_probes.gpu_facts()
    fields["nvml"] = nvml_facts(gpu, nvml_handle)
    name = gpu.get("name") or torch.cuda.get_device_name(ordinal)
    return {
        "fields": fields,
        "result": f"{name} ({gpu['key']}), driver "
        f"{fields['nvml'].get('driver', '?')}, CUDA {torch.version.cuda}, NCCL {fields['nccl']}; "
        f"{arch} in the build: {fields['build_drives_device']}; {says}",
    }


def nvml_facts(gpu: dict, nvml_handle) -> dict:
    """Driver, clocks and power limits of the rank's board (NVML; found as production finds
    it), or why not."""
    try:
        import pynvml as n

        n.nvmlInit()
        handle, how = nvml_handle(n, gpu)
    except Exception as exc:  # noqa: BLE001 (no NVML: say why)
        return {"available": False, "reason": repr(exc)}
    out = {"available": True, "board_by": how}
    reads = {
        "driver": lambda: n.nvmlSystemGetDriverVersion(),
        "name": lambda: n.nvmlDeviceGetName(handle),
        "uuid": lambda: n.nvmlDeviceGetUUID(handle),
        "sm_clock_mhz": lambda: n.nvmlDeviceGetClockInfo(handle, n.NVML_CLOCK_SM),
        "sm_clock_max_mhz": lambda: n.nvmlDeviceGetMaxClockInfo(handle, n.NVML_CLOCK_SM),
        "mem_clock_max_mhz": lambda: n.nvmlDeviceGetMaxClockInfo(handle, n.NVML_CLOCK_MEM),
        "sm_application_clock_mhz": lambda: n.nvmlDeviceGetApplicationsClock(
            handle, n.NVML_CLOCK_SM
        ),
        "power_limit_w": lambda: n.nvmlDeviceGetPowerManagementLimit(handle) / 1000,
        "power_limit_enforced_w": lambda: n.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000,
        "energy_counter_mj": lambda: n.nvmlDeviceGetTotalEnergyConsumption(handle),
        "persistence_mode": lambda: n.nvmlDeviceGetPersistenceMode(handle),
    }
    for key, read in reads.items():
        try:
            value = read()
            out[key] = value.decode() if isinstance(value, bytes) else value
        except Exception as exc:  # noqa: BLE001 (one fact missing is recorded)
            out[key] = f"unavailable: {exc}"
    return out


def run_child(a, rows: Rows, budget: Budget, python: str, specs: list[dict]) -> None:
    """Steps c-f in one child process, killed at the budget; its rows written as they come,
    the rows it did not report written as skipped (stopped at the budget) or failed (the child
    died)."""
    if not specs:
        return
    estimate = PRIOR_S[a.device]["child"] + row_estimate(a.device, specs[0]["kind"], specs[0])
    if not budget.fits(estimate):
        for spec in specs:
            rows.write(
                {
                    "step": spec["step"],
                    "row": spec["row"],
                    "target": spec["target"],
                    "status": SKIPPED,
                    "reason": not_here(a.device, spec["kind"]) or budget.why_not(estimate),
                }
            )
        return
    deadline = time.time() + budget.left()
    argv = [python, str(Path(__file__).resolve()), "--child", "--device", a.device]
    argv += ["--deadline", f"{deadline:.3f}", "--rows", json.dumps(specs)]
    if a.hardware:
        argv += ["--hardware", a.hardware]
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=fidelity.child_env(),
        start_new_session=True,
    )
    fidelity.SESSIONS.add(proc.pid)
    lines: queue.Queue = queue.Queue()
    err: list[str] = []
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
    threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True).start()
    done, started = set(), time.monotonic()
    killed = False
    while True:
        try:
            line = lines.get(timeout=0.2)
        except queue.Empty:
            if proc.poll() is not None and lines.empty():
                break
            if budget.left() <= 0 and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                killed = True
            continue
        if line.startswith(ROW_PREFIX):
            row = json.loads(line[len(ROW_PREFIX) :])
            rows.write(row)
            done.add(row["row"])
        else:
            print(line, end="", flush=True)
    proc.wait()
    fidelity.SESSIONS.discard(proc.pid)
    rest = [s for s in specs if s["row"] not in done]
    for i, spec in enumerate(rest):
        base = {"step": spec["step"], "row": spec["row"], "target": spec["target"]}
        if killed:
            what = "stopped at the budget in this row" if i == 0 else "not reached"
            why = not_here(a.device, spec["kind"]) if i else None
            rows.write({**base, "status": SKIPPED, "reason": why or f"budget: {what}"})
        else:
            tail = "".join(err)[-1500:]
            rows.write(
                {
                    **base,
                    "status": FAILED,
                    "reason": f"the child of steps c-f exited {proc.returncode} before this row",
                    "seconds": time.monotonic() - started if i == 0 else None,
                    "fields": {"stderr_tail": tail},
                }
            )


# ---------------------------------------------------------------------------- the run
def needs(device: str, steps: set) -> tuple[dict[str, str], dict[str, str]]:
    """What a run imports besides torch (module -> distribution to install from --wheels): what
    it cannot run without (numpy; jsonschema for the fidelity step's launcher), and what a row
    reports as missing when it is absent (PyYAML: the MFU row's peak; nvidia-ml-py: NVML's
    facts, energy and GPU telemetry)."""
    hard = {"numpy": "numpy", **({"jsonschema": "jsonschema"} if "b" in steps else {})}
    optional = {"yaml": "pyyaml", **({"pynvml": "nvidia-ml-py"} if device == "cuda" else {})}
    return hard, optional


def run(a, rows: Rows, budget: Budget, steps: set, work: Path) -> None:
    """The steps asked for, in order, in the run's temporary folder `work`."""
    hard, optional = needs(a.device, steps)
    installed = fidelity.provide_harness_packages(a.python, a.wheels, work, hard, optional)
    # one compile cache for every process of the run (steps b, c, e)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(work / INDUCTOR_CACHE)
    specs = [
        {**s, "estimate": a.measured.get(s["row"])}
        for s in child_rows(a.device, a.plan, a.memory_bytes, a.recorded)
        if s["step"] in steps and wanted(a, s["row"])
    ]
    if "a" in steps:
        started = time.monotonic()
        base = {"step": "a", "row": "environment"}
        try:
            if os.environ.get(BREAK_ENV) == "environment":
                raise RuntimeError(f"{BREAK_ENV}=environment: a deliberate break (tests)")
            env = environment(a.device)
            env["fields"]["wheels_installed"] = installed
            seconds = time.monotonic() - started
            rows.write({**base, "status": OK, "reason": None, "seconds": seconds, **env})
        except Exception as exc:  # noqa: BLE001 (the row fails, the others still run)
            rows.write(failed(base, exc, time.monotonic() - started))
    if "b" in steps:
        child = PRIOR_S[a.device]["child"] if specs else 0.0
        later = child + sum(
            row_estimate(a.device, s["kind"], s) for s in specs if not not_here(a.device, s["kind"])
        )
        b_rows = [(c, m) for m in MODES for c in a.plan["fidelity_cases"]]

        def reserve_after(index: int) -> float:
            """The first repetitions of the b rows after `index` and every row of c-f."""
            firsts = sum(
                a.measured.get(
                    f"fidelity {model} {precision} b{batch} {mode}",
                    2 * PRIOR_S[a.device][f"fidelity_{mode}"],
                )
                for (model, precision, batch), mode in b_rows[index + 1 :]
                if not not_here(a.device, f"fidelity_{mode}")
                and wanted(a, f"fidelity {model} {precision} b{batch} {mode}")
            )
            return firsts + later

        first = child + kept_for_later(a.device, specs, "b")
        fidelity.fidelity_rows(a, budget, rows, a.python, work, first, reserve_after)
    run_child(a, rows, budget, a.python, specs)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child(argv[1:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="folder for rows.jsonl and rows.md")
    p.add_argument("--budget", type=float, default=300.0, help="seconds for the whole run")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None)
    p.add_argument("--steps", default="a,b,c,d,e,f", help="which steps (default: all)")
    p.add_argument(
        "--rows",
        default=None,
        help="only the rows of steps b-f whose name contains one of these (comma-separated), "
        "e.g. compiled: a rerun of what the first run skipped",
    )
    p.add_argument("--wheels", default=None, help="folder of wheels for missing packages")
    p.add_argument(
        "--estimates",
        type=Path,
        nargs="+",
        default=None,
        help="earlier runs' rows.jsonl files (e.g. benchmarks/gpu-runs/*.jsonl): their measured "
        "seconds are this run's estimates",
    )
    p.add_argument("--hardware", default=None, help="hardware entry of this GPU (MFU's peak)")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the plan against --hardware's entry (the rows, their estimates and memory "
        "predictions, what fits the budget and what is left for another call); run nothing",
    )
    p.add_argument("--python", default=sys.executable)
    a = p.parse_args(argv)
    budget = Budget(a.budget)
    recorded = a.estimates or sorted(RECORDED_RUNS.glob("*.jsonl"))
    a.measured = measured_estimates(recorded)
    a.recorded = recorded_fields(recorded)
    import torch

    from dlscale.rank.provenance import git_commit

    a.device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    a.plan = PLANS[a.device]
    steps = set(a.steps.split(","))
    entry = hardware_entry(a.hardware) if a.hardware else None
    a.memory_bytes = device_memory_bytes(a.device, entry) if a.device == "cuda" else None
    if a.dry_run:
        return dry_run(a, steps, entry)
    name = (
        torch.cuda.get_device_name()
        if a.device == "cuda" and torch.cuda.is_available()
        else f"CPU ({platform.machine()})"
    )
    rows = Rows(
        a.out,
        {
            "device_name": name,
            "device": a.device,
            "started": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": git_commit(REPO),
            "torch": torch.__version__,
            "budget_s": a.budget,
        },
    )
    cache_was = os.environ.get("TORCHINDUCTOR_CACHE_DIR")

    def stopped(signum, frame):  # a timeout from outside: no side or child outlives the suite
        fidelity.stop_sessions()
        raise Stopped(signum)

    handlers = {sig: signal.signal(sig, stopped) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        with tempfile.TemporaryDirectory(prefix="dlscale-gpu-suite-") as tmp:
            run(a, rows, budget, steps, Path(tmp))
    except Stopped as stop:
        print(f"stopped by signal {stop.args[0]}: {len(rows.rows)} rows written", flush=True)
        return 128 + stop.args[0]
    finally:
        fidelity.stop_sessions()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        if cache_was is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_was
    left_for_later(rows.rows, a)
    elapsed = time.monotonic() - budget.started
    bad = [r for r in rows.rows if r["status"] == FAILED]
    print(
        f"{len(rows.rows)} rows in {elapsed:.1f} s (budget {a.budget:g} s): "
        f"{sum(r['status'] == OK for r in rows.rows)} ok, "
        f"{sum(r['status'] == SKIPPED for r in rows.rows)} skipped, {len(bad)} failed; "
        f"{a.out / ROWS_FILE}, {a.out / TABLE_FILE}",
        flush=True,
    )
    return 1 if bad else 0


def left_for_later(rows: list[dict], a) -> list[str]:
    """Print the rows the budget left for another call (skipped with a budget reason) and the
    command that runs them; returns their names."""
    later = [
        r for r in rows if r["status"] == SKIPPED and str(r.get("reason")).startswith("budget")
    ]
    if not later:
        print("left for another call: none", flush=True)
        return []
    names = [r["row"] for r in later]
    steps = ",".join(sorted({"a", *(r["step"] for r in later)}))
    print(
        f"left for another call ({len(names)}): " + "; ".join(names) + "\n  rerun: python3 "
        f"benchmarks/gpu_suite.py OUT2 --device {a.device} --steps {steps} --rows "
        f"'{','.join(names)}'" + (f" --hardware {a.hardware}" if a.hardware else ""),
        flush=True,
    )
    return names


def hardware_entry(key: str) -> dict:
    """The hardware file's entry `key` (PyYAML)."""
    import yaml

    entries = yaml.safe_load((REPO / "config" / "hardware.yaml").read_text()) or {}
    if key not in entries:
        raise SystemExit(f"--hardware {key}: no such entry; entries: {', '.join(entries)}")
    return entries[key]


def dry_run(a, steps: set, entry: dict | None) -> int:
    """The plan of a call against a hardware entry, run nowhere: each row in order with its
    estimate (recorded runs, decoder_estimate, PRIOR_S), the decoder rows' memory prediction
    against the entry's device_memory_gib, and whether it fits the budget by the same rule as
    a run (the cheapest row of each later step kept; step b's first repetition only), the rows
    that do not listed as left for another call."""
    device, plan = a.device, a.plan
    left = a.budget - SAFETY_S
    rows = []
    if "a" in steps:
        left -= PRIOR_S[device]["environment"]
        rows.append({"step": "a", "row": "environment", "estimate": PRIOR_S[device]["environment"]})
    specs = [
        {**s, "estimate": a.measured.get(s["row"])}
        for s in child_rows(device, plan, a.memory_bytes, a.recorded)
        if s["step"] in steps and wanted(a, s["row"])
    ]
    child = PRIOR_S[device]["child"] if specs else 0.0
    if "b" in steps:
        for mode in MODES:
            for model, precision, batch in plan["fidelity_cases"]:
                name = f"fidelity {model} {precision} b{batch} {mode}"
                if not wanted(a, name) or not_here(device, f"fidelity_{mode}"):
                    continue
                est = a.measured.get(name, 2 * PRIOR_S[device][f"fidelity_{mode}"])
                reserve = child + kept_for_later(device, specs, "b")
                fits = est <= left - reserve
                left -= est if fits else 0
                rows.append({"step": "b", "row": name, "estimate": est, "fits": fits})
    left -= child
    for i, spec in enumerate(specs):
        why = not_here(device, spec["kind"]) or does_not_fit(spec)
        est = row_estimate(device, spec["kind"], spec)
        kept = kept_for_later(device, specs[i + 1 :], spec["step"])
        fits = why is None and est <= left - kept
        left -= est if fits else 0
        rows.append({**spec, "estimate": est, "fits": fits, "why": why})
    print(f"dry run: device {device}, hardware {a.hardware}, budget {a.budget:g} s")
    if a.memory_bytes is not None:
        print(f"  usable device memory {a.memory_bytes / 2**30:.1f} GiB (entry less headroom)")
    for row in rows:
        sizing = row.get("sizing") or {}
        memory = ""
        if sizing.get("tried"):
            pred = sizing["tried"][-1]
            memory = (
                f"; memory predicted {pred['total_bytes'] / 2**30:.1f} GiB at batch "
                f"{pred['batch']} (state {pred['state_bytes'] / 2**30:.1f}, activations "
                f"{pred['activation_bytes'] / 2**30:.1f}, logits gradient "
                f"{pred['logits_gradient_bytes'] / 2**30:.1f})"
            )
        verdict = (
            "runs"
            if row.get("fits", True) and not row.get("why")
            else f"not run: {row['why']}"
            if row.get("why")
            else "left for another call"
        )
        estimate = f"estimated {row['estimate']:.0f} s"
        print(f"  [{row['step']}] {row['row']}: {estimate}{memory} -- {verdict}")
    later = [r["row"] for r in rows if r.get("fits") is False and not r.get("why")]
    print(f"  left for another call: {'; '.join(later) if later else 'none'}")
    print(f"  estimated total of the rows that run: {a.budget - SAFETY_S - left:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
