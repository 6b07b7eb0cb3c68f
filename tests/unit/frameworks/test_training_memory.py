"""Training memory in one process: seeded initial values that do not depend on where a model lives
(dlscale.models.torch.seeded_init), the predicted memory parts (dlscale.frameworks.torch_memory)
and the timed window's device peak (the CUDA calls monkeypatched: there is no GPU here, so the
test checks that the production loop resets the peak statistics after the warm-up and re-warm
steps and reads them right after the window, not what a GPU would read)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from dlscale.frameworks.torch_memory import activation_bytes, local_rows, predicted_parts
from dlscale.models import get_spec, spec_for
from dlscale.models.torch import build, example_batch
from dlscale.models.torch.gpt import GPT
from dlscale.models.torch.seeded_init import (
    builds_with_init_weights,
    full_values,
    materialize,
    parameter_seed,
    seeded_init,
)


def meta(factory):
    with torch.device("meta"):
        return factory()


def small_gpt(layers: int) -> GPT:
    return GPT(
        vocab_size=64, seq_len=8, d_model=16, num_layers=layers, num_heads=2, dim_feedforward=32
    )


def test_a_parameters_values_depend_on_the_seed_and_its_name_only():
    """Each parameter from its own generator: the same name draws the same values in models of
    different depth (GPT-2's residual projections are scaled by 1/sqrt(2L): the same draws,
    scaled), another seed draws others."""
    one = dict(full_values(meta(lambda: small_gpt(1)), seed=0))
    two = dict(full_values(meta(lambda: small_gpt(2)), seed=0))
    for name in ("token_embedding.weight", "blocks.0.attn.wq.weight", "blocks.0.mlp.fc.weight"):
        assert torch.equal(one[name], two[name])
    ratio = (0.02 / math.sqrt(4)) / (0.02 / math.sqrt(2))
    torch.testing.assert_close(
        one["blocks.0.attn.wo.weight"] * ratio, two["blocks.0.attn.wo.weight"]
    )
    assert torch.equal(one["blocks.0.ln_1.weight"], torch.ones(16))
    assert torch.equal(one["blocks.0.attn.wq.bias"], torch.zeros(16))
    other = dict(full_values(meta(lambda: small_gpt(1)), seed=1))
    assert not torch.equal(one["token_embedding.weight"], other["token_embedding.weight"])
    assert parameter_seed(0, "a") == parameter_seed(0, "a") != parameter_seed(0, "b")
    assert "head.weight" not in one  # tied to the token embedding: drawn once


def test_a_meta_model_materialised_holds_the_seeded_values_and_its_ties():
    """to_empty gives a plain module's tied parameter two objects: materialize ties it again."""
    model = meta(lambda: build("gpt2_tiny"))
    materialize(model, meta(lambda: build("gpt2_tiny")), torch.device("cpu"), seed=0)
    assert model.head.weight is model.token_embedding.weight
    assert sum(p.numel() for p in model.parameters()) == get_spec("gpt2_tiny").param_count
    reference = build("gpt2_tiny")  # built as before, then given the seeded values
    seeded_init(reference, meta(lambda: build("gpt2_tiny")), seed=0)
    for (name, a), (_, b) in zip(model.named_parameters(), reference.named_parameters()):
        assert torch.equal(a, b), name
    assert builds_with_init_weights("gpt2_tiny") and not builds_with_init_weights("cnn_small")


class HalfSet(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("table", torch.zeros(3))

    def init_weights(self):
        nn.init.normal_(self.lin.weight)
        nn.init.zeros_(self.lin.bias)
        self.table = torch.arange(3.0, device=self.table.device)


class Unset(HalfSet):
    def init_weights(self):
        nn.init.normal_(self.lin.weight)  # the bias is never set


class NoBuffer(HalfSet):
    def init_weights(self):
        nn.init.normal_(self.lin.weight)
        nn.init.zeros_(self.lin.bias)  # the table is never computed


def test_init_weights_must_set_every_parameter_and_buffer():
    model = meta(HalfSet)
    materialize(model, meta(HalfSet), torch.device("cpu"), seed=0)
    assert torch.equal(model.table, torch.arange(3.0))
    assert torch.equal(model.lin.bias, torch.zeros(4))
    with pytest.raises(ValueError, match=r"Unset.init_weights\(\) left parameter lin.bias"):
        materialize(meta(Unset), meta(Unset), torch.device("cpu"), seed=0)
    with pytest.raises(ValueError, match=r"NoBuffer.init_weights\(\) left buffer\(s\) table"):
        materialize(meta(NoBuffer), meta(NoBuffer), torch.device("cpu"), seed=0)


def test_fsdps_rows_per_rank_and_the_predicted_shard():
    assert [local_rows(10, 4, i) for i in range(4)] == [3, 3, 3, 1]
    assert [local_rows(3, 4, i) for i in range(4)] == [1, 1, 1, 0]
    params = list(meta(lambda: build("gpt2_tiny")).parameters())
    n = get_spec("gpt2_tiny").param_count
    whole = predicted_parts(params, "adamw", 0.9)
    assert whole["param_bytes"] == whole["grad_bytes"] == 4 * n
    assert whole["optimizer_state_bytes"] == 8 * n and whole["state_bytes"] == 16 * n
    sgd = predicted_parts(params, "sgd", 0.9)
    assert sgd["optimizer_state_bytes"] == 4 * n
    assert predicted_parts(params, "sgd", 0.0)["optimizer_state_bytes"] == 0
    halves = [predicted_parts(params, "adamw", 0.9, (2, i)) for i in range(2)]
    assert [h["state_bytes"] for h in halves] == [8 * n, 8 * n]  # every dim 0 even
    assert {h["padding_bytes"] for h in halves} == {0}
    thirds = [predicted_parts(params, "adamw", 0.9, (3, i)) for i in range(3)]
    assert sum(t["param_bytes"] for t in thirds) == 4 * n  # the shards make the whole
    # dims 0 of 64 and 32 rows do not split in 3: FSDP2 pads each rank's shard to ceil(n / 3)
    assert thirds[0]["padding_bytes"] < thirds[2]["padding_bytes"]
    assert {t["full_state_bytes"] for t in thirds} == {16 * n}


def test_the_activation_estimate_is_what_autograd_saves():
    """On the meta device, attention counted as the fused kernels hold it: for the dropout-free
    decoder exactly the bytes a real CPU forward saves for backward (its flash kernel)."""
    estimate = activation_bytes("gpt2_tiny", None, 4)
    assert estimate["available"] and estimate["dtype"] == "float32"
    torch.manual_seed(0)
    model = build("gpt2_tiny")
    x, y = example_batch(spec_for("gpt2_tiny"), 4)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in params:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        torch.nn.functional.cross_entropy(model(x), y)
    assert estimate["bytes"] == sum(saved.values())
    half = activation_bytes("gpt2_tiny", None, 4, torch.bfloat16)
    assert 0.4 < half["bytes"] / estimate["bytes"] < 0.6
    assert not activation_bytes("no_such_model", None, 4)["available"]


def test_the_cuda_peak_is_reset_after_the_warm_up_and_read_after_the_window(monkeypatch):
    """The production loop (dlscale.rank.timing.run_timed) with the pytorch adapter's memory
    hooks, on an adapter whose device is CUDA but whose steps only log: torch.cuda's statistics
    are monkeypatched (no GPU here)."""
    from dlscale.frameworks import pytorch
    from dlscale.frameworks.base import HostTimer, RankContext
    from dlscale.rank import timing

    from helpers.parallel_ranks import train_spec

    log = []
    peaks = iter([900.0, 300.0, 350.0, 310.0])  # before reset, window allocated, reserved, end
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d=None: log.append("reset"))
    monkeypatch.setattr(
        torch.cuda, "max_memory_allocated", lambda d=None: log.append("read") or next(peaks) * 2**20
    )
    monkeypatch.setattr(
        torch.cuda, "max_memory_reserved", lambda d=None: log.append("read") or next(peaks) * 2**20
    )
    monkeypatch.setattr(timing, "IDLE_PROBE_SECONDS", 0.01)

    class Logged(pytorch.Adapter):
        records_attention_kernel = False  # no model was built: steps only log

        def step(self):
            log.append("step")

        def sync(self):
            pass

        def barrier(self):
            pass

        def step_timer(self):
            return HostTimer(self)

    ctx = RankContext(0, 1, 0, 1, 0, "n", "127.0.0.1", 1, "test")
    adapter = Logged(train_spec("ddp", 1, "gpt2_tiny"), ctx)
    adapter.device = torch.device("cuda", 0)
    spec = adapter.spec
    timing.run_timed(adapter)
    before = spec.warmup_steps + timing.REWARM_STEPS
    assert log == ["step"] * before + ["read", "reset"] + ["step"] * spec.steps + ["read"] * 2
    memory = adapter.memory_per_rank()
    assert memory["peak_before_window_mb"] == 900.0
    assert (memory["peak_allocated_mb"], memory["peak_reserved_mb"]) == (300.0, 350.0)
    assert memory["peak_scope"] == "timed window"
    assert adapter.peak_device_memory_mb() == 900.0  # the process's peak: before the window
