"""The network a rank's collectives take, seen from its node.

On a cluster every node is a host of its own. Rank 0's rendezvous address (MASTER_ADDR, the
first node's name) must resolve, on every other node, to an address that reaches rank 0, and
each collective binds an interface its peers can reach. `rendezvous()` checks both before any
framework waits on a peer, so a network the ranks cannot use fails the cell at once, naming the
node, the address and the interface to name, instead of a collective timing out minutes later:

- MASTER_ADDR must resolve here; on a node other than the master's, not to a loopback address
  (which reaches this node, not rank 0's);
- an interface the site names (a hardware entry's `env:` GLOO_SOCKET_IFNAME, or
  NCCL_SOCKET_IFNAME) is honoured, once checked to exist here, be up and hold an address;
- otherwise gloo is given (GLOO_SOCKET_IFNAME) the interface the kernel routes another node's
  address through (a UDP socket's connect: no packet is sent). Left to itself, gloo binds the
  address this node's own name resolves to, which on a node with a second interface that the
  other nodes cannot reach (or Debian's 127.0.1.1 for its own name) is one its peers cannot
  connect to;
- no route from here to another node of the cell is an error now, naming the interfaces here.

Cells whose nodes are one host (the local launcher's simulated nodes; a local cluster whose
nodes share one address: every node name resolves alike) are left as they are. The record
(rank_start `network`; the cell's provenance `rendezvous`, dlscale.store.metrics) says what
MASTER_ADDR resolved to on each node and which interface was taken, and why.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import struct
from collections.abc import MutableMapping

GLOO_IFNAME = "GLOO_SOCKET_IFNAME"
NCCL_IFNAME = "NCCL_SOCKET_IFNAME"
IFNAME_VARIABLES = (GLOO_IFNAME, NCCL_IFNAME)
_SIOCGIFFLAGS, _SIOCGIFADDR, _IFF_UP = 0x8913, 0x8915, 0x1


class NetworkError(RuntimeError):
    """The ranks of a cell cannot reach each other from this node: the cell fails at once."""


def resolve(host: str) -> str | None:
    """The address `host` resolves to here (IPv4 first, as the frameworks connect), or None."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return None
    addrs = [info[4][0] for info in infos]
    v4 = [a for a in addrs if ":" not in a]
    return (v4 or addrs or [None])[0]


def is_loopback(addr: str | None) -> bool:
    try:
        return addr is not None and ipaddress.ip_address(addr.split("%")[0]).is_loopback
    except ValueError:
        return False


def interfaces() -> dict[str, dict]:
    """This host's network interfaces: name -> {"up": bool, "addresses": [...]} (IPv4 from the
    kernel's interface table, IPv6 from /proc/net/if_inet6)."""
    found: dict[str, dict] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                flags = struct.unpack("H", fcntl.ioctl(s, _SIOCGIFFLAGS, request)[16:18])[0]
            except OSError:
                flags = 0
            entry = found.setdefault(name, {"up": bool(flags & _IFF_UP), "addresses": []})
            try:
                packed = fcntl.ioctl(s, _SIOCGIFADDR, request)[20:24]
                entry["addresses"].append(socket.inet_ntoa(packed))
            except OSError:
                pass  # no IPv4 address
    try:
        with open("/proc/net/if_inet6") as fh:
            for line in fh:
                fields = line.split()
                if len(fields) == 6 and fields[5] in found:
                    raw = bytes.fromhex(fields[0])
                    found[fields[5]]["addresses"].append(socket.inet_ntop(socket.AF_INET6, raw))
    except OSError:
        pass
    return found


def route_source(addr: str) -> str | None:
    """This host's address on the kernel's route to `addr` (no packet is sent), or None when no
    route leads there."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((addr, 9))
            return s.getsockname()[0]
    except OSError:
        return None


def interface_with(addr: str, table: dict[str, dict] | None = None) -> str | None:
    """The interface that holds `addr`."""
    for name, entry in (interfaces() if table is None else table).items():
        if addr in entry["addresses"]:
            return name
    return None


def shown(table: dict[str, dict]) -> str:
    """The interfaces as an error lists them: `eth0 10.0.0.1 (up), lo 127.0.0.1 (up)`."""
    return ", ".join(
        f"{name} {' '.join(e['addresses']) or 'no address'} ({'up' if e['up'] else 'down'})"
        for name, e in sorted(table.items())
    )


def _named(variable: str, value: str, table: dict[str, dict]) -> list[str]:
    """The interfaces here that a site's `variable` names (GLOO_SOCKET_IFNAME: exact names,
    comma-separated; NCCL_SOCKET_IFNAME: prefixes, `=` exact names, `^` an exclusion list,
    which names none in particular: every other interface)."""
    names = [n.strip() for n in value.split(",") if n.strip()]
    if variable == NCCL_IFNAME:
        if value.startswith("^"):
            excluded = [n.lstrip("^=") for n in names]
            return [i for i in table if not any(i.startswith(e) for e in excluded)]
        if value.startswith("="):
            names = [n.lstrip("=") for n in names]
            return [i for i in names if i in table]
        return [i for i in table if any(i.startswith(n) for n in names)]
    return [n for n in names if n in table]


def _usable(name: str, table: dict[str, dict]) -> bool:
    entry = table.get(name)
    return bool(entry and entry["up"] and entry["addresses"])


def rendezvous(ctx, device: str = "cpu", env: MutableMapping[str, str] | None = None) -> dict:
    """Check this rank's rendezvous and choose its collectives' interface (module docstring):
    GLOO_SOCKET_IFNAME, and on a `cuda` cell NCCL_SOCKET_IFNAME, checked where the site names
    them; `env` (os.environ) gains GLOO_SOCKET_IFNAME where the site named none. Returns the
    record; raises NetworkError when the ranks cannot reach each other from here."""
    env = os.environ if env is None else env
    own = ctx.hosts[min(ctx.node_index, len(ctx.hosts) - 1)] if ctx.hosts else ctx.master_addr
    record = {
        "node": ctx.node,
        "master_addr": ctx.master_addr,
        "master_port": ctx.master_port,
        "master_resolved": resolve(ctx.master_addr),
        "interface": None,
        "address": None,
        "chosen_by": None,
        "peer": None,
    }
    if len({resolve(h) or h for h in set(ctx.hosts)}) < 2:
        # the cell's nodes are one host (the local launcher's simulated nodes, a local
        # cluster's nodes on one address): its own loopback reaches every rank
        record["chosen_by"] = "one host: the frameworks' own choice"
        return record
    table = interfaces()
    here = f"node {ctx.node} (rank {ctx.rank})"
    if record["master_resolved"] is None:
        raise NetworkError(
            f"MASTER_ADDR {ctx.master_addr!r} does not resolve on {here}: every node must "
            "resolve the first node's name (its /etc/hosts or DNS)"
        )
    if ctx.node_index != 0 and is_loopback(record["master_resolved"]):
        raise NetworkError(
            f"MASTER_ADDR {ctx.master_addr!r} resolves to {record['master_resolved']} on {here}:"
            " a loopback address reaches this node, not rank 0's; the node's /etc/hosts or DNS "
            f"must give {ctx.master_addr} the address the nodes share"
        )
    peer = next((h for h in ctx.hosts if h != own), None)
    peer_addr = resolve(peer) if peer else None
    record["peer"] = f"{peer} {peer_addr}" if peer else None
    routed = route_source(peer_addr) if peer_addr else None
    routed_if = interface_with(routed, table) if routed else None
    for variable in IFNAME_VARIABLES if device == "cuda" else (GLOO_IFNAME,):
        value = env.get(variable, "").strip()
        if not value:
            continue
        named = _named(variable, value, table)
        if not any(_usable(n, table) for n in named):
            hint = f"; {peer} is reached through {routed_if} here" if routed_if else ""
            raise NetworkError(
                f"{variable}={value} names no interface of {here} that is up and has an "
                f"address (interfaces here: {shown(table)}){hint}: name the interface the "
                "nodes share in the hardware entry's env"
            )
        if variable == GLOO_IFNAME or record["interface"] is None:
            first = next(n for n in named if _usable(n, table))
            record.update(
                interface=first,
                address=table[first]["addresses"][0],
                chosen_by=f"the site: {variable}={value}",
            )
    if env.get(GLOO_IFNAME, "").strip():
        return record
    if peer_addr is None:
        raise NetworkError(
            f"{peer!r}, another node of the cell, does not resolve on {here}: every node must "
            "resolve the others' names (its /etc/hosts or DNS)"
        )
    if routed is None or routed_if is None:
        raise NetworkError(
            f"no interface of {here} reaches {peer} ({peer_addr}): name the interface the "
            f"nodes share in the hardware entry's env, {GLOO_IFNAME}: <name> (interfaces here: "
            f"{shown(table)})"
        )
    env[GLOO_IFNAME] = routed_if
    record.update(interface=routed_if, address=routed, chosen_by=f"the route to {peer}")
    return record
