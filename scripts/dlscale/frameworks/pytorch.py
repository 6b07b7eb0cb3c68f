"""PyTorch DistributedDataParallel adapter: gloo on CPU, NCCL on CUDA, TCP rendezvous at
MASTER_ADDR:MASTER_PORT; SGD with the config's learning rate and momentum (spec.learning_rate,
spec.momentum); collectives bounded by DLSCALE_COLLECTIVE_TIMEOUT_S (base.COLLECTIVE_TIMEOUT_S).

At world size 1 the step is the plain model (no process group, no DDP wrapper, no gradient
hooks): the best single-device program. Mode "compiled" runs the forward through
torch.compile (inductor); the first warm-up step pays the compilation (compile_seconds). On
CUDA: cuDNN autotuning on (fixed shapes), TF32 as PyTorch's defaults, channels_last for vision
models, the optimizer's foreach implementation (PyTorch's default on CUDA; fp16: the fused one,
with which GradScaler reads no inf check on the host); each is recorded (fast_paths). Steps are
timed with CUDA events, one synchronisation per window (CudaEventTimer); on CPUs by the host
clock alone (base.HostTimer: the step returns when its work is done).

No host synchronisation inside the timed window: DDP's runtime statistics (Reducer and Logger,
torch/csrc/distributed/c10d) time the first DDP_ALWAYS_SAMPLED iterations, and then every
`sample_rate`-th, with CUDA events that the next sampled forward synchronises on. The sample
rate is set beyond any step count (DistributedDataParallel._set_ddp_runtime_logging_sample_rate)
and at least DDP_ALWAYS_SAMPLED + 1 DDP steps run before the window (steps_before_window), so
no sampled iteration falls inside it."""

from __future__ import annotations

import contextlib
import datetime

import numpy
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from dlscale.frameworks.base import COLLECTIVE_TIMEOUT_S, HostTimer, StepTimer
from dlscale.frameworks.base import Adapter as BaseAdapter
from dlscale.models import spec_for
from dlscale.models.torch import build, example_batch
from dlscale.run.provenance import cpu_model

# DDP's Reducer::should_collect_runtime_stats: iterations 1..10 are always sampled, then every
# sample_rate-th; each sampled forward synchronises on the previous iteration's CUDA events.
DDP_ALWAYS_SAMPLED = 10
DDP_RUNTIME_LOGGING_SAMPLE_RATE = 2**31 - 1  # beyond any step count: no periodic sample


class CudaEventTimer(StepTimer):
    """Per-step times from CUDA events recorded around each step, read after the window's one
    synchronisation: no host synchronisation inside the timed window."""

    method = "CUDA events around each step (torch.cuda.Event), one synchronisation per window"
    syncs_per_step = False

    def start(self) -> None:
        self._start = torch.cuda.Event(enable_timing=True)
        self._start.record()

    def stop(self) -> None:
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self.times.append((self._start, end))

    def step_seconds(self) -> list[float]:
        torch.cuda.synchronize()
        return [start.elapsed_time(end) / 1e3 for start, end in self.times]


class TorchModel:
    """What every adapter that trains dlscale's PyTorch models shares (pytorch, horovod): the
    model on its device and memory format, the fixed synthetic batch, loss, autocast, device
    synchronisation, peak device memory, the probe buffer, seeding and the description in the
    metrics. Needs self.spec and self.device."""

    precisions = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}  # autocast dtypes

    def seed_framework(self, seed: int) -> None:
        torch.manual_seed(seed)

    def sgd(self, parameters, fused: bool = False) -> torch.optim.SGD:
        """SGD with the config's settings; `fused`: the fused implementation (one kernel),
        whose step takes GradScaler's scale and inf flag as device tensors (GradScaler.step's
        _step_supports_amp_scaling path, no .item())."""
        return torch.optim.SGD(
            parameters,
            lr=self.spec.learning_rate,
            momentum=self.spec.momentum,
            fused=True if fused else None,
        )

    fused_optimizer = False  # the pytorch adapter's fp16 on CUDA (Adapter.fused_optimizer)

    compile_method = "torch.compile (inductor, default mode) of the model's forward"

    def step_timer(self) -> StepTimer:
        if self.device.type == "cuda":
            return CudaEventTimer(self)
        return HostTimer(self)

    def host_sync_points(self) -> list[tuple[object, str]]:
        """Python calls that wait for the device (SyncAudit): reading a tensor's value on the
        host, synchronising the device, a stream or an event."""
        points = [
            (torch.Tensor, name)
            for name in ("item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__")
        ]
        points.append((torch.cuda, "synchronize"))
        points += [(torch.cuda.Event, n) for n in ("synchronize", "elapsed_time", "query")]
        points.append((torch.cuda.Stream, "synchronize"))
        return points

    def compile_forward(self, module: torch.nn.Module):
        """The callable a step runs the model through: the module itself, or torch.compile of
        it in mode "compiled" (compiled lazily, in the first warm-up step)."""
        if not self.compiled:
            return module
        try:
            return torch.compile(module)
        except Exception as exc:  # noqa: BLE001 - any compiler failure is this cell's error
            raise RuntimeError(
                f"{self.title}: torch.compile failed for model {self.spec.model}: {exc}"
            ) from exc

    def train_step(self, forward, optimizer) -> None:
        """One step of the plain training loop: forward under autocast, loss, backward (scaled
        for fp16), optimizer update."""
        with torch.autocast(
            self.device.type, dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None
        ):
            loss = self.loss_fn(forward(self.x), self.y)
        optimizer.zero_grad(set_to_none=True)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            loss.backward()
            optimizer.step()

    def fast_paths(self) -> dict:
        cuda = self.device.type == "cuda"
        return {
            "cudnn_benchmark": bool(torch.backends.cudnn.benchmark) if cuda else None,
            "tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32) if cuda else None,
            "tf32_cudnn": bool(torch.backends.cudnn.allow_tf32) if cuda else None,
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "memory_format": "channels_last"
            if self.memory_format == torch.channels_last
            else "contiguous",
            "optimizer": "SGD, fused (GradScaler reads no inf check on the host)"
            if self.fused_optimizer
            else ("SGD, foreach (multi-tensor)" if cuda else "SGD, for-loop (CPU)"),
            "compiled": self.compiled,
        }

    def prepare_model(self) -> torch.nn.Module:
        spec = self.spec
        if self.device.type == "cuda":
            torch.backends.cudnn.benchmark = True  # fixed shapes: autotune convolutions once
        self.model_spec = spec_for(spec.model, spec.seq_len)
        self.vision = self.model_spec.family == "vision"
        self.memory_format = (
            torch.channels_last
            if self.vision and spec.device == "cuda"
            else torch.contiguous_format
        )
        model = build(spec.model, spec.seq_len).to(self.device).to(memory_format=self.memory_format)
        self.model = model  # unwrapped (evaluation runs on it, outside any collective)
        self.param_count = sum(p.numel() for p in model.parameters())
        self.loss_fn = torch.nn.CrossEntropyLoss()
        x, y = example_batch(self.model_spec, spec.per_rank_batch, device=self.device)
        if self.vision:
            x = x.contiguous(memory_format=self.memory_format)
        self.x, self.y = x, y
        self.autocast_dtype = self.precision_dtype
        self.scaler = torch.amp.GradScaler("cuda") if spec.precision == "fp16" else None
        return model

    # ---- the convergence contract (base.Adapter; run by dlscale.run.convergence_loop)
    convergence_method = (
        "epochs over a torch DataLoader of the rank's shard of the training split "
        "(dlscale.data.torch_data), SGD with the learning rate of each step set from "
        "dlscale.study.lr, validation on the unwrapped model in eval mode with rank 0's "
        "normalisation statistics, counts summed by all_reduce"
    )

    def data_loaders(self, info, *, workers: int, seed: int):
        from dlscale.data.torch_data import make_loader

        rank, world, batch = self.ctx.rank, self.ctx.world_size, self.spec.per_rank_batch
        pin = self.device.type == "cuda"
        train, sampler = make_loader(
            info, "train", rank, world, batch, workers=workers, pin_memory=pin, seed=seed
        )
        val, _ = make_loader(
            info,
            "val",
            rank,
            world,
            batch,
            workers=workers,
            pin_memory=pin,
            seed=seed,
            train=False,
        )
        return train, sampler, val

    def _on_device(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = batch
        x = x.to(self.device, non_blocking=True)
        if self.vision:
            x = x.contiguous(memory_format=self.memory_format)
        return x, y.to(self.device, non_blocking=True)

    def _autocast(self):
        return torch.autocast(
            self.device.type, dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None
        )

    def train_batch(self, batch, learning_rate: float):
        x, y = self._on_device(batch)
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate
        with self._autocast():
            loss = self.loss_fn(self.forward(x), y)
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            loss.backward()
            self.optimizer.step()
        return loss.detach().float() * len(y), len(y)

    def warmup_pass(self, batch) -> None:
        x, y = self._on_device(batch)
        buffers = {name: b.clone() for name, b in self.model.named_buffers()}
        with self._autocast():
            loss = self.loss_fn(self.forward(x), y)
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
        self.optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            for name, b in self.model.named_buffers():
                b.copy_(buffers[name])

    def broadcast_buffers(self) -> None:
        """Rank 0's normalisation statistics on every rank (each rank's last training forward
        updated its own), so every shard is evaluated by the same model."""
        if self.data_parallel:
            for b in self.model.buffers():
                dist.broadcast(b, 0)

    def evaluate(self, batches) -> tuple[int, int]:
        self.broadcast_buffers()
        self.model.eval()
        correct = torch.zeros((), dtype=torch.int64, device=self.device)
        count = 0
        with torch.no_grad(), self._autocast():
            for batch in batches:
                x, y = self._on_device(batch)
                correct += (self.model(x).argmax(dim=1) == y).sum()
                count += len(y)
        self.model.train()
        return int(correct), count

    def to_host(self, value) -> float:
        return float(value)

    def _allreduce(self, values: list[float], op) -> list[float]:
        if not self.data_parallel:
            return [float(v) for v in values]
        t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=op)
        return t.tolist()

    def allreduce_sum(self, values: list[float]) -> list[float]:
        return self._allreduce(values, dist.ReduceOp.SUM)

    def allreduce_max(self, values: list[float]) -> list[float]:
        return self._allreduce(values, dist.ReduceOp.MAX)

    def probe_buffer(self, numel: int) -> torch.Tensor:
        """The allreduce probe's float32 buffer, allocated once per size."""
        buf = getattr(self, "_probe_buf", None)
        if buf is None or buf.numel() != numel:
            buf = self._probe_buf = torch.ones(numel, dtype=torch.float32, device=self.device)
        return buf

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def out_of_memory(self, error: BaseException) -> bool:
        """torch.OutOfMemoryError (a device allocation), the CPU allocator's failure, or
        Python's MemoryError."""
        return (
            isinstance(error, (MemoryError, torch.OutOfMemoryError))
            or isinstance(error, RuntimeError)
            and "can't allocate memory" in str(error)
        )

    def peak_device_memory_mb(self) -> float | None:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 2**20
        return None

    def model_flops(self) -> dict:
        """FLOPs per sample of this cell's model (dlscale.models.flops.count_flops_per_sample:
        counted
        once per model and sequence length on the meta device, before the first step), or
        why not: a failed count is a missing number, never a failed cell."""
        from dlscale.models.flops import count_flops_per_sample

        try:
            return {"available": True, **count_flops_per_sample(self.spec.model, self.spec.seq_len)}
        except Exception as exc:  # noqa: BLE001 - any counter failure is reported, not raised
            return {"available": False, "reason": f"{type(exc).__name__}: {exc}"}

    def build_info(self) -> dict:
        cuda = torch.cuda.is_available()
        nccl = None
        if cuda and torch.distributed.is_nccl_available():
            version = torch.cuda.nccl.version()
            nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        return {
            "available": True,
            "framework": "torch",
            "version": torch.__version__,
            "cuda_runtime": torch.version.cuda,
            "cudnn": str(cudnn) if cudnn else None,
            "nccl": nccl,
            "build": torch.__config__.show(),
            "parallel": torch.__config__.parallel_info(),
        }

    def describe_torch(self, libraries: dict) -> dict:
        if self.device.type == "cuda":
            device_model = torch.cuda.get_device_name(self.device)
        else:
            device_model = cpu_model()
        return {
            "libraries": {"torch": torch.__version__, "numpy": numpy.__version__, **libraries},
            "backend": self.backend,
            "device_model": device_model,
            "data_layout": "channels_last"
            if self.memory_format == torch.channels_last
            else ("NCHW" if self.vision else "tokens"),
            "input_shape": list(self.model_spec.input_shape),
            "param_count": self.param_count,
            **({"model_flops": self.model_flops()} if self.ctx.rank == 0 else {}),
            "data": "synthetic (one fixed batch per rank, generated on the device)",
            "sync_method": self.sync_method,
            "autocast": str(self.autocast_dtype).replace("torch.", "")
            if self.autocast_dtype
            else None,
        }


def torch_gpu_identity(ordinal: int) -> dict:
    """What CUDA tells of device `ordinal`: its UUID, PCI bus id (NVML's format) and name."""
    props = torch.cuda.get_device_properties(ordinal)
    bus = getattr(props, "pci_bus_id", None)
    pci = None
    if bus is not None:
        domain, device = getattr(props, "pci_domain_id", 0), getattr(props, "pci_device_id", 0)
        pci = f"{domain:08X}:{bus:02X}:{device:02X}.0"
    uuid = getattr(props, "uuid", None)
    return {"uuid": str(uuid) if uuid is not None else None, "pci_bus_id": pci, "name": props.name}


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
    # every parallelism (dlscale.study.parallel_dims): ddp by DistributedDataParallel, the others by
    # PyTorch's device mesh, fully_shard and tensor parallel (dlscale.frameworks.torch_parallel)
    strategies = ("ddp", "fsdp", "hsdp", "tp", "fsdp+tp", "pp")
    parallel_facts: dict | None = None  # what parallelize did (another strategy than ddp)

    @classmethod
    def has_breakdown(cls, spec) -> bool:
        """The compute-only step skips DDP's allreduce; a sharded or tensor-parallel step
        communicates inside its forward and backward, so it has none."""
        return spec.parallelism == "ddp"

    @property
    def ddp(self) -> bool:
        """Whether the step runs under DistributedDataParallel (ddp above one rank)."""
        return self.data_parallel and self.spec.parallelism == "ddp"

    @property
    def sharded_or_split(self) -> bool:
        """Another strategy than ddp above one rank (dlscale.frameworks.torch_parallel)."""
        return self.data_parallel and self.spec.parallelism != "ddp"

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
        if self.data_parallel:
            dist.init_process_group(
                backend,
                init_method=f"tcp://{ctx.master_addr}:{ctx.master_port}",
                rank=ctx.rank,
                world_size=ctx.world_size,
                timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S),
            )
        model = self.prepare_model()
        if self.sharded_or_split:
            model = self.parallelize(model)
        if self.ddp:
            model = DistributedDataParallel(
                model, device_ids=[self.device.index] if spec.device == "cuda" else None
            )
        if self.ddp:
            model._set_ddp_runtime_logging_sample_rate(DDP_RUNTIME_LOGGING_SAMPLE_RATE)
        self.module = model
        self.forward = self.compile_forward(model)
        self.optimizer = self.sgd(model.parameters(), fused=self.fused_optimizer)
        replicated = spec.parallelism in ("tp", "pp")  # replicas average their gradients
        if self.sharded_or_split and replicated and self.dims.dp_replicate > 1:
            from dlscale.frameworks.torch_parallel import gradient_averager

            group = self.mesh["dp_replicate"].get_group()
            self.optimizer.register_step_pre_hook(
                gradient_averager(model, group, self.dims.dp_replicate)
            )

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
        from dlscale.study.parallel_dims import ParallelDims

        spec, ctx = self.spec, self.ctx
        self.dims = ParallelDims.of(
            spec.parallelism,
            ctx.world_size // ctx.local_world_size,
            ctx.local_world_size,
            spec.tp_degree,
            spec.pp_degree,
        )
        broadcast_from_rank0(model)
        self.mesh = build_mesh(self.dims, self.device.type)
        if spec.parallelism == "pp":
            return self.pipeline(model)
        if self.dims.tp > 1:
            group = self.mesh["tp"].get_group()
            self.x = group_batch(self.x, group, self.dims.tp)
            self.y = group_batch(self.y, group, self.dims.tp)
        self.parallel_facts = parallelize(
            model, self.model_spec.arch, spec.parallelism, self.dims, self.mesh
        )
        return model

    pipelined = False  # pp: the step runs a pipeline schedule
    pipeline_losses: list = []  # pp: the last stage's micro-batch losses of the latest step

    def pipeline(self, model):
        """pp (torch.distributed.pipelining): this rank's stage of the model, its pipeline's
        ranks training on their batches together, GPipe over the cell's micro-batches."""
        from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

        from dlscale.frameworks.torch_parallel import group_batch, pipeline_stage

        pp, mesh = self.dims.pp, self.mesh["pp"]
        group, stage = mesh.get_group(), mesh.get_local_rank()
        self.x = group_batch(self.x, group, pp)
        self.y = group_batch(self.y, group, pp)
        module = pipeline_stage(model, self.model_spec.arch, stage, pp)
        self.pipe_stage = PipelineStage(module, stage, pp, self.device, group=group)
        self.schedule = ScheduleGPipe(self.pipe_stage, self.spec.microbatches, loss_fn=self.loss_fn)
        self.pipelined, self.pipeline_losses = True, []
        self.parallel_facts = {
            "dims": self.dims.as_dict(),
            "mesh": list(self.mesh.mesh_dim_names),
            "pipeline": {
                "stage": stage,
                "stages": pp,
                "microbatches": self.spec.microbatches,
                "schedule": "torch.distributed.pipelining.ScheduleGPipe",
                "layers": len(module.layers),
            },
        }
        return module

    def pipeline_step(self) -> None:
        """One step of the pipeline: the first stage feeds the batch, the last computes the
        loss against the labels (its micro-batch losses kept), then the optimizer update."""
        self.optimizer.zero_grad(set_to_none=True)
        stage = self.pipe_stage
        self.pipeline_losses = []
        with self._autocast():
            if stage.is_first:
                self.schedule.step(self.x)
            elif stage.is_last:
                self.schedule.step(target=self.y, losses=self.pipeline_losses)
            else:
                self.schedule.step()
        self.optimizer.step()

    def execution(self) -> dict:
        out = super().execution()
        out["parallelism"] = {
            "strategy": self.spec.parallelism,
            "tp_degree": self.spec.tp_degree,
            **(self.parallel_facts or {}),
        }
        return out

    def memory_per_rank(self) -> dict:
        """Peak RSS (base), peak allocated and reserved device memory on CUDA, and the bytes of
        parameters, gradients and optimizer state this rank holds (a DTensor's local shard)."""
        from dlscale.frameworks.torch_parallel import state_bytes

        out = super().memory_per_rank()
        cuda = self.device.type == "cuda"
        out["peak_allocated_mb"] = (
            torch.cuda.max_memory_allocated(self.device) / 2**20 if cuda else None
        )
        out["peak_reserved_mb"] = (
            torch.cuda.max_memory_reserved(self.device) / 2**20 if cuda else None
        )
        out.update(state_bytes(self.module, self.optimizer))
        out["method"] = (
            "torch.cuda.max_memory_allocated/max_memory_reserved; "
            if cuda
            else "peak resident set (VmHWM); "
        ) + "bytes of parameters, .grad and optimizer state held locally (DTensor: to_local())"
        return out

    def wrapper(self) -> str:
        if self.sharded_or_split:
            parts = {
                "fsdp": "torch.distributed.fsdp.fully_shard (FSDP2) over dp_shard",
                "hsdp": "torch.distributed.fsdp.fully_shard (FSDP2, hybrid) over "
                "(dp_replicate, dp_shard)",
                "tp": "torch.distributed.tensor.parallel (ColwiseParallel/RowwiseParallel) over "
                "tp, gradients averaged over dp_replicate",
                "fsdp+tp": "torch.distributed.tensor.parallel over tp, then fully_shard (FSDP2) "
                "over dp_shard",
                "pp": "torch.distributed.pipelining (PipelineStage, ScheduleGPipe) over pp, "
                "gradients averaged over dp_replicate",
            }
            return parts[self.spec.parallelism]
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
        set_timeout = dist.distributed_c10d._set_pg_timeout
        set_timeout(datetime.timedelta(seconds=seconds))
        try:
            yield
        finally:
            set_timeout(datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))

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
