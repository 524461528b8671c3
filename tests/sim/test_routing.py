from __future__ import annotations

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
    assert path.base_rtt_s == pytest.approx(2 * 50e-9 + 2 * 8000 / 2400e9, rel=1e-12)


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
    # base RTT 2*(500+500) ns + 2 * 8000 bit / 400 Gbps; payload (10000 + 10*48) B * 8 / 400 Gbps
    assert routing.ideal_fct(10_000, path) == pytest.approx(2040e-9 + 209.6e-9, rel=1e-12)


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
