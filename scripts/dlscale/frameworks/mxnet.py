"""MXNet Gluon adapter: data parallelism over the `dist_sync` parameter-server kvstore (ps-lite).

Roles, all started inside the cell's own allocation from the rank's environment (MXNet's own
`mxnet.tools.launch` is not used: it is broken on Python 3.11 and binds a non-loopback address):
  - every rank is a *worker* (`mx.kv.create("dist_sync")`);
  - rank 0 also starts the *scheduler* as a child process, listening on MASTER_ADDR:MASTER_PORT;
  - local rank 0 of every node starts one *server* child process, so there are
    DMLC_NUM_SERVER = nodes = world_size // local_world_size servers (big arrays are sharded
    over them, MXNET_KVSTORE_BIGARRAY_BOUND).
The children set PR_SET_PDEATHSIG themselves (a rank that dies takes them along), stay in the
rank's process group (the launcher's killpg reaches them) and are stopped at teardown.
Addresses: every node advertises DMLC_NODE_HOST = its entry of DLSCALE_HOSTS resolved to IPv4
(when a node's own name resolves to loopback, as with Debian's 127.0.1.1, the address on its
route to a peer node); DLSCALE_MXNET_INTERFACE=<ifname> makes ps-lite use that interface instead.

Update semantics: Gluon's Trainer with a dist kvstore updates on the servers (MXNet's default,
MXNET_UPDATE_ON_KVSTORE=1): each worker pushes the gradient of the *summed* per-sample loss of its
batch, the dist_sync server adds the pushes of all workers and runs SGD (the config's learning rate
and momentum: spec.learning_rate, spec.momentum) with rescale_grad = 1 / global batch
(Trainer.step(global_batch)); every worker then pulls the new weights. That is SGD with momentum on
the mean gradient over the global batch, as DDP. Initial weights are broadcast from kvstore rank 0
at the first step. A single rank has no kvstore at all (Trainer(kvstore=None): the update runs in
the worker, nothing is pushed or pulled): the best single-device program.

Modes: "eager" runs the Gluon network imperatively; "compiled" hybridizes it
(hybridize(static_alloc=True, static_shape=True): one cached static graph, built in the first
warm-up step).

Bounded collectives: ps-lite has no timeouts, so the base's watchdog (base.Watchdog) fails the
rank (exit 124, after killing the rank's scheduler/server children) when one blocking call
(kvstore start-up, a step, a barrier, a probe, shutdown) takes longer than
DLSCALE_COLLECTIVE_TIMEOUT_S (default 300) plus four times the longest step seen so far.

Precision: fp32; bf16 through MXNet AMP (`amp.init("bfloat16")`: oneDNN bf16 convolutions and
GEMMs, fp32 weights and gradients, no loss scaling) on CPUs with AVX-512 (oneDNN 2.x has no
bf16 convolution elsewhere: refused on others by the base's precision check, Adapter.cpu_needs,
naming the missing flags); fp16 only on CUDA (MXNet 1.9.1 has no
float16 GEMM/FullyConnected on CPU; the base's precision check refuses it there), with AMP
dynamic loss scaling and the update on the workers.

Seeding: MXNet's generator initialises the weights on every rank, and they meet in the kvstore
only at the first step, so it gets the spec's seed on every rank (the same initial weights
everywhere, as the other frameworks' broadcasts give); the rank's seed (seed + rank) picks its
data.

Threads: OMP_NUM_THREADS (intra-op) = spec.threads, set before MXNet is imported; the engine's
scheduling threads (inter-op, MXNET_CPU_WORKER_NTHREADS) stay at 1, because each of them runs
its operators with the full OpenMP team, so more would oversubscribe the rank's CPUs.
"""

from __future__ import annotations

import ctypes
import gc
import os
import signal
import socket
import subprocess
import sys
import time

from dlscale.frameworks.base import Adapter as BaseAdapter
from dlscale.frameworks.base import Watchdog
from dlscale.models import get_spec
from dlscale.rank.provenance import cpu_model

SHUTDOWN_WAIT_S = 60.0
# A blocking call's deadline: the collective timeout + 4 x the longest step so far.
WATCHDOG_GROWTH, WATCHDOG_STEPS = 4.0, ("a training step", "a compute-only step")
PR_SET_PDEATHSIG = 1

# A scheduler/server child: die with the rank (PDEATHSIG), then let `import mxnet` run the role
# (mxnet.kvstore_server starts the server/scheduler loop on import when DMLC_ROLE says so).
_CHILD = (
    "import ctypes, os, signal, sys\n"
    f"ctypes.CDLL(None, use_errno=True).prctl({PR_SET_PDEATHSIG}, signal.SIGKILL)\n"
    "role = os.environ['DMLC_ROLE']\n"
    "if os.getppid() != int(os.environ['DLSCALE_MXNET_PARENT']):\n"
    "    sys.exit(f'[dlscale.mxnet] parent rank gone before the {role} started')\n"
    "import mxnet  # serves until stopped, then exits\n"
    "sys.exit(f'[dlscale.mxnet] {role}: mxnet returned without serving')\n"
)


def _ipv4(host: str) -> str:
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host


def _loopback(addr: str) -> bool:
    return addr.startswith("127.") or addr in ("localhost", "::1")


def _route_to(addr: str) -> str | None:
    """This host's address on the route to `addr` (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((addr, 9))
            return s.getsockname()[0]
    except OSError:
        return None


class Adapter(BaseAdapter):
    name = "mxnet"
    title = "MXNet 1.9.1"
    sync_method = "mx.nd.waitall"
    precisions = {"fp32": None, "bf16": "bfloat16", "fp16": "float16"}  # AMP target dtypes
    cuda_only = {"fp16": "no float16 GEMM / FullyConnected kernels"}
    cpu_needs = {
        "bf16": (
            ("avx512f", "avx512bw", "avx512vl", "avx512dq"),
            "MXNet 1.9.1's oneDNN has bfloat16 convolutions on AVX-512 CPUs only",
        )
    }
    has_allreduce_probe = True
    breakdown_method = (
        "the same forward/backward and SGD-momentum update through a second, "
        "kvstore-less Gluon Trainer (no push/pull)"
    )

    # ------------------------------------------------------------------ ps-lite roles
    def _node_host(self) -> str | None:
        """The address this node's server and workers advertise to the others: on nodes that
        are hosts of their own, this node's address on the route to another node (where the
        others reach it), not what its own name resolves to here, which may be loopback
        (Debian's 127.0.1.1) or an interface the others cannot reach (a second network)."""
        if os.environ.get("DLSCALE_MXNET_INTERFACE"):
            return None  # ps-lite uses DMLC_INTERFACE
        ctx = self.ctx
        hosts = [_ipv4(h) for h in ctx.hosts]
        mine = hosts[ctx.node_index] if ctx.node_index < len(hosts) else _ipv4(ctx.node)
        if all(_loopback(h) for h in hosts) or len(set(hosts)) < 2:
            return mine  # one host (simulated nodes)
        for i, h in enumerate(hosts):
            if i != ctx.node_index and not _loopback(h):
                addr = _route_to(h)
                if addr and not _loopback(addr):
                    return addr
        return None  # ps-lite picks an interface

    def _ps_env(self) -> dict:
        ctx = self.ctx
        root = _ipv4(ctx.master_addr)
        env = {
            "DMLC_PS_ROOT_URI": root,
            "DMLC_PS_ROOT_PORT": str(ctx.master_port),
            "DMLC_NUM_SERVER": str(self.num_servers),
            "DMLC_NUM_WORKER": str(ctx.world_size),
        }
        host = self._node_host()
        if host:
            env["DMLC_NODE_HOST"] = host
        if os.environ.get("DLSCALE_MXNET_INTERFACE"):
            env["DMLC_INTERFACE"] = os.environ["DLSCALE_MXNET_INTERFACE"]
        elif host and _loopback(host):
            env["DMLC_INTERFACE"] = "lo"
        self.multi_host = not all(_loopback(_ipv4(h)) for h in ctx.hosts)
        return env

    def _spawn(self, role: str, base_env: dict) -> None:
        env = dict(
            os.environ,
            **base_env,
            DMLC_ROLE=role,
            DLSCALE_MXNET_PARENT=str(os.getpid()),
            OMP_NUM_THREADS=str(self.spec.threads),
            MXNET_CPU_WORKER_NTHREADS="1",
        )
        if role == "scheduler" and self.multi_host and _loopback(base_env["DMLC_PS_ROOT_URI"]):
            # The master's own name resolves to loopback here, but the other nodes reach it by
            # its real address: make ps-lite bind the scheduler on all interfaces.
            env["DMLC_USE_KUBERNETES"] = "1"
        proc = subprocess.Popen([sys.executable, "-c", _CHILD], env=env, stdin=subprocess.DEVNULL)
        self.children.append((role, proc))

    def _stop_children(self, wait: float) -> None:
        deadline = time.monotonic() + wait
        for role, proc in self.children:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(
                    f"[dlscale.mxnet] {role} (pid {proc.pid}) still running; killing it",
                    file=sys.stderr,
                    flush=True,
                )
                proc.kill()
                proc.wait()
        self.children = []

    def _kill_children(self) -> None:
        for _, proc in self.children:
            if proc.poll() is None:
                try:
                    proc.send_signal(signal.SIGKILL)
                except OSError:
                    pass

    # ------------------------------------------------------------------ the contract
    def setup(self) -> None:
        spec, ctx = self.spec, self.ctx
        self.children: list[tuple[str, subprocess.Popen]] = []
        self.kv = self.trainer = self.local_trainer = self.net = None
        # Before MXNet is imported: its OpenMP team size is read once, at engine start.
        os.environ["OMP_NUM_THREADS"] = str(spec.threads)
        os.environ["MXNET_CPU_WORKER_NTHREADS"] = "1"
        import mxnet as mx
        import numpy
        from mxnet import autograd

        self.mx, self.np, self.autograd = mx, numpy, autograd
        self.watchdog = Watchdog(
            self.name,
            ctx.rank,
            grow=WATCHDOG_GROWTH,
            grow_with=WATCHDOG_STEPS,
            on_fire=self._kill_children,
        )

        self.autocast = self.precision_dtype
        self.device = self._mx_device()
        if self.autocast:
            from mxnet.contrib import amp

            amp.init(target_dtype=self.autocast)  # before the model is built
            self.amp = amp

        self._start_kvstore()
        self._build_model()
        mx.nd.waitall()

    def _mx_device(self):
        """This rank's MXNet context: its GPU (refused where MXNet sees none) or the CPU."""
        mx = self.mx
        if self.spec.device == "cuda":
            if mx.context.num_gpus() == 0:
                raise RuntimeError(
                    "device 'cuda': this MXNet build has no CUDA support or sees "
                    "no GPU (envs/mxnet.txt installs the CPU wheel mxnet==1.9.1)"
                )
            return mx.gpu(self.choose_gpu(mx.context.num_gpus()))
        return mx.cpu()

    def _start_kvstore(self) -> None:
        """Above one rank: the ps-lite scheduler (rank 0) and this node's server (local rank 0)
        as child processes, then this worker's dist_sync kvstore; at world size 1 none."""
        ctx = self.ctx
        if ctx.world_size > 1:
            self.num_servers = ctx.world_size // ctx.local_world_size
            ps_env = self._ps_env()
            if ctx.rank == 0:
                self._spawn("scheduler", ps_env)
            if ctx.local_rank == 0:
                self._spawn("server", ps_env)
            os.environ.update(ps_env, DMLC_ROLE="worker")
            with self.watchdog("kvstore start-up (ps-lite registration)"):
                self.kv = self.mx.kv.create("dist_sync")
            if self.kv.num_workers != ctx.world_size:
                raise RuntimeError(
                    f"dist_sync kvstore sees {self.kv.num_workers} workers, "
                    f"the cell has {ctx.world_size}"
                )
            self.backend = "dist_sync"
        else:
            self.kv = None  # world size 1: no kvstore, the update runs here
            self.backend = "none (world size 1)"

    def _build_model(self) -> None:
        """The model (same initial weights on every rank), its fixed batch, loss and trainer."""
        spec, ctx = self.spec, self.ctx
        from mxnet import gluon

        self.model_spec = get_spec(spec.model)
        self.vision = self.model_spec.family == "vision"
        from dlscale.models.mxnet import build, example_batch, param_count

        self.seed()  # same initial weights on every rank
        self.net = build(spec.model, ctx=self.device)
        self.param_count = param_count(self.net)
        if self.compiled:
            self.net.hybridize(static_alloc=True, static_shape=True)
        # Different (fixed) data on every rank.
        self.x, self.y = example_batch(
            self.model_spec, spec.per_rank_batch, ctx=self.device, seed=self.data_seed
        )
        self.loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
        self.global_batch = spec.per_rank_batch * ctx.world_size
        self.loss_scaling = spec.precision == "fp16"
        self.converging = spec.workload == "convergence"
        self.gather_keys: dict[int, tuple] = {}  # kvstore key -> shape, initialised once
        self.trainer = gluon.Trainer(
            self.net.collect_params(),
            "sgd",
            self._sgd(),
            kvstore=self.kv,
            # dynamic loss scaling changes the gradient scale every step, and a convergence
            # cell's learning rate every step (dlscale.study.lr): update on the workers
            update_on_kvstore=False if self.loss_scaling or self.converging else None,
        )
        if self.loss_scaling:
            self.amp.init_trainer(self.trainer)
        self.local_trainer = None  # compute-only breakdown (step_without_allreduce)
        self.probe_keys: dict[int, tuple[int, object]] = {}

    def seed_framework(self, seed: int) -> None:
        # the weights' generator: the spec's seed on every rank; the data: the rank's seed + 1
        self.mx.random.seed(self.spec.seed, ctx=self.device)
        self.data_seed = seed + 1

    def _sgd(self) -> dict:
        return {"learning_rate": self.spec.learning_rate, "momentum": self.spec.momentum}

    def _forward_backward(self, trainer) -> None:
        with self.autograd.record():
            loss = self.loss_fn(self.net(self.x), self.y)  # per-sample losses
            if self.loss_scaling:
                with self.amp.scale_loss(loss, trainer) as scaled:
                    self.autograd.backward(scaled)
        if not self.loss_scaling:
            loss.backward()  # gradient of the summed loss

    def step(self) -> None:
        with self.watchdog("a training step"):
            self._forward_backward(self.trainer)
            # rescale_grad = 1 / global batch: the servers' sum over workers becomes the mean
            self.trainer.step(self.global_batch)
            self.mx.nd.waitall()  # pulled weights are in place

    def step_without_allreduce(self) -> None:
        """Forward, backward and the same SGD update applied locally: no kvstore traffic.
        Runs after the timed window; the ranks' weights diverge from here on (as under DDP's
        no_sync), which nothing afterwards depends on."""
        if self.local_trainer is None:
            from mxnet import gluon

            self.local_trainer = gluon.Trainer(
                self.net.collect_params(), "sgd", self._sgd(), kvstore=None
            )
            if self.loss_scaling:
                self.amp.init_trainer(self.local_trainer)
        with self.watchdog("a compute-only step"):
            self._forward_backward(self.local_trainer)
            self.local_trainer.step(self.global_batch)
            self.mx.nd.waitall()

    def allreduce(self, numel: int) -> None:
        """A kvstore push + pull of a float32 buffer of `numel` elements (a key of its own,
        initialised once): every worker sends the buffer to the servers and pulls the merged
        result back, which is how this framework reduces gradients. The servers apply the
        registered optimizer to the merged value (MXNet's update-on-kvstore), so the value
        pulled is not the plain sum; the traffic and the synchronisation are the gradients'."""
        mx = self.mx
        with self.watchdog("an allreduce probe"):
            if numel not in self.probe_keys:
                key = 1_000_000 + len(self.probe_keys)  # far above the parameters' indices
                buf = mx.nd.ones((numel,), dtype="float32", ctx=self.device)
                self.kv.init(key, buf)  # collective (rank 0 pushes, barrier)
                self.probe_keys[numel] = (key, buf)
            key, buf = self.probe_keys[numel]
            self.kv.pushpull(key, buf, out=buf)
            buf.wait_to_read()

    # ------------------------------------------------------------------ the convergence contract
    convergence_method = (
        "epochs over a Gluon DataLoader of the rank's shard of the training split "
        "(dlscale.data.mxnet_data: torch DistributedSampler's order, reshuffled from seed + "
        "epoch), Gluon Trainer on the dist_sync kvstore with the update on the workers "
        "(update_on_kvstore=False: the gradients' sum is pulled, every worker runs the same SGD "
        "step) so that the learning rate of each step can be set from dlscale.study.lr; validation "
        "with rank 0's normalisation statistics, counts summed through the kvstore"
    )
    GATHER_KEY, STATS_KEY = 3_000_000, 4_000_000  # far above the parameters' and probes' keys

    def data_loaders(self, info, *, workers: int, seed: int):
        from dlscale.data.mxnet_data import make_loader

        rank, world, batch = self.ctx.rank, self.ctx.world_size, self.spec.per_rank_batch
        train, sampler = make_loader(info, "train", rank, world, batch, workers=workers, seed=seed)
        val, _ = make_loader(
            info, "val", rank, world, batch, workers=workers, seed=seed, train=False
        )
        return train, sampler, val

    def _on_device(self, batch):
        x, y = batch
        return x.as_in_context(self.device), y.as_in_context(self.device)

    def train_batch(self, batch, learning_rate: float):
        x, y = self._on_device(batch)
        self.trainer.set_learning_rate(learning_rate)
        with self.watchdog("a training step"):
            with self.autograd.record():
                loss = self.loss_fn(self.net(x), y)  # per-sample losses
                if self.loss_scaling:
                    with self.amp.scale_loss(loss, self.trainer) as scaled:
                        self.autograd.backward(scaled)
            if not self.loss_scaling:
                loss.backward()  # gradient of the summed loss
            # rescale_grad = 1 / global batch: the kvstore's sum over workers becomes the mean
            self.trainer.step(self.global_batch)
        return loss.sum(), int(y.shape[0])

    def _running_stats(self) -> list:
        """The normalisation statistics (Gluon parameters with grad_req 'null')."""
        params = self.net.collect_params().values()
        return [p for p in params if p.grad_req == "null"]

    def warmup_pass(self, batch) -> None:
        """One forward and backward pass without update (hybridize's graph is built here, and
        the shapes of deferred parameters are known from here on); the normalisation statistics
        it moved are restored. Then the kvstore is set up and rank 0's weights broadcast
        (Trainer's lazy start, else in the first step)."""
        x, y = self._on_device(batch)
        saved = [p.data().copy() for p in self._running_stats()]
        with self.autograd.record():
            loss = self.loss_fn(self.net(x), y)
        loss.backward()
        for p, value in zip(self._running_stats(), saved):
            p.set_data(value)
        self.mx.nd.waitall()
        if not self.trainer._kv_initialized:
            with self.watchdog("kvstore start-up (parameters)"):
                self.trainer._init_kvstore()
                self.trainer._init_params()
                self.mx.nd.waitall()

    def _pushpull_sum(self, key: int, buf):
        """The element-wise sum of `buf` over all workers through the dist_sync kvstore (no
        optimizer on the servers: update_on_kvstore=False, so they return the merged pushes)."""
        if key not in self.gather_keys:
            self.kv.init(key, self.mx.nd.zeros(buf.shape, dtype=buf.dtype))
            self.gather_keys[key] = buf.shape
        self.kv.pushpull(key, buf, out=buf)
        return buf

    def _broadcast_stats(self) -> None:
        """Rank 0's normalisation statistics on every rank (each rank's last training forward
        moved its own), so that every shard is evaluated by the same model."""
        if not self.data_parallel:
            return
        with self.watchdog("a broadcast of normalisation statistics"):
            for i, p in enumerate(self._running_stats()):
                mine = p.data().copy() if self.ctx.rank == 0 else self.mx.nd.zeros_like(p.data())
                p.set_data(self._pushpull_sum(self.STATS_KEY + i, mine))
            self.mx.nd.waitall()

    def evaluate(self, batches) -> tuple[int, int]:
        self._broadcast_stats()
        correct, count = 0, 0
        for batch in batches:
            x, y = self._on_device(batch)
            hits = self.net(x).argmax(axis=1) == y  # predict mode: the running statistics
            correct += int(hits.sum().asscalar())
            count += int(y.shape[0])
        return correct, count

    def to_host(self, value) -> float:
        return float(value.asscalar()) if hasattr(value, "asscalar") else float(value)

    def _gathered(self, values: list[float]):
        """(world_size, k): every rank's `values`, each in its own row of a summed buffer."""
        np, k = self.np, len(values)
        rows = np.zeros((self.ctx.world_size, k), dtype=np.float64)
        rows[self.ctx.rank] = [float(v) for v in values]
        if not self.data_parallel:
            return rows
        with self.watchdog("an all-reduce of epoch figures"):
            buf = self.mx.nd.array(rows.ravel(), ctx=self.device, dtype="float64")
            out = self._pushpull_sum(self.GATHER_KEY + k, buf).asnumpy()
        return out.reshape(self.ctx.world_size, k)

    def allreduce_sum(self, values: list[float]) -> list[float]:
        return self._gathered(values).sum(axis=0).tolist()

    def allreduce_max(self, values: list[float]) -> list[float]:
        return self._gathered(values).max(axis=0).tolist()

    def sync(self) -> None:
        self.mx.nd.waitall()

    def barrier(self) -> None:
        if self.backend == "dist_sync":
            with self.watchdog("a barrier"):
                self.kv._barrier()

    compile_method = "Gluon hybridize(static_alloc=True, static_shape=True): a cached static graph"

    def wrapper(self) -> str:
        if self.data_parallel:
            return "gluon.Trainer on the dist_sync kvstore (update on the servers)"
        return super().wrapper()

    def fast_paths(self) -> dict:
        return {
            "hybridized": self.compiled,
            "cudnn_autotune": os.environ.get("MXNET_CUDNN_AUTOTUNE_DEFAULT", "1 (default)")
            if self.spec.device == "cuda"
            else None,
        }

    def teardown(self) -> None:
        failing = sys.exc_info()[0] is not None
        kv = getattr(self, "kv", None)
        if failing:
            # A failed rank must not wait in ps-lite's exit barrier for peers that will never
            # arrive: skip it, and take the scheduler/server down with this rank.
            if kv is not None and getattr(self, "backend", "") == "dist_sync":
                self.mx.base._LIB.MXKVStoreSetBarrierBeforeExit(kv.handle, ctypes.c_int(0))
            self._kill_children()
        if kv is not None:
            # Freeing the kvstore finalises ps-lite: an exit barrier over all nodes, after which
            # worker rank 0 stops the servers and the scheduler exits. Gluon keeps the kvstore
            # alive through every Parameter's trainer, so free it explicitly, now.
            with self.watchdog("kvstore shutdown"):
                self._free_kvstore(kv)
        if getattr(self, "children", None):
            self._stop_children(0.0 if failing else SHUTDOWN_WAIT_S)

    def _free_kvstore(self, kv) -> None:
        for trainer in (self.trainer, self.local_trainer):
            if trainer is not None:
                trainer._kvstore = None
                trainer._kvstore_params["kvstore"] = None
        if getattr(self, "net", None) is not None:
            for param in self.net.collect_params().values():
                param._trainer = None
        self.trainer = self.local_trainer = self.kv = None
        self.probe_keys = {}
        self.mx.nd.waitall()
        handle, kv.handle = kv.handle, None  # KVStore.__del__ then frees NULL: a no-op
        self.mx.base.check_call(self.mx.base._LIB.MXKVStoreFree(handle))
        gc.collect()

    def build_info(self) -> dict:
        import mxnet.runtime  # not imported by `import mxnet`

        features = {f.name: bool(f.enabled) for f in mxnet.runtime.Features().values()}
        return {
            "available": True,
            "framework": "mxnet",
            "version": self.mx.__version__,
            # MXNet's runtime features say whether CUDA, cuDNN and NCCL are built in, no versions
            "cuda_runtime": "built in (version not exposed)" if features.get("CUDA") else None,
            "cudnn": "built in (version not exposed)" if features.get("CUDNN") else None,
            "nccl": "built in (version not exposed)" if features.get("NCCL") else None,
            "build": {"enabled": sorted(k for k, v in features.items() if v)},
        }

    def describe(self) -> dict:
        mx = self.mx
        if self.device.device_type == "gpu":
            device_model = f"GPU {self.device.device_id} (CUDA, name not exposed by MXNet)"
        else:
            device_model = cpu_model()
        return {
            "libraries": {"mxnet": mx.__version__, "numpy": self.np.__version__},
            "backend": self.backend,
            "device_model": device_model,
            "data_layout": "NCHW" if self.vision else "tokens",
            "input_shape": list(self.model_spec.input_shape),
            "param_count": self.param_count,
            "data": "synthetic (one fixed batch per rank, generated on the device)",
            "sync_method": self.sync_method,
            "autocast": self.autocast,
        }
