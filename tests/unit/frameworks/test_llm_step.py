"""The LLM step's settings on the CPU: the attention kernel a cell asks for and the one the
profiler saw run, op-level selective checkpointing's memory against its prediction, FSDP2 at
degree 1 against the single-process bf16 program under plain SGD, the compiled loss, torchao's
float8 conversion (where the torchao folder is built), and each setting refused before any job
where it cannot run, with every other cell's identity kept."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dlscale.frameworks.train_spec import TrainSpec
from dlscale.rank.rank_context import RankContext
from dlscale.registry.attention import AUTO_ORDER, backend_order, kernel_of
from dlscale.study.matrix import load_study
from dlscale.study.matrix_checks import llm_step_problems

from .test_torch_parallel_ranks import SIGHT, loss_check, reference, run_ranks

REPO = Path(__file__).resolve().parents[3]


def adapter(port: int = 0, **kw):
    """The production PyTorch adapter of a one-rank llama3_debug cell, set up."""
    from dlscale.frameworks.pytorch import Adapter
    from dlscale.run.launchers import ports

    settings = dict(
        framework="pytorch",
        model="llama3_debug",
        per_rank_batch=2,
        warmup_steps=1,
        steps=1,
        precision="fp32",
        device="cpu",
        threads=1,
        learning_rate=0.01,
        momentum=0.0,
    )
    settings.update(kw)
    ctx = RankContext(0, 1, 0, 1, 0, "n", "127.0.0.1", port or ports.local_port(1), "t")
    a = Adapter(TrainSpec(**settings), ctx)
    a.setup()
    return a


# ---- the attention kernel ----
def test_auto_is_one_fixed_order_per_device_class():
    assert backend_order("auto", "cuda", 9.0) == ("cudnn", "flash", "efficient", "math")
    assert backend_order("auto", "cuda", 8.0) == AUTO_ORDER["cuda"]
    assert backend_order("auto", "cpu") == ("flash", "math")
    assert backend_order("math", "cuda", 9.0) == ("math",)
    with pytest.raises(ValueError, match="allowed values: auto, cudnn, flash, efficient, math"):
        backend_order("fast", "cpu")
    ops = ["aten::mm", "aten::_scaled_dot_product_flash_attention_for_cpu"]
    assert kernel_of(ops)["kernel"] == "flash"
    assert kernel_of(["aten::mm"])["kernel"] is None


def test_the_kernel_asked_for_runs_and_the_profiler_names_it():
    """flash and math on a CPU (and auto: flash first), each with enable_gqa (llama3_debug's 4
    query heads share 2 key/value heads); the kernel read from the profiler's operator names of
    a step after the window; the cell without a setting keeps repeat_kv and PyTorch's choice."""
    seen = {}
    for setting in (None, "flash", "math", "auto"):
        a = adapter(attention=setting)
        try:
            a.step()
            found = a.after_window()["attention_kernel"]
            seen[setting] = found["kernel"]
            assert a.gqa["enable_gqa"] is (setting is not None)
            assert a.execution()["attention"]["setting"] == setting
        finally:
            a.teardown()
    assert seen == {None: "flash", "flash": "flash", "math": "math", "auto": "flash"}


# ---- op-level selective checkpointing ----
def test_selective_op_keeps_the_predicted_activations_and_trains_the_same():
    """selective_op on every block: the bytes the forward saves outside the checkpoints plus
    the outputs the op-level policy keeps (matrix products, the attention kernel's output and
    log-sum-exp) are the predicted activations within 1 %, between full's and none's; the loss
    after two steps is the unchecked model's."""
    losses, kept = {}, {}
    for mode in ("none", "selective_op"):
        a = adapter(activation_checkpointing=mode, attention="flash")
        try:
            a.step()
            params = {p.untyped_storage()._cdata for p in a.module.parameters()}
            saved: dict[int, int] = {}

            def pack(t, saved=saved, params=params):
                s = t.untyped_storage()
                if s._cdata not in params:
                    saved[s._cdata] = s.nbytes()
                return t

            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                with a.attention_scope():
                    loss = a.loss_fn(a.forward(a.x), a.y)
                policy = sum(
                    m.op_checkpoint.saved_bytes
                    for m in a.module.modules()
                    if hasattr(m, "op_checkpoint")
                )
                loss.backward()
            a.optimizer.step()
            kept[mode] = (sum(saved.values()) + policy, a.predicted_memory["activation"])
            losses[mode] = float(a.loss_value(a.x, a.y))
        finally:
            a.teardown()
    measured, predicted = kept["selective_op"]
    print(f"selective_op: kept {measured} bytes, predicted {predicted['bytes']}")
    assert predicted["checkpointing"] == "selective_op"
    assert measured == pytest.approx(predicted["bytes"], rel=0.01)
    assert kept["none"][0] == pytest.approx(kept["none"][1]["bytes"], rel=0.01)
    assert predicted["bytes"] < predicted["bytes_without_checkpointing"]
    assert losses["selective_op"] == pytest.approx(losses["none"], rel=1e-6)


# ---- bf16 at world size 1: FSDP2 at degree 1 ----
# One process, no reduction: FSDP2's casts are the single-process bf16 program's (measured 0.0
# apart); the autocast path's float32 detours move gpt2_tiny's plain-SGD loss by 1.8e-5.
ONE_DEVICE_RTOL = 1e-6


def test_fsdp_at_degree_one_trains_to_the_single_process_bf16_loss(tmp_path):
    """single_device fully_shard: FSDP2 at degree 1 casts the parameters to bf16 for the
    forward and backward (no autocast) and reduces the gradients in float32; under plain SGD
    (no momentum, no clipping) its loss after 3 steps is the single-process bf16 program's
    within ONE_DEVICE_RTOL, a tenth of what the autocast path (float32 parameters, norms and
    residuals: the float32 detours) differs from that program by, asserted."""
    entry = "ddp:fs1/sgd0"
    (rank,) = run_ranks(tmp_path, f"{entry},ddp/sgd0", 1, 1, 1, "gpt2_tiny", "sgd0", "bf16")
    same_casts = reference("gpt2_tiny", 1, "sgd0", "bf16")
    rel = loss_check(
        "gpt2_tiny fsdp degree 1 bf16, single-process bf16",
        rank[entry]["loss"],
        same_casts,
        ONE_DEVICE_RTOL,
        "sighted",
        "sgd0",
    )
    autocast = abs(rank["ddp/sgd0"]["loss"] - same_casts) / same_casts
    print(f"  the autocast path differs from the bf16 program by {autocast:.2e}")
    assert rel <= ONE_DEVICE_RTOL
    assert rank[entry]["forward_weight_dtype"] == "torch.bfloat16"
    assert rank["ddp/sgd0"]["forward_weight_dtype"] == "torch.float32"
    assert rank[entry]["wrapper"].startswith("torch.distributed.fsdp.fully_shard (FSDP2) at degree")
    assert rank[entry]["training"]["single_device"] == "fully_shard"
    memory = rank[entry]["memory"]
    assert memory["param_bytes"] + memory["grad_bytes"] == 2 * memory["predicted"]["param_bytes"]
    assert autocast >= SIGHT * ONE_DEVICE_RTOL


# ---- the compiled loss ----
def test_the_compiled_loss_is_the_float32_cross_entropy():
    from dlscale.frameworks.torch_model import float32_cross_entropy

    logits = torch.randn(6, 11, dtype=torch.bfloat16)
    target = torch.randint(0, 11, (6,))
    expected = torch.nn.functional.cross_entropy(logits.float(), target)
    assert float32_cross_entropy(logits, target).dtype == torch.float32
    assert torch.equal(float32_cross_entropy(logits, target), expected)
    a = adapter(mode="compiled", compile_loss=True, compile_scope="block")
    try:  # compiled lazily, at the first step: not run here (inductor on 2 cores: minutes)
        assert a.compiles_loss and not isinstance(a.loss_fn, torch.nn.CrossEntropyLoss)
        assert "the loss too" in a.execution()["compile_method"]
    finally:
        a.teardown()


# ---- float8 ----
TORCHAO = REPO / ".venvs" / "pytorch-float8"
FLOAT8_SCRIPT = """
import sys, torch
sys.path.insert(1, "scripts")
from dlscale.frameworks.torch_float8 import convert
from dlscale.models import get_spec
from dlscale.models.torch import build
spec = get_spec("llama3_debug")
with torch.device("meta"):
    meta = build("llama3_debug")
facts = convert(meta, spec.vocab_size, sharded=True)
assert "output" not in facts["converted"] and "output" in facts["kept_in_bf16"], facts
assert "layers.0.attention.wq" in facts["converted"], facts
assert type(meta.layers[0].attention.wq).__name__ == "Float8Linear"
assert meta.layers[0].attention.wq.config.enable_fsdp_float8_all_gather
model = torch.nn.Sequential(torch.nn.Linear(64, 64, bias=False), torch.nn.Linear(64, 32))
convert(model, 32, sharded=False)
out = model(torch.randn(16, 64))
out.sum().backward()
print("float8 ok", facts["torchao"], len(facts["converted"]), model[0].weight.grad.shape)
"""


def test_torchaos_float8_conversion_on_the_meta_device_and_a_cpu_step():
    """torchao's conversion (its own package folder, envs/pytorch-float8.txt, never the
    driver's environment): every Linear but the output head becomes a Float8Linear with the
    float8 all-gather where sharded, on the meta device; a converted model steps on a CPU."""
    assert (TORCHAO / "torchao").is_dir(), (
        "torchao's folder is not built (scripts/setup.sh builds it with the default "
        "environments): .venv/bin/python -m pip install --no-deps --target "
        ".venvs/pytorch-float8 -r envs/pytorch-float8.txt"
    )
    env = {**os.environ, "PYTHONPATH": f"{TORCHAO}{os.pathsep}{REPO / 'scripts'}"}
    done = subprocess.run(
        [sys.executable, "-c", FLOAT8_SCRIPT],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "float8 ok 0.18.0" in done.stdout


# ---- the study: refusals, identity, the trace ----
def gpu_hardware() -> dict:
    return {
        "cpu": {"device": "cpu"},
        "v100": {"device": "cuda", "compute_capability": 7.0},
        "h100": {"device": "cuda", "compute_capability": 9.0},
    }


def axes(**changes) -> dict:
    out = {
        "framework": ["pytorch"],
        "hardware": ["cpu"],
        "precision": ["fp32"],
        "parallelism": ["ddp"],
    }
    return {**out, **changes}


@pytest.mark.parametrize(
    "config, where, message",
    [
        (
            {"attention": "cudnn"},
            axes(),
            "attention: 'cudnn' does not run on hardware 'cpu' .*allowed values: null, auto, "
            "flash, math",
        ),
        (
            {"attention": "flash"},
            axes(framework=["pytorch", "tensorflow"]),
            "attention: 'flash' is run by framework\\(s\\) pytorch, not 'tensorflow'",
        ),
        (
            {},
            axes(hardware=["v100"], precision=["bf16", "float8"]),
            "axes.precision: 'float8' on hardware 'v100': compute capability 7.0 has no FP8 "
            "tensor cores .*allowed values there: fp32, bf16, fp16",
        ),
        (
            {},
            axes(precision=["float8"]),
            "axes.precision: 'float8' on hardware 'cpu': a cpu device has no FP8 tensor cores",
        ),
        (
            {},
            axes(hardware=["h100"], precision=["float8"], framework=["pytorch", "horovod"]),
            "axes.precision: 'float8' .* not 'horovod'; allowed values for horovod: fp32",
        ),
        (
            {"compile_loss": True},
            axes(parallelism=["ddp", "tp"]),
            "compile_loss: true with parallelism 'tp'.*allowed values for a study with tp: false",
        ),
        (
            {"single_device": "fully_shard"},
            axes(framework=["mxnet"]),
            "single_device: 'fully_shard' is run by framework\\(s\\) pytorch, not 'mxnet'; "
            "allowed values for a study with mxnet: plain",
        ),
    ],
)
def test_each_setting_is_refused_where_it_cannot_run(config, where, message):
    import re

    problems = llm_step_problems({"exclude": [], **config}, where, gpu_hardware())
    assert any(re.search(message, p) for p in problems), problems
    assert not llm_step_problems(
        {"exclude": []}, axes(hardware=["h100"], precision=["float8"]), gpu_hardware()
    )


def test_the_settings_enter_only_the_cells_they_change(root, base_config):
    """At their defaults the keys leave every cell's identity and the study's hash as they
    were; attention enters every pytorch cell's identity, single_device the cells of world size
    1 only (with FSDP2's mixed precision for bf16), compile_loss the compiled cells only; a
    trace marks one cell and is in no identity or hash."""
    import copy

    from .test_torch_parallel import parallel_config

    config = parallel_config(base_config, model=["llama3_debug"], parallelism=["ddp"], nodes=[1, 2])
    config["ranks_per_node"] = 1
    config["axes"]["mode"] = ["eager", "compiled"]
    config["axes"]["precision"] = ["fp32"]
    before = load_study(copy.deepcopy(config), root)
    changed = {
        **copy.deepcopy(config),
        "attention": "flash",
        "single_device": "fully_shard",
        "compile_loss": True,
        "trace": {"cell": "*/eager/n1/r1", "steps": 2},
    }
    after = load_study(changed, root)
    assert (
        before.config_hash
        == load_study({**copy.deepcopy(config), "trace": {"cell": "*/n1/r1"}}, root).config_hash
    )
    traced = []
    for old, new in zip(before.cells, after.cells, strict=True):
        extra = {"attention": "flash"}
        if new.world_size == 1:
            extra["single_device"] = "fully_shard"
        if new.mode == "compiled":
            extra["compile_loss"] = True
        assert new.identity() == {**old.identity(), **extra}, new.path
        traced += [new.path] if new.trace_steps else []
    assert len(traced) == 1 and "/eager/n1/" in traced[0]
    from dlscale.study.config import ConfigError

    with pytest.raises(ConfigError, match="trace.cell: 'nowhere' matches no cell"):
        load_study({**copy.deepcopy(config), "trace": {"cell": "nowhere"}}, root)
    assert all("trace_steps" not in c.identity() for c in after.cells)
