"""A local cluster's layout as scripts/slurm/cluster-up.sh made it (`<state dir>/etc/layout`):
separate hosts (each node its own network namespace, address, /tmp, /dev/shm and node-local
scratch) or the single-address fallback; and the network faults the tests give a node (an
interface down, a second interface its peers cannot reach), each undone when the test ends."""

from __future__ import annotations

import contextlib
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Node:
    name: str
    address: str
    netns: str
    folder: Path  # on the login side: the node's /tmp is folder/tmp, its scratch folder/scratch


@dataclass(frozen=True)
class Layout:
    kind: str  # "hosts" or "single"
    net: str | None
    scratch: str | None  # the node-local scratch folder, as every node sees it
    nodes: dict[str, Node]

    @property
    def separate_hosts(self) -> bool:
        return self.kind == "hosts"


def layout(state_dir: str | Path | None = None) -> Layout:
    """The layout of the cluster in `state_dir` (default: this process's DLSCALE_SLURM_DIR)."""
    state = Path(state_dir or os.environ["DLSCALE_SLURM_DIR"])
    values: dict[str, list[str]] = {}
    for line in (state / "etc" / "layout").read_text().splitlines():
        key, _, value = line.partition("=")
        values.setdefault(key, []).append(value)
    nodes = {}
    for entry in values.get("node", []):
        name, address, netns, folder = entry.split()
        nodes[name] = Node(name, address, netns, Path(folder))
    return Layout(
        kind=values["layout"][0],
        net=values.get("net", [None])[0],
        scratch=values.get("scratch", [None])[0],
        nodes=nodes,
    )


def in_node(node: Node, *command: str, check: bool = True) -> subprocess.CompletedProcess:
    """`command` in the node's network namespace (root)."""
    return subprocess.run(
        ["ip", "netns", "exec", node.netns, *command],
        capture_output=True,
        text=True,
        check=check,
        timeout=30,
    )


@contextlib.contextmanager
def interface_down(node: Node, interface: str = "eth0"):
    """The node's interface down (its peers and slurmctld cannot reach it), up again after."""
    in_node(node, "ip", "link", "set", interface, "down")
    try:
        yield
    finally:
        in_node(node, "ip", "link", "set", interface, "up", check=False)


def decoy_address(node: Node) -> str:
    """The address of `node`'s second interface: on a network of that node alone (inside its
    own namespace: no other node or host has a route there)."""
    parts = node.address.split(".")
    return f"10.212.{parts[2]}.{parts[3]}"


@contextlib.contextmanager
def decoy_interface(node: Node, interface: str = "eth1"):
    """A second interface on `node` (up, on a network no other node reaches), whose
    address the node's own name resolves to first on the node itself (its own /etc/hosts), as a
    management network's address can: what a collective that goes by the node's name would
    bind. Removed after, with the hosts line."""
    address = decoy_address(node)
    hosts = node.folder / "hosts"  # the node's own /etc/hosts (bind-mounted on the node)
    before = hosts.read_text()
    # a veth pair inside the node (a kernel without the dummy link type has veths): one end up
    # with the address, the other up and bare, so the first's link is up
    in_node(node, "ip", "link", "add", interface, "type", "veth", "peer", "name", f"{interface}p")
    try:
        in_node(node, "ip", "addr", "add", f"{address}/24", "dev", interface)
        in_node(node, "ip", "link", "set", f"{interface}p", "up")
        in_node(node, "ip", "link", "set", interface, "up")
        with open(hosts, "w") as fh:  # in place: the node's bind mount holds this file
            fh.write(f"{address}\t{node.name}\t# a second network, unreachable from the others\n")
            fh.write(before)
        yield address
    finally:
        with open(hosts, "w") as fh:
            fh.write(before)
        in_node(node, "ip", "link", "del", interface, check=False)


@contextlib.contextmanager
def cut_off(node: Node, interface: str = "eth0"):
    """`node` cut off: its interface down (no other node, nor slurmctld, reaches it); after,
    up again, and the node taken out and back in (DOWN, then RESUME) so that slurmctld drops
    what it could not deliver there and gives the node jobs again at once."""
    try:
        with interface_down(node, interface):
            yield
    finally:
        for state in ("DOWN", "RESUME"):
            subprocess.run(
                ["scontrol", "update", f"NodeName={node.name}", f"State={state}"]
                + (["Reason=dlscale-network-test"] if state == "DOWN" else []),
                capture_output=True,
                timeout=60,
            )
