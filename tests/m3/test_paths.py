"""Path decomposition, sampling and per-path scenarios on a small fat-tree."""

from __future__ import annotations

import numpy as np
import pytest

from m4ray.errors import InputError
from m4ray.m3.paths import RoutedFlows
from m4ray.sim.flows import Flow
from m4ray.sim.routing import Routing
from m4ray.sim.topologies import fat_tree


@pytest.fixture(scope="module")
def routed():
    topo = fat_tree(k=4, bandwidth_bps=10e9)
    rng = np.random.default_rng(3)
    flows = []
    for i in range(400):
        s, d = rng.choice(topo.hosts, 2, replace=False)
        flows.append(Flow(i, int(s), int(d), int(rng.integers(100, 100_000)), float(i) * 1e-6))
    return RoutedFlows(flows, Routing(topo, seed=1))


def test_every_flow_is_foreground_of_exactly_one_path(routed):
    owners = sorted(i for members in routed.by_path.values() for i in members)
    assert owners == list(range(routed.n_flows))
    for path, members in routed.by_path.items():
        assert all(routed.route(i) == path for i in members)
    assert {len(p) for p in routed.by_path} <= {2, 4, 6}


def test_sampling_is_seeded_and_counts_draws(routed):
    one, two = routed.sample(500, seed=7), routed.sample(500, seed=7)
    assert one == two
    assert sum(n for _, n in one) == 500
    assert len({p for p, _ in one}) == len(one)
    assert routed.sample(500, seed=8) != one


def test_scenario_holds_foreground_and_every_crossing_flow(routed):
    path = max(routed.by_path, key=lambda p: (len(p), len(routed.by_path[p])))
    scn = routed.scenario(path, draws=3)
    assert scn.n_links == 6 and scn.draws == 3
    fg = scn.foreground
    assert sorted(scn.origin[fg]) == sorted(routed.by_path[path])
    assert (scn.a[fg] == 0).all() and (scn.b[fg] == 6).all()
    crossing = {i for link in path for i in routed.on_link(link)[0].tolist()} - set(
        routed.by_path[path].tolist()
    )
    assert set(scn.origin[~fg].tolist()) == crossing
    for a, b, i in zip(scn.a[~fg], scn.b[~fg], scn.origin[~fg], strict=True):
        assert set(path[a:b]) <= set(routed.route(i))  # it uses every link of its stretch
    assert (scn.capacity_bps == 10e9).all()
    np.testing.assert_array_equal(scn.size_bytes, routed.size_bytes[scn.origin])


def _stretches(route: tuple[int, ...], position: dict[int, int]) -> list[tuple[int, int]]:
    """Reference: ``(a, b)`` of each maximal run of the route on consecutive path links."""
    out: list[tuple[int, int]] = []
    start = last = None
    for link in route:
        k = position.get(link)
        if k is not None and last is not None and k == last + 1:
            last = k
            continue
        if start is not None:
            out.append((start, last + 1))
        start = last = k
    if start is not None:
        out.append((start, last + 1))
    return out


def test_stretch_reference():
    position = {10: 0, 11: 1, 12: 2, 13: 3}
    assert _stretches((10, 11, 99, 13), position) == [(0, 2), (3, 4)]
    assert _stretches((5, 11, 12, 6), position) == [(1, 3)]
    assert _stretches((12, 11), position) == [(2, 3), (1, 2)]


def test_scenarios_match_the_flow_by_flow_reference(routed):
    """Every path's lot equals the scalar construction; in a fat-tree a flow that shares the edge
    uplink and the downlink of a path but not its core switch leaves and rejoins: pseudo-flows."""
    split = 0
    for path, members in routed.by_path.items():
        scn = routed.scenario(path)
        position = {link: k for k, link in enumerate(path)}
        rows = [(0, len(path), i) for i in members.tolist()]
        crossing = {i for link in path for i in routed.on_link(link)[0].tolist()}
        for i in sorted(crossing - set(members.tolist())):
            rows += [(a, b, i) for a, b in _stretches(routed.route(i), position)]
        expected = np.array(rows).T
        np.testing.assert_array_equal(np.stack([scn.a, scn.b, scn.origin]), expected)
        bg = scn.origin[~scn.foreground]
        split += len(bg) - len(set(bg.tolist()))
    assert split > 0


def test_unknown_hosts_and_empty_input_are_named():
    topo = fat_tree(k=4)
    with pytest.raises(InputError, match=r"flow 7 .* node 999"):
        RoutedFlows([Flow(7, 0, 999, 100)], Routing(topo))
    switch = topo.switches[0]
    with pytest.raises(InputError, match="not a host"):
        RoutedFlows([Flow(1, switch, 0, 100)], Routing(topo))
    with pytest.raises(InputError, match="no flows"):
        RoutedFlows([], Routing(topo))


def test_members_finds_a_route_and_names_one_no_flow_takes(routed):
    """A route's foreground by its links alone (the lookup sampled paths use), and a clear
    error for a path no flow takes (empty, a prefix, one link too many, reversed)."""
    for path, members in routed.by_path.items():
        assert routed.members(path).tolist() == members.tolist()
    some = max(routed.by_path, key=len)
    for bad in [(), some[:-1], (*some, some[0]), tuple(reversed(some))]:
        with pytest.raises(InputError, match="no flow takes the path"):
            routed.members(bad)


def test_the_fast_bookkeeping_equals_numpys_unique_and_lexsort():
    """The counting and radix forms m3's per-path bookkeeping uses give what np.unique and
    np.lexsort give, item for item: first appearances of small and large integer keys, a path's
    classes, route keys that are equal exactly where route rows are, and percentiles by group."""
    from m4ray.m3.lot import LotNetwork, class_paths
    from m4ray.m3.paths import _route_keys
    from m4ray.m3.pathsim import first_appearance
    from m4ray.models.m3_features import grouped_percentiles, nearest_ranks

    def unique_first(keys):
        _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        by_first = np.argsort(first)
        rank = np.empty(len(first), dtype=np.int64)
        rank[by_first] = np.arange(len(first))
        return rank[inverse.reshape(-1)], first[by_first]

    rng = np.random.default_rng(3)
    for keys in (rng.integers(0, 49, 7000), rng.integers(-5, 5, 9), np.array([4]),
                 rng.integers(0, 10**9, 500)):  # fmt: skip
        for got, want in zip(first_appearance(keys), unique_first(keys), strict=True):
            assert got.dtype == want.dtype and np.array_equal(got, want)

    class Lot:  # class_paths reads these two and the path of each class
        n_links, nic_cap_bps = 6, 1e12

        def path(self, a, b):
            return LotNetwork(
                capacity_bps=(1e10,) * 6, latency_s=(1e-6,) * 6, nic_cap_bps=1e12
            ).path(a, b)

    a = rng.integers(0, 6, 3000)
    b = np.minimum(a + 1 + rng.integers(0, 3, 3000), 6)
    paths, inverse = class_paths(Lot(), a, b)
    keys, want = np.unique(a * 7 + b, return_inverse=True)
    assert np.array_equal(inverse, want) and len(paths) == len(keys)

    table = rng.integers(-1, 40, (4000, 5))
    table[1000:2000] = table[:1000]  # repeated routes
    keys = _route_keys(table, 40)
    as_bytes = np.ascontiguousarray(table).view(np.dtype((np.void, 40))).reshape(-1)
    assert np.array_equal(first_appearance(keys)[0], first_appearance(as_bytes)[0])

    values = np.round(rng.lognormal(0, 1, 20000), 2)  # ties: equal values
    key = rng.integers(0, 30, 20000)
    ordered = values[np.lexsort((values, key))]
    count = np.bincount(key, minlength=32)
    offset = np.concatenate([[0], np.cumsum(count)[:-1]])
    pct, empty = grouped_percentiles(values, key, 32)
    full = count > 0
    assert np.array_equal(empty, ~full) and not pct[~full].any()
    assert np.array_equal(pct[full], ordered[offset[full, None] + nearest_ranks(count[full])])
    for got, want in zip(
        grouped_percentiles(values, key, 32, compiled=False), (pct, empty), strict=True
    ):
        assert np.array_equal(got, want)  # the numpy reference and the compiled grouping


def test_scenario_rows_carry_their_network_routes_to_the_bit():
    """Each lot row carries its flow's whole network route (one-way latency, Σ 1/bandwidth)
    exactly as :meth:`Routing.path` sums it: a background flow's route is longer than its lot
    segment (path flowSim's route round trips, ``PathQueues.route_rtt``)."""
    topo = fat_tree(k=4, bandwidth_bps=10e9, fabric_bandwidth_bps=40e9, latency_s=1.3e-6)
    rng = np.random.default_rng(5)
    flows = []
    for i in range(300):
        s, d = rng.choice(topo.hosts, 2, replace=False)
        flows.append(Flow(i, int(s), int(d), 1000, float(i) * 1e-6))
    routing = Routing(topo, seed=2)
    routed = RoutedFlows(flows, routing)
    path = max(routed.by_path, key=lambda p: (len(p), len(routed.by_path[p])))
    scn = routed.scenario(path)
    longer = 0
    for row, i in enumerate(scn.origin.tolist()):
        want = routing.path(flows[i].src, flows[i].dst, flows[i].id)
        assert scn.route_latency_s[row] == want.latency_s
        assert scn.route_inverse_bw[row] == want.inverse_bw_sum
        longer += len(want.links) > scn.b[row] - scn.a[row]
    assert longer > 0  # some background flows leave the path


def test_compiled_lots_and_tokens_equal_the_numpy_reference():
    """The compiled merge of a lot's stretches (``_pathsim.c``) and the compiled token
    percentiles (``_tokens.c``) give the numpy references' lots and tokens, value for value, on
    every route of a loaded k = 4 network (routes of 2, 4 and 6 links, hot hosts, equal
    slowdowns, empty buckets)."""
    from m4ray.m3.native import library
    from m4ray.models import m3_features
    from m4ray.models.m3_features import N_CONFIG, tokens

    if library() is None or m3_features.library() is None:
        pytest.skip("no C compiler: the numpy references are what runs")
    topo = fat_tree(k=4, bandwidth_bps=10e9)
    rng = np.random.default_rng(11)
    hosts = topo.hosts
    flows = []
    for i in range(3000):
        s, d = rng.choice(hosts[:6] if i % 3 else hosts, 2, replace=False)  # hot hosts
        size = (
            int(rng.choice([200, 999, 1000, 4000, 10_000, 60_000]))
            if i % 2
            else int(rng.integers(50, 200_000))
        )
        flows.append(Flow(i, int(s), int(d), size, float(i) * 1e-7))
    routed = RoutedFlows(flows, Routing(topo, seed=2))
    sampled = routed.sample(200, seed=4)
    assert {len(p) for p, _ in sampled} == {2, 4, 6}
    for path, draws in [*sampled, *((p, 1) for p in list(routed.by_path)[:60])]:
        fast, ref = routed.scenario(path, draws), routed.scenario(path, draws, compiled=False)
        for name in fast.__dataclass_fields__:
            got, want = getattr(fast, name), getattr(ref, name)
            same = np.array_equal(got, want) if isinstance(got, np.ndarray) else got == want
            assert same, (path, name)
        slowdown = np.round(1 + rng.exponential(1.5, len(fast.origin)), 1)  # ties
        args = (slowdown, fast.size_bytes, fast.a, fast.b, fast.foreground, np.ones(N_CONFIG))
        (tok, empty), (tok_ref, empty_ref) = tokens(*args), tokens(*args, compiled=False)
        assert np.array_equal(tok, tok_ref) and np.array_equal(empty, empty_ref), path
