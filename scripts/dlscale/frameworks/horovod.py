"""Horovod adapter: Horovod's PyTorch binding, gloo controller and CPU collectives (NCCL for GPU
tensors when Horovod was built with it), launched without horovodrun.

Ranks come from dlscale's launcher (local processes or srun), not from horovodrun, so this
adapter does what horovodrun's gloo launcher (horovod/runner/gloo_run.py) would have done:
  - rank 0 runs Horovod's own rendezvous HTTP server (RendezvousHTTPServer, in a daemon thread)
    on MASTER_ADDR:MASTER_PORT, initialised with the host allocation plan of the RankContext
    (node-major placement, ranks_per_node ranks per node);
  - every rank sets the HOROVOD_* variables horovodrun would set (rank, size, local and cross
    ranks, host label, rendezvous address, gloo controller and CPU operations, the network
    interface that reaches the other nodes) and calls hvd.init().
Collectives are bounded: gloo's timeout (HOROVOD_GLOO_TIMEOUT_SECONDS) for the rendezvous and
a dead peer, and the base's watchdog (base.Watchdog) for a peer that is alive but stops taking
part: a peer whose Python thread is stuck while its Horovod background thread still cycles never
breaks a gloo connection, and Horovod's stall inspector (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS, set
as well) did not end such a rank in our tests of 0.28.1 within minutes: synchronize() then waits
forever. So every step, barrier and probe runs under a fixed deadline of
DLSCALE_COLLECTIVE_TIMEOUT_S; past it the rank says what it waited for and exits with 124.
The model is dlscale's PyTorch model (dlscale.models.torch.build), so parameter counts match the
pytorch framework by construction; the optimizer is hvd.DistributedOptimizer around SGD (the
config's learning rate and momentum), gradients averaged by allreduce during backward. Parameters
are broadcast from rank 0 once. As in plain Horovod, module buffers (BatchNorm running statistics)
stay per rank (DDP broadcasts them from rank 0 at every forward).
"""

from __future__ import annotations

import importlib.metadata
import ipaddress
import os
import socket
import threading
import time

import torch

from dlscale.frameworks.base import Adapter as BaseAdapter
from dlscale.frameworks.base import Watchdog
from dlscale.frameworks.torch_model import TorchModel, torch_gpu_identity
from dlscale.rank.timing import COLLECTIVE_TIMEOUT_S


def _iface_for(addr: str) -> str:
    """Name of the local network interface whose address routes to `addr` (the interface gloo
    must bind to so that every peer can reach it): the source address the kernel picks for a
    datagram to `addr`, looked up in the interface table."""
    import psutil  # a Horovod runtime requirement

    infos = socket.getaddrinfo(addr, 9, proto=socket.IPPROTO_UDP)
    family, _, _, _, sockaddr = infos[0]
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect(sockaddr)  # UDP: no packet is sent, only the route is resolved
        local = ipaddress.ip_address(s.getsockname()[0].split("%")[0])
    for name, addrs in psutil.net_if_addrs().items():
        for a in addrs:
            if a.family in (socket.AF_INET, socket.AF_INET6):
                try:
                    if ipaddress.ip_address(a.address.split("%")[0]) == local:
                        return name
                except ValueError:
                    continue
    raise RuntimeError(f"no network interface has {local}, the local address that reaches {addr}")


def peer_address(ctx, nodes: int) -> str:
    """An address this node's gloo interface must reach: another node's when there is one (on
    the master node its own name may resolve to a loopback address such as Debian's 127.0.1.1,
    which would pick `lo`), else the master's (a single node, or simulated nodes on one host)."""
    own = ctx.hosts[min(ctx.node_index, len(ctx.hosts) - 1)] if ctx.hosts else ctx.master_addr
    for host in ctx.hosts[:nodes]:
        if host != own:
            return host
    return ctx.master_addr


def gloo_iface(ctx, nodes: int, env=os.environ) -> str:
    """The interface Horovod's gloo binds (HOROVOD_GLOO_IFACE, one name): an explicit
    HOROVOD_GLOO_IFACE; else the first of GLOO_SOCKET_IFNAME, which the site's env names or
    dlscale.rank.network chose on a cluster (Horovod reads only its own variable); else the one
    that reaches the other nodes (loopback in a local launch)."""
    if env.get("HOROVOD_GLOO_IFACE"):
        return env["HOROVOD_GLOO_IFACE"]
    named = env.get("GLOO_SOCKET_IFNAME", "").split(",")[0].strip()
    return named or _iface_for(peer_address(ctx, nodes))


def own_name_check(ctx, iface: str) -> None:
    """Fail at once where Horovod would bind an address the other nodes cannot reach: its
    process-set communicator (the global process set, always made) leaves HOROVOD_GLOO_IFACE
    out (Horovod 0.28.1, GlooContext::InitializeForProcessSet), so gloo binds what this node's
    own name resolves to here, which must be an address of `iface`, the interface that
    reaches the other nodes. Nothing to check on one host."""
    from dlscale.rank import network

    if len({network.resolve(h) or h for h in set(ctx.hosts)}) < 2:
        return
    name = socket.gethostname()
    addr = network.resolve(name)
    table = network.interfaces()
    ours = table.get(iface, {}).get("addresses", [])
    if addr is None or addr in ours:
        return
    raise network.NetworkError(
        f"node {name} resolves its own name to {addr} "
        f"({network.interface_with(addr, table) or 'no interface here'}), and Horovod's "
        "process-set communicator binds that address whatever HOROVOD_GLOO_IFACE says "
        f"(Horovod 0.28.1); the other nodes reach this node through {iface} "
        f"({', '.join(ours) or 'no address'}): give {name} that address in the node's "
        "/etc/hosts or DNS, or run Horovod on nodes whose names resolve to the network they "
        "share"
    )


def host_labels(hosts: tuple[str, ...], nodes: int) -> list[str]:
    """Horovod's per-node host label (HOROVOD_HOSTNAME: the name of the node's local gloo scope).
    The node address when addresses are distinct; simulated nodes on one host share an address,
    so they get `<address>-node<i>` (the label is a scope name, never resolved)."""
    addrs = [hosts[min(i, len(hosts) - 1)] for i in range(nodes)]
    if len(set(addrs)) == len(addrs):
        return addrs
    return [f"{a}-node{i}" for i, a in enumerate(addrs)]


def allocation_plan(world_size: int, ranks_per_node: int, labels: list[str]):
    """The host allocation plan horovodrun builds (horovod.runner.common.util.hosts
    .get_host_assignments): one SlotInfo per rank, placed node-major."""
    from horovod.runner.common.util.hosts import SlotInfo

    nodes = world_size // ranks_per_node
    return [
        SlotInfo(
            hostname=labels[r // ranks_per_node],
            rank=r,
            local_rank=r % ranks_per_node,
            cross_rank=r // ranks_per_node,
            size=world_size,
            local_size=ranks_per_node,
            cross_size=nodes,
        )
        for r in range(world_size)
    ]


class RendezvousThread:
    """Horovod's rendezvous HTTP server on a fixed address (horovodrun's RendezvousServer picks a
    random port, which the ranks could not know)."""

    def __init__(self, addr: str, port: int, plan):
        self.addr = f"{addr or '*'}:{port}"
        from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

        try:
            self.httpd = RendezvousHTTPServer((addr, port), RendezvousHandler, 0)
        except OSError as exc:
            raise RuntimeError(
                f"rank 0 cannot serve Horovod's rendezvous on {self.addr}: {exc}"
            ) from exc
        self.httpd.init(plan)
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, name="hvd-rendezvous", daemon=True
        )
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)


def _wait_for(addr: str, port: int, timeout: float) -> None:
    """Horovod's HTTP store gives up after a few quick retries: wait until rank 0 serves."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((addr, port), timeout=5):
                return
        except OSError as exc:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"Horovod's rendezvous server {addr}:{port} (rank 0) did not "
                    f"answer within {timeout:.0f} s: {exc}"
                ) from exc
            time.sleep(0.2)


class Adapter(TorchModel, BaseAdapter):
    name = "horovod"
    title = "Horovod"
    has_allreduce_probe = True
    convergence_method = (
        "epochs over a torch DataLoader of the rank's shard of the training split "
        "(dlscale.data.torch_data), Horovod's DistributedOptimizer with the learning rate of "
        "each step set from dlscale.study.lr, validation on the model in eval mode with rank 0's "
        "normalisation statistics (hvd.broadcast), counts summed by hvd.allreduce"
    )
    breakdown_method = (
        "the same step with Horovod's gradient allreduce deferred (its "
        "backward_passes_per_step accumulation path: the backward hooks submit "
        "nothing) and the optimizer update on the local gradients"
    )

    def setup(self) -> None:
        spec, ctx = self.spec, self.ctx
        self.seed()
        torch.set_num_threads(spec.threads)
        try:
            torch.set_num_interop_threads(spec.threads)
        except RuntimeError:  # already set (inter-op pool started): keep it
            pass
        self.server = None
        self.hvd = None
        # fixed deadlines: gloo operations time out after COLLECTIVE_TIMEOUT_S (a dead peer
        # fails the next collective at once: its connections close); this ends a rank whose
        # step, barrier or probe waits on a peer that stopped taking part
        self.watchdog = Watchdog(self.name, ctx.rank)
        if not self.data_parallel:
            # world size 1: the plain PyTorch loop, without Horovod (no rendezvous, no
            # DistributedOptimizer, no allreduce): the best single-device program
            self._setup_single_device()
            return
        # the rendezvous has its own timeout (HOROVOD_GLOO_TIMEOUT_SECONDS); this is a backstop
        with self.watchdog("hvd.init (rendezvous)", 2 * COLLECTIVE_TIMEOUT_S + 60):
            self._init_horovod()
        import horovod.torch as hvd

        self.hvd = hvd
        if hvd.size() != ctx.world_size or hvd.rank() != ctx.rank:
            raise RuntimeError(
                f"Horovod sees rank {hvd.rank()} of {hvd.size()}, the launcher "
                f"started rank {ctx.rank} of {ctx.world_size}"
            )
        if spec.device == "cuda":
            if not hvd.nccl_built():
                raise RuntimeError(
                    "this Horovod build has no GPU operations (built for CPU "
                    "with gloo): rebuild it with HOROVOD_GPU_OPERATIONS=NCCL"
                )
            ordinal = self.choose_gpu(torch.cuda.device_count(), torch_gpu_identity)
            torch.cuda.set_device(ordinal)
            self.device = torch.device("cuda", ordinal)
            self.backend = "nccl"
            self.sync_method = "torch.cuda.synchronize"
        else:
            self.device = torch.device("cpu")
            self.backend = "gloo"
            self.sync_method = (
                "none (CPU ops are synchronous; DistributedOptimizer.step waits for its allreduce)"
            )
        self.model = self.prepare_model()
        self.forward = self.compile_forward(self.model)
        optimizer = self.sgd(self.model.parameters())
        with self.watchdog("broadcast_parameters"):
            hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
        self.optimizer = hvd.DistributedOptimizer(
            optimizer, named_parameters=self.model.named_parameters(), op=hvd.Average
        )

    def _setup_single_device(self) -> None:
        if self.spec.device == "cuda":
            ordinal = self.choose_gpu(torch.cuda.device_count(), torch_gpu_identity)
            torch.cuda.set_device(ordinal)
            self.device = torch.device("cuda", ordinal)
            self.sync_method = "torch.cuda.synchronize"
        else:
            self.device = torch.device("cpu")
            self.sync_method = "none (CPU ops are synchronous)"
        self.backend = "none (world size 1)"
        self.model = self.prepare_model()
        self.forward = self.compile_forward(self.model)
        self.optimizer = self.sgd(self.model.parameters())

    def wrapper(self) -> str:
        if self.data_parallel:
            return "horovod.torch.DistributedOptimizer (average), parameters broadcast from rank 0"
        return super().wrapper()

    def _init_horovod(self) -> None:
        """Set what horovodrun would set, start the rendezvous server on rank 0, hvd.init()."""
        ctx = self.ctx
        rpn = ctx.local_world_size
        if ctx.world_size % rpn:
            raise RuntimeError(
                f"world size {ctx.world_size} is not a multiple of {rpn} ranks per node"
            )
        nodes = ctx.world_size // rpn
        labels = host_labels(ctx.hosts, nodes)
        port = ctx.master_port
        timeout = str(COLLECTIVE_TIMEOUT_S)
        env = {
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": ctx.master_addr,
            "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
            "HOROVOD_CONTROLLER": "gloo",
            "HOROVOD_CPU_OPERATIONS": "gloo",
            "HOROVOD_RANK": str(ctx.rank),
            "HOROVOD_SIZE": str(ctx.world_size),
            "HOROVOD_LOCAL_RANK": str(ctx.local_rank),
            "HOROVOD_LOCAL_SIZE": str(rpn),
            "HOROVOD_CROSS_RANK": str(ctx.node_index),
            "HOROVOD_CROSS_SIZE": str(nodes),
            "HOROVOD_HOSTNAME": labels[ctx.node_index],
            "HOROVOD_GLOO_TIMEOUT_SECONDS": timeout,
            "HOROVOD_STALL_CHECK_TIME_SECONDS": str(min(60, COLLECTIVE_TIMEOUT_S)),
            "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": timeout,
        }
        os.environ.update(env)
        os.environ["HOROVOD_GLOO_IFACE"] = gloo_iface(ctx, nodes)
        own_name_check(ctx, os.environ["HOROVOD_GLOO_IFACE"])
        os.environ.setdefault("NCCL_SOCKET_IFNAME", os.environ["HOROVOD_GLOO_IFACE"])
        if ctx.rank == 0:
            # On every interface, like horovodrun: a node's own name may resolve to a
            # loopback address (Debian's 127.0.1.1) that the other nodes cannot reach.
            plan = allocation_plan(ctx.world_size, rpn, labels)
            self.server = RendezvousThread("", port, plan)
        else:
            _wait_for(ctx.master_addr, port, COLLECTIVE_TIMEOUT_S)
        import horovod.torch as hvd

        hvd.init()

    def step(self) -> None:
        if not self.data_parallel:
            self.train_step(self.forward, self.optimizer)
            return
        with self.watchdog("a training step"):
            self._step(allreduce=True)

    def step_without_allreduce(self) -> None:
        with self.watchdog("a compute-only step"):
            self._step(allreduce=False)

    def _step(self, allreduce: bool, x=None, y=None):
        """One step on the fixed batch (or on x, y); returns the loss."""
        opt = self.optimizer
        with torch.autocast(
            self.device.type, dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None
        ):
            loss = self.loss_fn(
                self.forward(self.x if x is None else x), self.y if y is None else y
            )
        opt.zero_grad()  # Horovod's takes no argument; torch's default sets None
        if not allreduce:
            # One more backward pass than Horovod allreduces after: the gradient hooks only
            # count it down and record no handle (Horovod 0.28.1's local accumulation path).
            opt.set_backward_passes_per_step(opt.backward_passes_per_step + 1)
        scaled = self.scaler.scale(loss) if self.scaler is not None else loss
        scaled.backward()
        if allreduce:
            opt.synchronize()  # wait for the allreduce (average) of every gradient
        else:
            opt._handles.clear()  # the pending no-op entries the hooks left
            opt.set_backward_passes_per_step(opt.backward_passes_per_step - 1)
        with opt.skip_synchronize():
            if self.scaler is not None:
                self.scaler.step(opt)  # unscale + inf check on the averaged gradients
                self.scaler.update()
            else:
                opt.step()
        return loss

    # ---- the convergence contract: TorchModel's, with Horovod's optimizer and collectives
    def train_batch(self, batch, learning_rate: float):
        if not self.data_parallel:
            return super().train_batch(batch, learning_rate)
        x, y = self._on_device(batch)
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate
        with self.watchdog("a training step"):
            loss = self._step(allreduce=True, x=x, y=y)
        return loss.detach().float() * len(y), len(y)

    def warmup_pass(self, batch) -> None:
        if not self.data_parallel:
            return super().warmup_pass(batch)
        x, y = self._on_device(batch)
        buffers = {name: b.clone() for name, b in self.model.named_buffers()}
        with self.watchdog("the warm-up pass"):
            with self._autocast():
                loss = self.loss_fn(self.forward(x), y)
            (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
            self.optimizer.synchronize()  # Horovod's hooks submitted allreduces: wait for them
            self.optimizer.zero_grad()
        with torch.no_grad():
            for name, b in self.model.named_buffers():
                b.copy_(buffers[name])

    def broadcast_buffers(self) -> None:
        if self.data_parallel:
            with self.watchdog("a broadcast of the normalisation statistics"):
                self.hvd.broadcast_parameters(dict(self.model.named_buffers()), root_rank=0)

    def _allreduce(self, values: list[float], op) -> list[float]:
        if not self.data_parallel:
            return [float(v) for v in values]
        t = torch.tensor([float(v) for v in values], dtype=torch.float64)
        with self.watchdog("an allreduce of the epoch's counts"):
            if op == "max":  # the maximum over ranks from every rank's values
                return self.hvd.allgather(t.unsqueeze(0)).max(dim=0).values.tolist()
            return self.hvd.allreduce(t, op=self.hvd.Sum, name=f"dlscale.{op}").tolist()

    def allreduce_sum(self, values: list[float]) -> list[float]:
        return self._allreduce(values, "sum")

    def allreduce_max(self, values: list[float]) -> list[float]:
        return self._allreduce(values, "max")

    def barrier(self) -> None:
        if not self.data_parallel:
            return
        with self.watchdog("a barrier"):
            self.hvd.barrier()

    def allreduce(self, numel: int) -> None:
        with self.watchdog("an allreduce probe"):
            self.hvd.allreduce_(
                self.probe_buffer(numel), op=self.hvd.Sum, name="dlscale.allreduce_probe"
            )
            self.sync()

    def teardown(self) -> None:
        hvd = getattr(self, "hvd", None)
        if hvd is not None and hvd.is_initialized():
            with self.watchdog("hvd.shutdown"):
                hvd.shutdown()
        if getattr(self, "server", None) is not None:
            self.server.stop()
            self.server = None

    def build_info(self) -> dict:
        info = super().build_info()
        hvd = self.hvd
        if hvd is None:  # world size 1 runs without Horovod; its build flags need no init
            import horovod.torch as hvd
        if hvd is not None:
            info["horovod"] = {
                "version": importlib.metadata.version("horovod"),
                **{
                    name: bool(getattr(hvd, name)())
                    for name in ("gloo_built", "mpi_built", "nccl_built", "cuda_built")
                    if hasattr(hvd, name)
                },
            }
        return info

    def describe(self) -> dict:
        return self.describe_torch({"horovod": importlib.metadata.version("horovod")})
