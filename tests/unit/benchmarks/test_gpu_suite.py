"""benchmarks/gpu_suite.py's CPU path: the suite that carries every GPU check starts,
parses and writes without a GPU, so it cannot rot between GPU runs.

One run of `gpu_suite.py --device cpu` (tiny models, fp32, eager) in a fresh process whose
imports of Snakemake and PyYAML fail (a sitecustomize on PYTHONPATH, inherited by every process
the suite starts: the launcher, the rank, the plain loop, the child of steps c-f), as on a lent
GPU machine: every row the CPU can run ran, with sane values; the GPU-only rows are skipped with
their reason; rows.jsonl and rows.md hold the same rows. A row whose code raises is written as
failed and the suite exits 1; a run stopped by its budget leaves whole rows only, the row cut at
the budget written as skipped."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SUITE = ROOT / "benchmarks" / "gpu_suite.py"
BUDGET_S = 90  # an upper bound: the CPU path takes 15-20 s on a 2-core host and stops when done


def load_suite():
    spec = importlib.util.spec_from_file_location("gpu_suite", SUITE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


suite = load_suite()  # puts benchmarks/ on sys.path: the modules beside it import
import _gpu_common as common  # noqa: E402  (the rows' format, plans, targets)
import _gpu_plan as bookkeeping  # noqa: E402  (rows on disk, budget, the child's plan)

BLOCKER = """
import importlib.abc, os, sys
BLOCKED = set(os.environ.get("DLSCALE_TEST_BLOCKED_IMPORTS", "").split(","))
class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)")
        return None
sys.meta_path.insert(0, Blocked())
"""


@pytest.fixture(scope="module")
def cpu_run_started(tmp_path_factory):
    """The CPU path's run, started once in the background: the module's in-process tests
    (mostly waiting: the budget test's hang) run beside it, and the tests of its rows wait for
    it (cpu_run). Stopped at the module's end if still running."""
    tmp = tmp_path_factory.mktemp("gpu_suite")
    blocker = tmp / "blocker"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(BLOCKER)
    out = tmp / "out"
    env = dict(
        os.environ,
        PYTHONPATH=str(blocker),
        DLSCALE_TEST_BLOCKED_IMPORTS="snakemake,yaml",
    )
    env.pop(common.BREAK_ENV, None)
    proc = subprocess.Popen(
        [sys.executable, str(SUITE), str(out), "--device", "cpu", "--budget", str(BUDGET_S)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    yield proc, out
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


@pytest.fixture(scope="module")
def cpu_run(cpu_run_started):
    """The CPU path's run, finished: (exit code, the suite's own seconds, rows from the JSON
    lines, rows.md, its output)."""
    proc, out = cpu_run_started
    output, _ = proc.communicate(timeout=BUDGET_S + 60)
    took = re.search(r"rows in ([0-9.]+) s \(budget", output)
    rows = [json.loads(line) for line in (out / common.ROWS_FILE).read_text().splitlines()]
    seconds = float(took.group(1)) if took else None
    return proc.returncode, seconds, rows, out / common.TABLE_FILE, output


def by_row(rows: list[dict]) -> dict[str, dict]:
    return {r["row"]: r for r in rows}


@pytest.mark.parametrize(
    "broken, steps, row",
    [("environment", "a", "environment"), ("mfu", "e", "MFU gpt2_tiny fp32 b4 eager")],
)
def test_a_broken_row_fails_the_run(
    cpu_run_started, tmp_path, monkeypatch, capsys, broken, steps, row
):
    """A row whose code raises: written as failed with the error, the suite exits 1 (the
    parent's row in process; a child row, in the child of steps c-f, started by the suite)."""
    monkeypatch.setenv(common.BREAK_ENV, broken)
    code = suite.main([str(tmp_path), "--device", "cpu", "--steps", steps, "--budget", "60"])
    rows = by_row([json.loads(x) for x in (tmp_path / common.ROWS_FILE).read_text().splitlines()])
    assert code == 1, capsys.readouterr().out[-2000:]
    assert rows[row]["status"] == common.FAILED
    assert "deliberate break" in rows[row]["reason"]
    assert "RuntimeError" in rows[row]["fields"]["traceback"]
    assert [r["status"] for r in rows.values()].count(common.FAILED) == 1  # the others ran


def test_the_budget_stops_the_run_with_whole_rows(cpu_run_started, tmp_path, monkeypatch):
    """A budget too small for most rows: rows whose estimate does not fit are skipped before
    they start; the child of steps c-f, stuck in its first row (a deliberate hang), is killed
    at the budget and that row written as skipped. Every line is a whole row, the run ends
    before its budget."""
    monkeypatch.setenv(common.BREAK_ENV, "hang")
    budget = 10  # the child's estimate (5 s) fits after step a (3 s to spare); hang stopped at 8 s
    started = time.monotonic()
    code = suite.main(
        [str(tmp_path), "--device", "cpu", "--steps", "a,b,c", "--budget", str(budget)]
    )
    took = time.monotonic() - started
    assert code == 0
    assert took < budget
    lines = (tmp_path / common.ROWS_FILE).read_text().splitlines()
    rows = [json.loads(x) for x in lines]  # every line parses: no half-written row
    assert len(bookkeeping.read_table(tmp_path / common.TABLE_FILE)) == len(rows)
    got = {r["row"]: (r["status"], r["reason"]) for r in rows}
    with pytest.raises(SystemExit, match="exists"):  # the rows of a run are never overwritten
        suite.main([str(tmp_path), "--device", "cpu", "--steps", "a"])
    assert (tmp_path / common.ROWS_FILE).read_text().splitlines() == lines
    assert got == {
        "environment": (common.OK, None),
        "fidelity cnn_small fp32 b8 eager": (
            common.SKIPPED,
            got["fidelity cnn_small fp32 b8 eager"][1],
        ),
        "fidelity cnn_small fp32 b8 compiled": (common.SKIPPED, common.CPU_COMPILED),
        "sync-free window cnn_small fp32 b8 eager": (
            common.SKIPPED,
            "budget: stopped at the budget in this row",
        ),
        "sync-free window cnn_small fp32 b8 compiled": (common.SKIPPED, common.CPU_COMPILED),
    }
    assert got["fidelity cnn_small fp32 b8 eager"][1].startswith("budget: estimated 16 s, ")


def marked(marker: str, running: str = "") -> list[int]:
    """The processes whose environment holds DLSCALE_TEST_MARKER=marker (and whose command
    line contains `running`)."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if f"DLSCALE_TEST_MARKER={marker}".encode() not in environ.read_bytes().split(b"\0"):
                continue
            if running.encode() in (environ.parent / "cmdline").read_bytes():
                found.append(int(environ.parent.name))
        except OSError:
            pass
    return found


def wait_for(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def test_a_signal_stops_the_suite_and_every_process_it_started(cpu_run_started, tmp_path):
    """SIGTERM (a timeout from outside, as the device tool's) while the child of steps c-f
    runs (made to hang): the suite exits 143 and no process it started is left (each side and
    the child run in a session of their own, so they would outlive it unless killed)."""
    marker = f"gpu-suite-{os.getpid()}-{time.monotonic_ns()}"
    env = dict(os.environ, DLSCALE_TEST_MARKER=marker, **{common.BREAK_ENV: "hang"})
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, str(SUITE), str(out), "--device", "cpu", "--steps", "c"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        # the child of steps c-f has started (the suite's signal handlers are in place by
        # then; before, its git calls carry the marker too)
        assert wait_for(lambda: marked(marker, "--child"), 60)
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=30)
        assert proc.returncode == 128 + signal.SIGTERM, output[-2000:]
        assert "stopped by signal 15" in output
        assert wait_for(lambda: not marked(marker), 30), marked(marker)  # a loaded machine
        assert not (out / common.ROWS_FILE).exists()  # the hung row was never half written
    finally:  # whatever failed, nothing this test started keeps running
        if proc.poll() is None:
            proc.kill()
        for pid in marked(marker):
            os.kill(pid, signal.SIGKILL)


def test_the_cuda_plan_is_accepted_by_the_production_adapter(cpu_run_started):
    """What a GPU run will ask, checked here without a GPU: every row of steps c-f names a
    registered model and a precision, mode and parallelism the production adapter accepts on
    CUDA (made, not set up: nothing touches a device); the decoder is the largest registered
    one of the plan's list; the fidelity cases are the targets'."""
    from dlscale.models import SPECS
    from dlscale.rank.rank_context import RankContext
    from dlscale.registry.frameworks import get_adapter

    from helpers.cells import rank_spec

    plan = common.PLANS["cuda"]
    assert plan["fidelity_cases"] == [("resnet50", "bf16", 256), ("resnet50", "fp32", 32)]
    expected = "llama3_1b" if "llama3_1b" in SPECS else "gpt2_124m"
    assert common.decoder(plan) == expected
    rows = bookkeeping.child_rows("cuda", plan)
    assert [r["step"] for r in rows] == ["c", "c", "c", "d", "d", "e", "e", "f"]
    assert all(common.not_here("cuda", r["kind"]) is None for r in rows)  # all run on a GPU
    ctx = RankContext(0, 1, 0, 1, 0, "n0", "127.0.0.1", 29500, "test")
    for row in rows:
        model, precision, batch = row["args"][:3]
        mode = row["args"][3] if len(row["args"]) > 3 else "eager"
        assert model in SPECS
        spec = rank_spec(
            model=model,
            per_rank_batch=batch,
            warmup_steps=1,
            steps=1,
            precision=precision,
            device="cuda",
            mode=mode,
            parallelism="fsdp" if row["kind"] == "memory" else "ddp",
        )
        get_adapter("pytorch")(spec, ctx)  # refuses what it does not run


def test_an_earlier_runs_seconds_are_the_estimates(cpu_run_started, tmp_path):
    """--estimates: a row that took longer last time than this budget allows is skipped before
    it starts, named with the measured estimate (a fidelity row per repetition)."""
    old = tmp_path / "old.jsonl"
    rows = [
        {"step": "b", "row": "fidelity cnn_small fp32 b8 eager", "status": "ok", "seconds": 900,
         "fields": {"n": 2}},
        {"step": "e", "row": "MFU gpt2_tiny fp32 b4 eager", "status": "ok", "seconds": 1000},
        {"step": "f", "row": "memory gpt2_tiny fp32 b4 fsdp world size 1", "status": "skipped",
         "seconds": None},
    ]  # fmt: skip
    old.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert bookkeeping.measured_estimates(old) == {
        "fidelity cnn_small fp32 b8 eager": 450,
        "MFU gpt2_tiny fp32 b4 eager": 1000,
    }
    # a second call's rows (e.g. the compiled rows the first skipped): both files are read,
    # and a row in the later file wins
    later = tmp_path / "later.jsonl"
    later.write_text(json.dumps({**rows[1], "seconds": 700}) + "\n"
                     + json.dumps({**rows[2], "status": "ok", "seconds": 5}) + "\n")  # fmt: skip
    assert bookkeeping.measured_estimates([old, later]) == {
        "fidelity cnn_small fp32 b8 eager": 450,
        "MFU gpt2_tiny fp32 b4 eager": 700,
        "memory gpt2_tiny fp32 b4 fsdp world size 1": 5,
    }
    out = tmp_path / "out"
    argv = [str(out), "--device", "cpu", "--steps", "b,e", "--estimates", str(old)]
    assert suite.main([*argv, "--budget", "60"]) == 0
    got = {r["row"]: r["reason"] for r in map(json.loads, (out / common.ROWS_FILE).open())}
    assert got["fidelity cnn_small fp32 b8 eager"].startswith("budget: estimated 450 s, ")
    # the child's start (3 s) and the row's measured 1000 s, against the time left
    assert got["MFU gpt2_tiny fp32 b4 eager"].startswith("budget: estimated 1003 s, ")
    assert got["MFU gpt2_tiny fp32 b4 compiled"] == common.CPU_COMPILED


def test_every_cpu_row_runs_and_the_gpu_rows_say_why_not(cpu_run):
    code, seconds, rows, _, output = cpu_run
    assert code == 0, output[-3000:]
    assert seconds is not None and seconds < BUDGET_S, output[-2000:]
    plan = common.PLANS["cpu"]
    expected = ["environment"]
    expected += [f"fidelity cnn_small fp32 b8 {mode}" for mode in common.MODES]
    expected += [s["row"] for s in bookkeeping.child_rows("cpu", plan)]
    assert [r["row"] for r in rows] == expected  # every row once, in the suite's order
    assert [r["step"] for r in rows] == sorted(r["step"] for r in rows)
    for row in rows:
        assert row["format"] == common.FORMAT and row["version"] == common.VERSION
        compiled = row["row"].endswith("compiled")
        if compiled or row["row"].startswith("energy"):  # GPU only: skipped, with the reason
            assert row["status"] == common.SKIPPED, row
            assert row["reason"] == (common.CPU_COMPILED if compiled else common.GPU_ONLY_ENERGY)
        else:
            assert row["status"] == common.OK, row
            assert row["reason"] is None and row["seconds"] >= 0 and row["result"]


def test_the_rows_hold_sane_values(cpu_run):
    from dlscale.models import get_spec
    from dlscale.models.flops import decoder_flops_per_token

    rows = by_row(cpu_run[2])
    env = rows["environment"]["fields"]
    assert env["capability_check"]["drives_cuda"] is False  # the CPU build, said so
    assert "CPU build" in env["capability_check"]["says"]
    assert env["torch"] and env["python"]

    fid = rows["fidelity cnn_small fp32 b8 eager"]["fields"]
    assert fid["n"] == 1 and len(fid["harness_samples_per_s"]) == len(fid["plain_samples_per_s"])
    assert fid["harness_median"] > 0 and fid["plain_median"] > 0
    assert fid["ratio"] == pytest.approx(fid["harness_median"] / fid["plain_median"])
    assert 0.1 < fid["ratio"] < 10  # the same work on both sides, on a shared 2-core host

    sync = rows["sync-free window cnn_small fp32 b8 eager"]
    audit = sync["fields"]["sync_audit"]
    assert sync["fields"]["host_syncs_in_window"] == 0 and audit["inside_window"] == {}
    # the audit's hooks were in place: the synchronisations around the window were counted
    assert audit["outside_window"]["adapter.sync"] >= plan_window()[0] + 1
    assert sync["target_met"] is True

    tele = rows["telemetry cnn_small fp32 b8"]["fields"]
    assert tele["empty"] == []
    for quantity in ("cpu_util_pct", "rss_mb"):
        assert tele["telemetry"]["quantities"][quantity]["n"] >= 1
    assert tele["telemetry"]["quantities"]["rss_mb"]["mean"] > 10

    mfu = rows["MFU gpt2_tiny fp32 b4 eager"]["fields"]
    spec = get_spec("gpt2_tiny")
    assert mfu["seq_len"] == spec.input_shape[0]
    # the rank's FLOP count, made where PyYAML cannot be imported, equals the formula's
    assert mfu["flops_per_token"] == decoder_flops_per_token(spec)["counted"]
    assert mfu["formula_counted_per_token"] == mfu["flops_per_token"]
    assert mfu["tokens_per_s"] == pytest.approx(mfu["throughput_samples_per_s"] * mfu["seq_len"])
    assert mfu["tokens_per_s"] > 0
    per_sample = mfu["flops_per_sample"]
    assert mfu["achieved_tflops"] == pytest.approx(
        per_sample * mfu["throughput_samples_per_s"] / 1e12
    )
    # no peak without the hardware file (PyYAML blocked, as on a bare GPU machine): no MFU
    assert mfu["mfu"] is None and mfu["peak_from"].startswith("unknown peak (PyYAML")

    mem = rows["memory gpt2_tiny fp32 b4 fsdp world size 1"]["fields"]
    n = spec.param_count
    assert mem["param_count"] == n
    # AdamW (the decoder rows train as torchtitan does): 4 + 4 + 8 bytes per parameter, under
    # FSDP2 at degree 1 (single_device fully_shard), the prediction the row was sized by beside
    assert mem["predicted_bytes"] == {
        "param_bytes": 4 * n,
        "grad_bytes": 4 * n,
        "optimizer_state_bytes": 8 * n,
    }
    assert mem["measured_bytes"] == mem["predicted_bytes"]
    assert mem["predicted_total"]["state_bytes"] == 16 * n
    assert mem["wrapper"].startswith("torch.distributed.fsdp.fully_shard (FSDP2) at degree 1")
    assert mfu["attention_kernel"]["kernel"] == "flash"  # auto's first on a CPU
    assert mfu["settings"]["optimizer"] == "adamw" and mfu["settings"]["attention"] == "auto"
    assert mem["peak_allocated_mb_window"] is None and mem["peak_rss_mb"] > 0


def plan_window() -> tuple[int, int]:
    return common.PLANS["cpu"]["window"]


def test_the_table_and_the_json_lines_agree(cpu_run):
    rows, table = cpu_run[2], bookkeeping.read_table(cpu_run[3])
    assert len(table) == len(rows)
    for line, row in zip(table, rows):
        assert line == {c: bookkeeping.table_cell(row, c) for c in bookkeeping.Rows.COLUMNS}
    assert "sync-free window" in cpu_run[3].read_text()
