"""Path flowSim: the analytic cases of reference/flowsim_m3.md A.4, exactly, and agreement with the
generic flowSim on the same parking-lot topology; each for the Python loop and the compiled one."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from m4ray.errors import InputError
from m4ray.m3 import native
from m4ray.m3.lot import LotNetwork, class_paths
from m4ray.m3.pathsim import class_rates, path_drain_times
from m4ray.sim.flows import Flow
from m4ray.sim.flowsim import FlowSim
from m4ray.sim.routing import WireFormat

G = 1e9
LOT5 = [10 * G, 40 * G, 40 * G, 10 * G]


def _reload_native() -> None:
    from m4ray.models import core, fairshare, m3_features, numpy_step
    from m4ray.sim import dagloop

    for loader in (native.library, dagloop.library, fairshare._compiled, core.library,
                   m3_features.library, numpy_step.native_step_library):  # fmt: skip
        loader.cache_clear()


@pytest.fixture(params=["python", "native"], autouse=True)
def engine(request, monkeypatch):
    """Every test here runs on both loops; the compiled one must build on this machine. Every
    compiled library is loaded afresh before and after (flowSim's fluid loop, which path flowSim
    under DCQCN's rates runs in, and its max-min too: one a "python" run loads is off for good
    otherwise, here and in every test after)."""
    if request.param == "python":
        monkeypatch.setenv("M4RAY_NATIVE", "0")
    _reload_native()
    yield request.param
    _reload_native()
    if request.param == "native":
        assert native.library() is not None  # no silent fallback


def bits(size: int) -> float:
    return WireFormat().wire_bytes(size) * 8.0


def drain_ns(a, b, size, start_ns, capacity):
    out = path_drain_times(
        a, b, [bits(s) for s in size], np.asarray(start_ns) * 1e-9, capacity, nic_cap_bps=10 * G
    )
    return out * 1e9


def test_equal_flows_on_one_link_finish_together():
    assert drain_ns([0] * 4, [1] * 4, [1000] * 4, [0] * 4, [10 * G]) == pytest.approx(
        [3353.6] * 4, rel=1e-12
    )


def test_two_flows_share_the_first_link():
    out = drain_ns([0, 0], [2, 1], [10_000] * 2, [0, 0], [10 * G, 10 * G])
    assert out == pytest.approx([16_768, 16_768], rel=1e-12)


def test_staggered_arrival():
    out = drain_ns([0, 1], [2, 2], [10_000] * 2, [0, 5000], [10 * G, 10 * G])
    assert out == pytest.approx([11_768, 11_768], rel=1e-12)  # A done at 11,768; B's FCT 11,768


@pytest.mark.parametrize(
    ("classes", "counts", "expected"),
    [
        ([(0, 4), (1, 3)], [1, 5], [40 / 6, 40 / 6]),
        ([(0, 4), (1, 3)], [1, 3], [10, 10]),
        ([(1, 3)], [1], [10]),
        ([(0, 4), (0, 1), (2, 4), (1, 3)], [1, 1, 1, 1], [5, 5, 5, 10]),
    ],
)
def test_five_host_rates(classes, counts, expected):
    rates = class_rates(classes, counts, LOT5, 10 * G)
    assert np.array(rates) / G == pytest.approx(expected, rel=1e-12)


def test_lone_flow_and_conservation():
    out = drain_ns([1], [3], [123_456], [0], LOT5)
    assert out[0] == pytest.approx(bits(123_456) / 10, rel=1e-12)  # NIC cap, not 40G


def _random_lot(rng, n_links, n_flows):
    a = rng.integers(0, n_links, n_flows)
    b = np.array([rng.integers(x + 1, n_links + 1) for x in a])
    size = rng.integers(50, 200_000, n_flows)
    start = np.sort(rng.uniform(0, 2e-4, n_flows))
    start[5:9] = start[4]  # simultaneous arrivals
    return a, b, size, start


def generic_drains(lot, wire, a, b, size, start, **flowsim) -> np.ndarray:  # noqa: PLR0917
    """The generic flowSim on the lot's topology, NIC-capped: each flow's time from its start
    to its delivery, less its delivery delay (``flowsim`` adds FlowSim settings)."""
    routing = lot.routing(wire)
    sim = FlowSim(lot.topology(), routing, rate_cap_bps=lot.nic_cap_bps, **flowsim)
    done: dict[int, float] = {}
    flows = [
        Flow(i, int(x), int(y), int(s), float(t))
        for i, (x, y, s, t) in enumerate(zip(a, b, size, start, strict=True))
    ]
    for f in flows:
        sim.schedule(f.start_s, lambda f=f: sim.send(f, done.__setitem__))
    sim.run()
    return np.array(
        [
            done[f.id]
            - f.start_s
            - routing.delivery_delay(f.size_bytes, routing.path(f.src, f.dst))
            for f in flows
        ]
    )


@pytest.mark.parametrize("n_links", [2, 4, 6])
def test_matches_generic_flowsim_on_the_lot_topology(n_links):
    """Same drain times as m4ray.sim.flowsim (an independent implementation) on the lot."""
    rng = np.random.default_rng(n_links)
    a, b, size, start = _random_lot(rng, n_links, 120)
    capacity = [10 * G] + [40 * G] * (n_links - 2) + [10 * G]
    lot = LotNetwork(capacity_bps=tuple(capacity), latency_s=(1e-6,) * n_links, nic_cap_bps=10 * G)
    wire = WireFormat()
    ours = path_drain_times(a, b, [bits(int(s)) for s in size], start, capacity, nic_cap_bps=10 * G)
    theirs = generic_drains(lot, wire, a, b, size, start)
    assert ours == pytest.approx(theirs, rel=1e-9)
    assert (ours >= np.array([bits(int(s)) for s in size]) / (10 * G) * (1 - 1e-12)).all()


def test_bad_flows_are_rejected():
    with pytest.raises(InputError, match="a < b"):
        path_drain_times([1], [1], [8000.0], [0.0], [10 * G, 10 * G])
    with pytest.raises(InputError, match="bits"):
        path_drain_times([0], [1], [0.0], [0.0], [10 * G])


@pytest.mark.timeout(60)
def test_small_flows_late_in_a_run_always_finish():
    """Regression: a remainder of a small flow below the clock's resolution at t ~ 1 s (the HPCC
    traces start there) advanced no time and the loop spun forever."""
    for seed in (98, *range(10)):  # 98 spun before the fix
        rng = np.random.default_rng(seed)
        a = rng.integers(0, 4, 150)
        b = np.array([rng.integers(x + 1, 5) for x in a])
        bits = (np.maximum(rng.pareto(1.2, 150) * 2000, 50) + 48) * 8
        start = 1.0 + np.sort(rng.uniform(0, 0.02, 150))
        out = path_drain_times(a, b, bits, start, LOT5, nic_cap_bps=10 * G)
        assert np.isfinite(out).all() and (out >= bits / (10 * G) - 1e-14).all()  # ulps of 1 s


@pytest.mark.parametrize("n_links", [2, 4, 6])
def test_compiled_loop_matches_python(engine, n_links):
    if engine == "python":
        pytest.skip("compares the two loops once")
    rng = np.random.default_rng(10 + n_links)
    a, b, size, start = _random_lot(rng, n_links, 3000)
    capacity = [10 * G] + [40 * G] * (n_links - 2) + [10 * G]
    wire = [bits(int(s)) for s in size]
    c = path_drain_times(a, b, wire, start, capacity, nic_cap_bps=10 * G, native=True)
    py = path_drain_times(a, b, wire, start, capacity, nic_cap_bps=10 * G, native=False)
    assert c == pytest.approx(py, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("n_links", [2, 4, 6])
def test_lot_path_formula_is_the_routers_path(n_links):
    """LotNetwork.path (used for every ideal FCT) gives what routing the lot topology gives."""
    capacity = [10 * G] + [40 * G] * (n_links - 2) + [25 * G]
    latency = tuple(1e-6 * (k + 1) for k in range(n_links))
    lot = LotNetwork(capacity_bps=tuple(capacity), latency_s=latency, nic_cap_bps=10 * G)
    routing = lot.routing(WireFormat())
    for a in range(n_links):
        for b in range(a + 1, n_links + 1):
            ours, theirs = lot.path(a, b), routing.path(a, b)
            assert (ours.latency_s, ours.inverse_bw_sum, ours.bottleneck_bps) == (
                theirs.latency_s,
                theirs.inverse_bw_sum,
                theirs.bottleneck_bps,
            )


def test_without_a_compiler_the_python_loop_answers_with_one_warning(engine, monkeypatch, tmp_path):
    if engine == "python":
        pytest.skip("about the compiled loop's fallback")
    monkeypatch.setenv("M4RAY_CACHE_DIR", str(tmp_path))  # nothing built there yet
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    native.library.cache_clear()
    with pytest.warns(UserWarning, match="compiled path flowSim unavailable, using Python"):
        assert native.library() is None
    out = drain_ns([0, 0], [2, 1], [10_000] * 2, [0, 0], [10 * G, 10 * G])
    assert out == pytest.approx([16_768, 16_768], rel=1e-12)
    monkeypatch.delenv("CC")
    monkeypatch.delenv("M4RAY_CACHE_DIR")
    native.library.cache_clear()


def _queued_rdma(window_bytes: int = 18_000):
    from m4ray.sim.ns3.transports import RdmaConfig

    return RdmaConfig(
        window_bytes=window_bytes, ecn_k_bytes=[[10 * G, 12_000.0], [40 * G, 48_000.0]]
    )


def _queued_lot(seed: int, n_links: int, n_flows: int):
    """A random lot on an edge-fabric-edge path: its flows' columns, capacities, lot network and
    path scenario (what ``lot_queues`` reads)."""
    from m4ray.m3.paths import PathScenario

    a, b, size, start = _random_lot(np.random.default_rng(seed), n_links, n_flows)
    capacity = [10 * G] + [40 * G] * (n_links - 2) + [10 * G]
    lot = LotNetwork(capacity_bps=tuple(capacity), latency_s=(1e-6,) * n_links, nic_cap_bps=10 * G)
    scn = PathScenario(
        links=tuple(range(n_links)), capacity_bps=np.asarray(capacity),
        latency_s=np.full(n_links, 1e-6), a=a, b=b, size_bytes=size, start_s=start,
        origin=np.arange(len(a)), foreground=(a == 0) & (b == n_links),
    )  # fmt: skip
    return (a, b, size, start), capacity, lot, scn


@pytest.mark.parametrize("n_links", [2, 4, 6])
def test_standing_queues_match_generic_flowsim_on_the_lot_topology(n_links):
    """With standing queues, path flowSim (per class) waits each arriving flow as the generic
    flowSim (per flow, ``FlowSimConfig.queues``) does on the lot's topology, where the source
    host's uplink and the mid-path hosts' access links are hosts' uplinks (no queue)."""
    from m4ray.m3.lot import lot_queues
    from m4ray.sim.flowsim import StandingQueues

    (a, b, size, start), capacity, lot, scn = _queued_lot(20 + n_links, n_links, 150)
    wire, rdma = WireFormat(), _queued_rdma()
    queues = lot_queues(lot, wire, scn, rdma)
    wire_bits = [bits(int(s)) for s in size]
    ours = path_drain_times(a, b, wire_bits, start, capacity, nic_cap_bps=10 * G, queues=queues)
    plain = path_drain_times(a, b, wire_bits, start, capacity, nic_cap_bps=10 * G)
    assert (ours >= plain).all() and (ours > plain + 1e-7).sum() > 10  # many flows waited
    standing = StandingQueues(window_bytes=rdma.window_bytes, k_bytes=rdma.ecn_k_bytes)
    theirs = generic_drains(lot, wire, a, b, size, start, queues=standing)
    assert ours == pytest.approx(theirs, rel=1e-9, abs=1e-15)


def test_standing_queues_compiled_loop_matches_python(engine):
    if engine == "python":
        pytest.skip("compares the two loops once")
    from m4ray.m3.lot import lot_queues

    n_links = 6
    (a, b, size, start), capacity, lot, scn = _queued_lot(7, n_links, 3000)
    wire_bits = [bits(int(s)) for s in size]
    hpcc = dataclasses.replace(_queued_rdma(), cc="hpcc")
    for rdma, first in ((_queued_rdma(), False), (_queued_rdma(0), False), (hpcc, True)):
        # no window: a full link holds K; HPCC: first windows only; each with bursts
        for bursts in (False, True):
            queues = lot_queues(lot, WireFormat(), scn, rdma, first_windows=first, bursts=bursts)
            assert (queues[4] > 0) == (bursts and not first)  # HPCC's stay as they are
            kw = {"nic_cap_bps": 10 * G, "queues": queues}
            c = path_drain_times(a, b, wire_bits, start, capacity, native=True, **kw)
            py = path_drain_times(a, b, wire_bits, start, capacity, native=False, **kw)
            assert c == pytest.approx(py, rel=1e-12, abs=1e-15)
    # bursts at each flow's own round trip (route round trips: they differ within a class)
    rng = np.random.default_rng(8)
    queues = lot_queues(lot, WireFormat(), scn, _queued_rdma(), bursts=True)
    own = (queues[0] * rng.uniform(1.0, 3.0, len(a)), *queues[1:])
    kw = {"nic_cap_bps": 10 * G, "queues": own}
    c = path_drain_times(a, b, wire_bits, start, capacity, native=True, **kw)
    py = path_drain_times(a, b, wire_bits, start, capacity, native=False, **kw)
    assert c == pytest.approx(py, rel=1e-12, abs=1e-15)
    by_class = path_drain_times(a, b, wire_bits, start, capacity, nic_cap_bps=10 * G, queues=queues)
    assert np.abs(c - by_class).max() > 1e-7  # the flows' own round trips were used


@pytest.mark.parametrize(("n_links", "cc"), [(2, "dctcp"), (6, "dctcp"), (6, "hpcc")])
def test_bursts_match_generic_flowsim_on_the_lot_topology(n_links, cc):
    """First windows over the level (``bursts``): path flowSim (per class, each flow's bits
    left from its class's service) waits each arriving flow as the generic flowSim with
    ``StandingQueues(buffer_bytes=...)`` (per flow) does on the lot's topology; it differs from
    the standing model (young flows add on top of K, old flows keep at most what they have
    left), and a small buffer caps it."""
    from m4ray.m3.lot import lot_queues
    from m4ray.sim.flowsim import StandingQueues, standing_levels

    (a, b, size, start), capacity, lot, scn = _queued_lot(60 + n_links, n_links, 150)
    wire, rdma = WireFormat(), dataclasses.replace(_queued_rdma(), cc=cc)
    wire_bits = [bits(int(s)) for s in size]
    kw = {"nic_cap_bps": 10 * G}
    first = cc == "hpcc"
    standing = lot_queues(lot, wire, scn, rdma, first_windows=first)
    queues = lot_queues(lot, wire, scn, rdma, first_windows=first, bursts=True)
    if first:  # HPCC's first windows stay as they are; the loop still takes a buffer there
        assert queues[4] == 0
        queues = (*queues[:4], float(rdma.buffer_bytes))
    assert queues[4] == rdma.buffer_bytes
    ours = path_drain_times(a, b, wire_bits, start, capacity, queues=queues, **kw)
    level = path_drain_times(a, b, wire_bits, start, capacity, queues=standing, **kw)
    assert np.abs(ours - level).max() > 1e-7  # not the standing model
    levels, first_rtt = standing_levels(rdma, [10 * G, 40 * G], lambda: 0.0)
    model = StandingQueues(
        window_bytes=rdma.window_bytes,
        k_bytes=levels,
        first_rtt=first_rtt,
        buffer_bytes=rdma.buffer_bytes,
    )
    theirs = generic_drains(lot, wire, a, b, size, start, queues=model)
    assert ours == pytest.approx(theirs, rel=1e-9, abs=1e-15)
    small = (*queues[:4], 13_000.0)  # a buffer just over K caps the young flows' share
    capped = path_drain_times(a, b, wire_bits, start, capacity, queues=small, **kw)
    assert (capped <= ours + 1e-15).all() and (capped < ours - 1e-9).any()
    if not first:  # no window: each young flow's burst is a round trip at its line rate, alike
        bare = dataclasses.replace(rdma, window_bytes=0)
        queues = lot_queues(lot, wire, scn, bare, bursts=True)
        ours = path_drain_times(a, b, wire_bits, start, capacity, queues=queues, **kw)
        model = dataclasses.replace(model, window_bytes=0)
        theirs = generic_drains(lot, wire, a, b, size, start, queues=model)
        assert ours == pytest.approx(theirs, rel=1e-9, abs=1e-15)


def test_without_a_window_a_young_flow_bursts_one_round_trip_at_line_rate():
    """Bursts with no window (``window`` infinite): a flow in its first round trip has out at
    most what its line rate (the NIC cap, else its class's first link) sends in one round
    trip, not its whole remainder. A 1 MB background flow alone at line rate on a full link
    keeps nothing beyond its bandwidth-delay product, so a flow arriving in that round trip
    waits nothing; with a window of three of its bandwidth-delay products it waits two of
    them; a slower line rate than its share is never a burst either."""
    capacity = [10 * G, 10 * G]
    rtt = 10e-6
    bdp = 10 * G * rtt / 8  # bytes
    a, b = np.array([1, 0]), np.array([2, 2])  # the background flow enters at link 1
    wire_bits = [8e6, bits(500)]
    start = np.array([0.0, 2e-6])  # the second arrives within the first's round trip

    def waited(window: float, nic: float | None) -> float:
        queues = (np.array([rtt, rtt]), window, [0.0, 1e6], False, 50e6)
        ours = path_drain_times(a, b, wire_bits, start, capacity, queues=queues, nic_cap_bps=nic)
        alone = path_drain_times(a, b, wire_bits, start, capacity, nic_cap_bps=nic)
        return float(ours[1] - alone[1])

    assert waited(np.inf, 10 * G) == pytest.approx(0.0, abs=1e-15)
    assert waited(np.inf, None) == pytest.approx(0.0, abs=1e-15)  # the first link's rate
    assert waited(3 * bdp, 10 * G) == pytest.approx(2 * bdp * 8 / (10 * G), rel=1e-12)


def test_route_round_trips_replace_the_lot_segments_under_bursts_only():
    """``route_rtt``: with bursts each flow's round trip is its network route's (the lot's
    rows carry it), TIMELY's level takes the largest; without bursts it is refused, under HPCC
    (no bursts) the lot's stay, and a lot without routes keeps its segments'."""
    from m4ray.m3.lot import PathQueues, lot_queues
    from m4ray.models.fairshare import round_trip_s

    n_links = 4
    _, _, lot, scn = _queued_lot(11, n_links, 200)
    wire, rdma = WireFormat(), _queued_rdma()
    plain = lot_queues(lot, wire, scn, rdma, bursts=True, route_rtt=True)
    assert plain[0] == pytest.approx(lot_queues(lot, wire, scn, rdma, bursts=True)[0], abs=0)
    hops = np.where(scn.foreground, n_links, 6)  # the background's routes run 6 hops
    routed = dataclasses.replace(scn, route_latency_s=hops * 1e-6, route_inverse_bw=hops / (10 * G))
    queues = PathQueues(rdma, bursts=True, route_rtt=True).of(lot, wire, routed)
    want = round_trip_s(wire, hops * 1e-6, hops / (10 * G), rdma.ack_bytes)
    np.testing.assert_array_equal(queues[0], want)
    assert queues[1:] == lot_queues(lot, wire, scn, rdma, bursts=True)[1:]
    hpcc = dataclasses.replace(rdma, cc="hpcc")
    kept = lot_queues(lot, wire, routed, hpcc, first_windows=True, bursts=True, route_rtt=True)
    np.testing.assert_array_equal(kept[0], lot_queues(lot, wire, scn, hpcc, first_windows=True)[0])
    timely = dataclasses.replace(rdma, cc="timely", cc_params={"t_low_s": 40e-6})
    level = lot_queues(lot, wire, routed, timely, bursts=True, route_rtt=True)[2]
    short = lot_queues(lot, wire, routed, timely, bursts=True)[2]
    assert max(level) < max(short)  # T_low less the longer round trip
    with pytest.raises(InputError, match="set bursts too") as err:
        PathQueues(rdma, route_rtt=True)
    assert err.value.field == "route_rtt"


@pytest.mark.parametrize("n_links", [2, 6])
def test_first_windows_match_generic_flowsim_on_the_lot_topology(n_links):
    """HPCC's first windows (only flows in their first round trip keep their excess queued):
    path flowSim waits each arriving flow as the generic flowSim with
    ``StandingQueues(first_rtt=True)`` does on the lot's topology; without ``first_windows``
    HPCC's lots queue nothing (as m3-v3 was trained)."""
    from m4ray.m3.lot import lot_queues
    from m4ray.sim.flowsim import StandingQueues, standing_levels

    (a, b, size, start), capacity, lot, scn = _queued_lot(40 + n_links, n_links, 150)
    wire, rdma = WireFormat(), dataclasses.replace(_queued_rdma(), cc="hpcc")
    wire_bits = [bits(int(s)) for s in size]
    kw = {"nic_cap_bps": 10 * G}
    plain = path_drain_times(a, b, wire_bits, start, capacity, **kw)
    none = lot_queues(lot, wire, scn, rdma)
    assert not none[3] and not any(none[2])  # nothing may queue: no young flows to count
    assert path_drain_times(a, b, wire_bits, start, capacity, queues=none, **kw) == pytest.approx(
        plain, rel=1e-12
    )
    queues = lot_queues(lot, wire, scn, rdma, first_windows=True)
    ours = path_drain_times(a, b, wire_bits, start, capacity, queues=queues, **kw)
    assert (ours >= plain - 1e-15).all() and (ours > plain + 1e-7).sum() > 5
    every = lot_queues(lot, wire, scn, _queued_rdma())  # the same window, DCTCP's K always
    assert (ours < path_drain_times(a, b, wire_bits, start, capacity, queues=every, **kw)).any()
    levels, first = standing_levels(rdma, [10 * G, 40 * G], lambda: 0.0)
    standing = StandingQueues(window_bytes=rdma.window_bytes, k_bytes=levels, first_rtt=first)
    theirs = generic_drains(lot, wire, a, b, size, start, queues=standing)
    assert ours == pytest.approx(theirs, rel=1e-9, abs=1e-15)


def test_lot_queues_take_each_cc_level():
    """A lot's standing queues hold each CC's level (``standing_levels``): DCTCP's K, HPCC
    none, TIMELY's T_low less the lot's largest round trip; the source host's link none."""
    from m4ray.m3.lot import lot_queues
    from m4ray.m3.paths import PathScenario
    from m4ray.sim.flowsim import round_trip
    from m4ray.sim.ns3.transports import RdmaConfig

    lot = LotNetwork(capacity_bps=(10 * G, 10 * G), latency_s=(1e-6,) * 2, nic_cap_bps=10 * G)
    one = np.array([0])
    scn = PathScenario(
        links=(0, 1), capacity_bps=np.array([10 * G] * 2), latency_s=np.full(2, 1e-6),
        a=one, b=one + 2, size_bytes=np.array([1000]), start_s=np.zeros(1), origin=one,
        foreground=np.array([True]),
    )  # fmt: skip
    rtt, _, caps, first, _ = lot_queues(
        lot, WireFormat(), scn, RdmaConfig(ecn_k_bytes=[[10 * G, 9e3]])
    )
    assert caps == [0.0, 9e3] and not first
    assert lot_queues(lot, WireFormat(), scn, RdmaConfig(cc="hpcc"))[2] == [0.0, 0.0]
    _, _, caps, first, _ = lot_queues(
        lot, WireFormat(), scn, RdmaConfig(cc="hpcc"), first_windows=True
    )
    assert first and caps[0] == 0.0 and caps[1] > 0  # the first windows may fill its buffer
    timely = RdmaConfig(cc="timely", cc_params={"t_low_s": 20e-6})
    _, _, caps, *_ = lot_queues(lot, WireFormat(), scn, timely)
    path = class_paths(lot, scn.a, scn.b)[0][0]
    assert rtt[0] == round_trip(path, WireFormat(), timely.ack_bytes)
    assert caps[1] == pytest.approx(10 * G * (20e-6 - rtt[0]) / 8, rel=1e-12)
    with pytest.raises(InputError, match="one round trip per flow"):
        path_drain_times([0], [2], [8000.0], [0.0], [10 * G] * 2, queues=(np.zeros(2), 1e4, [0, 0]))


@pytest.mark.parametrize(("n_links", "queued"), [(2, True), (4, False), (6, True)])
def test_dcqcn_rates_match_generic_flowsim_on_the_lot_topology(
    monkeypatch, engine, n_links, queued
):
    """Under DCQCN's rates (``rates``) every flow keeps its own rate, so path flowSim runs the
    lot per flow in flowSim's compiled fluid state: the same drains as the generic flowSim's
    numpy loop (``rate_control``, the reference) on the lot's topology, with and without
    standing queues and first windows over the level; cuts and increases happen (not classic
    path flowSim's answers)."""
    if engine == "python":
        pytest.skip("runs in flowSim's compiled fluid state only")
    from m4ray.m3.lot import lot_queues
    from m4ray.sim import flowsim
    from m4ray.sim.flowsim import DcqcnRates, StandingQueues, standing_levels

    (a, b, size, start), capacity, lot, scn = _queued_lot(90 + n_links, n_links, 300)
    params = {"increase_interval_s": 20e-6}  # several increases within the lot's 200 µs
    rdma = dataclasses.replace(_queued_rdma(), cc="dcqcn", cc_params=params)
    rates = DcqcnRates(cc_params=params, min_rate_bps=5e8)
    wire, kw = WireFormat(), {"nic_cap_bps": 10 * G}
    wire_bits = [bits(int(s)) for s in size]
    queues = lot_queues(lot, wire, scn, rdma, bursts=True) if queued else None
    ours = path_drain_times(a, b, wire_bits, start, capacity, queues=queues, rates=rates, **kw)
    plain = path_drain_times(a, b, wire_bits, start, capacity, queues=queues, **kw)
    assert np.abs(ours - plain).max() > 1e-6  # DCQCN's rates are not the max-min shares
    model = None
    if queued:
        levels, _ = standing_levels(rdma, [10 * G, 40 * G], lambda: 0.0)
        model = StandingQueues(
            window_bytes=rdma.window_bytes, k_bytes=levels, buffer_bytes=rdma.buffer_bytes
        )
    monkeypatch.setattr(flowsim, "native_fluid", lambda: False)
    theirs = generic_drains(lot, wire, a, b, size, start, queues=model, rate_control=rates)
    assert ours == pytest.approx(theirs, rel=1e-9, abs=1e-12)
