"""The fluid DCTCP (m4ray.sim.fluidcc) against what holds without simulating it: a lone flow's
ideal FCT, a shared port's capacity and fairness, the cuts' cost when few flows share a marked
port, and its refusals."""

from __future__ import annotations

import numpy as np
import pytest

from m4ray.errors import InputError
from m4ray.sim.backend import NetworkBackend
from m4ray.sim.flows import Flow
from m4ray.sim.flowsim import FlowSimConfig
from m4ray.sim.fluidcc import FluidDctcpConfig
from m4ray.sim.ns3.backend import Ns3Config
from m4ray.sim.ns3.transports import RdmaConfig
from m4ray.sim.routing import Routing
from m4ray.sim.topology import Cable, Topology
from m4ray.sim.trace import run_trace

GBPS = 10e9


def star(n_hosts: int) -> Topology:
    """Hosts 0..n-1 on one switch (node n), 10 Gbit/s and 1 us each way."""
    cables = tuple(Cable(h, n_hosts, GBPS, 1e-6) for h in range(n_hosts))
    return Topology(n_nodes=n_hosts + 1, switches=(n_hosts,), cables=cables)


def degraded_star() -> Topology:
    """Hosts 0-2 at 100 Gbit/s and host 3 at 25 Gbit/s on one switch (node 4), 1 us each way."""
    rates = (100, 100, 100, 25)
    return Topology(
        n_nodes=5,
        switches=(4,),
        cables=tuple(Cable(h, 4, r * 1e9, 1e-6) for h, r in enumerate(rates)),
    )


def dctcp(**rdma) -> Ns3Config:
    """RDMA DCTCP with the study's RED (K_min 1 KB per Gbit/s, K_max 4x, P_max 0.2)."""
    red = {
        "ecn_k_bytes": [[10e9, 10_000], [400e9, 400_000]],
        "ecn_k_max_bytes": [[10e9, 40_000], [400e9, 1_600_000]],
        "ecn_p_max": 0.2,
        "rate_ai_bps": 2e9,
    }
    return Ns3Config(transport="rdma", rdma=RdmaConfig(**{**red, **rdma}))


def dcqcn(**rdma) -> Ns3Config:
    """RDMA DCQCN with RED from 1 KB (K_min) and 1.8 KB (K_max) at 1 Gbit/s to 400 KB and 720 KB
    at 400 Gbit/s (a datagen draw's), the reference's timers, and ``rdma``."""
    red = {
        "k_min_bytes": [[1e9, 1000], [400e9, 400_000]],
        "k_max_bytes": [[1e9, 1800], [400e9, 720_000]],
    }
    return Ns3Config(transport="rdma", rdma=RdmaConfig(cc="dcqcn", cc_params=red, **rdma))


def hpcc(**rdma) -> Ns3Config:
    """RDMA HPCC with the reference's defaults (η 0.95, AI 50 Mbit/s, INT on every packet)."""
    return Ns3Config(transport="rdma", rdma=RdmaConfig(cc="hpcc", **rdma))


def timely(**rdma) -> Ns3Config:
    """RDMA TIMELY with the reference's defaults (T_low 50 us, T_high 500 us, β 0.8)."""
    return Ns3Config(transport="rdma", rdma=RdmaConfig(cc="timely", **rdma))


def fcts(
    topo: Topology, flows: list[tuple[int, int, int, float]], config, wire=None
) -> list[float]:
    routing = Routing(topo) if wire is None else Routing(topo, wire=wire)
    trace = [Flow(i, s, d, size, t) for i, (s, d, size, t) in enumerate(flows)]
    table = run_trace(topo, trace, config, routing)
    ids, fct = table.column("flow_id").to_pylist(), table.column("fct_s").to_pylist()
    by_id = dict(zip(ids, fct, strict=True))
    return [by_id[i] for i in range(len(flows))]


@pytest.mark.parametrize("var_window", [False, True])
def test_is_a_network_backend_and_a_lone_flow_takes_its_ideal_fct(var_window):
    topo = star(2)
    routing = Routing(topo)
    config = FluidDctcpConfig(network=dctcp(), var_window=var_window)
    assert isinstance(config.build(topo, routing), NetworkBackend)
    (fct,) = fcts(topo, [(0, 1, 1_000_000, 0.0)], config)
    assert fct == pytest.approx(routing.ideal_fct(1_000_000, routing.path(0, 1)), rel=1e-9)


@pytest.mark.parametrize("cuts", ["rate", "window"])
def test_two_long_flows_share_a_marked_port_fully_and_fairly(cuts):
    """Two 4 MB flows into one host: DCTCP's cuts keep the port's queue near K, so the port
    stays busy (they finish within 5 % of its capacity's bound) and they share it evenly."""
    topo = star(3)
    size = 4_000_000
    config = FluidDctcpConfig(network=dctcp(), cuts=cuts)
    got = fcts(topo, [(0, 2, size, 0.0), (1, 2, size, 0.0)], config)
    wire_bits = (size + -(-size // 1000) * 48) * 8.0
    bound = 2 * wire_bits / GBPS
    assert bound <= max(got) <= 1.05 * bound
    assert abs(got[0] - got[1]) <= 0.05 * max(got)


def test_a_capped_sender_cut_on_marks_others_make_finishes_late_as_in_ns3():
    """The study's mechanism in small: a sender on a degraded 25 Gbit/s NIC shares a 100 Gbit/s
    port with a healthy sender's two flows. Max-min gives it its NIC's rate throughout; under
    DCTCP the healthy flows' line-rate start fills the port's queue past K, RED marks every
    flow there, and the degraded sender halves (α starts at 1) and climbs back by the AI while
    its NIC idles. Real ns-3 finishes it ~5 % past max-min, and so does the fluid (within 2 %
    of ns-3; both cut rules); with marking out of reach the queue alone costs it only its
    wait. Held at the full window (not scaled with the rate as the network says) the fluid
    queues more and overdoes it (~13 % past max-min)."""
    cables = (Cable(0, 3, 25e9, 1e-6), Cable(1, 3, 100e9, 1e-6), Cable(2, 3, 100e9, 1e-6))
    topo = Topology(n_nodes=4, switches=(3,), cables=cables)
    flows = [(0, 2, 2_000_000, 0.0), (1, 2, 8_000_000, 0.0), (1, 2, 8_000_000, 0.0)]
    window = {"window_bytes": 100_000}
    network = dctcp(**window)
    packet = fcts(topo, flows, network)
    fair = fcts(topo, flows, FlowSimConfig())
    far = dctcp(ecn_k_bytes=[[10e9, 3_000_000]], ecn_k_max_bytes=[[10e9, 3_900_000]], **window)
    assert packet[0] > 1.03 * fair[0]
    for cuts in ("rate", "window"):
        fluid = fcts(topo, flows, FluidDctcpConfig(network=network, cuts=cuts))
        unmarked = fcts(topo, flows, FluidDctcpConfig(network=far, cuts=cuts))
        assert fluid[0] == pytest.approx(packet[0], rel=0.02)
        assert fluid[0] > 1.03 * fair[0]
        assert unmarked[0] == pytest.approx(fair[0], rel=0.05)
        assert fluid[1:] == pytest.approx(fair[1:], rel=0.01)  # the port itself stays busy
    held = fcts(topo, flows, FluidDctcpConfig(network=network, var_window=False))
    assert held[0] > 1.1 * fair[0]


@pytest.mark.parametrize("var_window", [False, True])
def test_a_window_scaled_by_the_rate_holds_a_cut_flow_behind_a_queue(monkeypatch, var_window):
    """A flow cut to 2 of its 10 Gbit/s behind a 200 KB queue (a round trip of ~164 us) with
    a 100 KB window: held at the window, the rate binds (the window allows 4.9 Gbit/s); scaled
    by rate / line rate as HPCC's VAR_WIN, the window allows 2 x 800 kbit / (10 Gbit/s x RTT),
    about 0.98 Gbit/s."""
    import math

    from m4ray.sim import fluidcc

    monkeypatch.setattr(fluidcc, "_LIB", [None])  # the numpy steps, whose state is readable
    topo = star(2)
    routing = Routing(topo)
    network = dctcp(window_bytes=100_000)
    config = FluidDctcpConfig(network=network, var_window=var_window, first_window=False)
    fluid = config.build(topo, routing)
    fluid.send(Flow(0, 0, 1, 10_000_000, 0.0), lambda fid, t: None)
    fluid._flush()
    port = routing.path(0, 1).links[1]  # the switch's port to host 1
    fluid._rate[:] = 2e9
    fluid._q[port] = 200_000 * 8.0
    left = fluid._left.copy()
    fluid._advance(math.inf)
    sent = float((left - fluid._left)[0] / fluid._now)
    rtt = float(fluid._rtt0[0]) + 200_000 * 8.0 / GBPS
    window_bits = fluid._win_bits
    expected = 2e9 * window_bits / (GBPS * rtt) if var_window else 2e9
    assert window_bits / rtt > 2e9 > expected or not var_window
    assert sent == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("native", [True, False])
def test_queues_drain_while_no_flow_sends(monkeypatch, native):
    """Two flows leave a queue at the port they share when their last bits are sent; a flow
    through that port long after finds it drained (the fluid steps only while flows send, so
    an idle gap has to drain the queues too) and takes its ideal FCT."""
    from m4ray.sim import fluidcc

    if not native:
        monkeypatch.setattr(fluidcc, "_LIB", [None])
    topo = star(3)
    routing = Routing(topo)
    flows = [(0, 2, 1_000_000, 0.0), (1, 2, 1_000_000, 0.0), (0, 2, 100_000, 0.01)]
    got = fcts(topo, flows, FluidDctcpConfig(network=dctcp(window_bytes=200_000)))
    assert got[2] == pytest.approx(routing.ideal_fct(100_000, routing.path(0, 2)), rel=1e-9)


def test_it_models_every_rdma_cc_refuses_tcp_and_unknown_settings():
    topo = star(2)
    with pytest.raises(InputError, match="not tcp") as err:
        FluidDctcpConfig(network=Ns3Config(transport="tcp")).build(topo, Routing(topo))
    assert err.value.field == "fluid_dctcp.network"
    for network in (dcqcn(), hpcc(), timely()):
        FluidDctcpConfig(network=network).build(topo, Routing(topo))
    for field, value in [
        ("dt_s", 0.0),
        ("cuts", "packet"),
        ("cnp", "always"),
        ("mark_delay", "never"),
    ]:
        with pytest.raises(InputError) as err:
            FluidDctcpConfig(network=dctcp(), **{field: value})
        assert err.value.field == field


@pytest.mark.parametrize(
    "options",
    [
        {"cuts": "rate", "var_window": False, "ack_load": False, "first_window": False},
        {"cuts": "rate", "var_window": True, "ack_load": True, "first_window": False},
        {"cuts": "window", "var_window": False, "ack_load": True, "first_window": False},
        {"cuts": "window", "var_window": True, "ack_load": True, "first_window": True},
    ],
)
def test_the_compiled_steps_answer_as_the_numpy_reference(monkeypatch, options):
    """The C steps (_fluidcc.c) against the numpy ones, on a SimAI collective over a degraded
    rail cluster (marks, cuts, NIC sharing, ACK load, quiet jumps): every flow's finish the
    same to the bit, with numpy's exp, pow and log1p swapped for the C library's
    (:func:`libm`). numpy's own (SIMD where the CPU has it) may round a last bit apart, and
    these rings amplify it (to 13 % with the rate rule and the ACK load); an AI 0.1 % off moves
    flows by 2.6 % (window cuts) and 15 % (rate cuts). Ties are staggered in the last case only
    (the same Python before either; its extra steps double the numpy's time), here and below."""
    stagger = 1.0 if options["first_window"] else 0.0
    config = FluidDctcpConfig(network=dctcp(window_bytes=200_000), stagger=stagger, **options)
    assert_compiled_as_numpy(monkeypatch, config, scale=0.1)


def test_the_compiled_steps_without_backlog_answer_as_the_numpy_reference(monkeypatch):
    """:func:`test_the_compiled_steps_answer_as_the_numpy_reference` with ``backlog=False`` (a
    queue a delay only, as before it): the same bits in C and numpy."""
    config = FluidDctcpConfig(network=dctcp(window_bytes=200_000), backlog=False, stagger=0.0)
    assert_compiled_as_numpy(monkeypatch, config, scale=0.1)


def assert_compiled_as_numpy(monkeypatch, config: FluidDctcpConfig, scale: float) -> None:
    """SimAI's collective of the study's workload at ``scale`` over the rail cluster with 8 GPUs
    degraded at R = 4, on ``config`` in C and in numpy (:func:`libm`'s exp and pow): every
    flow's finish the same."""
    from m4ray.sim import fluidcc
    from m4ray.sim.failures import GrayFailure
    from m4ray.sim.nccl import SimAISpec
    from m4ray.sim.scenario import Scenario, simulate
    from m4ray.workload.simai import SimAIWorkloadSpec

    if fluidcc.library() is None:
        pytest.skip("no C compiler here: only the numpy steps run")
    scenario = Scenario(
        failure=GrayFailure(n_degraded=8, reduction=4),
        workload=SimAIWorkloadSpec(path="microAllReduce_tp16", scale=scale),
        collective=SimAISpec(),
        backend="fluid_dctcp",
        backend_config=config,
    )
    compiled = simulate(scenario)[1].column("finish_s").to_numpy()
    monkeypatch.setattr(fluidcc, "_LIB", [None])
    libm(monkeypatch)
    reference = simulate(scenario)[1].column("finish_s").to_numpy()
    assert len(compiled) == len(reference) > 1000
    np.testing.assert_array_equal(compiled, reference)


def test_a_ring_steps_links_carry_its_neighbours_acks_as_in_ns3():
    """A ring step on an NVSwitch (no marks): each GPU's link carries its data to the next GPU
    and its ACKs to the previous one's, one 64 B ACK per 1,048 B packet, at high priority.
    Real ns-3 finishes the step 1 + ACK / packet later than the wire alone says; the fluid with
    the ACK load (the default) within 1 % of it, without it as fast as max-min."""
    import numpy as np

    from m4ray.sim.topology import Cable, Topology

    gpus, size = 5, 512 * 1024
    cables = tuple(Cable(h, gpus, 400e9, 5e-8) for h in range(gpus))
    topo = Topology(n_nodes=gpus + 1, switches=(gpus,), nvswitches=(gpus,), cables=cables)
    flows = [(g, (g + 1) % gpus, size, 0.0) for g in range(gpus) for _ in range(4)]
    network = dctcp()
    packet = fcts(topo, flows, network)
    acks = fcts(topo, flows, FluidDctcpConfig(network=network))
    bare = fcts(topo, flows, FluidDctcpConfig(network=network, ack_load=False))
    fair = fcts(topo, flows, FlowSimConfig())
    assert max(acks) == pytest.approx(max(packet), rel=0.01)
    assert np.mean(acks) == pytest.approx(np.mean(packet), rel=0.01)
    assert max(bare) == pytest.approx(max(fair), rel=0.002)
    assert max(bare) < 0.96 * max(packet)


def test_with_var_window_a_chunk_into_a_degraded_port_takes_what_ns3_takes():
    """A healthy 400 Gbit/s sender's 2 MiB into a degraded 100 Gbit/s receiver (the study's
    healthy-to-degraded chunk), ns-3 scaling its window with the rate (VAR_WIN, its default):
    the fluid with ``var_window`` (the default: as the network says) within 1 % of real ns-3.
    Held at the full window, four times this path's BDP, it queues more at the port and ends
    later."""
    rates = (400e9, 100e9, 400e9)  # host 2 idle: the window is the 400 Gbit/s pairs' BDP
    cables = tuple(Cable(h, 3, r, 1e-6) for h, r in enumerate(rates))
    topo = Topology(n_nodes=4, switches=(3,), cables=cables)
    flows = [(0, 1, 2 * 1024 * 1024, 0.0)]
    network = dctcp()
    assert network.rdma.var_window
    (packet,) = fcts(topo, flows, network)
    (scaled,) = fcts(topo, flows, FluidDctcpConfig(network=network, var_window=True))
    (held,) = fcts(topo, flows, FluidDctcpConfig(network=network, var_window=False))
    (default,) = fcts(topo, flows, FluidDctcpConfig(network=network))  # as the network says
    assert scaled == pytest.approx(packet, rel=0.01)
    assert default == scaled
    assert held > 1.03 * packet


def test_a_first_window_unheld_marks_what_ns3_marks_on_a_shared_uplink():
    """A rail ToR's 400 Gbit/s uplink shared by two degraded (100 Gbit/s) senders' 2 MiB to
    healthy GPUs and two healthy senders' to degraded ones, all at once (the study's first
    ring steps): ns-3's healthy senders send their first window at line rate, the uplink's
    queue passes K and its marks cut the degraded senders, which finish ~30 % past their NIC's
    time. With ``first_window`` the fluid sends a flow's first window unheld too and finishes
    the degraded senders within 6 % of ns-3 with marks back a round trip late and every hop
    seeing the senders' rates (the fluid before 2026-12-07), and up to 22 % past it with the
    defaults (marks back per hop, tandem hops); capping every window by the queues at once, it
    never marks them and gives their NIC's time, as flowSim does."""
    g = 1e9
    rates = ((0, 8, 100), (1, 8, 400), (2, 8, 100), (3, 8, 400))
    rates += ((4, 9, 400), (5, 9, 100), (6, 9, 400), (7, 9, 100))
    cables = tuple(Cable(h, s, r * g, 1e-6) for h, s, r in rates)
    cables += (Cable(8, 10, 400 * g, 1e-6), Cable(10, 9, 400 * g, 1e-6))
    topo = Topology(n_nodes=11, switches=(8, 9, 10), cables=cables)
    size = 2 * 1024 * 1024
    flows = [(0, 4, size, 0.0), (1, 5, size, 0.0), (2, 6, size, 0.0), (3, 7, size, 0.0)]
    network = dctcp()
    packet = fcts(topo, flows, network)
    before = {"var_window": True, "mark_delay": "rtt", "tandem": False}
    first = fcts(topo, flows, FluidDctcpConfig(network=network, first_window=True, **before))
    held = fcts(topo, flows, FluidDctcpConfig(network=network, first_window=False, **before))
    default = fcts(topo, flows, FluidDctcpConfig(network=network))
    fair = fcts(topo, flows, FlowSimConfig())
    degraded = [0, 2]
    assert min(packet[i] for i in degraded) > 1.2 * fair[0]
    for i in degraded:
        assert first[i] == pytest.approx(packet[i], rel=0.06)
        assert held[i] == pytest.approx(fair[i], rel=0.02)
        assert packet[i] < default[i] < 1.25 * packet[i]


def test_a_sender_runs_at_most_the_networks_max_rate_as_in_ns3():
    """With ``max_rate_bps`` (a parking lot's mid-path senders on fast access links) every
    sender's line rate is capped there, in ns-3 and in the fluid alike: a lone 1 MB flow on a
    100 Gbit/s NIC capped at 25 Gbit/s takes ns-3's time (within 1 %), about 4x its NIC's."""
    cables = (Cable(0, 2, 100e9, 1e-6), Cable(1, 2, 100e9, 1e-6))
    topo = Topology(n_nodes=3, switches=(2,), cables=cables)
    flows = [(0, 1, 1_000_000, 0.0)]
    capped = dctcp(max_rate_bps=25e9)
    (packet,) = fcts(topo, flows, capped)
    (fluid,) = fcts(topo, flows, FluidDctcpConfig(network=capped))
    (free,) = fcts(topo, flows, FluidDctcpConfig(network=dctcp()))
    assert fluid == pytest.approx(packet, rel=0.01)
    assert fluid > 3.5 * free


def jumbo_fcts(topo, flows, config) -> list[float]:
    """:func:`fcts` with 8,948 B packets (the datagen collectives' jumbo frames)."""
    from m4ray.models.wire import WireFormat

    return fcts(topo, flows, config, wire=WireFormat(mtu_bytes=8948, header_bytes=54))


def test_under_dcqcn_a_flow_cut_deep_waits_out_the_increase_timer_as_in_ns3():
    """DCQCN's pathology on a degraded port, in small: a healthy 400 Gbit/s sender's 414 KB
    into a 44 Gbit/s receiver (one switch). Its first window (245 KB) fills the port's queue
    past K_max; every ACK back carries a CNP while the queue drains, so the sender is cut every
    4 us (α = 1: halved each time) to near its minimum rate, and climbs back only at the
    increase timer (900 us). Real ns-3 takes ~900 us, twelve times flowSim's; the fluid, whose
    CNPs come with the ACKs of what is in flight, within 15 % of it. Counting the CNPs by what
    the sender sends instead (it is window-bound as soon as it is cut), it would stop at
    ~230 us."""
    cables = (Cable(0, 2, 400e9, 5e-7), Cable(1, 2, 44e9, 5e-7))
    topo = Topology(n_nodes=3, switches=(2,), cables=cables)
    network = dcqcn(window_bytes=245_266)
    flows = [(0, 1, 414_360, 0.0)]
    (packet,) = jumbo_fcts(topo, flows, network)
    options = {"first_window": True, "mark_delay": "hop", "tandem": True}
    (fluid,) = jumbo_fcts(topo, flows, FluidDctcpConfig(network=network, **options))
    (fair,) = jumbo_fcts(topo, flows, FlowSimConfig())
    assert packet > 10 * fair
    assert fluid == pytest.approx(packet, rel=0.15)


def test_tandem_hops_queue_a_burst_once_as_in_ns3():
    """Four 42 KB flows from four hosts on one ToR to four on another, through one spine: they
    share the ToR's uplink and the spine's downlink. Real ns-3 queues them once, at the uplink
    (5.5-5.9 us); a fluid whose every hop sees what the senders send queues them again at the
    downlink (8.3 us), while with ``tandem`` the downlink sees what the uplink lets through
    (within 2 % of ns-3's last)."""
    g = 1e9
    cables = tuple(Cable(h, 8, 400 * g, 5e-7) for h in range(4))
    cables += tuple(Cable(h + 4, 9, 400 * g, 5e-7) for h in range(4))
    cables += (Cable(8, 10, 400 * g, 5e-7), Cable(10, 9, 400 * g, 5e-7))
    topo = Topology(n_nodes=11, switches=(8, 9, 10), cables=cables)
    flows = [(h, h + 4, 42_584, 0.0) for h in range(4)]
    network = dctcp()
    packet = jumbo_fcts(topo, flows, network)
    tandem = jumbo_fcts(topo, flows, FluidDctcpConfig(network=network, tandem=True))
    senders = jumbo_fcts(topo, flows, FluidDctcpConfig(network=network, tandem=False))
    assert max(tandem) == pytest.approx(max(packet), rel=0.02)
    assert min(senders) > 1.3 * max(packet)


def test_a_burst_held_at_a_shared_uplink_reaches_the_degraded_port_behind_it_as_in_ns3():
    """Four 128 KiB chunks from one ToR through one spine, one of them into a GPU degraded to
    100 Gbit/s (the study's healthy-to-degraded chunk), and two more chunks into it while the
    uplink still drains (the next ring steps). Real ns-3 queues the burst at the uplink, which
    then feeds the degraded port its share until the burst is out; the later chunks wait
    behind it there (13.1 / 18.1 / 23.0 us). With ``backlog`` the fluid's uplink passes what
    each flow holds there on to its next hop, and a last bit waits out each queue in turn:
    every chunk within 2 % of ns-3. Without it (the uplink's queue a delay only), the bits
    held there never reach the degraded port and the third chunk ends ~14 % early."""
    g = 1e9
    rates = (400, 400, 400, 400, 100, 400, 400, 400)
    cables = tuple(Cable(h, 8 if h < 4 else 9, r * g, 5e-7) for h, r in enumerate(rates))
    cables += (Cable(8, 10, 400 * g, 5e-7), Cable(10, 9, 400 * g, 5e-7))
    topo = Topology(n_nodes=11, switches=(8, 9, 10), cables=cables)
    chunk = 128 * 1024
    flows = [(h, h + 4, chunk, 0.0) for h in range(4)] + [(0, 4, chunk, t) for t in (6e-6, 12e-6)]
    network = dctcp()
    packet = np.array(fcts(topo, flows, network))
    held = np.array(fcts(topo, flows, FluidDctcpConfig(network=network)))
    delay_only = np.array(fcts(topo, flows, FluidDctcpConfig(network=network, backlog=False)))
    np.testing.assert_allclose(held, packet, rtol=0.02)
    assert delay_only[-1] < 0.9 * packet[-1]


def test_chunks_into_a_degraded_port_are_not_sped_up_by_others_on_their_uplink_as_in_ns3():
    """Ten 128 KiB chunks 10 us apart from one GPU into a GPU degraded to 400/7 Gbit/s (the
    study's N4R7 stream), beside three more such streams from the same ToR to healthy GPUs,
    2 us apart: all share the ToR's uplink and the spine's downlink, whose queues the bursts
    fill. ns-3 ends the degraded stream at the same time with or without them (the degraded
    port is its bottleneck either way). The fluid's split at a shared hop passes others' bits
    in a flow's place; when the flow's last bit is due out (FIFO) what it still had there
    moves on ahead of it to the next hop's queue. Before 2026-12-08 those bits stayed behind
    as others', the degraded port never saw them, and the stream ended 11 % early."""
    g = 1e9
    rates = (400, 400, 400, 400, 400 / 7, 400, 400, 400)
    cables = tuple(Cable(h, 8 if h < 4 else 9, r * g, 5e-7) for h, r in enumerate(rates))
    cables += (Cable(8, 10, 400 * g, 5e-7), Cable(10, 9, 400 * g, 5e-7))
    topo = Topology(n_nodes=11, switches=(8, 9, 10), cables=cables)
    chunk, gap = 128 * 1024, 10e-6
    stream = [(0, 4, chunk, k * gap) for k in range(10)]
    others = [
        (h, h + 4, chunk, k * gap + 2e-6 * j) for j, h in enumerate((1, 2, 3)) for k in range(10)
    ]
    network, fluid = dctcp(), FluidDctcpConfig(network=dctcp())
    alone = sum(fcts(topo, stream, network))
    packet = sum(fcts(topo, stream + others, network)[:10])
    held = sum(fcts(topo, stream + others, fluid)[:10])
    assert packet == pytest.approx(alone, rel=0.005)
    assert held == pytest.approx(packet, rel=0.01)
    assert sum(fcts(topo, stream, fluid)) == pytest.approx(alone, rel=0.01)


def test_marks_come_back_sooner_from_later_hops():
    """``mark_delay="hop"``: a mark made at a path's last hop is back at the sender after the
    last hop and the ACK's return, one made at its first after the whole round trip."""
    from m4ray.sim.fluidcc import FluidDctcp

    g = 1e9
    cables = (Cable(0, 2, 400 * g, 1e-6), Cable(2, 3, 400 * g, 1e-6), Cable(1, 3, 100 * g, 1e-6))
    topo = Topology(n_nodes=4, switches=(2, 3), cables=cables)
    routing = Routing(topo)
    fluid = FluidDctcpConfig(network=dcqcn(), mark_delay="hop").build(topo, routing)
    assert isinstance(fluid, FluidDctcp)
    path = routing.path(0, 1)
    from m4ray.models.fairshare import round_trip_s

    rtt = round_trip_s(routing.wire, path.latency_s, path.inverse_bw_sum, fluid.ack_bytes)
    lags = fluid._lags_of(np.asarray(path.links), rtt)
    assert list(lags) == sorted(lags, reverse=True) and lags[0] > lags[-1] >= 1
    assert lags[0] == round(rtt / fluid.dt_s)


def test_cnp_draws_are_fixed_by_seed_flow_and_tick():
    from m4ray.sim.fluidcc import uniform, uniform_one

    ids = np.arange(10_000)
    draws = uniform(0, ids, 3)
    assert ((draws >= 0) & (draws < 1)).all() and abs(draws.mean() - 0.5) < 0.01
    np.testing.assert_array_equal(draws[::-1], uniform(0, ids[::-1], 3))  # not by position
    assert not np.array_equal(draws, uniform(1, ids, 3))
    assert not np.array_equal(draws, uniform(0, ids, 4))
    # one flow's draw in Python's integers (the stagger's) is the same number
    for seed, k in ((0, 3), (2**31 + 5, 1 << 40)):
        some = ids[::997]
        one = [uniform_one(seed, int(i), k) for i in some]
        np.testing.assert_array_equal(uniform(seed, some, k), one)


@pytest.mark.parametrize("cnp", ["sampled", "expected"])
def test_the_compiled_dcqcn_steps_answer_as_the_numpy_reference(monkeypatch, cnp):
    """DCQCN with every option (CNPs drawn or in expectation, marks back per hop, tandem hops,
    first windows, ACK load) on a degraded SimAI collective: every flow's finish the same in C
    and numpy (the same draws; the same arithmetic in the same order)."""
    options = {
        "first_window": True,
        "mark_delay": "hop",
        "tandem": True,
        "cnp": cnp,
        "stagger": 0.0,
    }
    config = FluidDctcpConfig(network=dcqcn(window_bytes=200_000), **options)
    assert_compiled_as_numpy(monkeypatch, config, scale=0.1)


def libm(monkeypatch) -> None:
    """The numpy steps with the C library's exp, pow and log1p (as ``_fluidcc.c`` calls them)
    in place of numpy's SIMD ones, which may round a last bit apart."""
    import math

    from m4ray.sim import fluidcc

    def elementwise(fn):
        vec = np.vectorize(fn, otypes=[float])
        return lambda *args: vec(*np.broadcast_arrays(*args))

    monkeypatch.setattr(fluidcc, "_exp", elementwise(math.exp))
    monkeypatch.setattr(fluidcc, "_power", elementwise(math.pow))
    monkeypatch.setattr(fluidcc, "_log1p", elementwise(math.log1p))


def test_under_hpcc_a_flow_runs_at_eta_of_its_line_and_shares_as_in_ns3():
    """HPCC aims every hop at η (0.95) of its capacity and its telemetry adds 42 B to every
    packet: a lone 1 MB flow on a 100 Gbit/s path takes ~9 % past max-min's time in real ns-3,
    two flows into one port and a degraded port likewise; the fluid (its INT bytes, its U from
    each hop's tx rate and queue a return trip old, the reference rate once a window) within
    2 % of ns-3 in each, where flowSim is 7 % short or more."""
    topo = degraded_star()
    cases = [
        [(0, 1, 1_000_000, 0.0)],
        [(0, 2, 2_000_000, 0.0), (1, 2, 2_000_000, 0.0)],
        [(0, 3, 1_000_000, 0.0)],
    ]
    for flows in cases:
        packet = max(fcts(topo, flows, hpcc()))
        fluid = max(fcts(topo, flows, FluidDctcpConfig(network=hpcc())))
        fair = max(fcts(topo, flows, FlowSimConfig()))
        assert fluid == pytest.approx(packet, rel=0.02)
        assert fair < 0.93 * packet


def test_under_hpcc_the_senders_own_nic_stamps_no_telemetry_as_in_ns3():
    """HPCC's telemetry comes from switch egresses only: flows that share their sender's
    degraded 25 Gbit/s NIC (all at once, and joining one by one) see idle switch ports, so no
    hop says the NIC is full and none is cut below its share of it. The fluid within 0.5 % of
    real ns-3 flow by flow (counting the NIC's own tx as a hop, it was 4-9 % long: each window
    cut the flows toward η of a link the NIC share already held full)."""
    topo = degraded_star()
    for flows in (
        [(3, 0, 1_000_000, 0.0), (3, 1, 1_000_000, 0.0), (3, 2, 1_000_000, 0.0)],
        [(3, 0, 1_000_000, 0.0), (3, 1, 1_000_000, 20e-6), (3, 2, 1_000_000, 40e-6)],
    ):
        packet = fcts(topo, flows, hpcc())
        fluid = fcts(topo, flows, FluidDctcpConfig(network=hpcc()))
        for got, want in zip(fluid, packet, strict=True):
            assert got == pytest.approx(want, rel=0.005)


@pytest.mark.parametrize("make", [hpcc, timely])
def test_the_compiled_hpcc_and_timely_steps_answer_as_the_numpy_reference(monkeypatch, make):
    """HPCC (its telemetry read per hop, utilisation, reference rate) and TIMELY (RTT samples
    from the queues a return trip old, their gradient, once a window) on a degraded SimAI
    collective: every flow's finish the same in C and numpy."""
    config = FluidDctcpConfig(network=make(window_bytes=200_000), stagger=0.0)
    assert_compiled_as_numpy(monkeypatch, config, 0.1)


def test_under_timely_two_flows_into_a_degraded_port_take_what_ns3_takes():
    """TIMELY with its reference thresholds (T_low 50 us) hardly cuts on a 10 us path: two
    1 MB flows into a 25 Gbit/s port take real ns-3's time within 0.5 %, the 8 B send time on
    every packet included; a late joiner too."""
    topo = degraded_star()
    for flows in (
        [(0, 3, 1_000_000, 0.0), (1, 3, 1_000_000, 0.0)],
        [(0, 2, 4_000_000, 0.0), (1, 2, 1_000_000, 50e-6)],
    ):
        packet = fcts(topo, flows, timely())
        fluid = fcts(topo, flows, FluidDctcpConfig(network=timely()))
        for got, want in zip(fluid, packet, strict=True):
            assert got == pytest.approx(want, rel=0.01)


def test_flows_posted_at_one_instant_start_up_to_a_packet_time_apart():
    """``stagger``: a flow posted at the instant another was starts a draw of up to one packet
    time (at its sender's line rate) later, by flow and ``seed``: on disjoint paths the first
    posted takes its ideal FCT, the second its ideal plus its draw, another seed draws anew;
    without stagger both take exactly their ideal (a closed loop's symmetric flows, posted as
    one, then run in lockstep)."""
    topo = star(4)
    routing = Routing(topo)
    flows = [(0, 1, 1_000_000, 0.0), (2, 3, 1_000_000, 0.0)]
    staggered = fcts(topo, flows, FluidDctcpConfig(network=dctcp()))
    reseeded = fcts(topo, flows, FluidDctcpConfig(network=dctcp(), seed=7))
    plain = fcts(topo, flows, FluidDctcpConfig(network=dctcp(), stagger=0.0))
    ideal = [routing.ideal_fct(size, routing.path(s, d)) for s, d, size, _ in flows]
    packet = routing.wire.wire_bytes(routing.wire.mtu_bytes) * 8.0 / GBPS
    assert plain == pytest.approx(ideal, rel=1e-9)
    for got in (staggered, reseeded):
        assert got[0] == pytest.approx(ideal[0], rel=1e-9)
        assert ideal[1] < got[1] <= ideal[1] + packet * (1 + 1e-9)
    assert staggered[1] != reseeded[1]


def test_marks_come_back_after_their_delay_in_time_however_events_split_the_steps(monkeypatch):
    """The marking history keeps a row per step's length of time, not per step: two senders at
    line rate into one port pass its K_min, and at their first cut (their window's end) they
    read the marks made a round trip of marks earlier, and cut as deep, whether the steps are
    0.5 us long or events split them every 50 ns. Counted in steps, the split run read marks
    made a tenth as long ago, on a deeper queue, and cut to 6.3 Gbit/s against 7.0."""
    from m4ray.sim import fluidcc

    monkeypatch.setattr(fluidcc, "_LIB", [None])  # the numpy steps, whose rates are readable
    topo = star(3)
    routing = Routing(topo)
    config = FluidDctcpConfig(network=dctcp(window_bytes=200_000), stagger=0.0)

    def first_cut(tick_s: float) -> tuple[float, float]:
        fluid = config.build(topo, routing)
        for src in range(2):
            fluid.send(Flow(src, src, 2, 2_000_000, 0.0), lambda fid, t: None)
        cuts: list[tuple[float, float]] = []

        def probe() -> None:
            if not cuts and len(fluid._rate) and fluid._rate[0] < GBPS:
                cuts.append((fluid._now, float(fluid._rate[0])))

        for k in range(1, int(30e-6 / tick_s)):
            fluid.schedule(k * tick_s, probe)
        fluid.run(until=30e-6)
        return cuts[0]

    (t_plain, plain), (t_split, split) = first_cut(0.5e-6), first_cut(50e-9)
    assert t_split == pytest.approx(t_plain, abs=1e-6)
    assert 0.5 * GBPS < split < GBPS
    assert split == pytest.approx(plain, rel=0.02)


def test_a_last_bit_waits_out_a_queue_at_what_the_reverse_acks_leave_as_in_ns3():
    """On an NVSwitch (no marks), a 128 KiB chunk into a GPU degraded to 343 Gbit/s (the
    study's 2,400 at R = 7) whose own 2 MiB runs the other way: the chunk's first window leaves
    at line rate and queues at the degraded port, which also carries the 2 MiB's ACKs (one 64 B
    per 1,048 B packet, first). Its last bit leaves when that queue drains at what the ACKs
    leave of the port: real ns-3 and the fluid within 1 %; drained at the whole port's rate, as
    the fluid once did, it ended 4.8 % early, 0.9 % after the chunk alone."""
    gpus = 2
    rates = (2400e9, 343e9)
    cables = tuple(Cable(h, gpus, rates[h], 5e-8) for h in range(gpus))
    topo = Topology(n_nodes=gpus + 1, switches=(gpus,), nvswitches=(gpus,), cables=cables)
    flows = [(1, 0, 2 * 1024 * 1024, 0.0), (0, 1, 128 * 1024, 5e-6)]
    network = dctcp()
    _, packet = fcts(topo, flows, network)
    _, fluid = fcts(topo, flows, FluidDctcpConfig(network=network))
    alone = fcts(topo, flows[1:], FluidDctcpConfig(network=network))
    assert fluid == pytest.approx(packet, rel=0.01)
    assert fluid > 1.04 * alone[0]  # the ACKs' share: 64 / 1,048 of the port
