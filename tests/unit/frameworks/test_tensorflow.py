"""The tensorflow and keras frameworks (.venvs/tensorflow): the Keras models reproduce the PyTorch
architectures (same parameter counts, and the same outputs with PyTorch's weights loaded, under
Keras 3 and legacy Keras 2), real 1-rank and 2-rank local launches, gradient averaging across
ranks, and a dead peer failing the surviving rank on its own.

TensorFlow runs in subprocesses of the tensorflow venv; this file runs in the driver venv.
Skipped when .venvs/tensorflow is missing, unless CI is set (then they must run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from dlscale.models import builds, get_spec, names
from dlscale.run.launchers import ports
from dlscale.store.metrics import read_metrics

from helpers.cells import cell_dict, launch_cell, wait_ranks

ROOT = Path(__file__).resolve().parents[3]
PYTHON = ROOT / ".venvs" / "tensorflow" / "bin" / "python"
FRAMEWORKS = ("tensorflow", "keras")
# The registry's counts (the PyTorch references, dlscale.models.torch), which every framework
# must reproduce.
#: The models TensorFlow/Keras build (every registered one but the PyTorch-only decoders).
BUILT = [n for n in names() if builds("tensorflow", n)]
TORCH_PARAMS = {n: get_spec(n).param_count for n in BUILT}


def test_only_the_decoders_have_no_tensorflow_builder():
    assert {get_spec(n).arch for n in names() if n not in BUILT} == {"gpt", "llama"}
    assert len(BUILT) >= 5


@pytest.fixture(scope="module")
def tf_python() -> Path:
    if not PYTHON.exists():
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but {PYTHON} is missing (envs/tensorflow.txt)")
        pytest.skip(
            f"{PYTHON} is missing: build it with `python3 -m venv .venvs/tensorflow && "
            ".venvs/tensorflow/bin/pip install --upgrade 'pip>=24' && "
            ".venvs/tensorflow/bin/pip install -r envs/tensorflow.txt && "
            ".venvs/tensorflow/bin/pip install --no-deps -e .` (set CI=true to require it)"
        )
    return PYTHON


def tf_env(legacy: bool = False, **extra: str) -> dict:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("DLSCALE_", "SLURM_", "TF_CONFIG"))
    }
    env.update(TF_CPP_MIN_LOG_LEVEL="2", TF_USE_LEGACY_KERAS="1" if legacy else "0", **extra)
    return env


def run_tf(
    python: Path,
    code: str,
    *args: str,
    legacy: bool = False,
    timeout: int = 600,
    cwd: Path | None = None,
) -> str:
    proc = subprocess.run(
        [str(python), "-c", textwrap.dedent(code), *args],
        env=tf_env(legacy),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


# ----------------------------------------------------------------------------- the models
COUNTS = """
    import json
    from dlscale.models import supported
    from dlscale.models.tf import build, param_count
    built = supported("dlscale.models.tf")
    print("COUNTS " + json.dumps({n: param_count(build(n)) for n in built}))
"""


@pytest.mark.parametrize("legacy", [False, True], ids=["keras3", "tf_keras"])
def test_parameter_counts_equal_the_torch_models(keras_models, legacy):
    out = keras_models(legacy)
    counts = json.loads(next(line for line in out.splitlines() if line.startswith("COUNTS "))[7:])
    assert set(counts) == set(BUILT)
    assert counts == TORCH_PARAMS


def test_torch_reference_counts_are_the_constants():
    import torch

    from dlscale.models.torch import build

    assert {n: sum(p.numel() for p in build(n).parameters()) for n in BUILT} == TORCH_PARAMS
    del torch


# PyTorch weights -> Keras: conv (O, I, kh, kw) -> (kh, kw, I, O); linear (O, I) -> (I, O).
COMPARE = """
    import json, sys
    import numpy as np
    import tensorflow as tf
    from dlscale.models import supported
    from dlscale.models.tf import build

    def conv(w): return w.transpose(2, 3, 1, 0)
    def lin(w): return w.T

    out = {}
    for n in supported("dlscale.models.tf"):
        d = np.load(f"{sys.argv[1]}/{n}.npz")
        used = set()
        def g(k):
            used.add(k)
            return d[k]
        m = build(n)
        for layer in m.layers:
            if not layer.weights:
                continue
            name, cls = layer.name, type(layer).__name__
            if n == "transformer_small":
                if name == "embedding":
                    layer.token_embedding.set_weights([g("token_embedding.weight")])
                    layer.position_embedding.set_weights([g("position_embedding.weight")])
                elif name.startswith("encoder_layers_"):
                    p = f"encoder.layers.{name.split('_')[-1]}."
                    for ln in ("norm1", "norm2"):
                        getattr(layer, ln).set_weights([g(p + ln + ".weight"), g(p + ln + ".bias")])
                    layer.in_proj.set_weights([lin(g(p + "self_attn.in_proj_weight")),
                                               g(p + "self_attn.in_proj_bias")])
                    layer.out_proj.set_weights([lin(g(p + "self_attn.out_proj.weight")),
                                                g(p + "self_attn.out_proj.bias")])
                    for ll in ("linear1", "linear2"):
                        getattr(layer, ll).set_weights([lin(g(p + ll + ".weight")),
                                                        g(p + ll + ".bias")])
                elif name == "encoder_norm":
                    layer.set_weights([g("encoder.norm.weight"), g("encoder.norm.bias")])
                elif name == "head":
                    layer.set_weights([lin(g("head.weight")), g("head.bias")])
                else:
                    raise SystemExit(f"unmapped layer {name}")
                continue
            if n == "cnn_small" and name != "head":
                i = int(name.split("_")[1])
                tp = f"features.{4 * i + (0 if name.endswith('conv') else 1)}"
            else:
                tp = name.replace("_", ".")
            if cls == "Conv2D":
                layer.set_weights([conv(g(tp + ".weight"))])
            elif cls == "BatchNormalization":
                layer.set_weights([g(tp + ".weight"), g(tp + ".bias"), g(tp + ".running_mean"),
                                   g(tp + ".running_var")])
            elif cls == "Dense":
                layer.set_weights([lin(g(tp + ".weight")), g(tp + ".bias")])
            else:
                raise SystemExit(f"unmapped layer {name} ({cls})")
        x = d["__x"]
        if x.ndim == 4:
            x = x.transpose(0, 2, 3, 1)  # NCHW -> NHWC
        y = m(tf.constant(x), training=False).numpy()
        ref = d["__y"]
        out[n] = {"unused": sorted(set(k for k in d.files if not k.startswith("__")) - used),
                  "rel_err": float(np.abs(y - ref).max() / np.abs(ref).max())}
    print("COMPARE " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def torch_reference(tmp_path_factory) -> Path:
    """Each PyTorch model (eval mode, random BN statistics), its input and its output."""
    import torch

    from dlscale.models.torch import build, example_batch

    out = tmp_path_factory.mktemp("torch_reference")
    torch.manual_seed(0)
    for n in BUILT:
        model = build(n).eval()
        with torch.no_grad():
            for mod in model.modules():
                if isinstance(mod, torch.nn.BatchNorm2d):
                    mod.running_mean.uniform_(-0.5, 0.5)
                    mod.running_var.uniform_(0.5, 1.5)
                    mod.weight.uniform_(0.5, 1.5)
                    mod.bias.uniform_(-0.2, 0.2)
            x, _ = example_batch(get_spec(n), 2)
            y = model(x)
        state = {
            k: v.numpy()
            for k, v in model.state_dict().items()
            if not k.endswith("num_batches_tracked")
        }
        np.savez(out / f"{n}.npz", __x=x.numpy(), __y=y.numpy(), **state)
    return out


@pytest.fixture(scope="module")
def keras_models(tf_python, torch_reference):
    """The output of both checks of the Keras models, COMPARE then COUNTS (its builds after
    COMPARE's: the layer names COMPARE maps are the first ones), in one TensorFlow process per
    Keras (`legacy`): one import of TensorFlow, seconds of CPU, for both."""
    outputs: dict[bool, str] = {}

    def output(legacy: bool) -> str:
        if legacy not in outputs:
            code = COMPARE + COUNTS
            outputs[legacy] = run_tf(tf_python, code, str(torch_reference), legacy=legacy)
        return outputs[legacy]

    return output


@pytest.mark.parametrize("legacy", [False, True], ids=["keras3", "tf_keras"])
def test_models_compute_what_the_torch_models_compute(keras_models, legacy):
    """Every PyTorch tensor loads into exactly one Keras weight and the outputs agree."""
    out = keras_models(legacy)
    result = json.loads(next(line for line in out.splitlines() if line.startswith("COMPARE "))[8:])
    for n in BUILT:
        assert result[n]["unused"] == [], (n, result[n])
        assert result[n]["rel_err"] < 1e-4, (n, result[n])


# ----------------------------------------------------------------------------- real launches
def cell(framework: str, nodes: int, model: str = "cnn_small", precision: str = "fp32") -> dict:
    return cell_dict(
        framework=framework, model=model, precision=precision, nodes=nodes, global_batch=4 * nodes
    )


def run_cell(tmp_path: Path, python: Path, c: dict) -> list[dict]:
    code, out = launch_cell(tmp_path, c, python)
    assert code == 0
    return read_metrics(out)


@pytest.mark.parametrize("nodes", [1, 2])
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_local_launch_writes_a_valid_metrics_file(tmp_path, tf_python, framework, nodes):
    records = run_cell(tmp_path, tf_python, cell(framework, nodes))
    summary = records[-1]["value"]
    assert summary["status"] == "ok" and summary["world_size"] == nodes
    starts = [r for r in records if r["event"] == "rank_start"]
    ends = [r for r in records if r["event"] == "rank_end"]
    assert (
        sorted(r["rank"] for r in starts) == sorted(r["rank"] for r in ends) == list(range(nodes))
    )
    assert all(e["value"]["throughput_samples_per_s"] > 0 for e in ends)
    assert len([r for r in records if r["event"] == "step"]) == 2 * nodes
    first = starts[0]["value"]
    assert first["param_count"] == TORCH_PARAMS["cnn_small"]
    assert first["data_layout"] == "NHWC" and first["input_shape"] == [3, 32, 32]
    assert first["libraries"]["tensorflow"] == "2.21.0"
    assert ("tf_keras" if framework == "keras" else "keras") in first["libraries"]
    if nodes > 1:
        assert "MultiWorkerMirroredStrategy" in first["backend"]
    else:  # world size 1: TensorFlow's default strategy, no cluster (the single-device baseline)
        assert first["backend"] == "none (world size 1)"
    build = first["system"]["framework_build"]  # TF's build info, by each node's first rank
    assert build["available"] and build["framework"] == "tensorflow"
    assert build["version"] == "2.21.0" and "is_cuda_build" in build["build"]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_bf16_uses_the_mixed_bfloat16_policy(tmp_path, tf_python, framework):
    records = run_cell(
        tmp_path, tf_python, cell(framework, 1, model="transformer_small", precision="bf16")
    )
    start = next(r for r in records if r["event"] == "rank_start")["value"]
    assert start["autocast"] == "bfloat16" and start["data_layout"] == "tokens"
    assert start["param_count"] == TORCH_PARAMS["transformer_small"]


# ----------------------------------------------------------------------------- gradients, faults
RANK = """
    import sys
    import numpy as np
    from dlscale.registry.frameworks import get_adapter
    from dlscale.frameworks.train_spec import TrainSpec
    from dlscale.rank.rank_context import discover
    framework, out = sys.argv[1], sys.argv[2]
    ctx = discover()
    spec = TrainSpec(framework=framework, model="cnn_small", per_rank_batch=4, warmup_steps=0,
                     steps=1, precision="fp32", device="cpu", threads=1, learning_rate=0.01,
                     momentum=0.9)
    adapter = get_adapter(framework)(spec, ctx)
    adapter.setup()
    w0 = [v.numpy() for v in adapter.model.trainable_variables]
    adapter.step(); adapter.sync(); adapter.barrier()
    w1 = [v.numpy() for v in adapter.model.trainable_variables]
    np.savez(f"{out}/rank{ctx.rank}.npz", x=np.asarray(adapter.x), y=np.asarray(adapter.y),
             **{f"w0_{i}": w for i, w in enumerate(w0)}, **{f"w1_{i}": w for i, w in enumerate(w1)})
    adapter.teardown()
"""

# p1 must be p0 - lr * mean over ranks of each rank's gradient on its own batch (SGD momentum's
# first step), not p0 - lr * (this rank's gradient).
EXPECT = """
    import json, sys
    import numpy as np
    import tensorflow as tf
    from dlscale.models.tf import build
    out, world = sys.argv[1], 2
    d = [np.load(f"{out}/rank{r}.npz") for r in range(world)]
    n = len([k for k in d[0].files if k.startswith("w0_")])
    m = build("cnn_small")
    for i, v in enumerate(m.trainable_variables):
        v.assign(d[0][f"w0_{i}"])
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    grads = []
    for r in range(world):
        with tf.GradientTape() as tape:
            value = loss(d[r]["y"], m(d[r]["x"], training=True))
        grads.append([g.numpy() for g in tape.gradient(value, m.trainable_variables)])
    mean = [sum(gs) / world for gs in zip(*grads)]
    w = lambda r, s, i: d[r][f"w{s}_{i}"]
    pairs = [(r, i) for r in range(world) for i in range(n)]
    print("EXPECT " + json.dumps({
        "same_init": all(np.array_equal(w(0, 0, i), w(r, 0, i)) for r, i in pairs),
        "same_after": all(np.array_equal(w(0, 1, i), w(r, 1, i)) for r, i in pairs),
        "different_data": not np.array_equal(d[0]["x"], d[1]["x"]),
        "err_mean": max(float(np.abs(w(0, 1, i) - (w(0, 0, i) - 0.01 * mean[i])).max())
                        for i in range(n)),
        "err_rank0": max(float(np.abs(w(0, 1, i) - (w(0, 0, i) - 0.01 * grads[0][i])).max())
                         for i in range(n)),
        "update": max(float(np.abs(0.01 * mean[i]).max()) for i in range(n))}))
"""


def start_ranks(python: Path, argv_of, tmp_path: Path, world: int = 2, **extra: str):
    port = ports.local_port(world)  # production's chooser: below the ephemeral range
    procs = []
    for rank in range(world):
        env = tf_env(
            legacy=False,
            DLSCALE_LAUNCHER="local",
            DLSCALE_RANK=str(rank),
            DLSCALE_WORLD_SIZE=str(world),
            DLSCALE_LOCAL_RANK="0",
            DLSCALE_LOCAL_WORLD_SIZE="1",
            DLSCALE_NODE_INDEX=str(rank),
            MASTER_ADDR="127.0.0.1",
            DLSCALE_HOSTS=",".join(["127.0.0.1"] * world),
            MASTER_PORT=str(port),
            **extra,
        )
        env.pop("TF_USE_LEGACY_KERAS")  # each adapter chooses its Keras
        log = (tmp_path / f"rank{rank}.log").open("w")
        procs.append(
            subprocess.Popen(
                [str(python), *argv_of(rank)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=tmp_path,
                start_new_session=True,  # stopped as the launcher stops ranks (wait_ranks)
            )
        )
    return procs


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_gradients_are_averaged_across_ranks(tmp_path, tf_python, framework):
    procs = start_ranks(
        tf_python, lambda r: ["-c", textwrap.dedent(RANK), framework, str(tmp_path)], tmp_path
    )
    codes = wait_ranks(procs, timeout=600)
    logs = "\n".join((tmp_path / f"rank{r}.log").read_text()[-2000:] for r in range(2))
    assert codes == [0, 0], logs
    out = run_tf(tf_python, EXPECT, str(tmp_path), legacy=framework == "keras")
    got = json.loads(next(line for line in out.splitlines() if line.startswith("EXPECT "))[7:])
    assert got["different_data"] and got["same_init"] and got["same_after"], got
    assert got["err_mean"] < 1e-2 * got["update"], got  # p1 = p0 - lr * mean gradient
    assert got["err_rank0"] > 10 * got["err_mean"], got  # ... and not the local gradient


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_dead_peer_fails_the_surviving_rank(tmp_path, tf_python, framework):
    """Rank 1 exits before step 3 (DLSCALE_FAULT); rank 0, with no launcher to stop it, must fail
    on its own within the collective timeout instead of hanging."""
    spec_file = tmp_path / "cell.json"
    spec_file.write_text(
        json.dumps(cell_dict(framework=framework, nodes=2, warmup_steps=2, steps=3))
    )
    argv = [
        "-m",
        "dlscale.run.train",
        "--cell",
        str(spec_file),
        "--rank-dir",
        str(tmp_path / "ranks"),
    ]
    procs = start_ranks(
        tf_python,
        lambda r: argv,
        tmp_path,
        DLSCALE_FAULT="ranks:1:3:7",
        DLSCALE_COLLECTIVE_TIMEOUT_S="60",
    )
    assert procs[1].wait(timeout=600) == 7
    died = time.monotonic()
    try:
        code = procs[0].wait(timeout=240)
    except subprocess.TimeoutExpired:
        procs[0].kill()
        pytest.fail("rank 0 still running 240 s after its peer died")
    assert code != 0, (tmp_path / "rank0.log").read_text()[-2000:]
    assert time.monotonic() - died < 240


def test_keras_adapter_refuses_keras_3(tf_python):
    """The keras adapter runs legacy Keras 2 only; with Keras 3 already loaded it says so."""
    out = run_tf(
        tf_python,
        """
        import tensorflow as tf
        tf.keras.layers.Dense  # resolve tf.keras to Keras 3 first
        from dlscale.registry.frameworks import get_adapter
        from dlscale.frameworks.base import RankContext
        from dlscale.frameworks.train_spec import TrainSpec
        spec = TrainSpec(framework="keras", model="cnn_small", per_rank_batch=2, warmup_steps=0,
                         steps=1, precision="fp32", device="cpu", threads=1, learning_rate=0.01,
                         momentum=0.9)
        ctx = RankContext(rank=0, world_size=1, local_rank=0, local_world_size=1, node_index=0,
                          node="n", master_addr="127.0.0.1", master_port=1, launcher="none",
                          hosts=("127.0.0.1",))
        try:
            get_adapter("keras")(spec, ctx).setup()
        except RuntimeError as exc:
            print("REFUSED", exc)
    """,
    )
    assert "REFUSED" in out and "legacy Keras 2" in out


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
