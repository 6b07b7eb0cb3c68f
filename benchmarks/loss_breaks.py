"""Which loss checks see a broken gradient reduction: the equivalence tests on real ranks
(tests/helpers/parallel_ranks.py: each rank its own process running the production PyTorch
adapter over gloo) run with a break injected into every rank process, and each loss check's
difference from the single-process program is tabulated against its tolerance.

    PYTHONPATH=scripts .venv/bin/python benchmarks/loss_breaks.py \
        [--breaks no_average,double_average,skip_microbatch_scale,no_sync] [--select TEXT] \
        [--no-baseline] [--collect]

The breaks (helpers.parallel_ranks.FAULTS, injected by DLSCALE_TEST_BREAK: the helper
monkeypatches the production functions in each rank process before it trains; production
code never reads the variable):

  (a) no_average             the data-parallel gradients summed, not averaged
  (b) double_average         the data-parallel gradients averaged twice
  (c) skip_microbatch_scale  a pipeline's first micro-batch of each step left unscaled
  (d) no_sync                no gradient sync under bf16 fully_shard (each shard's rows from
                             its own rank's batch)

The tests run once without a break (the baseline: every check passes), then each break's
tests (TESTS) in one fresh pytest process (`-n 0 -s`, its own temporary folder); each test
prints one LOSS_CHECK line per loss check before any of its asserts, so a failing test still
reports all of its checks. A check is "old" (the AdamW and momentum-SGD checks as they were
before the plain-SGD ones, the bf16 one with its former tolerance of 2e-2 on the loss in bf16)
or "sighted" (plain SGD, and bf16 read in float32, each tolerance at most 1/10 of the loss
difference the break causes in the single-process program). Prints one row per check: the
break, the test, the check, its kind and optimizer, the relative loss difference from the
single-process program with the break and without it, the tolerance, and its verdict: CAUGHT
(the difference exceeds the tolerance: its assert fails), missed (the break moved the loss,
within the tolerance) or unaffected (the loss as without the break: nothing for it to act on,
e.g. no data parallel), with the test's outcome; then per break how many checks of each kind
caught it. Exits 1 where a break was caught by no check, a test failed without a break, or a
test could not run.

--select TEXT keeps the tests whose id contains TEXT (the test command runs the smallest case:
one break, one test); --collect only collects the tests each break runs (exits 1 where one no
longer exists). A full run takes several minutes on a 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from helpers.parallel_ranks import BREAK_VARIABLE, FAULTS  # noqa: E402

PARALLEL = "tests/unit/frameworks/test_torch_parallel_ranks.py"
PIPELINE = "tests/unit/frameworks/test_torch_pipeline.py"
EVERY = f"{PARALLEL}::test_every_strategy_trains_to_the_single_process_loss"
LLAMA = f"{PARALLEL}::test_llama_trains_to_the_single_process_loss_under_each_strategy"
BF16 = f"{PARALLEL}::test_a_bf16_fsdp_cell_takes_its_precision_from_fsdps_policy"
SCHEDULES = f"{PIPELINE}::test_llama_pipelines_train_to_the_single_process_loss_under_each_schedule"
COMBINED = f"{PIPELINE}::test_llama_pipelines_combine_with_fsdp_and_tp_on_four_ranks"
# the data-parallel cases: ddp, fsdp, hsdp, fsdp+tp and the replicas of tp and of a pipeline,
# each with its AdamW (or momentum-SGD) check and its plain-SGD one in the same processes
DATA_PARALLEL = [
    f"{EVERY}[gpt2_tiny-ddp-2-1-1-adamw-True]",
    f"{EVERY}[gpt2_tiny-fsdp-2-1-1-adamw-True]",
    f"{EVERY}[gpt2_tiny-hsdp-2-2-1-adamw-True]",
    f"{EVERY}[gpt2_tiny-fsdp+tp-2-2-2-adamw-True]",
    f"{EVERY}[transformer_small-tp-2-2-2-sgd-True]",
    f"{EVERY}[transformer_small-pp-2-2-2-sgd-True]",
    LLAMA,
    COMBINED,
]
# break -> the tests that must see it
TESTS = {
    "no_average": DATA_PARALLEL,
    "double_average": DATA_PARALLEL,
    "skip_microbatch_scale": [SCHEDULES, COMBINED, f"{EVERY}[transformer_small-pp-2-2-2-sgd-True]"],
    "no_sync": [BF16],
}
LABELS = dict(zip(TESTS, "abcd"))
# a check's verdict under a break: its assert fails; it passes though the break moved its loss;
# the break left its loss as it is without the break (nothing to act on: no data parallel, no
# pipeline)
VERDICTS = ("CAUGHT", "missed", "unaffected")


def pytest_command(tests: list[str], basetemp: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pytest",
        "-n",
        "0",
        "-p",
        "no:cacheprovider",
        f"--basetemp={basetemp}",
        *extra,
        *tests,
    ]


def collect(breaks: list[str]) -> int:
    """Collect (not run) every test the breaks run; 1 where one is missing."""
    tests = sorted({t for b in breaks for t in TESTS[b]})
    with tempfile.TemporaryDirectory(prefix="loss-breaks-") as tmp:
        proc = subprocess.run(
            pytest_command(tests, Path(tmp) / "pytest", "--collect-only", "-q"),
            cwd=REPO,
            capture_output=True,
            text=True,
        )
    found = {line.strip() for line in proc.stdout.splitlines()}
    missing = [t for t in tests if t not in found]
    for test in tests:
        print(f"{'ok     ' if test not in missing else 'MISSING'} {test}")
    if proc.returncode or missing:
        print(proc.stdout[-2000:] + proc.stderr[-2000:])
        return 1
    print(f"{len(tests)} tests collected for {len(breaks)} breaks")
    return 0


def run_break(name: str | None, tests: list[str]) -> tuple[list[dict], dict, float]:
    """Run `tests` with break `name` injected (None: none): their LOSS_CHECK records, each
    test's outcome (read_outcomes), the wall seconds."""
    env = {k: v for k, v in os.environ.items() if k != BREAK_VARIABLE}
    if name is not None:
        env[BREAK_VARIABLE] = name
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO / "scripts"), env.get("PYTHONPATH")) if p
    )
    with tempfile.TemporaryDirectory(prefix="loss-breaks-") as tmp:
        junit = Path(tmp) / "junit.xml"
        start = time.perf_counter()
        proc = subprocess.run(
            pytest_command(tests, Path(tmp) / "pytest", "-s", "-q", f"--junitxml={junit}"),
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - start
        outcomes = read_outcomes(junit) if junit.exists() else {}
    records = [
        json.loads(line.partition("LOSS_CHECK ")[2])
        for line in proc.stdout.splitlines()
        if line.startswith("LOSS_CHECK ")
    ]
    if not outcomes:
        print(proc.stdout[-3000:] + proc.stderr[-3000:])
    return records, outcomes, wall


def read_outcomes(junit: Path) -> dict[str, tuple[str, str]]:
    """Each test's outcome from pytest's JUnit XML, by its node id: (passed, failed, error or
    skipped; the first line of its failure's message)."""
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        path = case.get("classname", "").replace(".", "/")
        nodeid = f"{path}.py::{case.get('name')}"
        outcome, message = "passed", ""
        for child, word in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
            found = case.find(child)
            if found is not None:
                outcome, message = word, (found.get("message") or "").splitlines()[:1]
                message = message[0] if message else ""
        out[nodeid] = (outcome, message)
    return out


def short(test: str) -> str:
    """A test id without its folder and the common prefixes."""
    module, _, name = test.rpartition("/")[2].partition("::")
    name = name.replace("test_every_strategy_trains_to_the_single_process_loss", "every")
    name = name.replace("test_llama_pipelines_", "pipelines_").replace("test_", "")
    return f"{module.removeprefix('test_').removesuffix('.py')}::{name}"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--breaks",
        default=",".join(TESTS),
        help=f"comma-separated breaks to inject (default: all of {', '.join(TESTS)})",
    )
    parser.add_argument("--select", default="", help="only the tests whose id contains TEXT")
    parser.add_argument(
        "--collect", action="store_true", help="only collect the tests each break runs"
    )
    parser.add_argument(
        "--no-baseline",
        action="store_true",
        help="skip the run without a break (then no check is called unaffected)",
    )
    args = parser.parse_args()
    breaks = args.breaks.split(",")
    unknown = [b for b in breaks if b not in TESTS]
    if unknown:
        parser.error(f"--breaks: {', '.join(unknown)}; allowed values: {', '.join(TESTS)}")
    if args.collect:
        return collect(breaks)

    selected = {name: [t for t in TESTS[name] if args.select in t] for name in breaks}
    selected = {name: tests for name, tests in selected.items() if tests}
    failed = False
    baseline = {}  # (test, check) -> the difference without a break
    if not args.no_baseline:
        tests = sorted({t for tests in selected.values() for t in tests})
        print(f"without a break: {len(tests)} tests ...", flush=True)
        records, outcomes, wall = run_break(None, tests)
        for test, (outcome, message) in outcomes.items():
            if outcome != "passed":
                print(f"  {short(test)}: {outcome} without a break: {message[:300]}")
                failed = True
        baseline = {(r["test"], r["check"]): r["rel"] for r in records}
        print(f"  {len(records)} checks in {wall:.0f} s")
    rows, summary = [], []
    for name, tests in selected.items():
        print(f"({LABELS[name]}) {name}: {FAULTS[name]}; {len(tests)} tests ...", flush=True)
        records, outcomes, wall = run_break(name, tests)
        missing = [t for t in tests if t not in outcomes]
        if missing:
            print(f"  could not run: {', '.join(missing)}")
            failed = True
        for test, (outcome, message) in outcomes.items():
            if not any(r["test"] == test for r in records):  # failed before its loss checks
                print(f"  {short(test)}: {outcome} before any loss check: {message[:300]}")
                failed = True
        for r in records:
            r["break"], r["outcome"] = name, outcomes.get(r["test"], ("?", ""))[0]
            r["base"] = baseline.get((r["test"], r["check"]))
            if r["rel"] > r["tol"]:
                r["verdict"] = "CAUGHT"
            elif r["base"] is not None and abs(r["rel"] - r["base"]) <= 1e-9:
                r["verdict"] = "unaffected"  # nothing for the break to act on
            else:
                r["verdict"] = "missed"
        rows += records
        counts = {}
        for kind, of_kind in (
            ("old", [r for r in records if r["kind"] == "old"]),
            ("old adamw", [r for r in records if r["kind"] == "old" and r["optimizer"] == "adamw"]),
            ("sighted", [r for r in records if r["kind"] == "sighted"]),
        ):
            counts[kind] = {v: sum(r["verdict"] == v for r in of_kind) for v in VERDICTS}
        failing = sum(o in ("failed", "error") for o, _ in outcomes.values())
        summary.append((name, counts, failing, len(outcomes), wall))
        if not any(r["verdict"] == "CAUGHT" for r in records):
            failed = True
    header = (
        "break",
        "test",
        "check",
        "kind",
        "optimizer",
        "loss diff",
        "without break",
        "tolerance",
        "verdict",
    )
    table = [
        (
            f"({LABELS[r['break']]}) {r['break']}",
            short(r["test"]),
            r["check"],
            r["kind"],
            r["optimizer"],
            f"{r['rel']:.2e}",
            "-" if r["base"] is None else f"{r['base']:.2e}",
            f"{r['tol']:.0e}",
            f"{r['verdict']} (test {r['outcome']})",
        )
        for r in rows
    ]
    widths = [max(len(str(c)) for c in column) for column in zip(header, *table)]
    print()
    for line in [header, tuple("-" * w for w in widths), *table]:
        print("  ".join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip())
    print()
    for name, counts, failing, ran, wall in summary:
        parts = [
            f"{kind} checks caught {n['CAUGHT']}, missed {n['missed']}"
            + (f", unaffected {n['unaffected']}" if n["unaffected"] else "")
            for kind, n in counts.items()
        ]
        print(
            f"({LABELS[name]}) {name}: " + "; ".join(parts) + f"; tests failed {failing}/{ran}"
            f"; {wall:.0f} s"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
