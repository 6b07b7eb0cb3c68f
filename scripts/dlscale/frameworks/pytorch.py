"""PyTorch DistributedDataParallel adapter: gloo on CPU, NCCL on CUDA, TCP rendezvous at
MASTER_ADDR:MASTER_PORT; the cell's optimizer (spec.optimizer, dlscale.registry.optimizers):
SGD with the config's learning rate and momentum, or AdamW (fused on CUDA, foreach on CPUs)
with its gradients' total norm clipped (spec.grad_clip_norm; over shards and stages:
torch_parallel.gradient_clipper); collectives bounded by DLSCALE_COLLECTIVE_TIMEOUT_S
(dlscale.rank.timing.COLLECTIVE_TIMEOUT_S).

Under fsdp and hsdp a model with init_weights() (the decoders) is built on the meta device,
sharded by fully_shard and only then materialised, its shards drawn with the values one process
draws (dlscale.models.torch.seeded_init); a bf16 or fp16 cell under fully_shard takes its
precision from FSDP2's MixedPrecisionPolicy (parameters all-gathered in the precision,
gradients reduced in float32; spec.fsdp_mixed_precision) and runs no autocast. Memory per rank
(memory_per_rank): the timed window's peak device memory, the state bytes held, and the
predicted parts beside them (dlscale.frameworks.torch_memory).

At world size 1 the step is the plain model (no process group, no DDP wrapper, no gradient
hooks): the best single-device program. Mode "compiled" runs the forward through
torch.compile (inductor): each block's, before any wrapper, where the cell's compile_scope is
"block" (torchtitan's per-block compile), else the whole model's; the first warm-up step pays
the compilation (compile_seconds). The blocks' activation checkpointing (the cell's
activation_checkpointing) and, under tensor parallel with a vocabulary-sharded head, the loss
and its backward inside loss_parallel(): dlscale.frameworks.torch_parallel. On
CUDA: cuDNN autotuning on (fixed shapes), TF32 as PyTorch's defaults, channels_last for vision
models, the optimizer's foreach implementation (PyTorch's default on CUDA; fp16: the fused one,
with which GradScaler reads no inf check on the host); each is recorded (fast_paths). Steps are
timed with CUDA events, one synchronisation per window (torch_model.CudaEventTimer); on CPUs by
the host clock alone (base.HostTimer: the step returns when its work is done).

No host synchronisation inside the timed window: DDP's runtime statistics (Reducer and Logger,
torch/csrc/distributed/c10d) time the first DDP_ALWAYS_SAMPLED iterations, and then every
`sample_rate`-th, with CUDA events that the next sampled forward synchronises on. The sample
rate is set beyond any step count (DistributedDataParallel._set_ddp_runtime_logging_sample_rate)
and at least DDP_ALWAYS_SAMPLED + 1 DDP steps run before the window (steps_before_window), so
no sampled iteration falls inside it."""

from __future__ import annotations

import contextlib
import datetime

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from dlscale.frameworks.base import Adapter as BaseAdapter
from dlscale.frameworks.torch_model import TorchModel, torch_gpu_identity
from dlscale.rank.timing import COLLECTIVE_TIMEOUT_S
from dlscale.registry.strategies import STRATEGIES

# DDP's Reducer::should_collect_runtime_stats: iterations 1..10 are always sampled, then every
# sample_rate-th; each sampled forward synchronises on the previous iteration's CUDA events.
DDP_ALWAYS_SAMPLED = 10
DDP_RUNTIME_LOGGING_SAMPLE_RATE = 2**31 - 1  # beyond any step count: no periodic sample


class Adapter(TorchModel, BaseAdapter):
    name = "pytorch"
    title = "PyTorch"
    has_allreduce_probe = True
    breakdown_method = (
        "the same step under DistributedDataParallel.no_sync() (no gradient allreduce)"
    )
    first_step_deadline_method = (
        "the process group's timeout (torch.distributed _set_pg_timeout) raised for the first "
        "warm-up step, restored after it"
    )
    ddp_steps = 0  # DDP steps with gradient sync so far (the Reducer's num_iterations_)
    # its strategies are its record's (dlscale.registry.frameworks): ddp by
    # DistributedDataParallel, the others by PyTorch's device mesh, fully_shard, tensor parallel
    # and pipelining (dlscale.frameworks.torch_parallel)
    parallel_facts: dict | None = None  # what parallelize did (another strategy than ddp)
    records_attention_kernel = True  # after the window (TorchModel.after_window)
    # float8: bf16 around torchao's float8 linears (dlscale.frameworks.torch_float8), on GPUs
    precisions = {**TorchModel.precisions, "float8": torch.bfloat16}
    cuda_only = {
        "float8": "torchao's float8 linears need FP8 tensor cores (compute capability 8.9+)"
    }
    float8_facts: dict | None = None

    @property
    def one_device_fsdp(self) -> bool:
        """World size 1 with single_device "fully_shard": FSDP2 at degree 1 (a process group
        and a device mesh of one rank), its MixedPrecisionPolicy carrying a bf16/fp16 cell's
        precision (torchtitan's one-GPU training), instead of the plain program."""
        return not self.data_parallel and self.spec.single_device == "fully_shard"

    @classmethod
    def has_breakdown(cls, spec) -> bool:
        """The compute-only step skips DDP's allreduce; a sharded or tensor-parallel step
        communicates inside its forward and backward, so it has none."""
        return STRATEGIES[spec.parallelism].plain_data_parallel

    @property
    def ddp(self) -> bool:
        """Whether the step runs under DistributedDataParallel (ddp above one rank)."""
        return self.data_parallel and STRATEGIES[self.spec.parallelism].plain_data_parallel

    @property
    def sharded_or_split(self) -> bool:
        """Another strategy than ddp above one rank (dlscale.frameworks.torch_parallel)."""
        return self.data_parallel and not STRATEGIES[self.spec.parallelism].plain_data_parallel

    @property
    def materialize_later(self) -> bool:
        """fsdp and hsdp above one rank: a meta-device model is materialised after fully_shard
        (its shards only); every other strategy materialises it before wrapping it."""
        record = STRATEGIES[self.spec.parallelism]
        return self.one_device_fsdp or (
            self.data_parallel
            and record.sharded
            and not record.splits_layers
            and not record.pipeline
        )

    def check_precision(self) -> None:
        """The precision check (base), and FSDP2's mixed precision only where it applies: a
        bf16 or fp16 cell of a strategy that wraps the model in fully_shard."""
        super().check_precision()
        spec = self.spec
        one_device = spec.single_device == "fully_shard" and not self.data_parallel
        if spec.fsdp_mixed_precision and (
            spec.precision == "fp32" or not (STRATEGIES[spec.parallelism].sharded or one_device)
        ):
            raise ValueError(
                f"fsdp_mixed_precision: a {spec.precision} {spec.parallelism} cell has no FSDP2 "
                "mixed precision; it applies to bf16 and fp16 cells of fsdp, hsdp and fsdp+tp, "
                "and of world size 1 with single_device fully_shard"
            )

    def fsdp_policy(self):
        """FSDP2's MixedPrecisionPolicy of the cell (None: float32 throughout): parameters
        all-gathered in the cell's precision, gradients reduced in float32."""
        if not self.spec.fsdp_mixed_precision:
            return None
        from torch.distributed.fsdp import MixedPrecisionPolicy

        return MixedPrecisionPolicy(param_dtype=self.precision_dtype, reduce_dtype=torch.float32)

    @property
    def fused_optimizer(self) -> bool:
        """fp16 on CUDA: the foreach SGD would make GradScaler.step read its inf check on the
        host (.item()) every step; the fused SGD takes it as a device tensor. On CPUs the
        for-loop SGD stays (PyTorch's CPU default): GradScaler('cuda') is disabled without
        CUDA, and a CPU value is read without waiting for any device."""
        return self.scaler is not None and self.device.type == "cuda"

    def setup(self) -> None:
        spec, ctx = self.spec, self.ctx
        self.seed()
        torch.set_num_threads(spec.threads)
        if spec.device == "cuda":
            ordinal = self.choose_gpu(torch.cuda.device_count(), torch_gpu_identity)
            torch.cuda.set_device(ordinal)
            self.device = torch.device("cuda", ordinal)
            backend = "nccl"
            self.sync_method = "torch.cuda.synchronize"
        else:
            self.device = torch.device("cpu")
            backend = "gloo"
            self.sync_method = (
                "none (CPU ops are synchronous; DDP backward waits for its allreduce)"
            )
        self.backend = backend if self.data_parallel else "none (world size 1)"
        if self.one_device_fsdp:
            self.backend = f"{backend} (a process group of one rank: fully_shard at degree 1)"
        if self.data_parallel or self.one_device_fsdp:
            dist.init_process_group(
                backend,
                init_method=f"tcp://{ctx.master_addr}:{ctx.master_port}",
                rank=ctx.rank,
                world_size=ctx.world_size,
                timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S),
            )
        self.mesh = None  # the device mesh of a strategy other than ddp (parallelize)
        model = self.prepare_model()
        if spec.precision == "float8":  # before tensor parallel, compile and fully_shard
            from dlscale.frameworks.torch_float8 import convert

            sharded = self.one_device_fsdp or (
                self.data_parallel and STRATEGIES[spec.parallelism].sharded
            )
            self.float8_facts = convert(model, self.model_spec.vocab_size, sharded)
        if self.sharded_or_split or self.one_device_fsdp:
            model = self.parallelize(model)
        else:  # ddp and one device: the blocks wrapped before DistributedDataParallel
            from dlscale.frameworks.torch_parallel import wrap_blocks

            self.block_facts = wrap_blocks(
                model,
                self.model_spec.arch,
                spec.activation_checkpointing,
                self.compiles_blocks,
            )
        if self.ddp:
            model = DistributedDataParallel(
                model, device_ids=[self.device.index] if spec.device == "cuda" else None
            )
        if self.ddp:
            model._set_ddp_runtime_logging_sample_rate(DDP_RUNTIME_LOGGING_SAMPLE_RATE)
        self.module = model
        self.forward = self.compile_forward(model)
        self.optimizer = self.make_optimizer(model.parameters())
        if self.clips_gradients:  # the replicas' gradients are reduced by then (FSDP2, DDP)
            from dlscale.frameworks.torch_parallel import gradient_clipper

            stages = self.mesh["pp"].get_group() if self.pipelined else None
            self.optimizer.register_step_pre_hook(
                gradient_clipper(model.parameters(), spec.grad_clip_norm, stages)
            )
        if self.float8_facts and self.float8_facts["fsdp_float8_all_gather"]:
            from dlscale.frameworks.torch_float8 import scale_precompute_hook

            self.optimizer.register_step_post_hook(scale_precompute_hook(model))
        self.predicted_memory = self.predict_memory()

    def parallelize(self, model):
        """Another strategy than ddp (dlscale.frameworks.torch_parallel): every rank starts
        from rank 0's weights, one device mesh from the cell's ParallelDims, a tensor-parallel
        group trains on its ranks' batches together (the same global batch as ddp), then
        tensor parallel and fully_shard as the strategy asks."""
        from dlscale.frameworks.torch_parallel import (
            broadcast_from_rank0,
            build_mesh,
            group_batch,
            parallelize,
        )
        from dlscale.registry.parallel_dims import ParallelDims

        spec, ctx = self.spec, self.ctx
        self.dims = ParallelDims.of(
            "fsdp" if self.one_device_fsdp else spec.parallelism,
            ctx.world_size // ctx.local_world_size,
            ctx.local_world_size,
            spec.tp_degree,
            spec.pp_degree,
        )
        if not self.meta_init:  # seeded values agree on every rank already
            broadcast_from_rank0(model)
        self.mesh = build_mesh(self.dims, self.device.type)
        if STRATEGIES[spec.parallelism].pipeline:
            if spec.activation_checkpointing != "none" or self.compiles_blocks:
                raise ValueError(
                    f"activation_checkpointing {spec.activation_checkpointing!r}, compile_scope "
                    f"{spec.compile_scope!r}: a pp cell runs its stages eagerly without "
                    "checkpointing; allowed: none, model"
                )
            return self.pipeline(model)
        if self.dims.tp > 1:
            group = self.mesh["tp"].get_group()
            self.x = group_batch(self.x, group, self.dims.tp)
            self.y = group_batch(self.y, group, self.dims.tp)
        self.parallel_facts = parallelize(
            model,
            self.model_spec.arch,
            "fsdp" if self.one_device_fsdp else spec.parallelism,
            self.dims,
            self.mesh,
            mp_policy=self.fsdp_policy(),
            tp_plan=spec.tp_plan,
            checkpointing=spec.activation_checkpointing,
            per_block_compile=self.compiles_blocks,
        )
        self.loss_parallel = bool(self.parallel_facts.get("loss_parallel"))
        if self.meta_init and self.materialize_later:
            from dlscale.models.torch.seeded_init import materialize

            materialize(model, self.meta_twin(), self.device, spec.seed)
        return model

    block_facts: dict = {}  # ddp and one device: the blocks' checkpointing and compilation
    loss_parallel = False  # the logits vocabulary-sharded: loss_parallel around the loss

    def loss_scope(self):
        """loss_parallel() where the tensor-parallel plan leaves the logits
        vocabulary-sharded (torch_parallel.loss_parallel_if), else nothing."""
        from dlscale.frameworks.torch_parallel import loss_parallel_if

        return loss_parallel_if(self.loss_parallel)

    pipelined = False  # a pipelined strategy: the step runs a pipeline schedule
    pipe = None  # its dlscale.frameworks.torch_pipeline.Pipeline

    def pipeline(self, model):
        """A pipelined strategy (dlscale.frameworks.torch_pipeline): this rank's stages of the
        model, tensor parallel and fully_shard on each, the cell's schedule over its
        micro-batches; a pipeline's ranks (its stages and their tensor-parallel ranks) train on
        their batches together."""
        from dlscale.frameworks.torch_parallel import group_batch
        from dlscale.frameworks.torch_pipeline import build_pipeline

        # the mesh's dimensions but the data-parallel ones: the pipeline's stages and their
        # tensor-parallel ranks
        for dim in (d for d in self.mesh.mesh_dim_names if not d.startswith("dp_")):
            size = self.mesh[dim].size()
            if size > 1:
                group = self.mesh[dim].get_group()
                self.x = group_batch(self.x, group, size)
                self.y = group_batch(self.y, group, size)
        self.pipe = build_pipeline(
            model,
            self.model_spec.arch,
            self.dims,
            self.mesh,
            self.device,
            self.spec.pp_schedule,
            self.spec.microbatches,
            self.loss_fn,
            mp_policy=self.fsdp_policy(),
        )
        self.pipelined = True
        self.parallel_facts = self.pipe.facts
        return self.pipe.module

    def pipeline_step(self) -> None:
        """One step of the pipeline (its schedule over the micro-batches), then the optimizer
        update."""
        self.optimizer.zero_grad(set_to_none=True)
        with self._autocast(), self.attention_scope():
            self.pipe.step(self.x, self.y)
        self.optimizer.step()

    def execution(self) -> dict:
        out = super().execution()
        out["parallelism"] = {
            "strategy": self.spec.parallelism,
            "tp_degree": self.spec.tp_degree,
            **self.block_facts,
            **(self.parallel_facts or {}),
        }
        if self.float8_facts is not None:
            out["float8"] = self.float8_facts
        out["training"] = self.training_facts()
        return out

    def training_facts(self) -> dict:
        """How the step trains, recorded in rank_start `training`: the optimizer and its
        settings, the clipping norm, where the precision comes from, how the weights were
        initialised."""
        spec = self.spec
        optimizer = {"name": spec.optimizer, "learning_rate": spec.learning_rate}
        if spec.optimizer == "adamw":
            optimizer.update(
                betas=[spec.adam_beta1, spec.adam_beta2],
                eps=spec.adam_eps,
                weight_decay=spec.weight_decay,
                grad_clip_norm=spec.grad_clip_norm,
            )
        else:
            optimizer["momentum"] = spec.momentum
        optimizer["implementation"] = self.optimizer_description()
        if spec.precision == "fp32":
            precision = "float32 throughout"
        elif spec.precision == "float8":
            precision = "torchao float8 linears (the output head in bf16), the rest bf16 (" + (
                "FSDP2 MixedPrecisionPolicy, float8 all-gather)"
                if spec.fsdp_mixed_precision
                else "torch.autocast(bf16))"
            )
        elif spec.fsdp_mixed_precision:
            precision = (
                f"FSDP2 MixedPrecisionPolicy(param_dtype={spec.precision}, "
                "reduce_dtype=float32), no autocast"
            )
        else:
            precision = f"torch.autocast({spec.precision}) around the forward"
        return {
            "optimizer": optimizer,
            "precision": precision,
            "init": self.init_method,
            "activation_checkpointing": spec.activation_checkpointing,
            "compile_scope": spec.compile_scope if self.compiled else None,
            "compile_loss": self.compiles_loss,
            "single_device": spec.single_device if not self.data_parallel else None,
        }

    predicted_memory: dict | None = None

    def predict_memory(self) -> dict:
        """This rank's predicted memory parts (dlscale.frameworks.torch_memory.predicted_parts):
        the module's parameters as the strategy lays them out, the optimizer's state, and (rank
        0) the activations of its batch where the whole model sees the whole batch (one device,
        ddp, fsdp, hsdp): the same on every rank, and cells.csv adds them to every rank's
        state."""
        from dlscale.frameworks.torch_memory import activation_bytes, predicted_parts

        spec = self.spec
        record = STRATEGIES[spec.parallelism]
        fsdp_shard = None
        if self.materialize_later or (  # fsdp, hsdp, pp+fsdp: dim 0 over dp_shard
            self.pipelined and self.dims.dp_shard > 1 and self.dims.tp == 1
        ):
            shard_mesh = self.mesh["dp_shard"]
            fsdp_shard = (shard_mesh.size(), shard_mesh.get_local_rank())
        if self.data_parallel and (record.splits_layers or record.pipeline):
            activation = {
                "available": False,
                "reason": f"not estimated under {spec.parallelism} (a rank holds part of the "
                "model's activations)",
            }
        elif self.ctx.rank != 0:
            # the same model and batch size on every rank: rank 0's estimate is every rank's
            # (a meta-device forward imports torch._dynamo, seconds, which rank 0 pays for its
            # FLOP count anyway)
            activation = {
                "available": False,
                "reason": "estimated on rank 0 (the same on every rank)",
            }
        else:
            dtype = None if spec.precision == "fp32" else self.precision_dtype
            activation = activation_bytes(
                spec.model,
                spec.seq_len,
                spec.per_rank_batch,
                dtype,
                spec.activation_checkpointing,
                gqa=bool((self.gqa or {}).get("enable_gqa")),
            )
        params = list(self.module.parameters())
        return predicted_parts(params, spec.optimizer, spec.momentum, fsdp_shard, activation)

    def memory_per_rank(self) -> dict:
        """Peak RSS (base); on CUDA the peak allocated and reserved device memory of the timed
        window (reset after the warm-up and re-warm steps) and the peak before it; the bytes
        of parameters, gradients and optimizer state this rank holds (a DTensor's local shard);
        and the predicted parts beside them (dlscale.frameworks.torch_memory)."""
        from dlscale.frameworks.torch_memory import measured_state

        out = super().memory_per_rank()
        cuda = self.device.type == "cuda"
        peaks = self.window_peaks or {}
        out["peak_allocated_mb"] = peaks.get("peak_allocated_mb") if cuda else None
        out["peak_reserved_mb"] = peaks.get("peak_reserved_mb") if cuda else None
        out["peak_before_window_mb"] = self.peak_before_window_mb if cuda else None
        out["peak_scope"] = (
            ("timed window" if peaks else "no timed window (peaks not read)") if cuda else None
        )
        module, optimizer = getattr(self, "module", None), getattr(self, "optimizer", None)
        if module is not None and optimizer is not None:
            out.update(measured_state(module, optimizer))
        if self.predicted_memory is not None:
            out["predicted"] = self.predicted_memory
        out["method"] = (
            "torch.cuda.max_memory_allocated/max_memory_reserved over the timed window "
            "(torch.cuda.reset_peak_memory_stats after the warm-up and re-warm steps); "
            if cuda
            else "peak resident set (VmHWM); "
        ) + "bytes of parameters, .grad and optimizer state held locally (DTensor: to_local())"
        return out

    def wrapper(self) -> str:
        if self.one_device_fsdp:
            return (
                "torch.distributed.fsdp.fully_shard (FSDP2) at degree 1 (world size 1, "
                "single_device fully_shard)"
            )
        if self.pipelined:
            return self.pipe.wrapper
        if self.sharded_or_split:
            from dlscale.frameworks.torch_parallel import wrapper_of

            return wrapper_of(self.spec.parallelism, self.dims.dp_replicate)
        if self.data_parallel:
            return "torch.nn.parallel.DistributedDataParallel"
        return super().wrapper()

    def fast_paths(self) -> dict:
        paths = super().fast_paths()
        if self.ddp:
            paths["ddp_runtime_logging"] = (
                f"sample rate {DDP_RUNTIME_LOGGING_SAMPLE_RATE} "
                "(DistributedDataParallel._set_ddp_runtime_logging_sample_rate); its "
                f"{DDP_ALWAYS_SAMPLED} always-sampled iterations run before the timed window "
                f"(at least {self.steps_before_window()} untimed DDP steps)"
            )
        return paths

    def step(self) -> None:
        if self.pipelined:
            self.pipeline_step()
            return
        self.train_step(self.forward, self.optimizer)
        self.ddp_steps += self.ddp and self.module.require_backward_grad_sync

    def step_without_allreduce(self) -> None:
        with self.module.no_sync():
            self.step()

    def steps_before_window(self) -> int:
        """Under DDP, its always-sampled iterations all before the window: the forward of
        iteration k + 1 synchronises on iteration k's events for k <= DDP_ALWAYS_SAMPLED."""
        return DDP_ALWAYS_SAMPLED + 1 if self.ddp else 0

    def first_step_deadline(self, seconds: float):
        if not self.data_parallel:
            return contextlib.nullcontext()
        return self._pg_timeout(seconds)

    @contextlib.contextmanager
    def _pg_timeout(self, seconds: float):
        """Every process group of the cell (the world's and its device mesh's: FSDP, TP, PP and
        replica groups) waits `seconds` inside the block, the collective timeout after it."""
        from dlscale.frameworks.torch_parallel import mesh_groups, set_group_timeout

        groups = [None, *(mesh_groups(self.mesh) if self.mesh is not None else [])]
        for group in groups:
            set_group_timeout(group, seconds)
        try:
            yield
        finally:
            for group in groups:
                set_group_timeout(group, COLLECTIVE_TIMEOUT_S)

    def window_facts(self) -> dict:
        if not self.ddp:
            return {}
        data = self.module._get_ddp_logging_data()
        return {"ddp_steps": self.ddp_steps, "ddp_last_sampled_iteration": data.get("iteration")}

    def allreduce(self, numel: int) -> None:
        dist.all_reduce(self.probe_buffer(numel))
        self.sync()

    def barrier(self) -> None:
        if not self.data_parallel:
            return
        if self.device.type == "cuda":
            dist.barrier(device_ids=[self.device.index])
        else:
            dist.barrier()

    def teardown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    def describe(self) -> dict:
        return self.describe_torch({})
