"""The PyTorch timed window holds no host synchronisation, through real launches on
the CPU: every rank counts its synchronisations through the adapter's own hooks and PyTorch's
host reads (dlscale.rank.timing.SyncAudit, DLSCALE_SYNC_AUDIT=1); DDP's sampled
runtime-stats iterations all precede the window; the fp16 path's fused SGD keeps GradScaler off
the host; the breakdown's compute-only steps use the timed steps' clock; the first warm-up step
has its own deadline, in no cell's identity. The GPU variant (torch.cuda.set_sync_debug_mode) is
in tests/gpu/."""

from __future__ import annotations

import pytest
import torch

from dlscale.frameworks.base import RankContext
from dlscale.frameworks.pytorch import DDP_ALWAYS_SAMPLED
from dlscale.frameworks.pytorch import Adapter as TorchAdapter
from dlscale.frameworks.train_spec import TrainSpec
from dlscale.rank.timing import SYNC_AUDIT_ENV, SyncAudit, run_timed
from dlscale.store.metrics import read_metrics
from dlscale.study.cell import Cell
from dlscale.study.protocol import FIRST_STEP_TIMEOUT_S, REWARM_STEPS

from helpers.cells import cell_dict, launch_cell, rank_spec

WARMUP, STEPS = 2, 3


def rank_records(out, event: str) -> list[dict]:
    return [r["value"] for r in read_metrics(out) if r["event"] == event]


@pytest.mark.parametrize("nodes", [1, 2])
def test_the_pytorch_window_holds_no_host_sync(tmp_path, monkeypatch, nodes):
    monkeypatch.setenv(SYNC_AUDIT_ENV, "1")
    cell = cell_dict(nodes=nodes, warmup_steps=WARMUP, steps=STEPS)
    cell["global_batch"] = cell["per_rank_batch"] * nodes
    code, out = launch_cell(tmp_path, cell)
    assert code == 0
    starts, ends = rank_records(out, "rank_start"), rank_records(out, "rank_end")
    assert len(ends) == nodes
    for start, end in zip(starts, ends):
        audit = end["sync_audit"]
        assert audit["inside_window"] == {}
        # the hooks were in place: the synchronisations around the window were counted
        assert audit["outside_window"]["adapter.sync"] >= WARMUP + 1
        # one clock: the breakdown's compute-only steps are timed like the timed steps
        assert end["breakdown"]["compute_seconds"]
        if nodes == 1:
            assert end["rewarm_steps"] == REWARM_STEPS
            assert audit["window_facts"] == {"open": {}, "close": {}}
            continue
        assert end["breakdown"]["timer"] == start["timer"]
        assert audit["outside_window"]["adapter.barrier"] >= 2
        # DDP's always-sampled iterations (which synchronise on CUDA) all before the window:
        # at least DDP_ALWAYS_SAMPLED + 1 DDP steps, re-warm topping up the warm-up
        assert end["rewarm_steps"] == DDP_ALWAYS_SAMPLED + 1 - WARMUP
        opened, closed = audit["window_facts"]["open"], audit["window_facts"]["close"]
        assert opened["ddp_steps"] == DDP_ALWAYS_SAMPLED + 1
        assert closed["ddp_steps"] == opened["ddp_steps"] + STEPS
        assert closed["ddp_last_sampled_iteration"] == opened["ddp_last_sampled_iteration"]
        assert opened["ddp_last_sampled_iteration"] == DDP_ALWAYS_SAMPLED
        assert "ddp_runtime_logging" in start["fast_paths"]


def one_rank_adapter(**spec) -> TorchAdapter:
    ctx = RankContext(0, 1, 0, 1, 0, "n0", "127.0.0.1", 29500, "test")
    adapter = TorchAdapter(rank_spec(**{"warmup_steps": WARMUP, "steps": STEPS, **spec}), ctx)
    adapter.setup()
    return adapter


def test_the_audit_counts_a_host_read_inside_the_window():
    """The audit can fail: a .item() in every timed step is counted as inside the window."""
    adapter = one_rank_adapter()
    audit = SyncAudit(adapter)
    try:
        run = run_timed(adapter, before_step=lambda i: torch.ones(1).item(), audit=audit)
    finally:
        audit.uninstall()
    assert run["sync_audit"]["inside_window"] == {"Tensor.item": STEPS}
    assert run["sync_audit"]["outside_window"]["Tensor.item"] == WARMUP
    assert "item" not in vars(torch.Tensor)  # uninstalled: the class is as it was


def grad_scaler_host_reads(fused: bool) -> int:
    """Tensor.item calls of GradScaler.step + update over three fp16 steps with SGD."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=fused or None)
    scaler = torch.amp.GradScaler("cpu")
    assert scaler.is_enabled()
    calls = []
    item = torch.Tensor.item

    def counted(self):
        calls.append(1)
        return item(self)

    for _ in range(3):
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(torch.randn(4, 8)).float().sum()
        opt.zero_grad()
        scaler.scale(loss).backward()
        torch.Tensor.item = counted
        try:
            scaler.step(opt)
            scaler.update()
        finally:
            del torch.Tensor.item
    return len(calls)


def test_the_fused_sgd_keeps_the_grad_scaler_off_the_host():
    """Why fp16 on CUDA uses the fused SGD: GradScaler.step reads its inf check on the host
    (.item()) each step for the for-loop/foreach SGD, and hands it to the fused one as a
    device tensor (shown on the CPU's scaler, the same Python path as CUDA's)."""
    assert grad_scaler_host_reads(fused=False) == 3
    assert grad_scaler_host_reads(fused=True) == 0


def test_the_first_step_waits_longer_than_a_collective(tmp_path, monkeypatch):
    """A peer that is 8 s late for the first warm-up step (a slow compile) is waited for under
    first_step_timeout_s although collectives time out after 3 s; late for the second step,
    it fails the cell."""
    monkeypatch.setenv("DLSCALE_COLLECTIVE_TIMEOUT_S", "3")
    cell = cell_dict(warmup_steps=2, steps=2, first_step_timeout_s=60)
    monkeypatch.setenv("DLSCALE_FAULT", f"{tmp_path.name}/first:1:0:sleep8")
    code, out = launch_cell(tmp_path / "first", cell)
    assert code == 0
    ends = rank_records(out, "rank_end")
    for end in ends:
        assert end["first_step_deadline"]["seconds"] == 60
        assert "process group's timeout" in end["first_step_deadline"]["method"]
    assert ends[0]["first_step_seconds"] > 3  # rank 0 waited for its late peer
    monkeypatch.setenv("DLSCALE_FAULT", f"{tmp_path.name}/second:1:1:sleep8")
    code, out = launch_cell(tmp_path / "second", cell)
    assert code != 0 and not out.exists()


def test_the_first_step_deadline_is_in_no_identity():
    default = Cell.from_dict(cell_dict())
    longer = Cell.from_dict(cell_dict(first_step_timeout_s=7200))
    assert default.first_step_timeout_s == FIRST_STEP_TIMEOUT_S
    assert "first_step_timeout_s" not in default.as_dict()  # serialised as before it existed
    assert longer.as_dict()["first_step_timeout_s"] == 7200  # carried to the ranks
    assert longer.config_hash == default.config_hash
    spec = TrainSpec.from_cell(longer)
    assert spec.first_step_timeout_s == 7200


def test_the_energy_window_opens_after_the_devices_queue_is_drained(monkeypatch):
    """Work still queued on the device when the window opens (the re-warm steps) is
    not counted. A stand-in for a device queue: each step queues one unit of energy, a sync
    runs what is queued; the meter reads the energy run so far. With the meter started before
    the window's opening sync, the re-warm steps' units were counted too."""
    import dlscale.rank.timing as timing

    adapter = one_rank_adapter()
    device = {"queued": 0, "ran": 0}
    step, sync = adapter.step, adapter.sync

    def queued_step():
        step()
        device["queued"] += 1

    def draining_sync():
        sync()
        device["ran"] += device.pop("queued")
        device["queued"] = 0

    class Meter:  # reads the stand-in's counter as the board's energy counter
        def __init__(self, device_kind, gpu):
            pass

        def start(self):
            self.at_start = device["ran"]

        def stop(self, samples):
            return {"available": True, "joules": device["ran"] - self.at_start}

    monkeypatch.setattr(adapter, "step", queued_step)
    monkeypatch.setattr(adapter, "sync", draining_sync)
    monkeypatch.setattr(timing, "EnergyMeter", Meter)
    run = run_timed(adapter)
    assert run["rewarm_steps"] >= REWARM_STEPS >= 1
    assert run["energy"]["joules"] == STEPS  # the window's steps, none of the re-warm ones
