"""TensorFlow adapter: tf.distribute.MultiWorkerMirroredStrategy with a custom training loop.

Distribution. One rank is one MultiWorkerMirroredStrategy (MWMS) worker with one replica (its
CPU, or its local GPU). TF_CONFIG is built from the RankContext: every rank's host:port
(RankContext.rank_address with base port MASTER_PORT + 1, clear of the launcher's MASTER_PORT) and
this rank's task index; MWMS runs for one rank too, so every cell runs the same code. Collectives:
RING over gRPC on CPU, NCCL on GPU, each bounded by DLSCALE_COLLECTIVE_TIMEOUT_S (default 300 s);
the start-up wait for the other workers is bounded by the same time (MWMS waits forever by
default), and MWMS's health-check thread aborts collectives when a peer dies. Model variables are
created in `strategy.scope()`: MWMS broadcasts worker 0's initial values, as DDP does.

Step. TensorFlow's custom-training-loop idiom: a `tf.function` that runs, under `strategy.run`, on
the rank's fixed batch: forward (training mode), per-example sparse cross-entropy averaged over the
GLOBAL batch (`tf.nn.compute_average_loss`), gradient tape, and Keras SGD (the config's learning
rate and momentum: spec.learning_rate, spec.momentum) `apply_gradients`, which all-reduces (sums)
the gradients over all replicas before updating; the sum of global-batch-averaged gradients is the
mean of the ranks' local-mean gradients, as in PyTorch DDP. `step()` fetches the loss to the host,
so it returns only when the step has run (on CPU TensorFlow executes the whole function, update
included, before returning; on GPU `sync()` also waits for the device).

Keras: the Keras 3 that TensorFlow 2.21 uses as `tf.keras` (the `keras` adapter, sharing this
module's helpers, uses legacy Keras 2 = tf_keras). Models: dlscale.models.tf, NHWC. Precision:
bf16 is the Keras mixed-precision policy `mixed_bfloat16` (float32 variables, bfloat16 compute,
float32 logits and loss); fp16 (`mixed_float16` + loss-scale optimizer) only on GPU (the base's
precision check refuses it on CPU, from Adapter.precisions / cuda_only).

Optional probes (timing.run_timed): `allreduce(numel)` is a replica-context all-reduce (sum) of a
float32 buffer through the same strategy; `step_without_allreduce()` is the same step with the
gradients applied locally (computed under `strategy.run`, applied in cross-replica context,
where Keras' optimizer does not aggregate). Not under fp16 (has_breakdown: the loss-scale
optimizer's local path is not validated).
"""

from __future__ import annotations

import json
import os
import sys
import time

# Before TensorFlow is imported: TensorFlow's default Keras (Keras 3), unless the keras adapter,
# which imports this module for its helpers, asked for legacy Keras first. A stray
# TF_USE_LEGACY_KERAS=1 in a tensorflow rank's environment fails in setup() (check_keras).
os.environ.setdefault("TF_USE_LEGACY_KERAS", "0")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import numpy  # noqa: E402
import tensorflow as tf  # noqa: E402

from dlscale.frameworks.base import Adapter as BaseAdapter
from dlscale.models import get_spec  # noqa: E402
from dlscale.rank.provenance import cpu_model  # noqa: E402
from dlscale.rank.timing import COLLECTIVE_TIMEOUT_S  # noqa: E402

AUTOCAST = {"mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}  # policy -> compute dtype
TEARDOWN_GRACE_S = 1.0
DATA = "synthetic (one fixed batch per rank, generated on the device)"


# ----------------------------------------------------------------------------- shared helpers
def uses_legacy_keras() -> bool:
    """Whether `tf.keras` is legacy Keras 2 (tf_keras) in this process."""
    return tf.keras.layers.Layer.__module__.startswith("tf_keras")


def check_keras(legacy: bool, adapter: str) -> None:
    if uses_legacy_keras() != legacy:
        raise RuntimeError(
            f"the {adapter} adapter needs {'legacy Keras 2 (tf_keras)' if legacy else 'Keras 3'} "
            f"as tf.keras, but this process has the other one: set TF_USE_LEGACY_KERAS="
            f"{'1' if legacy else '0'} (or leave it unset) before TensorFlow is imported"
        )


def keras_versions() -> dict:
    """The version of the Keras in use, under its distribution's name."""
    if uses_legacy_keras():
        import tf_keras

        return {"tf_keras": tf_keras.__version__}
    import keras

    return {"keras": keras.__version__}


def configure_runtime(adapter) -> None:
    """Threads and visible devices; must run before the TensorFlow runtime starts. A cuda rank
    keeps one GPU, chosen by dlscale.rank.devices.pick_gpu over the GPUs TensorFlow sees
    (adapter.choose_gpu, which records the board: TensorFlow reports its name only)."""
    spec = adapter.spec
    tf.config.threading.set_intra_op_parallelism_threads(spec.threads)
    tf.config.threading.set_inter_op_parallelism_threads(spec.threads)
    gpus = tf.config.list_physical_devices("GPU")
    if spec.device == "cuda":

        def identify(ordinal):
            details = tf.config.experimental.get_device_details(gpus[ordinal])
            return {"name": details.get("device_name")}

        ordinal = adapter.choose_gpu(len(gpus), identify)
        tf.config.set_visible_devices(gpus[ordinal], "GPU")
        tf.config.experimental.set_memory_growth(gpus[ordinal], True)
    elif gpus:
        tf.config.set_visible_devices([], "GPU")


def make_strategy(spec, ctx):
    """MWMS over all ranks. Returns (strategy, backend description)."""
    workers = [ctx.rank_address(i, ctx.master_port + 1) for i in range(ctx.world_size)]
    os.environ["TF_CONFIG"] = json.dumps(
        {"cluster": {"worker": workers}, "task": {"type": "worker", "index": ctx.rank}}
    )
    impl = tf.distribute.experimental.CommunicationImplementation
    implementation = impl.NCCL if spec.device == "cuda" else impl.RING
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=implementation, timeout_seconds=COLLECTIVE_TIMEOUT_S
    )
    # Bound the start-up wait for the other workers: a private class attribute of MWMS's
    # implementation (default 0 = wait forever); skipped if a TensorFlow release drops it.
    from tensorflow.python.distribute import collective_all_reduce_strategy as cars

    extended = getattr(cars, "CollectiveAllReduceExtended", None)
    if extended is not None and hasattr(extended, "_check_health_initial_timeout"):
        extended._check_health_initial_timeout = COLLECTIVE_TIMEOUT_S
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    if strategy.num_replicas_in_sync != ctx.world_size:
        raise RuntimeError(
            f"MultiWorkerMirroredStrategy has {strategy.num_replicas_in_sync} "
            f"replicas, the cell has {ctx.world_size} ranks"
        )
    backend = (
        f"tf.distribute.MultiWorkerMirroredStrategy, {implementation.name} collectives"
        f"{' over gRPC' if spec.device != 'cuda' else ''}"
    )
    return strategy, backend


def set_precision_policy(policy: str | None) -> str | None:
    tf.keras.mixed_precision.set_global_policy(policy or "float32")
    return policy


def make_collectives(strategy):
    """(barrier, allreduce) tf.functions through the strategy's collectives."""

    @tf.function
    def barrier():
        ones = strategy.run(lambda: tf.ones([], tf.float32))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, ones, axis=None)

    @tf.function
    def allreduce(buf):
        def replica_fn(b):
            b = tf.identity(b)  # placed on the replica's device (all_reduce needs one)
            return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, b)

        out = strategy.run(replica_fn, args=(buf,))
        return strategy.experimental_local_results(out)[0][:1]  # a depending output, 4 bytes

    return barrier, allreduce


def stop_health_check(strategy) -> None:
    """Stop MWMS's peer health-check thread so that ranks finishing at slightly different times
    do not abort each other's collectives on the way out."""
    stop = getattr(getattr(strategy, "extended", None), "_stop_check_health_thread", None)
    if stop is not None:
        try:
            stop()
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass


def leave_together() -> None:
    """Every worker waits here, at the end of a rank that did not fail, for all the others. The
    ring all-reduce pulls: a worker whose share of the last collective is done may still be
    serving a peer's RecvBuf of it, and exiting then resets that peer's connection (seen in CI:
    rank 0's last allreduce probe failed with "Connection reset by peer" once rank 1 had
    finished). The barrier is the coordination service's (worker 0 hosts it), not a collective,
    so passing it means every worker's collectives are over. Bounded by the collectives'
    timeout; a failed rank skips it (its peers are stopped by the launcher, or time out)."""
    from tensorflow.python.eager import context

    context.context().wait_at_barrier("dlscale_leave_together", COLLECTIVE_TIMEOUT_S * 1000)


class Batches:
    """A tf.data dataset of one rank's batches with its length (batches per epoch), as
    dlscale.run.convergence_loop needs; each iteration is one pass (the training dataset reshuffles
    on
    every iteration: dlscale.data.tf_data)."""

    def __init__(self, dataset, batches: int):
        self.dataset, self.batches = dataset, batches

    def __len__(self) -> int:
        return self.batches

    def __iter__(self):
        return iter(self.dataset)


class EpochSampler:
    """dlscale.run.convergence_loop calls set_epoch(e) before each epoch: tf.data reshuffles a
    rank's fixed
    part on every iteration by itself (seed + rank), so there is nothing to set."""

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch


def make_gather(strategy):
    """A tf.function that gathers a float64 vector from every replica (one per rank):
    (world_size, k) on every rank, through the strategy's collectives."""

    @tf.function
    def gather(values):
        def replica_fn(v):
            v = tf.identity(v)
            return tf.distribute.get_replica_context().all_gather(v[None, :], axis=0)

        out = strategy.run(replica_fn, args=(values,))
        return strategy.experimental_local_results(out)[0]

    return gather


def device_model(spec) -> str:
    if spec.device == "cuda":
        gpus = tf.config.get_visible_devices("GPU")
        if gpus:
            details = tf.config.experimental.get_device_details(gpus[0])
            return details.get("device_name", gpus[0].name)
    return cpu_model()


# ----------------------------------------------------------------------------- the adapter
class Adapter(BaseAdapter):
    name = "tensorflow"
    title = "TensorFlow"
    legacy_keras = False
    precisions = {"fp32": None, "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}  # policies
    cuda_only = {"fp16": "mixed_float16 on CPU is not a meaningful measurement"}
    has_allreduce_probe = True
    breakdown_method = (
        "the same tf.function step with the gradients applied locally (computed "
        "under strategy.run, applied in cross-replica context: no all-reduce)"
    )

    compile_method = (
        "XLA: the forward and backward pass as a tf.function(jit_compile=True) inside the "
        "step (the gradient all-reduce and the update stay outside it)"
    )

    # ---- the convergence contract (base.Adapter; run by dlscale.run.convergence_loop)
    convergence_method = (
        "epochs over the rank's tf.data pipeline of the training split (dlscale.data.tf_data: "
        "a fixed part per rank, reshuffled every epoch from seed + rank), the custom loop's "
        "tf.function step under MultiWorkerMirroredStrategy (the throughput step) with the "
        "learning rate of each step set from dlscale.study.lr, validation in replica context "
        "with rank 0's normalisation statistics, counts summed by all_gather"
    )

    def data_loaders(self, info, *, workers: int, seed: int):
        # `workers`: tf.data has no worker processes; its map runs on TensorFlow's own threads
        # (AUTOTUNE), bounded by the rank's intra-op threads
        from dlscale.data.tf_data import make_dataset

        rank, world, batch = self.ctx.rank, self.ctx.world_size, self.spec.per_rank_batch
        train = make_dataset(info, "train", rank, world, batch, seed=seed)
        val = make_dataset(info, "val", rank, world, batch, seed=seed, train=False)
        steps = (info.samples("train") // world) // batch
        return Batches(train, steps), EpochSampler(), val

    def _convergence_functions(self) -> None:
        """The evaluation step and the gather, traced lazily (outside the clock: the first
        validation and the first all-reduce follow the first epoch's synchronisation)."""
        if getattr(self, "_predict", None) is not None:
            return
        strategy, model = self.strategy, self.model

        @tf.function(reduce_retracing=True)
        def predict(x, y):
            def replica_fn(x, y):
                logits = model(x, training=False)
                hits = tf.equal(tf.argmax(logits, axis=1), tf.cast(y, tf.int64))
                return tf.reduce_sum(tf.cast(hits, tf.int64))

            out = strategy.run(replica_fn, args=(x, y))
            return strategy.experimental_local_results(out)[0]

        self._predict = predict
        self._gather = make_gather(strategy) if self.data_parallel else None

    def set_learning_rate(self, learning_rate: float) -> None:
        self.optimizer.learning_rate.assign(learning_rate)

    def train_batch(self, batch, learning_rate: float):
        x, y = batch
        self.set_learning_rate(learning_rate)
        return self._conv_step(x, y) * self._conv_loss_scale, int(y.shape[0])

    def _saved_state(self) -> list:
        return [tf.identity(v) for v in self.model.non_trainable_variables]

    def _restore_state(self, saved: list) -> None:
        for v, value in zip(self.model.non_trainable_variables, saved):
            v.assign(value)

    def warmup_pass(self, batch) -> None:
        """The step's tf.function traced (not run) on the batch's shapes, then one forward and
        backward pass without update; the normalisation statistics it moved are restored."""
        x, y = batch
        self._convergence_functions()
        self._conv_step.get_concrete_function(x, y)
        saved = self._saved_state()
        self.strategy.run(self._forward_backward_fn, args=(x, y))
        self._restore_state(saved)

    def _broadcast_stats(self) -> None:
        """Rank 0's normalisation statistics on every rank (each rank's last training forward
        moved its own), so that every shard is evaluated by the same model, as in the PyTorch
        adapters: the floating non-trainable variables in one all_gather, row 0 assigned."""
        variables = [v for v in self.model.non_trainable_variables if "float" in str(v.dtype)]
        if not self.data_parallel or not variables:
            return
        with tf.device(self.device_name):
            flat = tf.concat([tf.reshape(tf.cast(v, tf.float64), [-1]) for v in variables], 0)
        first, offset = self._gather(flat)[0], 0
        for v in variables:
            size = int(numpy.prod(v.shape))
            v.assign(tf.cast(tf.reshape(first[offset : offset + size], v.shape), v.dtype))
            offset += size

    def evaluate(self, batches) -> tuple[int, int]:
        self._convergence_functions()
        self._broadcast_stats()
        correct, count = 0, 0
        for x, y in batches:
            correct += int(self._predict(x, y).numpy())
            count += int(y.shape[0])
        return correct, count

    def to_host(self, value) -> float:
        return float(value.numpy()) if hasattr(value, "numpy") else float(value)

    def _gathered(self, values: list[float]):
        if not self.data_parallel:
            return numpy.array([[float(v) for v in values]])
        self._convergence_functions()
        with tf.device(self.device_name):
            local = tf.constant([float(v) for v in values], tf.float64)
        return self._gather(local).numpy()

    def allreduce_sum(self, values: list[float]) -> list[float]:
        return self._gathered(values).sum(axis=0).tolist()

    def allreduce_max(self, values: list[float]) -> list[float]:
        return self._gathered(values).max(axis=0).tolist()

    def wrapper(self) -> str:
        if self.data_parallel:
            return "tf.distribute.MultiWorkerMirroredStrategy"
        return "none (world size 1: TensorFlow's default strategy)"

    def fast_paths(self) -> dict:
        return {
            "xla": self.compiled,
            "tf32": bool(tf.config.experimental.is_tensor_float_32_execution_enabled())
            if self.spec.device == "cuda"
            else None,
            "data_layout": "NHWC",
        }

    @classmethod
    def has_breakdown(cls, spec) -> bool:
        # not under fp16: the loss-scale optimizer's local path is not validated
        return spec.precision != "fp16" and super().has_breakdown(spec)

    def seed_framework(self, seed: int) -> None:
        # Python's, NumPy's and TensorFlow's generators and Keras' own: Keras 3's initializers
        # draw from its global SeedGenerator, which tf.random.set_seed alone leaves unseeded
        # (two runs of one seed then started from different weights)
        tf.keras.utils.set_random_seed(seed)

    # -- shared set-up, also used by the keras adapter
    def _setup_common(self) -> None:
        spec, ctx = self.spec, self.ctx
        check_keras(self.legacy_keras, self.name)
        configure_runtime(self)
        # seed + rank as in every adapter; the initial weights are worker 0's on every rank all
        # the same: MWMS broadcasts variables' initial values (so, under Keras 3, are the
        # dropout layers' seed states, which are variables too).
        self.seed()
        if self.data_parallel:
            self.strategy, self.backend = make_strategy(spec, ctx)
        else:  # world size 1: TensorFlow's default strategy, no cluster, no all-reduce
            self.strategy, self.backend = tf.distribute.get_strategy(), "none (world size 1)"
        self.policy = set_precision_policy(self.precision_dtype)
        self.device_name = "/GPU:0" if spec.device == "cuda" else "/CPU:0"
        if spec.device == "cuda":
            self.sync_method = (
                "tf.test.experimental.sync_devices, after the step's loss is fetched to the host"
            )
        else:
            self.sync_method = (
                "the step's loss is fetched to the host (CPU ops are synchronous: "
                "the gradient all-reduce and the update run before it returns)"
            )
        self._barrier, self._allreduce = make_collectives(self.strategy)
        self._probe_buf = None
        self.model_spec = get_spec(spec.model)
        from dlscale.models.tf import build, example_batch, param_count

        with self.strategy.scope():
            self.model = build(spec.model)
        self.param_count = param_count(self.model)
        with tf.device(self.device_name):
            # one fixed batch per rank, different on every rank, created once on the device
            self.x, self.y = example_batch(
                self.model_spec, spec.per_rank_batch, seed=spec.seed * 100003 + ctx.rank
            )

    def setup(self) -> None:
        self._setup_common()
        spec, strategy, model = self.spec, self.strategy, self.model
        with strategy.scope():
            optimizer = tf.keras.optimizers.SGD(
                learning_rate=spec.learning_rate, momentum=spec.momentum
            )
            if spec.precision == "fp16":
                optimizer = tf.keras.mixed_precision.LossScaleOptimizer(optimizer)
        self.optimizer = optimizer
        global_batch = spec.per_rank_batch * self.ctx.world_size
        loss_scaled = spec.precision == "fp16"
        loss_obj = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

        def forward_backward(x, y):
            with tf.GradientTape() as tape:
                logits = model(x, training=True)
                per_example = loss_obj(y, tf.cast(logits, tf.float32))
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
                scaled = optimizer.scale_loss(loss) if loss_scaled else loss
            return loss, tape.gradient(scaled, model.trainable_variables)

        if self.compiled:  # XLA for the forward and backward pass (not the update's all-reduce)
            forward_backward = tf.function(forward_backward, jit_compile=True)

        def replica_step(x, y):
            loss, grads = forward_backward(x, y)
            # in replica context Keras' optimizer sums the gradients over all replicas first
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        @tf.function
        def train_step(x, y):
            per_replica = strategy.run(replica_step, args=(x, y))
            # this replica's loss: no extra cross-worker reduction (DDP has none either)
            return strategy.experimental_local_results(per_replica)[0]

        @tf.function
        def local_step(x, y):
            loss, grads = strategy.run(forward_backward, args=(x, y))
            grads = [strategy.experimental_local_results(g)[0] for g in grads]
            optimizer.apply_gradients(zip(grads, model.trainable_variables))  # cross-replica
            return strategy.experimental_local_results(loss)[0]

        self._train_step, self._local_step = train_step, local_step
        # convergence: the same step; its loss is the replica's per-example sum / global batch
        self._conv_step, self._conv_loss_scale = train_step, global_batch
        self._forward_backward_fn = forward_backward
        with strategy.scope():
            optimizer.build(model.trainable_variables)
        if self.has_breakdown(spec):
            # trace (without running) the compute-only step now, so that no tracing is timed
            local_step.get_concrete_function(self.x, self.y)

    def step(self) -> None:
        self._train_step(self.x, self.y).numpy()  # the loss fetched: the step has finished

    def step_without_allreduce(self) -> None:
        if not self.has_breakdown(self.spec):
            raise RuntimeError(f"{self.name}: no compute-only step under {self.spec.precision}")
        self._local_step(self.x, self.y).numpy()  # as step

    def allreduce(self, numel: int) -> None:
        if self._probe_buf is None or int(self._probe_buf.shape[0]) != numel:
            with tf.device(self.device_name):
                self._probe_buf = tf.ones([numel], tf.float32)
        self._allreduce(self._probe_buf).numpy()
        self.sync()

    def sync(self) -> None:
        if self.spec.device == "cuda":
            tf.test.experimental.sync_devices()

    def barrier(self) -> None:
        if not self.data_parallel:
            return
        total = float(self._barrier().numpy())
        if round(total) != self.ctx.world_size:
            raise RuntimeError(f"barrier all-reduce gave {total}, expected {self.ctx.world_size}")

    def peak_device_memory_mb(self) -> float | None:
        if self.spec.device == "cuda":
            return tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20
        return None

    def teardown(self) -> None:
        if getattr(self, "strategy", None) is None:
            return
        stop_health_check(self.strategy)
        if self.ctx.world_size == 1:
            return
        if sys.exc_info()[0] is None:  # a failing rank does not wait for its peers
            leave_together()
        if self.ctx.rank == 0:
            # worker 0 hosts TensorFlow's coordination service: leave the others a moment
            # to exit first, so that they do not log lost-leader errors on the way out
            time.sleep(TEARDOWN_GRACE_S)

    def build_info(self) -> dict:
        info = {k: str(v) for k, v in tf.sysconfig.get_build_info().items()}
        return {
            "available": True,
            "framework": "tensorflow",
            "version": tf.__version__,
            "cuda_runtime": info.get("cuda_version"),
            "cudnn": info.get("cudnn_version"),
            "nccl": None,  # TF's build info does not name an NCCL version
            "build": info,
            "compiler": tf.version.COMPILER_VERSION,
            "git_version": tf.version.GIT_VERSION,
        }

    def describe(self) -> dict:
        vision = self.model_spec.family == "vision"
        return {
            "libraries": {
                "tensorflow": tf.__version__,
                **keras_versions(),
                "numpy": numpy.__version__,
            },
            "backend": self.backend,
            "device_model": device_model(self.spec),
            "data_layout": "NHWC" if vision else "tokens",
            "input_shape": list(self.model_spec.input_shape),
            "param_count": self.param_count,
            "data": DATA,
            "sync_method": self.sync_method,
            "autocast": AUTOCAST.get(self.policy),
        }
