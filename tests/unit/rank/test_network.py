"""The rendezvous a rank checks before any framework waits on a peer (dlscale.rank.network):
MASTER_ADDR resolved on this node, the collectives' interface honoured where the site names it
and chosen by the route to another node where it does not, and a network the ranks cannot use
failing at once with the interface to name. The node's view is given here (its interfaces, its
names, its routes); the Slurm tests run the same checks on the local cluster's separate hosts."""

from __future__ import annotations

import pytest

from dlscale.frameworks import mxnet
from dlscale.frameworks.horovod import gloo_iface, own_name_check
from dlscale.rank import network
from dlscale.rank.rank_context import RankContext

# node n2 of a cell on n1 and n2: eth0 on the nodes' network, eth1 on a network the other node
# cannot reach (n2's own name resolves there, as a management address would)
TABLE = {
    "lo": {"up": True, "addresses": ["127.0.0.1"]},
    "eth0": {"up": True, "addresses": ["10.1.0.2"]},
    "eth1": {"up": True, "addresses": ["192.168.77.2"]},
    "eth2": {"up": False, "addresses": ["10.9.0.2"]},
}
NAMES = {"n1": "10.1.0.1", "n2": "192.168.77.2"}
ROUTES = {"10.1.0.1": "10.1.0.2"}  # n2 reaches n1 through eth0 only


def ctx(node_index: int = 1, hosts=("n1", "n2"), master: str = "n1") -> RankContext:
    return RankContext(
        rank=node_index,
        world_size=2,
        local_rank=0,
        local_world_size=1,
        node_index=node_index,
        node=hosts[node_index] if node_index < len(hosts) else "n2",
        master_addr=master,
        master_port=20000,
        launcher="srun",
        hosts=tuple(hosts),
    )


@pytest.fixture
def node(monkeypatch):
    """This node's interfaces, name resolution and routes (a dict each, changed by a test)."""
    view = {"table": dict(TABLE), "names": dict(NAMES), "routes": dict(ROUTES)}
    monkeypatch.setattr(network, "interfaces", lambda: view["table"])
    monkeypatch.setattr(network, "resolve", lambda host: view["names"].get(host))
    monkeypatch.setattr(network, "route_source", lambda addr: view["routes"].get(addr))
    return view


def test_unset_the_interface_that_routes_to_another_node_is_chosen(node):
    """n2's own name resolves to eth1 (what gloo would bind on its own), but n1 is reached
    through eth0: GLOO_SOCKET_IFNAME=eth0, and the record says why."""
    env: dict[str, str] = {}
    record = network.rendezvous(ctx(), env=env)
    assert env == {"GLOO_SOCKET_IFNAME": "eth0"}
    assert record["interface"] == "eth0" and record["address"] == "10.1.0.2"
    assert record["chosen_by"] == "the route to n1" and record["master_resolved"] == "10.1.0.1"


def test_no_route_to_another_node_fails_at_once_naming_the_variable_and_the_interfaces(node):
    node["routes"].clear()
    with pytest.raises(network.NetworkError) as err:
        network.rendezvous(ctx(), env={})
    message = str(err.value)
    assert "no interface of node n2 (rank 1) reaches n1 (10.1.0.1)" in message
    assert "GLOO_SOCKET_IFNAME: <name>" in message
    assert "eth0 10.1.0.2 (up)" in message and "eth2 10.9.0.2 (down)" in message


def test_the_sites_interface_is_honoured(node):
    env = {"GLOO_SOCKET_IFNAME": "eth1"}  # the site's choice wins, even against the route
    record = network.rendezvous(ctx(), env=env)
    assert env == {"GLOO_SOCKET_IFNAME": "eth1"}
    assert record["interface"] == "eth1" and record["chosen_by"] == (
        "the site: GLOO_SOCKET_IFNAME=eth1"
    )


@pytest.mark.parametrize("value", ["ib0", "eth2", "ib0,ib1"])
def test_a_sites_interface_missing_or_down_fails_at_once_naming_the_one_that_works(node, value):
    with pytest.raises(network.NetworkError) as err:
        network.rendezvous(ctx(), env={"GLOO_SOCKET_IFNAME": value})
    message = str(err.value)
    assert f"GLOO_SOCKET_IFNAME={value} names no interface of node n2" in message
    assert "n1 is reached through eth0 here" in message


def test_nccl_interfaces_are_checked_on_a_gpu_cell_only(node):
    env = {"NCCL_SOCKET_IFNAME": "ib"}
    assert network.rendezvous(ctx(), env=dict(env))["interface"] == "eth0"  # a CPU cell
    with pytest.raises(network.NetworkError, match="NCCL_SOCKET_IFNAME=ib names no interface"):
        network.rendezvous(ctx(), "cuda", env=dict(env))
    for value in ("eth", "=eth0", "^docker,lo"):  # NCCL's prefixes, exact names, exclusions
        record = network.rendezvous(ctx(), "cuda", env={"NCCL_SOCKET_IFNAME": value})
        assert record["interface"] == "eth0", value


def test_master_addr_on_loopback_fails_on_another_node_but_not_on_the_masters(node):
    node["names"]["n1"] = "127.0.1.1"  # Debian's line for a host's own name, here n2's copy
    with pytest.raises(network.NetworkError, match="resolves to 127.0.1.1 on node n2"):
        network.rendezvous(ctx(), env={})
    node["names"]["n2"] = "10.1.0.2"
    node["routes"]["10.1.0.2"] = "10.1.0.1"
    node["table"]["eth0"] = {"up": True, "addresses": ["10.1.0.1"]}
    record = network.rendezvous(ctx(node_index=0), env={})  # rank 0 on n1: its own name
    assert record["master_resolved"] == "127.0.1.1" and record["interface"] == "eth0"


def test_master_addr_that_does_not_resolve_fails_at_once(node):
    del node["names"]["n1"]
    with pytest.raises(network.NetworkError, match="MASTER_ADDR 'n1' does not resolve on node"):
        network.rendezvous(ctx(), env={})


def test_one_host_is_left_to_the_frameworks(node):
    """The local launcher's simulated nodes share one host, and so do the nodes of a local
    cluster on one address (every name resolves to 127.0.0.1): nothing is chosen or checked."""
    env: dict[str, str] = {}
    record = network.rendezvous(ctx(hosts=("127.0.0.1", "127.0.0.1"), master="127.0.0.1"), env=env)
    assert env == {} and record["interface"] is None
    node["names"].update(n1="127.0.0.1", n2="127.0.0.1")
    record = network.rendezvous(ctx(), env=env)
    assert env == {} and record["chosen_by"].startswith("one host")


def test_horovod_binds_the_sites_gloo_interface():
    """Horovod reads only HOROVOD_GLOO_IFACE: the site's GLOO_SOCKET_IFNAME (or the one
    dlscale.rank.network chose) reaches it; an explicit HOROVOD_GLOO_IFACE still wins."""
    c = ctx()
    assert gloo_iface(c, 2, {"GLOO_SOCKET_IFNAME": "ib0,eth0"}) == "ib0"
    assert gloo_iface(c, 2, {"GLOO_SOCKET_IFNAME": "ib0", "HOROVOD_GLOO_IFACE": "x"}) == "x"


def test_the_real_interface_table_holds_loopback():
    table = network.interfaces()
    assert "127.0.0.1" in table["lo"]["addresses"] and table["lo"]["up"]
    assert network.interface_with("127.0.0.1", table) == "lo"
    assert network.route_source("127.0.0.1") == "127.0.0.1"


def test_horovod_fails_at_once_where_its_process_sets_would_bind_the_nodes_own_name(
    node, monkeypatch
):
    """Horovod's process-set communicator binds what the node's own name resolves to, whatever
    HOROVOD_GLOO_IFACE says: on n2, whose name resolves to eth1 (a network n1 cannot reach),
    the cell fails at once saying so, instead of a rank aborting on `connect: Network is
    unreachable`; where the name resolves to the interface that reaches the others, nothing."""
    monkeypatch.setattr(network.socket, "gethostname", lambda: "n2")
    with pytest.raises(network.NetworkError) as err:
        own_name_check(ctx(), "eth0")
    message = str(err.value)
    assert "node n2 resolves its own name to 192.168.77.2 (eth1)" in message
    assert "through eth0 (10.1.0.2)" in message and "give n2 that address" in message
    node["names"]["n2"] = "10.1.0.2"
    own_name_check(ctx(), "eth0")


def test_mxnet_advertises_the_address_that_reaches_the_other_node(monkeypatch):
    """ps-lite's DMLC_NODE_HOST on n2: the address on the route to n1, not the one n2's own
    name resolves to (eth1, which n1 cannot reach); one host keeps its own name's address."""
    names = {"n1": "10.1.0.1", "n2": "192.168.77.2"}
    monkeypatch.setattr(mxnet, "_ipv4", lambda host: names.get(host, host))
    monkeypatch.setattr(mxnet, "_route_to", lambda addr: ROUTES.get(addr))
    monkeypatch.delenv("DLSCALE_MXNET_INTERFACE", raising=False)

    class Rank:
        pass

    rank = Rank()
    rank.ctx = ctx()
    assert mxnet.Adapter._node_host(rank) == "10.1.0.2"
    names.update(n1="127.0.0.1", n2="127.0.0.1")
    assert mxnet.Adapter._node_host(rank) == "127.0.0.1"
