"""flowSim against the analytic cases of reference/flowsim_m3.md A.4 (times in ns there)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from m4ray.models.fairshare import Window, ack_capacity, max_min_rates, reverse_links
from m4ray.sim.backend import NetworkBackend
from m4ray.sim.flows import Flow
from m4ray.sim.flowsim import FlowSim, FlowSimConfig
from m4ray.sim.routing import Routing
from m4ray.sim.topologies import fat_tree
from m4ray.sim.trace import run_trace
from tests.conftest import parking_lot

NIC = 10e9


def bits(size: int) -> float:
    return (size + -(-size // 1000) * 48) * 8.0


def simulate(capacities, flows, cap=NIC):
    """FCTs (s) of (src, dst, size, start_s) flows, minus each one's delivery delay (= fluid
    time)."""
    topo = parking_lot(capacities)
    routing = Routing(topo)
    trace = [Flow(i, s, d, size, t) for i, (s, d, size, t) in enumerate(flows)]
    table = run_trace(topo, trace, FlowSimConfig(rate_cap_bps=cap), routing)
    base = np.array(
        [routing.delivery_delay(f.size_bytes, routing.path(f.src, f.dst, f.id)) for f in trace]
    )
    return table.column("fct_s").to_numpy() - base, table


def test_is_a_network_backend():
    topo = parking_lot([10])
    assert isinstance(FlowSim(topo, Routing(topo)), NetworkBackend)


def test_case1_equal_flows_share_one_link():
    fluid, _ = simulate([10], [(0, 1, 1000, 0.0)] * 4)
    assert fluid == pytest.approx([3353.6e-9] * 4, rel=1e-9)


def test_case2_two_flows_share_the_first_link():
    fluid, _ = simulate([10, 10], [(0, 2, 10_000, 0.0), (0, 1, 10_000, 0.0)])
    assert fluid == pytest.approx([16_768e-9, 16_768e-9], rel=1e-9)


def test_case3_staggered_arrival():
    fluid, _ = simulate([10, 10], [(0, 2, 10_000, 0.0), (1, 2, 10_000, 5000e-9)])
    assert fluid == pytest.approx([11_768e-9, 11_768e-9], rel=1e-9)


def rates(capacities, pairs):
    topo = parking_lot(capacities)
    routing = Routing(topo)
    links = [np.array(routing.path(s, d, i).links) for i, (s, d) in enumerate(pairs)]
    return max_min_rates(links, topo.bandwidth_bps, NIC) / 1e9


@pytest.mark.parametrize(
    ("pairs", "expected"),
    [
        ([(0, 4)] + [(1, 3)] * 5, [40 / 6] * 6),
        ([(0, 4)] + [(1, 3)] * 3, [10] * 4),
        ([(1, 3)], [10]),
        ([(0, 4), (0, 1), (2, 4), (1, 3)], [5, 5, 5, 10]),
    ],
)
def test_case4_parking_lot_rates(pairs, expected):
    assert rates([10, 40, 40, 10], pairs) == pytest.approx(expected, rel=1e-12)


def test_without_cap_links_alone_limit_flows():
    topo = parking_lot([10, 40, 40, 10])
    routing = Routing(topo)
    lone = max_min_rates([np.array(routing.path(1, 3).links)], topo.bandwidth_bps)
    assert lone == pytest.approx([40e9])


def test_case5_max_min_property_on_random_instances():
    topo = fat_tree(k=4)
    routing = Routing(topo, seed=1)
    rng = np.random.default_rng(0)
    cap = topo.bandwidth_bps * rng.uniform(0.2, 1.0, topo.n_links)
    for _ in range(20):
        pairs = [tuple(rng.choice(16, 2, replace=False)) for _ in range(rng.integers(2, 40))]
        links = [np.array(routing.path(int(s), int(d), i).links) for i, (s, d) in enumerate(pairs)]
        rate = max_min_rates(links, cap)
        load = np.zeros(topo.n_links)
        for r, path in zip(rate, links, strict=True):
            load[path] += r
        assert (load <= cap * (1 + 1e-9)).all()
        for r, path in zip(rate, links, strict=True):
            saturated = [k for k in path if load[k] >= cap[k] * (1 - 1e-9)]
            assert saturated, "every flow has a saturated link"
            assert any(
                all(r >= rate[j] * (1 - 1e-9) for j, p in enumerate(links) if k in p)
                for k in saturated
            ), "and is maximal on one of them"


def test_case6_lone_flow_has_ideal_fct_and_slowdown_one():
    fluid, table = simulate([10, 40, 10], [(0, 3, 123_456, 0.0)])
    assert fluid[0] == pytest.approx(bits(123_456) / 10e9, rel=1e-12)
    assert table.column("fct_s")[0].as_py() == pytest.approx(
        table.column("ideal_fct_s")[0].as_py(), rel=1e-12
    )
    assert table.column("slowdown")[0].as_py() == pytest.approx(1.0, rel=1e-12)  # raw, unclamped


def test_case6_conservation_and_lower_bound():
    rng = np.random.default_rng(3)
    flows = [
        (
            int(s),
            int(s) + int(rng.integers(1, 5 - s)),
            int(rng.integers(50, 50_000)),
            float(rng.uniform(0, 20e-6)),
        )
        for s in rng.integers(0, 4, 30)
    ]
    fluid, table = simulate([10, 40, 40, 10], flows)
    sizes = np.array([bits(f[2]) for f in flows])
    assert (fluid >= sizes / 10e9 * (1 - 1e-9)).all()
    assert (table.column("slowdown").to_numpy() >= 1 - 1e-9).all()


def test_case7_completion_wins_ties_with_arrival():
    first = bits(10_000) / 10e9
    fluid, _ = simulate([10], [(0, 1, 10_000, 0.0), (0, 1, 10_000, first)])
    assert fluid == pytest.approx([first, first], rel=1e-12)


def test_case8_base_delay_on_the_path():
    topo = parking_lot([10, 10], latency_s=1000e-9)
    routing = Routing(topo)
    path = routing.path(0, 2)
    table = run_trace(topo, [Flow(0, 0, 2, 10_000, 0.0)], FlowSimConfig(rate_cap_bps=NIC), routing)
    delay = routing.delivery_delay(10_000, path)
    assert table.column("fct_s")[0].as_py() == pytest.approx(8384e-9 + delay, rel=1e-12)
    # one way 2 us; the first 1048-B packet is stored and forwarded once more than the fluid
    assert delay == pytest.approx(2000e-9 + 1048 * 8 / 10e9, rel=1e-9)


def test_schedule_and_run_until():
    topo = parking_lot([10])
    backend = FlowSim(topo, Routing(topo))
    seen = []
    backend.schedule(5e-6, lambda: seen.append(backend.now()))
    backend.run(until=1e-6)
    assert backend.now() == 1e-6 and not seen
    backend.run()
    assert seen == [5e-6]


@pytest.mark.timeout(30)
def test_a_flow_rounded_below_zero_bits_finishes_instead_of_spinning(monkeypatch):
    """Regression: a drained flow left at -1e-9 bits by float rounding made the next completion
    time lie in the past, the tie test select nothing, and run() loop forever (seen on a
    degraded 32-GPU GPT-13B replay). On the numpy state, whose arrays the test can reach (the
    compiled state clamps the same way: ``m4ray_fluidsim_next``)."""
    monkeypatch.setattr("m4ray.sim.flowsim.native_fluid", lambda: False)
    topo = parking_lot([10])
    routing = Routing(topo)
    backend = FlowSim(topo, Routing(topo))
    done = {}
    backend.send(Flow(0, 0, 1, 1000, 0.0), done.setdefault)
    backend.send(Flow(1, 0, 1, 100_000, 0.0), done.setdefault)
    backend._flush()  # the arrivals join the active arrays (done at the next rate computation)
    backend._remaining[0] = -1e-9  # what rounding leaves behind
    backend.run()
    assert set(done) == {0, 1}
    assert done[0] == pytest.approx(routing.delivery_delay(1000, routing.path(0, 1)), rel=1e-9)


def test_per_flow_caps_are_links_of_their_own():
    """Caps as an array: each flow crossing one more link of its own with the cap as capacity
    gives the same max-min rates."""
    topo = fat_tree(k=4)
    routing = Routing(topo, seed=1)
    rng = np.random.default_rng(2)
    for _ in range(20):
        pairs = [tuple(rng.choice(16, 2, replace=False)) for _ in range(rng.integers(2, 30))]
        links = [np.array(routing.path(int(s), int(d), i).links) for i, (s, d) in enumerate(pairs)]
        caps = np.where(rng.random(len(links)) < 0.5, rng.uniform(5e9, 60e9, len(links)), np.inf)
        own = topo.n_links + np.arange(len(links))
        virtual = [np.append(p, o) for p, o in zip(links, own, strict=True)]
        capacity = np.concatenate([topo.bandwidth_bps, np.where(np.isinf(caps), 1e30, caps)])
        assert max_min_rates(links, topo.bandwidth_bps, caps) == pytest.approx(
            max_min_rates(virtual, capacity), rel=1e-9
        )


def test_a_window_caps_a_lone_flow_in_rounds():
    """Window(k packets): a lone flow of n packets is floor((n-1)/k) rounds of rtt - k*tx late;
    a window of one BDP or more changes nothing."""
    topo = parking_lot([10, 10, 10, 10])
    routing = Routing(topo)
    path = routing.path(0, 4, 0)
    wire = routing.wire
    packet = (wire.mtu_bytes + wire.header_bytes) * 8
    rtt = 2 * path.latency_s + (packet + 64 * 8) * path.inverse_bw_sum
    tx = packet / path.bottleneck_bps
    window = Window(3 * wire.mtu_bytes - 10)  # three packets
    for size in (500, 3000, 3001, 10_000, 1_000_000):
        fct = (
            run_trace(
                topo, [Flow(0, 0, 4, size)], FlowSimConfig(window_bytes=window.bytes), routing
            )
            .column("fct_s")[0]
            .as_py()
        )
        n = -(-size // wire.mtu_bytes)
        late = (n - 1) // 3 * max(rtt - 3 * tx, 0.0)
        assert fct == pytest.approx(routing.ideal_fct(size, path) + late, rel=1e-9)
    assert rtt > 3 * tx  # the window binds on this path
    big = Window(10_000_000)
    assert big.limit(wire, path, 8e6) == (np.inf, 8e6)


@pytest.mark.parametrize(
    ("settings", "field"),
    [({"window_bytes": -1}, "window_bytes"), ({"ack_bytes": 0}, "ack_bytes"),
     ({"rate_cap_bps": 0.0}, "rate_cap_bps")],
)  # fmt: skip
def test_impossible_flowsim_settings_name_the_field(settings, field):
    from m4ray.errors import InputError

    with pytest.raises(InputError) as err:
        FlowSimConfig(**settings)
    assert err.value.field == field


def test_ack_load_takes_a_fraction_of_the_reverse_link():
    """ACKs of the data on a link's reverse ride on it: a cable used both ways gives each
    direction 1 − a + a² (three passes toward 1 / (1 + a)), one used one way gives it all;
    per link, what :func:`ack_capacity` leaves is capacity − a · reverse data (at least 1 %)."""
    topo = parking_lot([10, 10])  # hosts 0, 1, 2 on a chain of 10 Gbps switch links
    routing = Routing(topo)
    a = 64 / (routing.wire.mtu_bytes + routing.wire.header_bytes)
    size = 1_000_000
    both_ways = [Flow(0, 0, 2, size), Flow(1, 2, 0, size)]
    ack = run_trace(topo, both_ways, FlowSimConfig(ack_load=True), routing).column("fct_s")
    classic = run_trace(topo, both_ways, FlowSimConfig(), routing).column("fct_s")
    delay = classic.to_numpy() - bits(size) / 10e9  # delivery delays: ACKs leave them be
    np.testing.assert_allclose(ack.to_numpy() - delay, bits(size) / (10e9 * (1 - a + a * a)))
    one_way = [Flow(0, 0, 2, size), Flow(1, 1, 2, size)]
    assert (
        run_trace(topo, one_way, FlowSimConfig(ack_load=True), routing)
        .column("fct_s")
        .equals(run_trace(topo, one_way, FlowSimConfig(), routing).column("fct_s"))
    )
    capacity = np.array([10.0, 10.0, 4.0, 4.0])
    data = np.array([0.0, 5.0, 100.0, -1e-9])  # a hair below 0 (rounding) counts as 0
    out = ack_capacity(capacity, reverse_links(4), 0.1, data)
    np.testing.assert_allclose(out, [9.5, 10.0, 4.0, 0.04])


def test_compiled_max_min_equals_the_numpy_reference():
    """``_maxmin.c`` (flowSim's share at every event) against :func:`max_min_rates`, with and
    without per-flow caps (some capped, or most at a few equal caps: the cap order's ties), on
    random flows over a degraded fat-tree (and over links of random rates: many levels): the
    same arithmetic in the same order, so the same bits."""
    from m4ray.models.fairshare import _compiled, compiled_max_min_rates

    if _compiled() is None:
        pytest.skip("no C compiler: flowSim uses the numpy loop")
    topo = fat_tree(k=4)
    routing = Routing(topo, seed=3)
    rng = np.random.default_rng(4)
    degraded = topo.bandwidth_bps * rng.choice([1.0, 0.25, 0.1], topo.n_links)
    uneven = topo.bandwidth_bps * rng.uniform(0.05, 1.0, topo.n_links)
    for trial in range(60):
        capacity = degraded if trial < 30 else uneven
        pairs = [tuple(rng.choice(16, 2, replace=False)) for _ in range(rng.integers(1, 200))]
        links = [np.array(routing.path(int(s), int(d), i).links) for i, (s, d) in enumerate(pairs)]
        caps = None
        if trial % 4 == 1:
            caps = np.where(
                rng.random(len(links)) < 0.3, rng.uniform(1e9, 20e9, len(links)), np.inf
            )
        elif trial % 4 == 3:  # DCQCN's rates: most flows capped, many at the same rate
            caps = rng.choice([1e9, 2.5e9, 4e9, np.inf], len(links), p=[0.3, 0.3, 0.3, 0.1])
        want = max_min_rates(links, capacity, caps)
        got = compiled_max_min_rates(links, capacity, caps)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"rate_cap_bps": 7e9},
        {"ack_load": True},
        {"window_bytes": 30_000, "ack_load": True},
        {"queues": {"window_bytes": 20_000, "k_bytes": [[10e9, 12_000], [40e9, 48_000]]}},
        {"queues": {"window_bytes": 9_000, "k_bytes": [[10e9, 30_000]]}, "ack_load": True},
        {"queues": {"window_bytes": 0, "k_bytes": [[10e9, 30_000]]}},
        {"queues": {"window_bytes": 20_000, "k_bytes": [[10e9, 4e5]], "first_rtt": True}},
        {"queues": {"window_bytes": 20_000, "k_bytes": [[10e9, 12_000]], "buffer_bytes": 60_000}},
        {
            "queues": {"window_bytes": 0, "k_bytes": [[10e9, 8_000]], "buffer_bytes": 30_000},
            "ack_load": True,
        },
        {"rate_control": {}},
        {
            "rate_control": {"cc_params": {"increase_interval_s": 30e-6}, "min_rate_bps": 5e8},
            "queues": {"window_bytes": 20_000, "k_bytes": [[10e9, 12_000]]},
        },
        {
            "rate_control": {"cc_params": {"increase_interval_s": 20e-6, "clamp_target_rate": 1}},
            "queues": {"window_bytes": 0, "k_bytes": [[10e9, 8_000]], "buffer_bytes": 30_000},
            "rate_cap_bps": 8e9,
            "ack_load": True,
        },
        {"service": "fifo"},
        {"service": "fifo", "rate_cap_bps": 8e9},
        {"service": "fifo", "window_bytes": 20_000},
        {"service": "fifo", "fifo_bytes": 100_000, "rate_cap_bps": 8e9},
        {
            "service": "fifo",
            "fifo_bytes": 100_000,
            "queues": {"window_bytes": 20_000, "k_bytes": [[10e9, 12_000]], "buffer_bytes": 50_000},
        },
    ],
    ids=[
        "classic",
        "cap",
        "acks",
        "window+acks",
        "queues",
        "queues+acks",
        "queues, no window",
        "first round trips",
        "first windows over the level",
        "bursts, no window, acks",
        "DCQCN's rates",
        "DCQCN's rates, fast timer, queues",
        "DCQCN's rates, clamped, bursts, cap, acks",
        "FIFO",
        "FIFO, cap",
        "FIFO, window",
        "FIFO up to 100 KB, cap",
        "FIFO up to 100 KB, bursts",
    ],
)
def test_compiled_fluid_state_equals_the_numpy_loop_to_the_bit(monkeypatch, settings):
    """flowSim's fluid state in C (``m4ray_fluidsim_*``, the default where it compiles) against
    the numpy loop it replaced (kept as the reference and fallback): 300 flows arriving over
    time on a fat-tree, a link degraded mid-run and ``run(until=...)`` in between, give the
    same delivery times to the bit (same max-min, same arithmetic in the same order)."""
    from m4ray.sim import flowsim

    if not flowsim.native_fluid():
        pytest.skip("no C compiler: flowSim uses the numpy loop")
    topo = fat_tree(k=4)
    rng = np.random.default_rng(11)
    pairs = [rng.choice(16, 2, replace=False) for _ in range(300)]
    sizes = rng.choice([800, 20_000, 400_000, 3_000_000], 300)
    starts = np.sort(rng.uniform(0, 400e-6, 300))
    starts[10:20] = starts[10]  # simultaneous arrivals
    flows = [
        Flow(i, int(s), int(d), int(b), float(t))
        for i, ((s, d), b, t) in enumerate(zip(pairs, sizes, starts, strict=True))
    ]

    def run(native: bool) -> dict:
        monkeypatch.setattr(flowsim, "native_fluid", lambda: native)
        routing = Routing(topo, seed=5)
        backend = FlowSimConfig(**settings).build(topo, routing)
        assert (backend._core is not None) == native
        done = {}
        for f in flows:
            backend.schedule(f.start_s, lambda f=f: backend.send(f, done.setdefault))
        backend.schedule(150e-6, lambda: backend.set_bandwidth(7, topo.bandwidth_bps[7] / 4))
        backend.run(until=100e-6)
        backend.run()
        return done

    numpy_loop, compiled = run(False), run(True)
    assert len(compiled) == len(flows)
    assert compiled == numpy_loop


def queued_trace(settings: dict, flows: list[Flow], latency_s: float = 1e-6) -> np.ndarray:
    topo = parking_lot([10], latency_s)
    return run_trace(topo, flows, FlowSimConfig(**settings), Routing(topo)).column("fct_s")


QUEUES = {"window_bytes": 100_000, "k_bytes": [[10e9, 30_000]]}


def test_standing_queues_delay_a_flow_that_meets_a_full_link():
    """A flow arriving on a link a long flow fills waits for what that flow keeps queued: its
    window beyond its bandwidth-delay product, at most K (here K: 30 KB at 10 Gbit/s, 24 µs);
    the long flow met an empty network and is as classic flowSim has it."""
    from m4ray.sim.flowsim import StandingQueues, round_trip

    flows = [Flow(0, 0, 1, 10_000_000, 0.0), Flow(1, 0, 1, 500, 100e-6)]
    classic = queued_trace({}, flows).to_numpy()
    queued = queued_trace({"queues": QUEUES}, flows).to_numpy()
    np.testing.assert_allclose(queued - classic, [0.0, 30_000 * 8 / 10e9], rtol=1e-9, atol=1e-15)
    # a smaller window keeps less than K in flight beyond the path's BDP: that is the queue
    small = {"window_bytes": 10_000, "k_bytes": [[10e9, 30_000]]}
    topo = parking_lot([10], 1e-6)
    routing = Routing(topo)
    rtt = round_trip(routing.path(0, 1, 0), routing.wire, 64)
    window = StandingQueues(**small).window_wire(routing.wire)
    assert window == 10 * 1048
    excess = window - 10e9 * rtt / 8
    assert 0 < excess < 30_000
    queued = queued_trace({"queues": small}, flows).to_numpy()
    np.testing.assert_allclose(queued - classic, [0.0, excess * 8 / 10e9], rtol=1e-9, atol=1e-15)


def test_standing_queues_need_a_full_link():
    """A long flow capped below the link's rate leaves it not full: no queue, classic FCTs;
    nor does a flow arriving on a path no other flow uses wait."""
    flows = [Flow(0, 0, 1, 10_000_000, 0.0), Flow(1, 0, 1, 500, 100e-6)]
    capped = {"rate_cap_bps": 4e9}
    assert queued_trace({**capped, "queues": QUEUES}, flows).equals(queued_trace(capped, flows))
    apart = [Flow(0, 0, 1, 10_000_000, 0.0), Flow(1, 1, 0, 500, 100e-6)]  # the other direction
    assert queued_trace({"queues": QUEUES}, apart).equals(queued_trace({}, apart))


@pytest.mark.parametrize(
    ("queues", "field"),
    [({"window_bytes": -1, "k_bytes": [[10e9, 1e4]]}, "queues.window_bytes"),
     ({"window_bytes": 9000, "k_bytes": [[0, 1e4]]}, "queues.k_bytes"),
     ({"window_bytes": 9000, "k_bytes": [[10e9, -1]]}, "queues.k_bytes"),
     ({"window_bytes": 9000, "k_bytes": []}, "queues.k_bytes")],
)  # fmt: skip
def test_impossible_standing_queues_name_the_field(queues, field):
    from m4ray.errors import InputError

    with pytest.raises(InputError) as err:
        FlowSimConfig(queues=queues)
    assert err.value.field == field


def test_standing_queues_of_a_network_take_its_window_and_its_cc_level():
    """From an ns-3 config: the RDMA window and the level its CC holds a full port at —
    DCTCP's K, DCQCN's K_min, TIMELY's T_low less the largest base round trip (at each of the
    topology's rates), HPCC none; TCP is refused by name."""
    from m4ray.errors import InputError
    from m4ray.sim.flowsim import StandingQueues
    from m4ray.sim.ns3.backend import Ns3Config
    from m4ray.sim.ns3.transports import RdmaConfig, max_base_rtt_s

    topo = parking_lot([10, 40], 1e-6)
    routing = Routing(topo)
    k = [[10e9, 12_000], [40e9, 48_000]]
    rdma = RdmaConfig(window_bytes=18_000, ecn_k_bytes=k)
    queues = StandingQueues.of(Ns3Config(rdma=rdma), routing)
    assert queues.window_bytes == 18_000
    assert queues.caps(np.array([10e9, 25e9, 100e9])).tolist() == [12_000, 30_000, 48_000]
    dcqcn = {"k_min_bytes": [[10e9, 20_000]], "k_max_bytes": [[10e9, 80_000]]}
    rdma = RdmaConfig(window_bytes=18_000, cc="dcqcn", cc_params=dcqcn)
    assert StandingQueues.of(Ns3Config(rdma=rdma), routing).k_bytes == [[10e9, 20_000]]
    rdma = RdmaConfig(window_bytes=0, cc="timely", cc_params={"t_low_s": 30e-6})
    queues = StandingQueues.of(Ns3Config(rdma=rdma), routing)
    delay = 30e-6 - max_base_rtt_s(routing, rdma.ack_bytes)
    assert 0 < delay < 30e-6 and queues.window_bytes == 0
    np.testing.assert_allclose(queues.caps(np.array([10e9, 40e9])), [1.25e9 * delay, 5e9 * delay])
    hpcc = StandingQueues.of(Ns3Config(rdma=RdmaConfig(cc="hpcc")), routing)
    assert hpcc.first_rtt and hpcc.caps(topo.bandwidth_bps).min() == RdmaConfig().buffer_bytes
    assert not queues.first_rtt
    with pytest.raises(InputError, match="RDMA's congestion controls") as err:
        StandingQueues.of(Ns3Config(transport="tcp"), routing)
    assert err.value.field == "queues"


def test_first_round_trip_queues_and_no_window_queues():
    """``first_rtt`` (HPCC's): a flow arriving while a long flow is in its first round trip
    waits for that flow's window beyond its bandwidth-delay product; one arriving later waits
    nothing (classic flowSim). With no window a full link's queue stands at its level whatever
    the flows' rates: the short flow waits level / rate."""
    from m4ray.sim.flowsim import round_trip

    topo = parking_lot([10], 1e-6)
    routing = Routing(topo)
    rtt = round_trip(routing.path(0, 1, 0), routing.wire, 64)
    first = {"window_bytes": 100_000, "k_bytes": [[10e9, 1e6]], "first_rtt": True}
    excess = 100 * 1048 - 10e9 * rtt / 8
    for arrival, wait in ((rtt / 2, excess * 8 / 10e9), (2 * rtt, 0.0)):
        flows = [Flow(0, 0, 1, 10_000_000, 0.0), Flow(1, 0, 1, 500, arrival)]
        classic = queued_trace({}, flows).to_numpy()
        queued = queued_trace({"queues": first}, flows).to_numpy()
        np.testing.assert_allclose(queued - classic, [0.0, wait], rtol=1e-9, atol=1e-15)
    flows = [Flow(0, 0, 1, 10_000_000, 0.0), Flow(1, 0, 1, 500, 100e-6)]
    classic = queued_trace({}, flows).to_numpy()
    queued = queued_trace({"queues": {"window_bytes": 0, "k_bytes": [[10e9, 50_000]]}}, flows)
    np.testing.assert_allclose(
        queued.to_numpy() - classic, [0.0, 50_000 * 8 / 10e9], rtol=1e-9, atol=1e-15
    )


def test_first_windows_queue_over_the_level_up_to_the_buffer():
    """``buffer_bytes`` (first windows over the level): a long flow past its first round trip
    holds the link at K; a flow in its first round trip adds its excess on top, its in flight at
    most what it has left (a 20,000-byte flow: its 20 packets, not a 100 KB window), up to the
    buffer. Without it the level caps everything (the standing model)."""
    from m4ray.sim.flowsim import round_trip

    topo = parking_lot([10], 1e-6)
    routing = Routing(topo)
    rtt = round_trip(routing.path(0, 1, 0), routing.wire, 64)
    k, window = 30_000, 100_000
    young_at, probe_at = 100e-6, 100e-6 + rtt / 4
    flows = [
        Flow(0, 0, 1, 10_000_000, 0.0),
        Flow(1, 0, 1, 20_000, young_at),  # in its first round trip when the probe arrives
        Flow(2, 0, 1, 500, probe_at),
    ]
    classic = queued_trace({}, flows).to_numpy()
    standing = {"window_bytes": window, "k_bytes": [[10e9, k]]}
    level = queued_trace({"queues": standing}, flows).to_numpy() - classic
    np.testing.assert_allclose(level[1:], [k * 8 / 10e9] * 2, rtol=1e-9)
    bursts = queued_trace({"queues": {**standing, "buffer_bytes": 4_000_000}}, flows).to_numpy()
    # the young flow: 20 packets on the wire (1,000 payload + 48 each), less what it sent at
    # its half of the link in rtt / 4, less its bandwidth-delay product
    wire_left = 20 * 1_048 - 5e9 * (rtt / 4) / 8
    young = wire_left - 5e9 * rtt / 8
    assert 10_000 < young < 20_960
    np.testing.assert_allclose(
        (bursts - classic)[2], (k + young) * 8 / 10e9, rtol=1e-6
    )  # the probe waits K and the young flow's excess
    capped = {**standing, "buffer_bytes": k + 100}
    capped = queued_trace({"queues": capped}, flows).to_numpy() - classic
    np.testing.assert_allclose(capped[2], (k + 100) * 8 / 10e9, rtol=1e-9)


def test_bursts_of_a_network_fill_its_buffer_where_its_cc_holds_a_level():
    """``StandingQueues.of(..., bursts=True)``: the network's switch buffer under DCTCP (and any
    CC holding a level); HPCC, whose queue is only its first windows, keeps them as they are."""
    from m4ray.sim.flowsim import StandingQueues
    from m4ray.sim.ns3.backend import Ns3Config
    from m4ray.sim.ns3.transports import RdmaConfig

    routing = Routing(parking_lot([10], 1e-6))
    dctcp = Ns3Config(rdma=RdmaConfig(buffer_bytes=700_000, window_bytes=18_000))
    assert StandingQueues.of(dctcp, routing, bursts=True).buffer_bytes == 700_000
    assert StandingQueues.of(dctcp, routing).buffer_bytes == 0
    hpcc = Ns3Config(rdma=RdmaConfig(cc="hpcc"))
    assert StandingQueues.of(hpcc, routing, bursts=True) == StandingQueues.of(hpcc, routing)


def _incast_pair() -> tuple:
    """Hosts 0 and 1 send to host 2 through switch 3, every link 10 Gbit/s, no latency."""
    from m4ray.sim.topology import Cable, Topology

    cables = (Cable(0, 3, 10e9, 0.0), Cable(1, 3, 10e9, 0.0), Cable(3, 2, 10e9, 0.0))
    topo = Topology(n_nodes=4, switches=(3,), cables=cables)
    return topo, Routing(topo)


def test_dcqcn_rates_stick_after_a_cut_until_the_increase_timer():
    """flowSim's DCQCN rates (``rate_control``), analytically: a flow alone at line rate
    through a link as fast is never cut (as classic flowSim); when a second flow arrives the
    switch's link to the receiver holds both below their NICs with more than K_min in flight,
    so both are cut to their shares and keep them after the first leaves (classic flowSim gives
    the second the whole link) until the increase timer moves the second halfway back to its
    target (its line rate when first cut), and again (the target at most the line rate)."""
    from m4ray.sim.flowsim import DcqcnRates

    topo, routing = _incast_pair()
    wire = routing.wire
    rc = DcqcnRates().params()  # DCQCN's defaults: 900 µs increase timer, one fast recovery
    lone = [Flow(0, 0, 2, 50_000, 0.0)]
    ours = run_trace(topo, lone, FlowSimConfig(rate_control={}), routing).column("fct_s")
    theirs = run_trace(topo, lone, FlowSimConfig(), routing).column("fct_s")
    assert ours.to_pylist() == pytest.approx(theirs.to_pylist(), rel=1e-12)

    t1, size_a, size_b = 10e-6, 200_000, 2_000_000
    flows = [Flow(0, 0, 2, size_a, 0.0), Flow(1, 1, 2, size_b, t1)]
    table = run_trace(topo, flows, FlowSimConfig(rate_control=DcqcnRates()), routing)
    ids, fcts = (table.column(c).to_pylist() for c in ("flow_id", "fct_s"))
    fct = dict(zip(ids, fcts, strict=True))
    late = [routing.delivery_delay(f.size_bytes, routing.path(f.src, f.dst, f.id)) for f in flows]
    bits_a, bits_b = (wire.wire_bytes(s) * 8.0 for s in (size_a, size_b))
    done_a = t1 + (bits_a - 10e9 * t1) / 5e9
    assert fct[0] == pytest.approx(done_a + late[0], rel=1e-9)
    # B: 5 Gbit/s until its first increase, then halfway to 10, then halfway again, ...
    left, t, rate = bits_b, t1, 5e9
    while left > rate * rc.increase_interval_s:
        left -= rate * rc.increase_interval_s
        t += rc.increase_interval_s
        rate = (rate + 10e9) / 2
    t += left / rate
    assert t > t1 + 2 * rc.increase_interval_s  # the test reaches the second increase
    assert fct[1] == pytest.approx(t - t1 + late[1], rel=1e-9)
    classic = run_trace(topo, flows, FlowSimConfig(), routing).column("fct_s").to_pylist()
    assert classic[1] < 0.8 * (t - t1)  # max-min gives B the link once A is done


def test_dcqcn_rates_take_the_networks_settings_and_refuse_another_cc():
    from m4ray.errors import InputError
    from m4ray.sim.flowsim import DcqcnRates
    from m4ray.sim.ns3.backend import Ns3Config
    from m4ray.sim.ns3.transports import RdmaConfig

    rdma = RdmaConfig(cc="dcqcn", cc_params={"increase_interval_s": 55e-6}, min_rate_bps=2e9)
    rc = DcqcnRates.of(Ns3Config(rdma=rdma))
    params = rc.params()
    assert params.increase_interval_s == 55e-6 and params.gain == 1 / 256
    assert rc.min_rate_bps == 2e9
    for cc in ("dctcp", "hpcc"):
        with pytest.raises(InputError) as err:
            DcqcnRates.of(Ns3Config(rdma=RdmaConfig(cc=cc)))
        assert err.value.field == "rate_control" and cc in err.value.message
    with pytest.raises(InputError) as err:
        FlowSimConfig(rate_control={"cc_params": {"gain": 0.0}})
    assert err.value.field == "rate_control.cc_params.gain"
    with pytest.raises(InputError) as err:
        FlowSimConfig(rate_control={"cc_params": {"t_low_s": 1e-5}})  # TIMELY's, not DCQCN's
    assert err.value.field.startswith("rate_control.cc_params")


def test_dctcp_rates_climb_back_by_the_ai_once_a_round_trip():
    """flowSim's DCTCP rates (``rate_control`` with ``cc: dctcp``), analytically: a lone flow
    is never cut; two flows into one receiver are cut to their shares (5 Gbit/s each) and held
    there while both last; once A leaves, B climbs back by the AI once a round trip (the
    round-trip grid's first tick after A's end, then every tick), where classic flowSim gives
    it the whole link at once."""
    from m4ray.sim.flowsim import DctcpRates

    topo, routing = _incast_pair()
    wire = routing.wire
    rc = {"cc": "dctcp", "k_bytes": [[10e9, 1000]], "round_trip_s": 10e-6, "rate_ai_bps": 1e9}
    lone = [Flow(0, 0, 2, 50_000, 0.0)]
    ours = run_trace(topo, lone, FlowSimConfig(rate_control=rc), routing).column("fct_s")
    theirs = run_trace(topo, lone, FlowSimConfig(), routing).column("fct_s")
    assert ours.to_pylist() == pytest.approx(theirs.to_pylist(), rel=1e-12)

    t1, size_a, size_b = 10e-6, 200_000, 2_000_000
    flows = [Flow(0, 0, 2, size_a, 0.0), Flow(1, 1, 2, size_b, t1)]
    config = FlowSimConfig(rate_control=rc)
    assert isinstance(config.rate_control, DctcpRates)
    table = run_trace(topo, flows, config, routing)
    fct = dict(zip(*(table.column(c).to_pylist() for c in ("flow_id", "fct_s")), strict=True))
    late = [routing.delivery_delay(f.size_bytes, routing.path(f.src, f.dst, f.id)) for f in flows]
    bits_a, bits_b = (wire.wire_bytes(s) * 8.0 for s in (size_a, size_b))
    done_a = t1 + (bits_a - 10e9 * t1) / 5e9
    assert fct[0] == pytest.approx(done_a + late[0], rel=1e-9)
    rtt = rc["round_trip_s"]
    t, rate = done_a, 5e9
    left = bits_b - 5e9 * (done_a - t1)
    tick = math.ceil(done_a / rtt) * rtt
    steps = 0
    while left > rate * (tick - t):
        left -= rate * (tick - t)
        t, rate, tick = tick, min(rate + 1e9, 10e9), tick + rtt
        steps += 1
    t += left / rate
    assert steps >= 3  # the test sees B climb
    assert fct[1] == pytest.approx(t - t1 + late[1], rel=1e-9)
    classic = run_trace(topo, flows, FlowSimConfig(), routing).column("fct_s").to_pylist()
    assert classic[1] < fct[1] - rtt  # the climb costs B ~1.5 round trips here


def test_dctcp_rates_take_the_networks_settings_and_refuse_another_cc():
    from m4ray.errors import InputError
    from m4ray.sim.flowsim import DctcpRates
    from m4ray.sim.ns3.backend import Ns3Config
    from m4ray.sim.ns3.transports import RdmaConfig, max_base_rtt_s

    _, routing = _incast_pair()
    rdma = RdmaConfig(rate_ai_bps=3e9, min_rate_bps=2e9, ecn_k_bytes=[[10e9, 30_000]])
    rc = DctcpRates.of(Ns3Config(rdma=rdma), routing)
    assert (rc.rate_ai_bps, rc.min_rate_bps, rc.k_bytes) == (3e9, 2e9, [[10e9, 30_000]])
    assert rc.round_trip_s == max_base_rtt_s(routing, rdma.ack_bytes) > 0
    with pytest.raises(InputError) as err:
        DctcpRates.of(Ns3Config(rdma=RdmaConfig(cc="dcqcn")), routing)
    assert err.value.field == "rate_control" and "dcqcn" in err.value.message
    with pytest.raises(InputError) as err:
        FlowSimConfig(rate_control={"cc": "dctcp", "k_bytes": [[10e9, 1]], "round_trip_s": 0})
    assert err.value.field == "rate_control.round_trip_s"
    with pytest.raises(InputError) as err:
        FlowSimConfig(rate_control={"cc": "reno"})
    assert err.value.field == "rate_control.cc"


def test_fifo_service_serves_flows_in_order_of_arrival_and_shares_ties():
    """``service: fifo``, analytically: into one 10 Gbit/s receiver, A (t = 0) takes the whole
    link until it is done and B (t = 1 µs), queued behind it, drains after A at the full rate:
    A finishes as if alone, B when both are through (classic flowSim shares the link and
    finishes A later). Two flows arriving together share it max-min, as classic flowSim."""
    from m4ray.errors import InputError

    topo, routing = _incast_pair()
    wire = routing.wire
    size, t1 = 100_000, 1e-6
    bits = wire.wire_bytes(size) * 8.0
    flows = [Flow(0, 0, 2, size, 0.0), Flow(1, 1, 2, size, t1)]
    late = [routing.delivery_delay(f.size_bytes, routing.path(f.src, f.dst, f.id)) for f in flows]
    table = run_trace(topo, flows, FlowSimConfig(service="fifo"), routing)
    fct = dict(zip(*(table.column(c).to_pylist() for c in ("flow_id", "fct_s")), strict=True))
    assert fct[0] == pytest.approx(bits / 10e9 + late[0], rel=1e-9)
    assert fct[1] == pytest.approx(2 * bits / 10e9 - t1 + late[1], rel=1e-9)
    classic = run_trace(topo, flows, FlowSimConfig(), routing).column("fct_s").to_pylist()
    assert classic[0] > fct[0] * 1.5
    together = [Flow(0, 0, 2, size, 0.0), Flow(1, 1, 2, size, 0.0)]
    ours = run_trace(topo, together, FlowSimConfig(service="fifo"), routing).column("fct_s")
    theirs = run_trace(topo, together, FlowSimConfig(), routing).column("fct_s")
    assert ours.to_pylist() == pytest.approx(theirs.to_pylist(), rel=1e-12)
    for bad in ({"service": "lifo"}, {"service": "fifo", "ack_load": True}):
        with pytest.raises(InputError) as err:
            FlowSimConfig(**bad)  # refused before any simulator is built
        assert err.value.field == "service"


def test_fifo_service_up_to_a_size_serves_larger_flows_with_what_is_left():
    """``fifo_bytes``: only flows of at most that many bytes are served in order of arrival
    (ahead of larger ones); a larger flow shares max-min what they leave. A 1 MB flow alone
    from t = 0 has the link until a 50 KB flow arrives at t = 10 µs, which then takes it
    whole until done; the large one resumes after. ``"window"`` is RDMA's default window."""
    from m4ray.errors import InputError
    from m4ray.sim.ns3.transports import bdp_window_bytes

    topo, routing = _incast_pair()
    wire = routing.wire
    big, small, t1 = 1_000_000, 50_000, 10e-6
    flows = [Flow(0, 0, 2, big, 0.0), Flow(1, 1, 2, small, t1)]
    late = [routing.delivery_delay(f.size_bytes, routing.path(f.src, f.dst, f.id)) for f in flows]
    config = FlowSimConfig(service="fifo", fifo_bytes=100_000)
    table = run_trace(topo, flows, config, routing)
    fct = dict(zip(*(table.column(c).to_pylist() for c in ("flow_id", "fct_s")), strict=True))
    bits_big, bits_small = (wire.wire_bytes(s) * 8.0 for s in (big, small))
    assert fct[1] == pytest.approx(bits_small / 10e9 + late[1], rel=1e-9)
    assert fct[0] == pytest.approx((bits_big + bits_small) / 10e9 + late[0], rel=1e-9)
    every = run_trace(topo, flows, FlowSimConfig(service="fifo"), routing).column("fct_s")
    assert every.to_pylist()[0] == pytest.approx(bits_big / 10e9 + late[0], rel=1e-9)
    window = FlowSimConfig(service="fifo", fifo_bytes="window").fifo_bits(routing)
    assert window == pytest.approx(
        math.ceil(bdp_window_bytes(routing, 64) / wire.mtu_bytes)
        * (wire.mtu_bytes + wire.header_bytes)
        * 8.0
    )
    for bad in ("bdp", -1, 1.5, True):
        with pytest.raises(InputError) as err:
            FlowSimConfig(service="fifo", fifo_bytes=bad)
        assert err.value.field == "fifo_bytes"
