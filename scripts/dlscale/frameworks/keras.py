"""Keras adapter: Keras `Model.fit`'s training step under tf.distribute.MultiWorkerMirroredStrategy.

Keras version and backend: legacy Keras 2 -- the `tf-keras` package (tf_keras 2.21.0), selected
with TF_USE_LEGACY_KERAS=1 before TensorFlow is imported -- on the TensorFlow 2.21 backend. Not
Keras 3: Keras 3's `fit` under MultiWorkerMirroredStrategy fails with "unsupported type
PerReplica" (keras-team/keras#20585), while tf_keras' `fit` is the multi-worker code path that
TensorFlow documents and tests. (The `tensorflow` adapter runs Keras 3 layers in a custom loop.)

Distribution: the same MWMS set-up as the tensorflow adapter (TF_CONFIG from the RankContext, RING
over gRPC on CPU / NCCL on GPU, bounded collectives; helpers from dlscale.frameworks.tensorflow).
The model is built and compiled in `strategy.scope()`: SGD (the config's learning rate and
momentum: spec.learning_rate, spec.momentum), sparse categorical cross-entropy from logits; under
the strategy tf_keras scales the loss by 1/replicas and its optimizer sums the gradients over all
replicas (= the mean gradient, as DDP). Precision: `mixed_bfloat16` for bf16; `mixed_float16`
(compile adds the loss-scale optimizer) on GPU only, and there without the compute-only breakdown
(has_breakdown, as the tensorflow adapter).

What one step is -- and why not `fit(epochs=1, steps_per_epoch=1)`: each `fit` call rebuilds the
data handler, callbacks, progress logging and distributed iterator, which would be timed as
training. `train_on_batch` is not usable either: under MWMS it builds and auto-shards a one-element
dataset per call, so workers would not each get their own batch. Instead the adapter compiles the
model and takes `model.make_train_function()` -- the very `tf.function` that `fit` calls once per
step (forward, compiled loss, `optimizer.minimize` with gradient aggregation, metrics) and that
`fit` would reuse -- and calls it on an iterator over the rank's fixed batch, distributed with
`strategy.distribute_datasets_from_function` (each worker its own per-replica batch, like a
per-worker input pipeline). So each step is exactly one step of `fit`'s training loop, minus
fit's per-step Python callbacks. The returned loss is fetched to the host, so `step()` returns
only when the step has run.
"""

from __future__ import annotations

import os

# Before TensorFlow is imported (also by the helpers' module): legacy Keras 2 as tf.keras.
os.environ["TF_USE_LEGACY_KERAS"] = "1"

import tensorflow as tf  # noqa: E402

from dlscale.frameworks import tensorflow as tfa  # noqa: E402

_SGD_BASE = tf.keras.optimizers.SGD if tfa.uses_legacy_keras() else object


class _SGD(_SGD_BASE):
    """tf_keras SGD whose `apply_gradients` can skip the cross-replica aggregation (for the
    compute-only breakdown only; `skip_aggregation` is False in every timed step, where this is
    stock SGD)."""

    skip_aggregation = False

    def apply_gradients(
        self, grads_and_vars, name=None, skip_gradients_aggregation=False, **kwargs
    ):
        return super().apply_gradients(
            grads_and_vars,
            name=name,
            skip_gradients_aggregation=skip_gradients_aggregation or self.skip_aggregation,
            **kwargs,
        )


class Adapter(tfa.Adapter):
    name = "keras"
    title = "Keras (tf_keras)"
    legacy_keras = True
    compile_method = "XLA: Model.compile(jit_compile=True), fit's train function compiled"

    def cannot_compile_here(self) -> str | None:
        # fit's train function holds the gradient all-reduce, which XLA compiles only for
        # NCCL collectives (TensorFlow: "Only compiling NCCL/auto collective is supported")
        if self.data_parallel and self.spec.device != "cuda":
            return (
                "XLA compiles fit's gradient all-reduce only as NCCL collectives (GPUs); "
                "on CPUs MultiWorkerMirroredStrategy uses RING collectives"
            )
        return None

    breakdown_method = (
        "a second Model.make_train_function() traced with the optimizer's "
        "gradient all-reduce skipped (tf_keras skip_gradients_aggregation); "
        "fit's per-step all-reduce of its loss metric (scalars) remains"
    )

    def setup(self) -> None:
        self._setup_common()
        spec, strategy, model = self.spec, self.strategy, self.model
        with strategy.scope():
            self.optimizer = _SGD(learning_rate=spec.learning_rate, momentum=spec.momentum)
            model.compile(
                optimizer=self.optimizer,
                loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                steps_per_execution=1,
                jit_compile=self.compiled,
            )
        dataset = tf.data.Dataset.from_tensors((self.x, self.y)).repeat()
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        dataset = dataset.with_options(options)
        distributed = strategy.distribute_datasets_from_function(lambda _input_context: dataset)
        self.iterator = iter(distributed)
        self.train_function = model.make_train_function()
        with strategy.scope():
            self.optimizer.build(model.trainable_variables)
        self._local_train_function = None
        self._setup_convergence()
        if self.has_breakdown(spec):
            # the compute-only step's own train function, traced (not run) now so that no
            # tracing is timed; fit's function stays the model's train_function
            self._local_train_function = model.make_train_function(force=True)
            model.train_function = self.train_function
            self.optimizer.skip_aggregation = True  # read while the function traces
            try:
                self._local_train_function.get_concrete_function(self.iterator)
            finally:
                self.optimizer.skip_aggregation = False

    # ---- the convergence contract: the tensorflow adapter's (data, evaluation, collectives),
    # with fit's own step
    convergence_method = (
        "epochs over the rank's tf.data pipeline of the training split (dlscale.data.tf_data, "
        "as the tensorflow adapter), a custom loop calling Model.train_step -- fit's own step: "
        "compiled loss scaled by 1/replicas, optimizer.minimize with the gradient all-reduce, "
        "the loss metric -- under strategy.run in one tf.function per batch, the learning rate "
        "of each step set from dlscale.study.lr; not Model.fit, whose data handler, callbacks and "
        "validation would sit inside its epochs (the clock of time-to-accuracy holds training "
        "only) and whose schedules change the rate per epoch, not per step as dlscale.study.lr does"
    )

    def _setup_convergence(self) -> None:
        strategy, model = self.strategy, self.model

        @tf.function
        def conv_step(x, y):
            def replica_fn(x, y):
                for metric in model.metrics:  # the loss metric then holds this batch only
                    metric.reset_state()
                return model.train_step((x, y))["loss"]  # the replica's mean loss

            out = strategy.run(replica_fn, args=(x, y))
            return strategy.experimental_local_results(out)[0]

        def forward_backward(x, y):
            with tf.GradientTape() as tape:
                loss = model.compute_loss(x, y, model(x, training=True))
            return tape.gradient(loss, model.trainable_variables)

        self._conv_step, self._conv_loss_scale = conv_step, self.spec.per_rank_batch
        self._forward_backward_fn = forward_backward

    def _run(self, function) -> None:
        with self.strategy.scope():
            logs = function(self.iterator)
        logs["loss"].numpy()  # the loss fetched: the step has finished (StepTimer)

    def step(self) -> None:
        self._run(self.train_function)

    def step_without_allreduce(self) -> None:
        if self._local_train_function is None:  # fp16: compile wraps the optimizer in a
            # loss-scale one, whose local path is not validated (has_breakdown)
            raise RuntimeError(f"{self.name}: no compute-only step under {self.spec.precision}")
        self._run(self._local_train_function)
