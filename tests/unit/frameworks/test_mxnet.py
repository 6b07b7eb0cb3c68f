"""The MXNet adapter in its own environment (.venvs/mxnet): the Gluon models reproduce the PyTorch
references (parameter counts, and the same outputs given the same weights), real 1- and 2-rank
local launches over the dist_sync kvstore, and gradient averaging checked against a
single-process reference.

The MXNet code runs in subprocesses of .venvs/mxnet/bin/python (MXNet 1.9.1 needs numpy < 2;
the driver environment has numpy 2). Without that environment the tests are skipped, unless
CI is set: then they must run, and fail.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from dlscale.models import builds, get_spec, names
from dlscale.run.launchers import local as local_launcher
from dlscale.run.launchers import ports
from dlscale.store.metrics import read_metrics

from helpers import ranks
from helpers.cells import cell_dict, launch_cell

ROOT = Path(__file__).resolve().parents[3]
MXNET_PY = ROOT / ".venvs" / "mxnet" / "bin" / "python"
IN_CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")

pytestmark = pytest.mark.skipif(
    not MXNET_PY.exists() and not IN_CI,
    reason=f"MXNet environment missing ({MXNET_PY}); build it with scripts/setup.sh "
    "(envs/mxnet.txt) - with CI set these tests run and fail instead",
)

#: The models MXNet builds (every registered one but the PyTorch-only decoders) and their
#: registered trainable parameter counts (the PyTorch references, dlscale.models.torch).
BUILT = [n for n in names() if builds("mxnet", n)]
TORCH_COUNTS = {n: get_spec(n).param_count for n in BUILT}


def test_only_the_decoders_have_no_mxnet_builder():
    assert {get_spec(n).arch for n in names() if n not in BUILT} == {"gpt", "llama"}
    assert len(BUILT) >= 5


def mx_run(code: str, *args: str, timeout: int = 600, env: dict | None = None) -> str:
    assert MXNET_PY.exists(), f"CI is set but the MXNet environment is missing: {MXNET_PY}"
    proc = subprocess.run(
        [str(MXNET_PY), "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc.stdout


# ----------------------------------------------------------------------------- the models
COUNT = """
import json
from dlscale.models import supported
from dlscale.models.mxnet import build, param_count
print(json.dumps({name: param_count(build(name)) for name in supported("dlscale.models.mxnet")}))
"""


def test_parameter_counts_equal_the_torch_models():
    counts = json.loads(mx_run(COUNT).strip().splitlines()[-1])
    assert counts == TORCH_COUNTS
    try:
        from dlscale.models.torch import build as torch_build
    except ImportError:
        return
    for name, count in counts.items():
        assert sum(p.numel() for p in torch_build(name).parameters()) == count


# Load the torch model's weights into the Gluon model (trainable parameters in registration
# order; the transformer by name) and compare inference-mode outputs on the same input.
LOAD = r"""
import json, re, sys
import numpy as np, mxnet as mx
from dlscale.models.mxnet import build

def torch_name(n):
    n = re.sub(r"^transformerclassifier\d+_", "", n)
    m = re.match(r"encoder_layer(\d+)_(.*)", n)
    if m:
        i, rest = m.groups()
        rest = re.sub(r"^(in_proj)_(weight|bias)$", r"self_attn.\1_\2", rest)
        rest = re.sub(r"^out_proj_(weight|bias)$", r"self_attn.out_proj.\1", rest)
        rest = re.sub(r"^(norm\d|linear\d)_(gamma|weight)$", r"\1.weight", rest)
        rest = re.sub(r"^(norm\d|linear\d)_(beta|bias)$", r"\1.bias", rest)
        return f"encoder.layers.{i}.{rest}"
    n = n.replace("norm_gamma", "encoder.norm.weight").replace("norm_beta", "encoder.norm.bias")
    return n.replace("_weight", ".weight").replace("_bias", ".bias")

out = {}
for name, path in zip(sys.argv[1::2], sys.argv[2::2]):
    z = np.load(path)
    torch_params = [(k[2:], z[k]) for k in z.files if k.startswith("p:")]
    net = build(name)
    params = [p for p in net.collect_params().values() if p.grad_req != "null"]
    assert len(params) == len(torch_params), (len(params), len(torch_params))
    if name == "transformer_small":
        by_name = dict(torch_params)
        pairs = [(p, by_name[torch_name(p.name)]) for p in params]
    else:
        pairs = list(zip(params, [v for _, v in torch_params]))
    for p, v in pairs:
        assert p.shape == v.shape, (p.name, p.shape, v.shape)
        p.set_data(mx.nd.array(v))
    y = net(mx.nd.array(z["x"].astype("float32"))).asnumpy()   # inference mode
    out[name] = {"max_abs_diff": float(np.abs(y - z["out"]).max()),
                 "max_abs_out": float(np.abs(z["out"]).max())}
print(json.dumps(out))
"""


def test_outputs_equal_the_torch_models_given_the_same_weights(tmp_path):
    import numpy as np
    import torch

    from dlscale.models import get_spec
    from dlscale.models.torch import build, example_batch

    args = []
    for name in TORCH_COUNTS:
        torch.manual_seed(0)
        model = build(name).eval()
        x, _ = example_batch(get_spec(name), 2)
        with torch.no_grad():
            y = model(x)
        arrays = {f"p:{k}": v.detach().numpy() for k, v in model.named_parameters()}
        np.savez(tmp_path / f"{name}.npz", x=x.numpy(), out=y.numpy(), **arrays)
        args += [name, str(tmp_path / f"{name}.npz")]
    result = json.loads(mx_run(LOAD, *args).strip().splitlines()[-1])
    for name, r in result.items():
        assert r["max_abs_diff"] <= 1e-5 * max(1.0, r["max_abs_out"]), (name, r)


# ----------------------------------------------------------------------------- launches
CELL = cell_dict(framework="mxnet")


def launch_mxnet_cell(tmp_path: Path, cell: dict) -> tuple[int, Path]:
    assert MXNET_PY.exists(), f"CI is set but the MXNet environment is missing: {MXNET_PY}"
    return launch_cell(tmp_path, cell, MXNET_PY)


def test_one_rank_local_launch(tmp_path):
    cell = dict(CELL, nodes=1, world_size=1, global_batch=4)
    code, out = launch_mxnet_cell(tmp_path, cell)
    assert code == 0
    records = read_metrics(out)
    starts = [r["value"] for r in records if r["event"] == "rank_start"]
    assert len(starts) == 1
    s = starts[0]
    # world size 1: no kvstore at all, the update runs in the worker (the single-device baseline)
    assert s["backend"] == "none (world size 1)"
    assert s["param_count"] == TORCH_COUNTS["cnn_small"]
    assert set(s["libraries"]) == {"mxnet", "numpy"} and s["libraries"]["mxnet"] == "1.9.1"
    assert s["data_layout"] == "NCHW" and s["autocast"] is None
    assert records[-1]["value"]["world_size"] == 1
    build = s["system"]["framework_build"]  # MXNet's runtime features
    assert build["available"] and build["framework"] == "mxnet"
    assert "DIST_KVSTORE" in build["build"]["enabled"] and build["cuda_runtime"] is None


def test_two_rank_local_launch_over_dist_sync(tmp_path):
    code, out = launch_mxnet_cell(tmp_path, CELL)
    assert code == 0
    records = read_metrics(out)
    assert {r["rank"] for r in records if r["event"] == "rank_end"} == {0, 1}
    starts = [r["value"] for r in records if r["event"] == "rank_start"]
    assert {s["node_index"] for s in starts} == {0, 1}
    assert len({s["pid"] for s in starts}) == 2  # two real processes
    assert {s["backend"] for s in starts} == {"dist_sync"}
    assert records[0]["value"]["provenance"]["world_size"] == 2
    assert records[-1]["value"]["world_size"] == 2
    assert not (out.parent / ".ranks").exists()


def test_bf16_runs_on_avx512_cpus_else_is_refused_and_fp16_is_refused_on_cpu(tmp_path, capfd):
    """bf16 runs where oneDNN has bf16 convolutions (AVX-512) and is refused before any step
    elsewhere, naming the missing CPU flags (an AVX2-only host fails inside oneDNN otherwise:
    "could not create a primitive descriptor iterator")."""
    from dlscale.frameworks.base import cpu_flags

    code, out = launch_mxnet_cell(
        tmp_path / "bf16", dict(CELL, nodes=1, world_size=1, global_batch=4, precision="bf16")
    )
    avx512 = {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= cpu_flags()
    if avx512:
        assert code == 0
        starts = [r["value"] for r in read_metrics(out) if r["event"] == "rank_start"]
        assert starts[0]["autocast"] == "bfloat16"
    else:
        assert code != 0 and not out.exists()
        err = capfd.readouterr().err
        assert "precision bf16 is not supported by MXNet 1.9.1 on CPU" in err
        assert "AVX-512 CPUs only; this CPU lacks avx512" in err and "use one of: fp32" in err
    code, out = launch_mxnet_cell(
        tmp_path / "fp16", dict(CELL, nodes=1, world_size=1, global_batch=4, precision="fp16")
    )
    assert code != 0 and not out.exists()
    assert "fp16 is not supported by MXNet 1.9.1 on CPU" in capfd.readouterr().err


# ----------------------------------------------------------------------------- gradient averaging
# Each rank: the adapter's setup, its (rank-specific) batch and weights before and after each
# step, saved for the reference.
WORKER = """
import json, sys
import numpy as np
from dlscale.frameworks.train_spec import TrainSpec
from dlscale.frameworks.mxnet import Adapter
from dlscale.rank.rank_context import discover
out, model, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
ctx = discover()
a = Adapter(TrainSpec(framework="mxnet", model=model, per_rank_batch=4, warmup_steps=0,
                      steps=steps, precision="fp32", device="cpu", threads=1,
                      learning_rate=0.01, momentum=0.9), ctx)
try:
    a.setup()
    def weights():
        return {p.name: p.data().asnumpy() for p in a.net.collect_params().values()
                if p.grad_req != "null"}
    snap = {"x": a.x.asnumpy(), "y": a.y.asnumpy()}
    snap.update({"init/" + k: v for k, v in weights().items()})
    for s in range(steps):
        a.step()
        snap.update({f"step{s + 1}/" + k: v for k, v in weights().items()})
    a.barrier()
    np.savez(f"{out}/rank{ctx.rank}.npz", **snap)
    print(json.dumps({"backend": a.backend, "kv_workers": a.kv.num_workers}))
finally:
    a.teardown()
"""

# One process, no kvstore: the same initial weights, the gradients of every rank's batch summed
# (BatchNorm statistics per rank's batch, as under data parallelism), SGD momentum 0.9 with
# rescale 1 / global batch: SGD on the mean gradient.
REFERENCE = """
import json, sys
import numpy as np, mxnet as mx
from mxnet import autograd, gluon
from dlscale.models.mxnet import build
out, model, steps, world = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
ranks = [np.load(f"{out}/rank{r}.npz") for r in range(world)]
net = build(model)
params = [p for p in net.collect_params().values() if p.grad_req != "null"]
for p in params:
    p.set_data(mx.nd.array(ranks[0]["init/" + p.name]))
    p.grad_req = "add"
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01, "momentum": 0.9},
                        kvstore=None)
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
report = {"same_init": all(np.array_equal(ranks[0]["init/" + p.name], r["init/" + p.name])
                           for r in ranks[1:] for p in params),
          "batches_differ": not np.array_equal(ranks[0]["x"], ranks[1]["x"]),
          "identical": [], "max_diff": [], "max_update": []}
for s in range(1, steps + 1):
    for p in params:
        p.zero_grad()
    for r in ranks:
        with autograd.record():
            loss = loss_fn(net(mx.nd.array(r["x"])), mx.nd.array(r["y"]))
        loss.backward()
    trainer.step(sum(len(r["y"]) for r in ranks))
    key = f"step{s}/"
    report["identical"].append(all(np.array_equal(ranks[0][key + p.name], r[key + p.name])
                                   for r in ranks[1:] for p in params))
    report["max_diff"].append(max(float(np.abs(p.data().asnumpy() - ranks[0][key + p.name]).max())
                                  for p in params))
    report["max_update"].append(max(float(np.abs(ranks[0][key + p.name]
                                                 - ranks[0]["init/" + p.name]).max())
                                    for p in params))
print(json.dumps(report))
"""


def test_gradients_are_averaged_across_ranks(tmp_path):
    """2 ranks, different data, 2 steps: the weights are identical on both ranks and equal to
    a single process stepping on the mean gradient of both batches."""
    assert MXNET_PY.exists(), f"CI is set but the MXNet environment is missing: {MXNET_PY}"
    world, steps, port = 2, 2, ports.local_port(2)
    procs = []
    for rank in range(world):
        env = {
            **local_launcher.local_rank_env(rank, world, 1, port),
            "DLSCALE_COLLECTIVE_TIMEOUT_S": "120",
        }
        procs.append(
            subprocess.Popen(
                [str(MXNET_PY), "-c", WORKER, str(tmp_path), "cnn_small", str(steps)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                cwd=ROOT,
            )
        )
    for p, output in zip(procs, ranks.outputs(procs, timeout=600), strict=True):
        assert p.returncode == 0, output[-5000:]
        assert json.loads(output.strip().splitlines()[-1]) == {
            "backend": "dist_sync",
            "kv_workers": 2,
        }
    report = json.loads(
        mx_run(REFERENCE, str(tmp_path), "cnn_small", str(steps), str(world))
        .strip()
        .splitlines()[-1]
    )
    assert report["same_init"] and report["batches_differ"]
    assert report["identical"] == [True] * steps
    assert all(u > 1e-4 for u in report["max_update"])  # the weights did move
    assert all(d <= 1e-6 for d in report["max_diff"]), report
