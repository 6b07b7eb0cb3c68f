"""The PyTorch kit that the pytorch and horovod adapters share (TorchModel): dlscale's PyTorch
model on its device and memory format, the fixed synthetic batch, loss, autocast, the plain
training step, the convergence contract (base.Adapter; run by dlscale.run.convergence_loop), device
synchronisation and step timers (CudaEventTimer on CUDA: one synchronisation per window; HostTimer
on CPUs), peak device memory, the probe buffer, build info and the description in the metrics;
and what CUDA tells of a device (torch_gpu_identity). Imported only in environments with torch."""

from __future__ import annotations

import contextlib

import numpy
import torch
import torch.distributed as dist

from dlscale.frameworks.base import HostTimer, StepTimer
from dlscale.models import spec_for
from dlscale.models.torch import build, example_batch
from dlscale.models.zoo import record_of_cell
from dlscale.rank.provenance import cpu_model


class CudaEventTimer(StepTimer):
    """Per-step times from CUDA events recorded around each step, read after the window's one
    synchronisation: no host synchronisation inside the timed window."""

    method = "CUDA events around each step (torch.cuda.Event), one synchronisation per window"

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

    def make_optimizer(self, parameters) -> torch.optim.Optimizer:
        """The cell's optimizer (spec.optimizer; dlscale.registry.optimizers): SGD (sgd), or
        AdamW with the cell's betas, eps and weight decay, fused on CUDA (one kernel; its step
        takes GradScaler's scale and inf flag as device tensors) and foreach on CPUs."""
        spec = self.spec
        groups = _tensor_kind_groups(parameters)
        if spec.optimizer != "adamw":
            return self.sgd(groups, fused=self.fused_optimizer)
        cuda = self.device.type == "cuda"
        return torch.optim.AdamW(
            groups,
            lr=spec.learning_rate,
            betas=(spec.adam_beta1, spec.adam_beta2),
            eps=spec.adam_eps,
            weight_decay=spec.weight_decay,
            fused=True if cuda else None,
            foreach=None if cuda else True,
        )

    @property
    def clips_gradients(self) -> bool:
        """An AdamW cell with a clipping norm (spec.grad_clip_norm)."""
        return self.spec.optimizer == "adamw" and self.spec.grad_clip_norm is not None

    def optimizer_step(self, optimizer, loss) -> None:
        """Backward (scaled for fp16) and the update: with a clipping norm, the gradients are
        unscaled first (GradScaler.unscale_), so the clipping hook (registered on the optimizer,
        dlscale.frameworks.torch_parallel.gradient_clipper) reads their true norm."""
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            if self.clips_gradients:
                self.scaler.unscale_(optimizer)
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            loss.backward()
            optimizer.step()

    def optimizer_description(self) -> str:
        """The optimizer as fast_paths records it."""
        cuda = self.device.type == "cuda"
        if self.spec.optimizer == "adamw":
            clip = (
                f", gradients clipped to norm {self.spec.grad_clip_norm:g}"
                if self.clips_gradients
                else ""
            )
            return ("AdamW, fused" if cuda else "AdamW, foreach (multi-tensor)") + clip
        if self.fused_optimizer:
            return "SGD, fused (GradScaler reads no inf check on the host)"
        return "SGD, foreach (multi-tensor)" if cuda else "SGD, for-loop (CPU)"

    compile_method = "torch.compile (inductor, default mode) of the model's forward"
    block_compile_method = (
        "torch.compile (inductor, default mode) of each block (nn.Module.compile, in place, "
        "before any wrapper: torchtitan's per-block compile)"
    )

    def execution(self) -> dict:
        out = super().execution()
        if self.compiles_blocks:
            out["compile_method"] = self.block_compile_method
        if self.compiles_loss:
            out["compile_method"] = (
                out.get("compile_method", self.compile_method)
                + "; the loss too (torch.compile of the float32 cross-entropy)"
            )
        out["attention"] = self.attention_facts()
        return out

    @property
    def compiles_blocks(self) -> bool:
        """Mode "compiled" with compile_scope "block": each block compiled (torchtitan's
        per-TransformerBlock compile), the model's forward not."""
        return self.compiled and self.spec.compile_scope == "block"

    def loss_scope(self):
        """What the loss and its backward run inside (the pytorch adapter's loss_parallel under
        a vocabulary-sharded head); nothing here."""
        return contextlib.nullcontext()

    def loss_value(self, x, y) -> torch.Tensor:
        """The loss of the model on (x, y) without gradients, as a plain tensor (a
        loss_parallel loss is a replicated DTensor: its full value)."""
        with torch.no_grad(), self.loss_scope(), self._autocast(), self.attention_scope():
            loss = self.loss_fn(self.forward(x), y)
        full = getattr(loss, "full_tensor", None)
        return (full() if full is not None else loss).detach().clone()

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
        it in mode "compiled" (compiled lazily, in the first warm-up step); with compile_scope
        "block" the module itself (its blocks were compiled before wrapping)."""
        if not self.compiled or self.compiles_blocks:
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
        with self.loss_scope():
            with (
                torch.autocast(
                    self.device.type,
                    dtype=self.autocast_dtype,
                    enabled=self.autocast_dtype is not None,
                ),
                self.attention_scope(),
            ):
                loss = self.loss_fn(forward(self.x), self.y)
            optimizer.zero_grad(set_to_none=True)
            self.optimizer_step(optimizer, loss)

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
            "optimizer": self.optimizer_description(),
            "compiled": self.compiled,
        }

    # A model with init_weights() (the decoders) is built on the meta device and materialised by
    # dlscale.models.torch.seeded_init: each parameter from its own seeded generator, the same
    # values on every rank and under every strategy (meta_init). `materialize_later`: the
    # adapter materialises it after sharding (fsdp, hsdp), else prepare_model does.
    meta_init = False
    materialize_later = False
    init_method = "the model's constructor under torch.manual_seed(seed + rank)"

    def prepare_model(self) -> torch.nn.Module:
        """The cell's model on its device (or, where the adapter materialises it after
        sharding, still on the meta device), its synthetic batch, loss, autocast and scaler.
        The batch is drawn right after seeding in a meta-initialised model (its construction
        draws nothing), as in the single-process reference."""
        from dlscale.models.torch.seeded_init import builds_with_init_weights, materialize

        spec = self.spec
        if self.device.type == "cuda":
            torch.backends.cudnn.benchmark = True  # fixed shapes: autotune convolutions once
        record_of_cell(spec.model, getattr(spec, "model_source", None))  # a study's own model
        self.model_spec = spec_for(spec.model, spec.seq_len)
        self.vision = self.model_spec.family == "vision"
        self.memory_format = (
            torch.channels_last
            if self.vision and spec.device == "cuda"
            else torch.contiguous_format
        )
        self.meta_init = builds_with_init_weights(spec.model)
        if self.meta_init:
            model = self.meta_twin()
            self.init_method = (
                "built on the meta device, then materialised "
                + ("after fully_shard (its shards only)" if self.materialize_later else "whole")
                + f" and initialised by {type(model).__name__}.init_weights(), each parameter "
                f"from its own generator seeded by seed {spec.seed} and its name "
                "(dlscale.models.torch.seeded_init)"
            )
        else:
            model = build(spec.model, spec.seq_len).to(self.device)
            model = model.to(memory_format=self.memory_format)
        self.param_count = sum(p.numel() for p in model.parameters())
        self.loss_fn = torch.nn.CrossEntropyLoss()
        if self.compiles_loss:
            self.loss_fn = torch.compile(float32_cross_entropy)
        self.choose_attention(model)
        x, y = example_batch(self.model_spec, spec.per_rank_batch, device=self.device)
        if self.vision:
            x = x.contiguous(memory_format=self.memory_format)
        self.x, self.y = x, y
        if self.meta_init and not self.materialize_later:
            materialize(model, self.meta_twin(), self.device, spec.seed)
        self.model = model  # unwrapped (evaluation runs on it, outside any collective)
        # FSDP2's MixedPrecisionPolicy carries a sharded cell's precision: no autocast then
        self.autocast_dtype = None if spec.fsdp_mixed_precision else self.precision_dtype
        self.scaler = torch.amp.GradScaler("cuda") if spec.precision == "fp16" else None
        return model

    # ---- the attention kernel (dlscale.frameworks.torch_attention)
    attention_order: tuple = ()  # the cell's backend order (empty: PyTorch's own choice)
    records_attention_kernel = False  # the pytorch adapter's cells record it (after_window)
    gqa: dict | None = None  # whether enable_gqa is passed, and why

    def choose_attention(self, model: torch.nn.Module) -> None:
        """The cell's attention backends (spec.attention: dlscale.registry.attention) and
        whether its grouped-query attention passes enable_gqa (uses_gqa; the model's attention
        modules switched by set_gqa)."""
        from dlscale.frameworks.torch_attention import order_for, set_gqa, uses_gqa

        self.attention_order = order_for(self.spec.attention, self.device)
        kwargs = self.model_spec.arch_kwargs or {}
        shapes = None
        if "num_kv_heads" in kwargs:
            shapes = {
                "heads": kwargs["num_heads"],
                "kv_heads": kwargs["num_kv_heads"],
                "head_dim": kwargs["d_model"] // kwargs["num_heads"],
                "seq_len": self.model_spec.input_shape[0],
                "batch": self.spec.per_rank_batch,
            }
        dtype = self.precision_dtype if self.spec.precision != "fp32" else torch.float32
        self.gqa = uses_gqa(self.attention_order, self.device, shapes, dtype)
        set_gqa(model, self.gqa["enable_gqa"])

    def attention_scope(self):
        """sdpa_kernel over the cell's backends (nothing where the cell names none)."""
        from dlscale.frameworks.torch_attention import attention_scope

        return attention_scope(self.attention_order)

    @property
    def compiles_loss(self) -> bool:
        """Mode "compiled" with compile_loss: the loss (float32_cross_entropy) compiled too."""
        return self.compiled and self.spec.compile_loss

    def attention_facts(self) -> dict:
        """The attention the cell asked for, as rank_start's execution records it."""
        return {
            "setting": self.spec.attention,
            "order": list(self.attention_order) or None,
            "enable_gqa": (self.gqa or {}).get("enable_gqa", False),
            "gqa_why": (self.gqa or {}).get("why"),
        }

    def after_window(self) -> dict:
        """After the timed window (run_timed): the attention kernel one profiled step ran
        (torch_attention.attention_kernel, where the model has attention), and on rank 0 of a
        traced cell (spec.trace_steps) a Chrome/Perfetto trace of that many steps (every rank
        steps with it: the steps' collectives need them all)."""
        from dlscale.frameworks.torch_attention import attention_kernel, trace

        out = {}
        if self.records_attention_kernel and self.model_spec.family != "vision":
            out["attention_kernel"] = attention_kernel(
                self.step, self.device, self.sync, self.attention_order
            )
        steps = self.spec.trace_steps
        if steps:
            if self.ctx.rank == 0:
                path = self.spec.trace_path or "trace.json"
                from pathlib import Path

                Path(path).parent.mkdir(parents=True, exist_ok=True)
                out["trace"] = trace(
                    self.step, self.device, self.sync, path, steps, self.spec.trace_nsys
                )
            else:
                for _ in range(steps + 1):
                    self.step()
                self.sync()
        return out

    def meta_twin(self) -> torch.nn.Module:
        """A second meta-device build of the cell's model: seeded_init draws the values on it."""
        with torch.device("meta"):
            return build(self.spec.model, self.spec.seq_len)

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
        self.optimizer_step(self.optimizer, loss)
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

    # The peak memory statistics: reset after the warm-up and re-warm steps, so the peak read
    # after the timed window is the step's (dlscale.rank.timing.run_timed calls both hooks).
    peak_before_window_mb: float | None = None
    window_peaks: dict | None = None

    def reset_peak_memory(self) -> None:
        """On CUDA: keep the peak so far (construction, warm-up, compilation) and reset the
        allocator's peak statistics (torch.cuda.reset_peak_memory_stats)."""
        if self.device.type != "cuda":
            return
        self.peak_before_window_mb = torch.cuda.max_memory_allocated(self.device) / 2**20
        torch.cuda.reset_peak_memory_stats(self.device)

    def read_peak_memory(self) -> None:
        """On CUDA, right after the window's closing synchronisation: the peak allocated and
        reserved device memory since the reset, i.e. over the timed window's steps."""
        if self.device.type != "cuda":
            return
        self.window_peaks = {
            "peak_allocated_mb": torch.cuda.max_memory_allocated(self.device) / 2**20,
            "peak_reserved_mb": torch.cuda.max_memory_reserved(self.device) / 2**20,
        }

    def peak_device_memory_mb(self) -> float | None:
        """The process's peak allocated device memory (before the window and since, together)."""
        if self.device.type == "cuda":
            since = torch.cuda.max_memory_allocated(self.device) / 2**20
            return max(since, self.peak_before_window_mb or 0.0)
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


def float32_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The cross-entropy taken in float32 from logits of any precision: compiled
    (TorchModel.compiles_loss), the float32 copy of the full-vocabulary logits lives only inside
    the compiled kernel, as torchtitan compiles its loss."""
    return torch.nn.functional.cross_entropy(logits.float(), target)


def _tensor_kind_groups(parameters) -> list:
    """The parameters as the optimizer takes them: one group, or where DTensors (a tensor
    parallel split) and plain tensors (what the plan leaves whole) mix, one group of each: the
    foreach and fused implementations run one kernel over a group and refuse the mix."""
    from torch.distributed.tensor import DTensor

    params = list(parameters)
    split = [p for p in params if isinstance(p, DTensor)]
    whole = [p for p in params if not isinstance(p, DTensor)]
    if split and whole:
        return [{"params": split}, {"params": whole}]
    return params


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
