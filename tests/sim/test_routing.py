from __future__ import annotations

import numpy as np
import pytest

from m4ray.errors import InputError
from m4ray.sim.routing import Routing, WireFormat
from m4ray.sim.topologies import fat_tree, rail_cluster
from m4ray.sim.topology import Cable, Topology


def nodes_of(topo, path):
    return [int(topo.link_src[path.links[0]])] + [int(topo.link_dst[k]) for k in path.links]


def test_same_server_uses_the_nvswitch():
    topo = rail_cluster()
    path = Routing(topo).path(0, 5)
    assert nodes_of(topo, path) == [0, 32, 5]
    assert path.bottleneck_bps == 2400e9
    assert path.latency_s == pytest.approx(2 * 25e-9, rel=1e-12)
    assert path.inverse_bw_sum == pytest.approx(2 / 2400e9, rel=1e-12)


def test_cross_server_paths_use_rails_and_never_transit_hosts():
    topo = rail_cluster()
    routing = Routing(topo)
    assert nodes_of(topo, routing.path(0, 8)) == [0, 36, 8]  # same rail
    assert nodes_of(topo, routing.path(0, 9)) == [0, 36, 44, 37, 9]  # via the spine
    for dst in range(1, 32):
        inner = nodes_of(topo, routing.path(0, dst))[1:-1]
        assert all(node >= 32 for node in inner)


def test_ideal_fct_by_hand():
    routing = Routing(rail_cluster(), wire=WireFormat(mtu_bytes=1000, header_bytes=48))
    path = routing.path(0, 8)
    # one way 2 * 500 ns; first packet 1048 B stored and forwarded twice at 400 Gbps; the other
    # 9 packets (9432 B) at the bottleneck
    expected = 1000e-9 + 2 * 1048 * 8 / 400e9 + 9432 * 8 / 400e9
    assert routing.ideal_fct(10_000, path) == pytest.approx(expected, rel=1e-12)
    assert routing.delivery_delay(10_000, path) == pytest.approx(1000e-9 + 1048 * 8 / 400e9)


@pytest.mark.parametrize("size", [1, 50, 999, 1000, 1001, 64_000, 1_234_567])
def test_ideal_fct_is_m3s_standalone_fct(size):
    """m3's ns-3 ideal (reference/flowsim_m3.md B.9): base_rtt/2 + sum over links of
    (min(size, 1000) + 48) * 8 / bw + (size - head) * 8 / b + ((size - 1) // 1000) * 48 * 8 / b,
    on a 10G / 40G / 40G / 10G path with 1 us links."""
    topo = Topology(
        n_nodes=5,
        switches=(1, 2, 3),
        cables=(
            Cable(0, 1, 10e9, 1e-6),
            Cable(1, 2, 40e9, 1e-6),
            Cable(2, 3, 40e9, 1e-6),
            Cable(3, 4, 10e9, 1e-6),
        ),
    )
    routing = Routing(topo, wire=WireFormat(mtu_bytes=1000, header_bytes=48))
    bws = (10e9, 40e9, 40e9, 10e9)
    head = min(size, 1000)
    m3 = 8e-6 / 2 + sum((head + 48) * 8 / bw for bw in bws)
    m3 += (size - head) * 8 / 10e9 + ((size - 1) // 1000) * 48 * 8 / 10e9
    assert routing.ideal_fct(size, routing.path(0, 4)) == pytest.approx(m3, rel=1e-12)


def test_ecmp_is_deterministic_and_spreads_flows():
    topo = fat_tree(k=4)
    paths = [Routing(topo, seed=7).path(0, 15, key).links for key in range(64)]
    again = [Routing(topo, seed=7).path(0, 15, key).links for key in range(64)]
    assert paths == again
    assert all(len(p) == 6 for p in paths)
    assert len(set(paths)) == 4  # every core switch is used
    other_seed = [Routing(topo, seed=8).path(0, 15, key).links for key in range(64)]
    assert other_seed != paths


def test_routing_errors():
    two_islands = Topology(
        n_nodes=4, switches=(2, 3), cables=(Cable(0, 2, 1e9, 0.0), Cable(1, 3, 1e9, 0.0))
    )
    with pytest.raises(InputError, match="not connected"):
        Routing(two_islands).path(0, 1)
    with pytest.raises(InputError, match="not a host"):
        Routing(rail_cluster()).path(0, 40)
    with pytest.raises(InputError, match="same host"):
        Routing(rail_cluster()).path(3, 3)
    many = Routing(two_islands).links_many
    with pytest.raises(InputError, match=r"flow #0: hosts 0 and 1 are not connected"):
        many(np.array([0, 0]), np.array([1, 1]), [5, 6])
    with pytest.raises(InputError, match=r"flow #0: node 40 is not a host"):
        Routing(rail_cluster()).links_many([40], [3], [0])
    with pytest.raises(InputError, match=r"flow #1: .*same host 3"):
        Routing(rail_cluster()).links_many([1, 3], [2, 3], [0, 0])


@pytest.mark.parametrize(
    "topo",
    [
        pytest.param(fat_tree(k=8, bandwidth_bps=10e9, oversubscription=2), id="fat-tree"),
        pytest.param(rail_cluster(), id="rail-cluster"),
    ],
)
@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "numpy"])
def test_links_many_takes_the_same_paths_as_path(monkeypatch, topo, compiled):
    """The vectorised walk, in C (the default where it compiles) and in numpy, takes
    :meth:`Routing.path`'s every hop, negative keys included."""
    from m4ray.sim import dagloop

    if compiled and dagloop.library() is None:
        pytest.skip("no C compiler")
    if not compiled:
        monkeypatch.setattr("m4ray.sim.routing.dagloop_library", lambda: None)
    routing = Routing(topo, seed=11)
    rng = np.random.default_rng(0)
    hosts = np.array(topo.hosts)
    src, dst = rng.choice(hosts, 3000), rng.choice(hosts, 3000)
    src, dst = src[src != dst], dst[src != dst]
    keys = rng.integers(-(2**40), 2**62, len(src))
    table = Routing(topo, seed=11).links_many(src, dst, keys, chunk=700)
    for row, s, d, k in zip(table.tolist(), src.tolist(), dst.tolist(), keys.tolist(), strict=True):
        assert tuple(x for x in row if x >= 0) == routing.path(s, d, k).links


def test_max_bdp_bytes_is_the_largest_over_the_paths_path_takes():
    """The vectorised BDP (routed with links_many) equals a loop over Routing.path, to the bit,
    on healthy and degraded rail and fat-tree topologies; the answer is kept on the routing."""
    from m4ray.sim.failures import GrayFailure
    from m4ray.sim.ns3.transports import max_bdp_bytes
    from m4ray.sim.topologies import FatTreeSpec, RailClusterSpec

    for topo in (
        RailClusterSpec().build(),
        GrayFailure(n_degraded=8, reduction=4).apply(RailClusterSpec().build()),
        GrayFailure(n_degraded=2, reduction=7).apply(FatTreeSpec(k=4).build()),
    ):
        routing = Routing(topo, seed=3, wire=WireFormat(mtu_bytes=8948, header_bytes=54))
        packet = 8948 + 54
        best = 0.0
        for src in topo.hosts:
            for dst in topo.hosts:
                if dst != src:
                    path = routing.path(src, dst)
                    rtt = 2 * path.latency_s + (packet + 64) * 8 * path.inverse_bw_sum
                    best = max(best, path.bottleneck_bps * rtt / 8)
        assert max_bdp_bytes(routing, 64) == best
        assert routing.memo[("max_bdp_bytes", 64)][0] == best  # (BDP, HPCC's base RTT)


@pytest.mark.parametrize(
    "spec",
    [
        {"template": "alibaba_hpn", "gpus": 64},
        {"template": "alibaba_hpn", "gpus": 64, "dual_plane": True},
        {"template": "dcn_plus", "gpus": 32},
        {"template": "spectrum_x", "gpus": 128},
    ],
)
def test_host_distances_from_switches_equal_a_walk_to_the_host(spec):
    """A host's hop counts, derived from the switches it hangs off, are the breadth-first
    walk's (no transit through hosts) on every template, dual-homed GPUs included."""
    from m4ray.sim.templates import ClusterTemplateSpec

    topo = ClusterTemplateSpec(**spec).build()
    routing = Routing(topo)
    for host in topo.hosts:
        np.testing.assert_array_equal(routing._distances_to(host), routing._walk(host))
