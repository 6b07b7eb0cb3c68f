"""Measurement fidelity: the project's cell (dlscale.run.launch, one rank) against a plain training
loop written here, side by side, on a GPU where there is one and on the CPU otherwise.

    python benchmarks/gpu_fidelity.py [--device cuda|cpu] [--repeats N]
        [--cases resnet50:bf16:256,resnet50:fp32:32] [--modes eager,compiled]
        [--warmup 10] [--steps 50] [--wheels DIR]

One call on a bare GPU machine: it needs this checkout and a CUDA PyTorch with numpy, nothing
else (no Snakemake, no project environment). The harness side's launcher validates the cell's
metrics file with jsonschema (where fastjsonschema is absent): where it is missing, bring its
wheels (0.6 MiB with attrs, referencing, rpds-py, jsonschema-specifications and
typing-extensions; on a connected machine: `pip download jsonschema -d wheels
--only-binary=:all: --python-version 3.12 --platform manylinux_2_17_x86_64`) and pass
`--wheels wheels`: they are installed into a temporary folder for this run only. A CPU check of
the script itself: `--device cpu --steps 3` (a tiny model, eager, two repetitions). Every GPU
check in one budgeted call, this one's sides included: benchmarks/gpu_suite.py.

For every case (model:precision:per-rank batch) and mode, the two sides alternate (the harness
first in odd repetitions, the plain loop first in even ones), `--repeats` times each:
  - harness: a one-rank cell through `python -m dlscale.run.launch` (a fresh process, as in a
    study), its throughput as the metrics file reports it (samples over the timed window);
  - plain: a fresh process running the loop below: the same model builder
    (dlscale.models.torch.build), the same synthetic batch, SGD with the config's defaults,
    autocast for bf16/fp16, channels_last for vision models on CUDA, torch.compile in mode
    compiled, cudnn.benchmark on CUDA, the same warm-up, then wall clock between two device
    synchronisations around the timed steps. No DDP (one rank), no per-step host sync.
Both sides: the same model construction, warm-up and timed window. Prints per case and mode
the medians, min-max ranges and the harness/plain ratio of medians (with the ratio range from
the min and max of the two sides), n each. Targets (one H100): ratio >= 0.99
for ResNet-50 bf16 b256 and >= 0.97 for fp32 b32, eager and compiled; ResNet-50 bf16 b256
compiled >= 5,600 img/s. The plain loop uses the optimizer the harness uses (fused SGD for fp16
on CUDA, so GradScaler reads nothing on the host; foreach otherwise).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _gpu_common import (  # noqa: E402
    BREAK_ENV,
    MODES,
    OK,
    PRIOR_S,
    SKIPPED,
    TARGETS,
    Stopped,
    failed,
    not_here,
    wanted,
)
from _gpu_plan import Budget, Rows  # noqa: E402

PLAIN = r"""
import json, sys, time, torch
from dlscale.models import get_spec
from dlscale.models.torch import build, example_batch
model_name, precision, batch, device, mode, warmup, steps, lr, momentum = sys.argv[1:10]
batch, warmup, steps = int(batch), int(warmup), int(steps)
torch.manual_seed(0)
dev = torch.device(device)
spec = get_spec(model_name)
vision = spec.family == "vision"
fmt = torch.channels_last if vision and dev.type == "cuda" else torch.contiguous_format
if dev.type == "cuda":
    torch.backends.cudnn.benchmark = True
model = build(model_name).to(dev).to(memory_format=fmt)
x, y = example_batch(spec, batch, device=dev)
if vision:
    x = x.contiguous(memory_format=fmt)
fused = True if precision == "fp16" and dev.type == "cuda" else None  # as the harness
opt = torch.optim.SGD(model.parameters(), lr=float(lr), momentum=float(momentum), fused=fused)
loss_fn = torch.nn.CrossEntropyLoss()
dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
scaler = torch.amp.GradScaler("cuda") if precision == "fp16" else None
forward = torch.compile(model) if mode == "compiled" else model
def sync():
    if dev.type == "cuda":
        torch.cuda.synchronize()
def step():
    with torch.autocast(dev.type, dtype=dtype, enabled=dtype is not None):
        loss = loss_fn(forward(x), y)
    opt.zero_grad(set_to_none=True)
    if scaler is not None:
        scaler.scale(loss).backward(); scaler.step(opt); scaler.update()
    else:
        loss.backward(); opt.step()
for _ in range(warmup):
    step()
sync()
t0 = time.perf_counter()
for _ in range(steps):
    step()
sync()
print(json.dumps({"throughput": batch * steps / (time.perf_counter() - t0)}))
"""


class SideTimeout(RuntimeError):
    """A side did not finish within its timeout (its process group was killed)."""


def run_side(argv: list[str], env: dict, timeout: float | None) -> subprocess.CompletedProcess:
    """Run one side in a session of its own; past `timeout` seconds the whole session (the
    launcher and its rank) is killed and SideTimeout raised."""
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    SESSIONS.add(proc.pid)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise SideTimeout(f"stopped after {timeout:.0f} s: {' '.join(argv[:4])} ...") from None
    finally:
        SESSIONS.discard(proc.pid)
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


# The sessions of the sides now running (their leaders' pids): a caller stopped by a signal
# kills them (stop_sessions), so no launcher or rank outlives it on the device.
SESSIONS: set[int] = set()


def stop_sessions() -> None:
    for pid in list(SESSIONS):
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        SESSIONS.discard(pid)


def harness(
    case: tuple, device: str, mode: str, a, python: str, work: Path, timeout: float | None = None
) -> float:
    """One one-rank cell through the launcher, as a study runs it; its reported throughput."""
    if str(REPO / "tests") not in sys.path:
        sys.path.insert(0, str(REPO / "tests"))  # the helpers the tests share
    from helpers.cells import small_cell

    model, precision, batch = case
    cell = small_cell(
        hardware="bench",
        model=model,
        precision=precision,
        mode=mode,
        nodes=1,
        device=device,
        per_rank_batch=batch,
        global_batch=batch,
        cpus_per_rank=a.threads,
        warmup_steps=a.warmup,
        steps=a.steps,
        hardware_hash="bench",
        environment="bench",
        study="fidelity",
    )
    out = work / f"{model}-{precision}-{batch}-{mode}" / "metrics.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    for old in out.parent.glob("measurements/*/metrics.jsonl"):
        old.unlink()  # a benchmark keeps nothing
    proc = run_side(
        [
            python,
            "-m",
            "dlscale.run.launch",
            "--cell-json",
            cell.to_json(),
            "--output",
            str(out),
            "--git-commit",
            "",
        ],
        child_env(),
        timeout,
    )
    if proc.returncode:
        raise SystemExit(f"harness {case} {mode} failed:\n{proc.stderr[-3000:]}")
    summary = json.loads(out.read_text().splitlines()[-1])["value"]
    out.unlink()
    return summary["throughput_samples_per_s"]


def plain(
    case: tuple, device: str, mode: str, a, python: str, timeout: float | None = None
) -> float:
    model, precision, batch = case
    proc = run_side(
        [
            python,
            "-c",
            PLAIN,
            model,
            precision,
            str(batch),
            device,
            mode,
            str(a.warmup),
            str(a.steps),
            "0.01",
            "0.9",
        ],
        child_env(a.threads),
        timeout,
    )
    if proc.returncode:
        raise SystemExit(f"plain {case} {mode} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["throughput"]


# What the harness side imports besides torch (the PyTorch adapter: numpy; the launcher's
# validation of the cell's metrics file: jsonschema, where fastjsonschema is absent), module ->
# distribution, and the extra folder they were installed to from --wheels (None: already
# importable). benchmarks/gpu_suite.py asks for more through the same function.
HARNESS_NEEDS = {"numpy": "numpy", "jsonschema": "jsonschema"}
EXTRA_SITE: list[str] = []


def importable(module: str) -> bool:
    """Whether `module` can be imported here (a finder that refuses it counts as missing)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def provide_harness_packages(
    python: str,
    wheels: str | None,
    work: Path,
    needs: dict[str, str] = HARNESS_NEEDS,
    optional: dict[str, str] | None = None,
) -> list[str]:
    """Make `needs` (module -> distribution) importable for the children: as they are, or
    installed from the wheels in `wheels` into a folder of this run (pip --no-index: nothing
    is downloaded; the folder also goes on this process's sys.path). `optional` ones are
    installed where `wheels` is given and left out otherwise. Returns the distributions
    installed."""
    missing = [dist for module, dist in needs.items() if not importable(module)]
    if missing and not wheels:
        raise SystemExit(
            f"this run needs {', '.join(missing)} (not installed here): bring their wheels "
            f"(pip download {' '.join(missing)} -d wheels --only-binary=:all: "
            "--python-version 3.12, on a connected machine of this platform) and pass "
            "--wheels wheels"
        )
    if wheels:
        missing += [d for m, d in (optional or {}).items() if not importable(m)]
    if not missing:
        return []
    site = work / "site"
    pip = subprocess.run(
        [
            python,
            "-m",
            "pip",
            "install",
            "--no-index",
            "--find-links",
            wheels,
            "--target",
            str(site),
            *missing,
        ],
    )
    if pip.returncode:
        # no pip in this Python (or it failed): a wheel of these packages is a zip of the
        # files that go into site-packages, so every wheel in the folder is unpacked there
        import zipfile

        print(f"pip exited {pip.returncode}: unpacking the wheels of {wheels} instead", flush=True)
        for wheel in sorted(Path(wheels).glob("*.whl")):
            with zipfile.ZipFile(wheel) as zf:
                zf.extractall(site)
    if str(site) not in EXTRA_SITE:
        EXTRA_SITE.append(str(site))
        sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    return missing


def child_env(threads: int | None = None) -> dict:
    # the caller's PYTHONPATH stays after the checkout's and the wheels' folders
    kept = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "scripts"), *EXTRA_SITE, *kept]))
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    p.add_argument("--cases", default=None, help="model:precision:batch,...")
    p.add_argument("--modes", default=None, help="default: eager,compiled (cuda), eager (cpu)")
    p.add_argument("--repeats", type=int, default=None, help="default: 5 (cuda), 2 (cpu)")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--threads", type=int, default=1, help="CPU threads per side (CPU runs)")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--wheels", default=None, help="wheels of missing packages (bare GPU)")
    a = p.parse_args()
    import torch

    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device == "cuda"
    default_cases = "resnet50:bf16:256,resnet50:fp32:32" if cuda else "cnn_small:fp32:8"
    a.modes = a.modes or ("eager,compiled" if cuda else "eager")
    a.repeats = a.repeats or (5 if cuda else 2)
    cases = [
        (m, pr, int(b))
        for m, pr, b in (c.split(":") for c in (a.cases or default_cases).split(","))
    ]
    name = torch.cuda.get_device_name() if device == "cuda" else f"CPU, {a.threads} thread(s)"
    print(
        f"device: {name}; torch {torch.__version__}; warmup {a.warmup}, steps {a.steps}, "
        f"repeats {a.repeats}; sides alternate"
    )
    print(
        f"{'case':<28} {'mode':<9} {'harness median (range)':>28} "
        f"{'plain median (range)':>28} {'harness/plain':>22}"
    )
    with tempfile.TemporaryDirectory(prefix="dlscale-fidelity-") as tmp:
        provide_harness_packages(a.python, a.wheels, Path(tmp))
        for case in cases:
            for mode in a.modes.split(","):
                h, q = [], []
                for r in range(a.repeats):
                    sides = [("h", harness), ("p", plain)]
                    for tag, fn in sides if r % 2 == 0 else sides[::-1]:
                        if tag == "h":
                            h.append(fn(case, device, mode, a, a.python, Path(tmp)))
                        else:
                            q.append(fn(case, device, mode, a, a.python))
                hm, qm = statistics.median(h), statistics.median(q)
                label = ":".join(map(str, case))
                print(
                    f"{label:<28} {mode:<9} {hm:>12,.1f} ({min(h):,.1f}-{max(h):,.1f}) "
                    f"{qm:>12,.1f} ({min(q):,.1f}-{max(q):,.1f}) "
                    f"{hm / qm:>8.3f} ({min(h) / max(q):.2f}-{max(h) / min(q):.2f}) "
                    f"n={len(h)}/{len(q)}",
                    flush=True,
                )


# ---------------------------------------------------------------------------- b: fidelity
def fidelity_rows(
    a, budget: Budget, rows: Rows, python: str, work: Path, first_reserve: float, reserve_after
) -> None:
    """Step b: per case, eager rows then compiled rows; in a row, the harness and the plain
    loop alternate (the harness first in odd repetitions), up to the plan's repetitions. The
    first repetition of a row runs if it fits the budget less `first_reserve` (the cheapest
    row of each later step); each further one only if it also leaves the estimates of every
    later row (`reserve_after(row index)`)."""
    device, plan = a.device, a.plan
    side = SimpleNamespace(
        threads=plan["threads"], warmup=plan["fidelity_warmup"], steps=plan["fidelity_steps"]
    )
    cases = plan["fidelity_cases"]
    specs = [(case, mode) for mode in MODES for case in cases]
    for index, (case, mode) in enumerate(specs):
        model, precision, batch = case
        name = f"fidelity {model} {precision} b{batch} {mode}"
        if not wanted(a, name):
            continue
        target = TARGETS.get(case)
        base = {
            "step": "b",
            "row": name,
            "target": f"harness/plain >= {target}" if target else None,
        }
        why = not_here(device, f"fidelity_{mode}")
        if why:
            rows.write({**base, "status": SKIPPED, "reason": why})
            continue
        started = time.monotonic()
        estimate = a.measured.get(name, 2 * PRIOR_S[device][f"fidelity_{mode}"])
        h, q, reps, stop = [], [], [], None
        try:
            if BREAK_ENV in os.environ and os.environ[BREAK_ENV] == "fidelity":
                raise RuntimeError(f"{BREAK_ENV}=fidelity: a deliberate break (tests)")
            for r in range(plan["fidelity_repeats"]):
                reserve = first_reserve if r == 0 else reserve_after(index)
                if not budget.fits(estimate, reserve):
                    stop = budget.why_not(estimate, reserve)
                    break
                rep_started = time.monotonic()
                order = ("harness", "plain") if r % 2 == 0 else ("plain", "harness")
                for which in order:
                    timeout = max(budget.left(), 1.0)
                    if which == "harness":
                        h.append(harness(case, device, mode, side, python, work, timeout))
                    else:
                        q.append(plain(case, device, mode, side, python, timeout))
                reps.append(time.monotonic() - rep_started)
                estimate = reps[-1]  # a repetition costs what the last one did
        except SideTimeout as exc:
            stop = f"budget: stopped at the budget in repetition {len(reps) + 1} ({exc})"
        except BaseException as exc:  # noqa: BLE001 (SystemExit from a side: its stderr)
            if isinstance(exc, (KeyboardInterrupt, Stopped)):
                raise
            rows.write(failed(base, exc, time.monotonic() - started))
            continue
        n = min(len(h), len(q))
        h, q = h[:n], q[:n]
        if not n:
            rows.write(
                {
                    **base,
                    "status": SKIPPED,
                    "reason": stop,
                    "seconds": time.monotonic() - started,
                }
            )
            continue
        hm, qm = statistics.median(h), statistics.median(q)
        ratio = hm / qm
        fields = {
            "model": model,
            "precision": precision,
            "per_rank_batch": batch,
            "mode": mode,
            "warmup_steps": side.warmup,
            "steps": side.steps,
            "harness_samples_per_s": h,
            "plain_samples_per_s": q,
            "harness_median": hm,
            "plain_median": qm,
            "ratio": ratio,
            "ratio_range": [min(h) / max(q), max(h) / min(q)],
            "n": n,
            "repetition_seconds": reps,
            "compile_cache": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
            "stopped": stop,
        }
        rows.write(
            {
                **base,
                "status": OK,
                "reason": None,
                "seconds": time.monotonic() - started,
                "fields": fields,
                "target_met": None if target is None else ratio >= target,
                "result": f"harness {hm:,.1f} ({min(h):,.1f}-{max(h):,.1f}), plain {qm:,.1f} "
                f"({min(q):,.1f}-{max(q):,.1f}) samples/s; harness/plain {ratio:.3f} "
                f"({fields['ratio_range'][0]:.2f}-{fields['ratio_range'][1]:.2f}), n={n}",
            }
        )


if __name__ == "__main__":
    main()
