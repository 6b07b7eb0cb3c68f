"""The horovod framework: real 1-rank and 2-rank local launches in .venvs/horovod (Horovod built
by scripts/build-horovod.sh), gradient averaging across ranks, and a dead peer failing a rank.

Skipped when .venvs/horovod is missing, unless CI is set (then they must run)."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from dlscale.run.launchers import local as local_launcher
from dlscale.run.launchers import ports
from dlscale.store.metrics import read_metrics

from helpers import ranks
from helpers.cells import cell_dict, launch_cell

ROOT = Path(__file__).resolve().parents[3]
PYTHON = ROOT / ".venvs" / "horovod" / "bin" / "python"

pytestmark = pytest.mark.skipif(
    not PYTHON.exists() and not os.environ.get("CI"),
    reason=f"{PYTHON} is missing: build it with `scripts/setup.sh horovod` (envs/horovod.txt, "
    "then scripts/build-horovod.sh); set CI=true to require it",
)

CELL = cell_dict(framework="horovod")


def run_cell(tmp_path: Path, cell: dict) -> list[dict]:
    code, out = launch_cell(tmp_path, cell, PYTHON)
    assert code == 0
    assert not (out.parent / ".ranks").exists()
    return read_metrics(out)  # schema-validated


def test_one_rank_local_launch(tmp_path):
    cell = dict(CELL, nodes=1, world_size=1, global_batch=4)
    records = run_cell(tmp_path, cell)
    starts = [r["value"] for r in records if r["event"] == "rank_start"]
    assert len(starts) == 1
    # world size 1: the plain PyTorch loop, no Horovod rendezvous or allreduce (the single-device
    # baseline)
    assert starts[0]["backend"] == "none (world size 1)"
    assert starts[0]["wrapper"] == "none (world size 1)"
    assert records[0]["value"]["provenance"]["world_size"] == 1
    build = starts[0]["system"]["framework_build"]  # torch's build and Horovod's flags
    assert build["framework"] == "torch" and build["horovod"]["gloo_built"] is True
    assert {r["rank"] for r in records if r["event"] == "rank_end"} == {0}


def test_two_rank_local_launch_writes_a_valid_metrics_file(tmp_path):
    records = run_cell(tmp_path, CELL)
    assert {r["rank"] for r in records if r["event"] == "rank_end"} == {0, 1}
    starts = [r["value"] for r in records if r["event"] == "rank_start"]
    assert {s["node_index"] for s in starts} == {0, 1}
    assert len({s["pid"] for s in starts}) == 2  # two real processes
    assert {s["backend"] for s in starts} == {"gloo"}
    assert {s["param_count"] for s in starts} == {391_466}  # the torch model, by construction
    assert all(s["libraries"]["horovod"].startswith("0.28.1") for s in starts)
    assert records[0]["value"]["provenance"]["world_size"] == 2
    assert len([r for r in records if r["event"] == "step"]) == 2 * CELL["steps"]


# One rank of a 2-rank job outside the launcher: the adapter itself, one step, state saved.
RANK_SCRIPT = textwrap.dedent("""
    import os, sys, time, torch
    from dlscale.frameworks.train_spec import TrainSpec
    from dlscale.frameworks.horovod import Adapter
    from dlscale.rank.rank_context import discover
    ctx = discover()
    spec = TrainSpec(framework="horovod", model="cnn_small", per_rank_batch=4, warmup_steps=0,
                     steps=1, precision="fp32", device="cpu", threads=1, learning_rate=0.01,
                     momentum=0.9)
    a = Adapter(spec, ctx)
    a.setup()
    before = {k: v.clone() for k, v in a.model.state_dict().items()}
    if os.environ.get("DIE_AFTER_SETUP") == str(ctx.rank):
        os._exit(3)                         # a dead peer: no teardown, sockets just close
    if os.environ.get("HANG_AFTER_SETUP") == str(ctx.rank):
        time.sleep(600)                     # a stuck peer: alive, Horovod's thread still cycling
    try:
        for _ in range(int(os.environ.get("STEPS", "1"))):
            a.step()
    except Exception as exc:
        print(f"STEP FAILED: {type(exc).__name__}: {exc}", flush=True)
        os._exit(4)
    after = {n: p.detach().clone() for n, p in a.model.named_parameters()}
    a.step_without_allreduce()              # compute only: the ranks' parameters diverge
    local = {n: p.detach().clone() for n, p in a.model.named_parameters()}
    a.step()                                # and a normal step still works after it
    a.barrier()
    torch.save({"before": before, "after": after, "local": local, "x": a.x, "y": a.y},
               os.path.join(sys.argv[1], f"rank{ctx.rank}.pt"))
    a.teardown()
""")


def start_ranks(tmp_path: Path, world: int = 2, **extra_env) -> list[subprocess.Popen]:
    port = ports.local_port(world)
    procs = []
    for rank in range(world):
        env = {**local_launcher.local_rank_env(rank, world, 1, port), **extra_env}
        procs.append(
            subprocess.Popen(
                [str(PYTHON), "-c", RANK_SCRIPT, str(tmp_path)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    return procs


def test_gradients_are_averaged_across_ranks(tmp_path):
    """Different data per rank, one SGD step: the parameters are identical on both ranks and
    equal to the initial ones minus lr x the mean of the two ranks' local gradients."""
    import torch

    from dlscale.models.torch import build

    procs = start_ranks(tmp_path)
    outputs = ranks.outputs(procs, timeout=600)
    assert [p.returncode for p in procs] == [0, 0], "\n".join(outputs)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert not torch.equal(r0["x"], r1["x"])  # different data per rank
    for name in r0["before"]:
        if "running" in name or "num_batches" in name:
            continue  # BN buffers are not synchronised by Horovod
        assert torch.equal(r0["before"][name], r1["before"][name]), name  # broadcast from rank 0
    grads = []
    for r in (r0, r1):
        model = build("cnn_small")
        model.load_state_dict(r0["before"])
        model.train()
        torch.nn.functional.cross_entropy(model(r["x"]), r["y"]).backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    assert any(not torch.allclose(grads[0][n], grads[1][n]) for n in grads[0])
    for name, after in r0["after"].items():
        assert torch.equal(after, r1["after"][name]), f"{name} differs between ranks"
        expected = r0["before"][name] - 0.01 * (grads[0][name] + grads[1][name]) / 2
        torch.testing.assert_close(after, expected, rtol=1e-4, atol=1e-6, msg=name)
    # the compute-only step of the breakdown really skips the allreduce
    assert any(not torch.equal(r0["local"][n], r1["local"][n]) for n in r0["local"])


def test_a_dead_peer_fails_the_surviving_rank(tmp_path):
    """Rank 1 dies after setup: rank 0's next allreduce fails instead of hanging."""
    procs = start_ranks(tmp_path, DIE_AFTER_SETUP="1", STEPS="3", DLSCALE_COLLECTIVE_TIMEOUT_S="30")
    out0 = procs[0].communicate(timeout=300)[0]
    procs[1].communicate(timeout=60)
    assert procs[1].returncode == 3
    assert procs[0].returncode != 0, out0


def test_a_stuck_peer_fails_the_waiting_rank_within_the_timeout(tmp_path):
    """Rank 1 stops taking part (alive, never submits its gradients): rank 0's watchdog ends it
    after DLSCALE_COLLECTIVE_TIMEOUT_S instead of waiting forever in Horovod's synchronize()."""
    # a short timeout: both ranks' Horovod threads cycle (a CPU each) until it ends rank 0
    procs = start_ranks(tmp_path, HANG_AFTER_SETUP="1", STEPS="3", DLSCALE_COLLECTIVE_TIMEOUT_S="6")
    try:
        out0 = procs[0].communicate(timeout=300)[0]
    finally:
        procs[1].kill()
        procs[1].communicate()
    assert procs[0].returncode == 124, out0
    assert "a training step did not finish within 6 s" in out0
