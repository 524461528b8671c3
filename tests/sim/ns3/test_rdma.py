"""The RDMA transport of the ns-3 backend (real ns-3 in Ray worker processes): a lone flow reaches
the one-way ideal FCT, flows share fairly, PFC keeps an incast lossless, loss is recovered, and
impossible settings are refused with the field named."""

from __future__ import annotations

import pytest

from m4ray.errors import InputError
from m4ray.sim.flows import Flow
from m4ray.sim.flowsim import FlowSimConfig
from m4ray.sim.ns3.backend import Ns3Config
from m4ray.sim.ns3.transports import RdmaConfig
from m4ray.sim.routing import Routing, WireFormat
from m4ray.sim.topology import Cable, Topology
from m4ray.sim.trace import run_trace

DEFAULT = WireFormat()  # 1000 B payload + 48 B headers
JUMBO = WireFormat(mtu_bytes=8948, header_bytes=54)


def chain(bw: float, delay: float = 1e-6) -> Topology:
    """host 0 - s2 - s3 - s4 - s5 - host 1: a 5-hop path."""
    switches = (2, 3, 4, 5)
    cables = [Cable(0, 2, bw, delay), Cable(5, 1, bw, delay)]
    cables += [Cable(a, a + 1, bw, delay) for a in (2, 3, 4)]
    return Topology(n_nodes=6, switches=switches, cables=tuple(cables))


def star(n_hosts: int, bw: float, delay: float = 1e-6) -> Topology:
    """Hosts 0..n-1 on one switch n."""
    cables = tuple(Cable(h, n_hosts, bw, delay) for h in range(n_hosts))
    return Topology(n_nodes=n_hosts + 1, switches=(n_hosts,), cables=cables)


def nvswitch_star(n_hosts: int, bw: float) -> Topology:
    """:func:`star` with its switch declared an NVSwitch (SimAI's node type 2)."""
    fabric = star(n_hosts, bw)
    return Topology(
        n_nodes=fabric.n_nodes, switches=(n_hosts,), nvswitches=(n_hosts,), cables=fabric.cables
    )


def _simulate(topo, flows, wire, cfg):
    """Trace table columns and the transport's counters, in a worker process."""
    routing = Routing(topo, wire=wire)
    backend = cfg.build(topo, routing)
    done: dict[int, float] = {}
    for flow in flows:
        backend.schedule(flow.start_s, lambda f=flow: backend.send(f, done.__setitem__))
    backend.run()
    ideal = {f.id: routing.ideal_fct(f.size_bytes, routing.path(f.src, f.dst, f.id)) for f in flows}
    return {f.id: (done.get(f.id), ideal[f.id]) for f in flows}, backend.counters()


@pytest.fixture(scope="module")
def simulate(ray_local):
    remote = ray_local.remote(_simulate)
    return lambda *args: ray_local.get(remote.remote(*args))


@pytest.mark.parametrize(
    ("bw", "wire"), [(10e9, DEFAULT), (266e9, JUMBO), (2.4e12, JUMBO)], ids=["10G", "266G", "2.4T"]
)
def test_a_lone_flow_is_ideal(simulate, bw, wire):
    flows = [Flow(i, 0, 1, size, i * 10e-3) for i, size in enumerate((1000, 64_000, 10_000_000))]
    result, counters = simulate(chain(bw), flows, wire, Ns3Config())
    for flow in flows:
        finish, ideal = result[flow.id]
        assert (finish - flow.start_s) / ideal == pytest.approx(1.0, abs=0.01)
    assert counters["drops"] == counters["timeouts"] == counters["pauses"] == 0


def test_the_trace_ideal_column_is_routing_ideal_fct(ray_local):
    topo = chain(10e9)
    routing = Routing(topo, wire=DEFAULT)
    flows = [Flow(0, 0, 1, 123_456, 0.0)]
    table = ray_local.get(ray_local.remote(run_trace).remote(topo, flows, Ns3Config(), routing))
    expected = routing.ideal_fct(123_456, routing.path(0, 1, 0))
    assert table.column("ideal_fct_s")[0].as_py() == expected
    assert table.column("slowdown")[0].as_py() == pytest.approx(1.0, abs=0.01)


def test_two_flows_into_one_receiver_share_fairly(simulate):
    flows = [Flow(i, i, 2, 10_000_000, 0.0) for i in range(2)]
    result, _ = simulate(star(3, 100e9), flows, JUMBO, Ns3Config())
    for finish, ideal in result.values():
        assert finish / ideal == pytest.approx(2.0, rel=0.1)


def test_an_incast_with_pfc_loses_nothing(simulate):
    """8:1 incast with no window and a small PFC threshold: the switch pauses its upstreams
    instead of dropping (the buffer holds 8 thresholds plus each port's in-flight headroom);
    every byte arrives without a retransmission timeout."""
    cfg = Ns3Config(
        rdma=RdmaConfig(window_bytes=0, buffer_bytes=1_000_000, pfc_threshold_bytes=40_000)
    )
    flows = [Flow(i, i, 8, 2_000_000, 0.0) for i in range(8)]
    result, counters = simulate(star(9, 100e9), flows, JUMBO, cfg)
    assert all(finish is not None for finish, _ in result.values())
    assert counters["pauses"] > 0
    assert counters["drops"] == 0 and counters["timeouts"] == 0
    assert counters["retransmits"] == 0 and counters["nacks"] == 0
    # nobody beats the shared receiver link
    assert max(finish / ideal for finish, ideal in result.values()) >= 8 * 0.98
    # with the default window (one BDP) the link stays busy: the last flow ends near 8x
    result, counters = simulate(star(9, 100e9), flows, JUMBO, Ns3Config())
    last = max(finish / ideal for finish, ideal in result.values())
    assert last == pytest.approx(8.0, rel=0.05)
    assert counters["drops"] == counters["pauses"] == 0  # the window alone bounds the queue
    # without PFC the same incast overflows the buffer and recovers by go-back-N
    lossy = Ns3Config(
        rdma=RdmaConfig(
            window_bytes=0, buffer_bytes=1_000_000, pfc_threshold_bytes=40_000, pfc=False
        )
    )
    result, counters = simulate(star(9, 100e9), flows, JUMBO, lossy)
    assert all(finish is not None for finish, _ in result.values())
    assert counters["drops"] > 0 and counters["retransmits"] > 0


def test_an_nvswitch_marks_no_ecn_sends_no_pfc_and_drops_nothing(simulate):
    """The incast above, through the same switch declared an NVSwitch (SimAI's node type 2): no
    ECN mark, no PAUSE and no drop, even with no window and a buffer it overfills; declared a
    rail switch, the same run marks and pauses."""
    cfg = Ns3Config(
        rdma=RdmaConfig(window_bytes=0, buffer_bytes=1_000_000, pfc_threshold_bytes=40_000)
    )
    flows = [Flow(i, i, 8, 2_000_000, 0.0) for i in range(8)]
    fabric = star(9, 100e9)
    result, counters = simulate(nvswitch_star(9, 100e9), flows, JUMBO, cfg)
    assert all(finish is not None for finish, _ in result.values())
    assert counters["marks"] == counters["pauses"] == counters["drops"] == 0
    assert max(finish / ideal for finish, ideal in result.values()) >= 8 * 0.98
    _, counters = simulate(fabric, flows, JUMBO, cfg)
    assert counters["marks"] > 0 and counters["pauses"] > 0


def test_packet_loss_is_recovered(simulate):
    topo = chain(10e9)
    lossy = topo.replace_cables(
        tuple(c.__class__(c.a, c.b, c.bandwidth_bps, c.latency_s, 0.01) for c in topo.cables)
    )
    flows = [Flow(0, 0, 1, 1_000_000, 0.0)]
    clean, _ = simulate(topo, flows, DEFAULT, Ns3Config())
    result, counters = simulate(lossy, flows, DEFAULT, Ns3Config())
    assert result[0][0] > clean[0][0]  # delivered, later
    assert counters["retransmits"] > 0


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"window_bytes": -1}, "ns3.rdma.window_bytes"),
        ({"buffer_bytes": 0}, "ns3.rdma.buffer_bytes"),
        ({"pfc_threshold_bytes": 5_000_000}, "ns3.rdma.pfc_threshold_bytes"),
        ({"ecn_k_bytes": [[10e9, 5_000_000]]}, "ns3.rdma.ecn_k_bytes"),
        ({"ecn_k_bytes": [[10e9]]}, "ns3.rdma.ecn_k_bytes"),
        ({"dctcp_gain": 0}, "ns3.rdma.dctcp_gain"),
        ({"window_rule": "hpcc"}, "ns3.rdma.window_rule"),
    ],
)
def test_impossible_settings_name_the_field(settings, field):
    with pytest.raises(InputError) as err:
        RdmaConfig(**settings)
    assert err.value.field == field


def test_an_unknown_transport_lists_the_choices():
    with pytest.raises(InputError, match="rdma, tcp"):
        Ns3Config(transport="roce")


def test_default_window_covers_the_longest_path():
    topo = chain(10e9)
    routing = Routing(topo, wire=DEFAULT)
    cfg = RdmaConfig()
    # one way 5 us, a 1048-B packet out and a 64-B ACK back over 5 hops
    rtt = 10e-6 + 5 * (1048 + 64) * 8 / 10e9
    assert cfg.window(routing) == pytest.approx(10e9 * rtt / 8 + 1048, abs=1)
    assert cfg.params13(routing)[1] == cfg.window(routing) / 1000
    assert RdmaConfig(window_bytes=18_000).window(routing) == 18_000


def test_a_window_below_the_bdp_paces_a_lone_flow_as_flowsim_models_it(simulate):
    """A 3-packet window on a 5-hop 10G path (BDP ~ 12 KB): ns-3 sends k packets per round trip
    and flowSim's Window gives the same FCTs (the held-out topologies' mid-size flows)."""
    topo = chain(10e9)
    routing = Routing(topo, wire=DEFAULT)
    cfg = Ns3Config(rdma=RdmaConfig(window_bytes=2_500))
    flows = [
        Flow(i, 0, 1, size, i * 1e-3) for i, size in enumerate((2_000, 7_000, 64_000, 400_000))
    ]
    result, _ = simulate(topo, flows, DEFAULT, cfg)
    fluid = run_trace(topo, flows, FlowSimConfig(window_bytes=2_500), routing)
    for flow, fct in zip(flows, fluid.column("fct_s").to_pylist(), strict=True):
        finish, _ = result[flow.id]
        assert finish - flow.start_s == pytest.approx(fct, rel=0.01)
    assert fluid.column("slowdown").to_pylist()[-1] > 1.5  # the window does bind


def test_acks_take_their_share_of_a_cable_used_both_ways(simulate):
    """RDMA ACKs every packet: two hosts sending to each other at once get 1 / (1 + a) of the
    cable (a = ACK bytes per data packet's, 6 % here), which flowSim with ``ack_load`` gives
    and classic flowSim does not; one way, ACKs ride on an idle direction and cost nothing."""
    topo = star(2, 10e9)
    size = 2_000_000
    both = [Flow(0, 0, 1, size), Flow(1, 1, 0, size)]
    one = [Flow(0, 0, 1, size)]
    routing = Routing(topo, wire=DEFAULT)
    fraction = 64 / (DEFAULT.mtu_bytes + DEFAULT.header_bytes)
    for flows, slower in ((both, 1 + fraction), (one, 1.0)):
        result, _ = simulate(topo, flows, DEFAULT, Ns3Config())
        ns3 = [result[f.id][0] for f in flows]
        fcts = {
            acks: run_trace(topo, flows, FlowSimConfig(ack_load=acks), routing)
            .column("fct_s")
            .to_numpy()
            for acks in (False, True)
        }
        assert fcts[True] == pytest.approx(fcts[False] * slower, rel=2e-3)
        assert ns3 == pytest.approx(fcts[True], rel=5e-3)  # within 0.5 %; classic: 6 % off


SIMAI_WIRE = WireFormat(mtu_bytes=1000, header_bytes=40)  # conf/wire/simai.yaml


def test_whole_ns_packets_time_a_lone_flow_as_simai_does(simulate):
    """``round_ns`` (SimAI's nanosecond clock): a lone flow through one 400 Gbit/s switch takes
    whole-ns packets — 1,040 B in 21 ns, not 20.8 — so its FCT grows by 0.2 ns a packet over
    the picosecond model's; at 2.4 Tbit/s (3.47 ns -> 3 ns) it shrinks."""
    size = 1_000_000  # 1,000 packets
    flows = [Flow(0, 0, 1, size, 0.0)]
    fct = {}
    for bw in (400e9, 2.4e12):
        for round_ns in (False, True):
            # no window: at 2.4 Tbit/s a BDP-sized one would bind this flow
            cfg = Ns3Config(rdma=RdmaConfig(round_ns=round_ns, ack_bytes=48, window_bytes=0))
            result, _ = simulate(star(2, bw, 500e-9), flows, SIMAI_WIRE, cfg)
            fct[bw, round_ns] = result[0][0]
    # the bottleneck is the second hop's serialisation of 1,000 packets (pacing at line rate)
    assert fct[400e9, True] - fct[400e9, False] == pytest.approx(1000 * 0.2e-9, rel=0.05)
    assert fct[2.4e12, True] - fct[2.4e12, False] == pytest.approx(
        -1000 * (1040 * 8 / 2.4e12 - 3e-9), rel=0.05
    )


def test_simai_window_rule_is_its_largest_payload_bdp():
    """``window_rule: simai`` on SimAI's study cluster (GPU - rail - spine - rail - GPU, 500 ns
    and 400 Gbit/s a hop): 2 x 2,000 ns + 4 x 20 ns = 4,080 ns x 400 Gbit/s = 204,000 B."""
    from m4ray.sim.topologies import RailClusterSpec

    topo = RailClusterSpec().build()
    routing = Routing(topo, wire=SIMAI_WIRE)
    assert RdmaConfig(window_rule="simai").window(routing) == 204_000
    assert RdmaConfig(window_rule="simai", window_bytes=9_000).window(routing) == 9_000


def test_reference_dctcp_alpha_cuts_an_incast_as_the_other_count_does(simulate):
    """``dctcp_reference_alpha`` (HandleAckDctcp's batches) on a 4:1 incast: the same flows
    finish, the receiver link shared (each within 10 % of 4 x alone), marks seen; the two
    counts give different but close answers."""
    flows = [Flow(i, i, 4, 2_000_000, 0.0) for i in range(4)]
    out = {}
    for reference in (False, True):
        cfg = Ns3Config(rdma=RdmaConfig(dctcp_reference_alpha=reference))
        result, counters = simulate(star(5, 100e9), flows, DEFAULT, cfg)
        assert counters["marks"] > 0
        out[reference] = [result[f.id][0] / result[f.id][1] for f in flows]
    for slowdowns in out.values():
        assert max(slowdowns) == pytest.approx(4.0, rel=0.1)
    assert out[True] != out[False]


def test_dctcp_alpha_init_sets_how_hard_a_new_flow_is_first_cut(simulate):
    """``dctcp_alpha_init`` (1, the reference's: a new flow's first marks halve its rate) reaches
    the NIC: on a 4:1 incast both settings share the receiver's link and see marks, with
    different answers; a value outside [0, 1] is refused by name."""
    flows = [Flow(i, i, 4, 2_000_000, 0.0) for i in range(4)]
    out = {}
    for alpha in (1.0, 0.0):
        cfg = Ns3Config(rdma=RdmaConfig(dctcp_alpha_init=alpha))
        result, counters = simulate(star(5, 100e9), flows, DEFAULT, cfg)
        assert counters["marks"] > 0
        out[alpha] = [result[f.id][0] / result[f.id][1] for f in flows]
        assert max(out[alpha]) == pytest.approx(4.0, rel=0.1)
    assert out[1.0] != out[0.0]
    with pytest.raises(InputError, match="dctcp_alpha_init"):
        RdmaConfig(dctcp_alpha_init=1.5)


def test_done_at_ack_reports_a_flow_when_its_sender_has_the_last_ack(simulate):
    """``done_at_ack`` (SimAI's QpComplete): a lone flow is reported one ACK trip later than
    its last byte's arrival (5 hops of 1 us and a 64 B ACK at 10 Gbit/s), and a backend built
    with it says so, so the replay adds no trip of its own."""
    flows = [Flow(0, 0, 1, 64_000, 0.0)]
    plain, _ = simulate(chain(10e9), flows, DEFAULT, Ns3Config())
    cfg = Ns3Config(rdma=RdmaConfig(done_at_ack=True))
    acked, _ = simulate(chain(10e9), flows, DEFAULT, cfg)
    trip = 5 * (1e-6 + 64 * 8 / 10e9)
    assert acked[0][0] - plain[0][0] == pytest.approx(trip, rel=0.01)


def test_feed_when_idle_leaves_no_gap_between_packets(simulate):
    """``feed_when_idle`` (a port picks its next packet as its wire goes idle, as SimAI's device
    does) adds no gap: a lone flow still runs at its ideal FCT, and a 4:1 incast still shares
    the receiver's link and loses nothing."""
    cfg = Ns3Config(rdma=RdmaConfig(feed_when_idle=True))
    lone = [Flow(0, 0, 1, 2_000_000, 0.0)]
    result, _ = simulate(chain(10e9), lone, DEFAULT, cfg)
    finish, ideal = result[0]
    assert finish / ideal == pytest.approx(1.0, abs=0.01)
    flows = [Flow(i, i, 4, 500_000, 0.0) for i in range(4)]
    result, counters = simulate(star(5, 100e9), flows, DEFAULT, cfg)
    assert max(result[f.id][0] / result[f.id][1] for f in flows) == pytest.approx(4.0, rel=0.1)
    assert counters["drops"] == counters["timeouts"] == 0 and counters["marks"] > 0


def test_simai_nic_wake_holds_a_paced_flow_behind_a_window_bound_one(simulate):
    """``nic_wake_simai`` (SimAI's DequeueAndTransmit): a NIC with no queue pair ready retries
    at the earliest next-send time over pairs with bytes left, window-bound ones included, and
    only if that is ahead; a window-bound pair (a long path, 10 KB window) whose time has passed
    leaves the NIC idle until an ACK comes in, so a paced pair on a short path (40 Gbit/s cap)
    beside it sends late: its FCT grows by a third. Alone, it runs the same either way."""
    topo = Topology(
        n_nodes=4,
        switches=(3,),
        cables=(Cable(0, 3, 100e9, 0.1e-6), Cable(1, 3, 100e9, 20e-6), Cable(2, 3, 100e9, 0.1e-6)),
    )
    paced = Flow(1, 0, 2, 1_000_000, 0.0)
    fct = {}
    for flows in ([paced], [Flow(0, 0, 1, 10_000_000, 0.0), paced]):
        for wake in (False, True):
            rdma = RdmaConfig(window_bytes=10_000, max_rate_bps=40e9, nic_wake_simai=wake)
            result, counters = simulate(topo, flows, DEFAULT, Ns3Config(rdma=rdma))
            assert counters["marks"] == counters["drops"] == 0
            fct[len(flows), wake] = result[1][0]
    assert fct[1, True] == fct[1, False]
    assert fct[1, False] == pytest.approx(fct[2, False], rel=1e-3)  # the ready rule: no loss
    assert fct[2, True] / fct[2, False] > 1.2


def per_link(topo, flows, wire, cfg, pairs):
    """Bytes sent and CE marks per directed link, the run's marks, and the links of each
    ``(src, dst)`` pair's path (flow 0's ECMP key), in a worker process."""
    routing = Routing(topo, wire=wire)
    backend = cfg.build(topo, routing)
    for flow in flows:
        backend.schedule(flow.start_s, lambda f=flow: backend.send(f, lambda *_: None))
    backend.run()
    paths = [routing.path(a, b, 0).links for a, b in pairs]
    marks = backend.counters()["marks"]
    return backend.sent_bytes(), backend.marked_packets(), marks, paths


def test_each_link_counts_the_bytes_it_put_on_its_wire(ray_local):
    """``sent_bytes``: a 1 MB flow over five hops puts its wire bytes (payload, headers, PPP) on
    every link of its path, its ACKs (one per packet) on the links back (the run stops at the
    last byte's delivery, so the last few ACKs are still on their way), nothing elsewhere."""
    flows = [Flow(0, 0, 1, 1_000_000, 0.0)]
    cfg = Ns3Config()
    sent, _, _, (forward, back) = ray_local.get(
        ray_local.remote(per_link).remote(chain(10e9), flows, DEFAULT, cfg, [(0, 1), (1, 0)])
    )
    packets = -(-1_000_000 // DEFAULT.mtu_bytes)
    assert set(sent[list(forward)].tolist()) == {DEFAULT.wire_bytes(1_000_000)}
    acks = sent[list(back)]
    assert (acks <= packets * cfg.rdma.ack_bytes).all()
    assert (acks >= 0.99 * packets * cfg.rdma.ack_bytes).all()
    assert (acks % cfg.rdma.ack_bytes == 0).all() and (acks[:-1] >= acks[1:]).all()
    assert sent.sum() == sent[list(forward)].sum() + sent[list(back)].sum()
