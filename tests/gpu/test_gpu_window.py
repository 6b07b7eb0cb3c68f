"""On a CUDA GPU: the PyTorch timed window holds no host synchronisation.

Skipped where torch.cuda.is_available() is false (the CPU variant, counting synchronisations
through the adapter's hooks, is tests/unit/rank/test_timing.py). One rank runs in this
process with torch.cuda.set_sync_debug_mode("error") over exactly the timed window: any
synchronising CUDA call a step makes (.item(), a host copy, GradScaler's inf check with a
non-fused optimizer, ...) raises. Two ranks (DDP over NCCL, two GPUs) run through the launcher
with the sync audit (DLSCALE_SYNC_AUDIT=1)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from dlscale.frameworks.base import RankContext
from dlscale.frameworks.pytorch import Adapter as TorchAdapter
from dlscale.rank.timing import SYNC_AUDIT_ENV, run_timed
from dlscale.run import launch
from dlscale.store.metrics import read_metrics

from helpers.cells import rank_spec, small_cell

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

WARMUP, STEPS = 3, 5


def one_rank(precision: str, mode: str, model: str = "cnn_small") -> TorchAdapter:
    ctx = RankContext(0, 1, 0, 1, 0, "n0", "127.0.0.1", 29500, "test")
    spec = rank_spec(
        model=model,
        per_rank_batch=32,
        warmup_steps=WARMUP,
        steps=STEPS,
        precision=precision,
        device="cuda",
        mode=mode,
    )
    adapter = TorchAdapter(spec, ctx)
    adapter.setup()
    return adapter


@pytest.mark.parametrize("mode", ["eager", "compiled"])
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_one_rank_window_makes_no_synchronising_cuda_call(precision, mode):
    adapter = one_rank(precision, mode)
    sync = adapter.sync
    modes = []

    def before_step(i: int) -> None:
        if i == WARMUP:  # the first timed step: the window has just opened
            torch.cuda.set_sync_debug_mode("error")
            modes.append(torch.cuda.get_sync_debug_mode())

    def closing_sync() -> None:
        torch.cuda.set_sync_debug_mode("default")  # the window's own closing sync
        sync()

    adapter.sync = closing_sync
    try:
        run = run_timed(adapter, before_step=before_step)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert modes == [2]  # "error" was in force over the timed steps
    assert len(run["step_seconds"]) == STEPS and all(t > 0 for t in run["step_seconds"])
    assert "CUDA events" in run["timer"]
    if precision == "fp16":
        assert adapter.fused_optimizer and "fused" in adapter.fast_paths()["optimizer"]


def test_the_ddp_window_makes_no_host_sync(tmp_path, monkeypatch):
    if torch.cuda.device_count() < 2:
        pytest.skip("DDP over NCCL needs two GPUs")
    monkeypatch.setenv(SYNC_AUDIT_ENV, "1")
    cell = small_cell(
        hardware="gpu",
        precision="fp16",
        nodes=1,
        device="cuda",
        ranks_per_node=2,
        per_rank_batch=32,
        global_batch=64,
        warmup_steps=WARMUP,
        steps=STEPS,
    )
    out = tmp_path / "cell" / "metrics.jsonl"
    argv = ["--cell-json", json.dumps(cell.as_dict()), "--output", str(out), "--git-commit", ""]
    assert launch.main([*argv, "--python", sys.executable]) == 0
    ends = [r["value"] for r in read_metrics(Path(out)) if r["event"] == "rank_end"]
    assert len(ends) == 2
    for end in ends:
        audit = end["sync_audit"]
        assert audit["inside_window"] == {}
        opened, closed = audit["window_facts"]["open"], audit["window_facts"]["close"]
        assert closed["ddp_last_sampled_iteration"] == opened["ddp_last_sampled_iteration"]
