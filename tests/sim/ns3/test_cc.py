"""The RDMA transport's congestion controls (DCQCN, HPCC, TIMELY beside DCTCP) on real ns-3, in Ray
worker processes: a lone flow runs at its ideal, two flows share a receiver, an incast with PFC
loses nothing, HPCC holds the queue below DCTCP's, and bad settings name their field."""

from __future__ import annotations

import pytest

from m4ray.errors import InputError
from m4ray.sim.flows import Flow
from m4ray.sim.ns3.backend import Ns3Config
from m4ray.sim.ns3.cc import HpccParams, TimelyParams
from m4ray.sim.ns3.transports import PARAMS13, RdmaConfig
from m4ray.sim.routing import Routing, WireFormat

from .test_rdma import DEFAULT, JUMBO, _simulate, chain, nvswitch_star, per_link, star

CCS = ["dctcp", "dcqcn", "hpcc", "timely"]


@pytest.fixture(scope="module")
def simulate(ray_local):
    remote = ray_local.remote(_simulate)
    return lambda *args: ray_local.get(remote.remote(*args))


def _rdma(cc: str, **settings) -> Ns3Config:
    return Ns3Config(rdma=RdmaConfig(cc=cc, **settings))


@pytest.mark.parametrize("cc", CCS)
def test_a_lone_flow_runs_at_its_ideal(simulate, cc):
    """Five hops at 10 Gbit/s: 1 KB, 64 KB and 10 MB alone within 1 % of the ideal FCT of the
    CC's wire format (HPCC's 42 B of telemetry and TIMELY's 8 B timestamp counted as header).
    HPCC settles at η (+ AI) of the line by design: its 10 MB flow is held to that ideal at
    η · line rate, and its 64 KB flow (which leaves line rate within its first RTT) is
    between the two."""
    extra = {"hpcc": HpccParams().int_bytes, "timely": TimelyParams().int_bytes}.get(cc, 0)
    wire = WireFormat(header_bytes=DEFAULT.header_bytes + extra)
    cfg = _rdma(cc, cc_params={"int_bytes": 0} if extra else None)
    flows = [Flow(i, 0, 1, size, i * 20e-3) for i, size in enumerate((1000, 64_000, 10_000_000))]
    result, counters = simulate(chain(10e9), flows, wire, cfg)
    hp = HpccParams()
    settled = 1 / (hp.target_utilization + hp.rate_ai_bps / 10e9)
    for flow in flows:
        finish, ideal = result[flow.id]
        slowdown = (finish - flow.start_s) / ideal
        if cc == "hpcc" and flow.size_bytes == 64_000:
            assert 1.0 < slowdown < settled
        else:
            big = cc == "hpcc" and flow.size_bytes > 1e6
            assert slowdown == pytest.approx(settled if big else 1.0, rel=0.01), flow
    assert counters["drops"] == counters["timeouts"] == counters["pauses"] == 0


@pytest.mark.parametrize("cc", CCS)
def test_two_flows_into_one_receiver_share_it(simulate, cc):
    """Two 10 MB flows from t = 0 into one 10 Gbit/s receiver: each ends within ±10 % of twice
    its time alone (the same CC, the same wire)."""
    flows = [Flow(i, i, 2, 10_000_000, 0.0) for i in range(2)]
    alone, _ = simulate(star(3, 10e9), flows[:1], DEFAULT, _rdma(cc))
    both, _ = simulate(star(3, 10e9), flows, DEFAULT, _rdma(cc))
    single = alone[0][0]
    for finish, _ in both.values():
        assert finish / single == pytest.approx(2.0, rel=0.1)


@pytest.mark.parametrize("cc", CCS)
def test_an_incast_with_pfc_loses_nothing(simulate, cc):
    """8:1 incast at 100 Gbit/s with no window (HPCC: its window) and a small PFC threshold:
    every byte arrives, nothing is dropped, retransmitted or timed out."""
    window = None if cc == "hpcc" else 0
    params = None
    if cc == "dcqcn":  # RED below the buffer
        params = {"k_min_bytes": [[100e9, 20_000]], "k_max_bytes": [[100e9, 80_000]]}
    cfg = _rdma(
        cc,
        window_bytes=window,
        buffer_bytes=1_000_000,
        pfc_threshold_bytes=40_000,
        cc_params=params,
    )
    flows = [Flow(i, i, 8, 2_000_000, 0.0) for i in range(8)]
    result, counters = simulate(star(9, 100e9), flows, JUMBO, cfg)
    assert all(finish is not None for finish, _ in result.values())
    assert counters["drops"] == counters["timeouts"] == 0
    assert counters["retransmits"] == counters["nacks"] == 0
    assert max(finish / ideal for finish, ideal in result.values()) >= 8 * 0.98


def test_a_dynamic_pfc_threshold_keeps_lossless_what_the_same_fixed_share_drops(simulate):
    """PFC on a share of the free buffer (the reference's rule, ``pfc_dynamic_shift``): a fixed
    eighth of a 1 MB buffer per ingress port lets the eight ports of a windowless 8:1 incast
    overfill it (drops); an eighth of what is still free falls as the buffer fills, and the
    same incast stays lossless."""
    flows = [Flow(i, i, 8, 2_000_000, 0.0) for i in range(8)]
    counters = {}
    for shift in (0, 3):
        cfg = _rdma(
            "dctcp",
            window_bytes=0,
            buffer_bytes=1_000_000,
            pfc_threshold_bytes=125_000,
            pfc_dynamic_shift=shift,
        )
        result, counters[shift] = simulate(star(9, 100e9), flows, JUMBO, cfg)
        assert all(finish is not None for finish, _ in result.values())
    assert counters[0]["drops"] > 0
    assert counters[3]["drops"] == counters[3]["timeouts"] == 0 and counters[3]["pauses"] > 0


@pytest.mark.parametrize("cc", CCS)
def test_an_nvswitch_marks_pauses_and_drops_nothing_under_any_cc(simulate, cc):
    """The windowless incast through an NVSwitch (SimAI's intra-server switch): whatever the CC,
    no ECN mark (DCQCN's RED included), no PAUSE, no drop, and every byte arrives."""
    window = None if cc == "hpcc" else 0
    cfg = _rdma(cc, window_bytes=window, buffer_bytes=1_000_000, pfc_threshold_bytes=40_000)
    flows = [Flow(i, i, 8, 2_000_000, 0.0) for i in range(8)]
    result, counters = simulate(nvswitch_star(9, 100e9), flows, JUMBO, cfg)
    assert all(finish is not None for finish, _ in result.values())
    assert counters["marks"] == counters["pauses"] == counters["drops"] == 0


def test_hpcc_holds_the_incast_queue_well_below_dctcps(simulate):
    """The same 8:1 incast at 100 Gbit/s, every flow with the default window. Both see the first
    round trip's burst (eight windows at once: ~576 KB at the receiver's port, before any
    feedback); after it DCTCP holds the queue near its K while HPCC's telemetry drains it. The
    mean queue a data packet finds there, measured: DCTCP 103 KB, HPCC 17 KB; asserted: HPCC's
    below a quarter of DCTCP's."""
    flows = [Flow(i, i, 8, 2_000_000, 0.0) for i in range(8)]
    queue = {}
    for cc in ("dctcp", "hpcc"):
        _, counters = simulate(star(9, 100e9), flows, JUMBO, _rdma(cc))
        queue[cc] = counters["mean_queue_bytes"]
    assert 0 < queue["hpcc"] < 0.25 * queue["dctcp"], queue


def test_dctcp_with_red_marks_less_and_queues_more_than_its_step_at_k_min(simulate):
    """DCTCP under the reference's RED (``ecn_k_max_bytes``, ``ecn_p_max``: what SimAI's
    study configures) on the 8:1 incast with the default window: the step at K = 20 KB marks
    every packet that leaves more queued; RED from K_min = 20 KB to K_max = 2 MB at p_max 0.05
    marks a few, so the queue a packet finds there runs deeper."""
    flows = [Flow(i, i, 8, 2_000_000, 0.0) for i in range(8)]
    counters = {}
    for name, red in (("step", {}), ("red", {"ecn_k_max_bytes": [[100e9, 2e6]]})):
        cfg = _rdma("dctcp", ecn_k_bytes=[[100e9, 20_000]], ecn_p_max=0.05, **red)
        result, counters[name] = simulate(star(9, 100e9), flows, JUMBO, cfg)
        assert all(finish is not None for finish, _ in result.values())
    assert 0 < counters["red"]["marks"] < 0.5 * counters["step"]["marks"], counters
    assert counters["red"]["mean_queue_bytes"] > 1.5 * counters["step"]["mean_queue_bytes"]


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"cc": "bbr"}, "ns3.rdma.cc"),
        ({"cc": "dcqcn", "ecn_k_max_bytes": [[1e9, 1e5]]}, "ns3.rdma.ecn_k_max_bytes"),
        ({"ecn_k_max_bytes": [[1e9, -1]]}, "ns3.rdma.ecn_k_max_bytes"),
        ({"ecn_p_max": 0}, "ns3.rdma.ecn_p_max"),
        ({"cc": "hpcc", "cc_params": {"k_min_bytes": 1}}, "ns3.rdma.cc_params.k_min_bytes"),
        ({"cc": "dctcp", "cc_params": {"eta": 0.9}}, "ns3.rdma.cc_params.eta"),
        ({"cc": "hpcc", "cc_params": {"target_utilization": 1.5}}, None),
        ({"cc": "timely", "cc_params": {"t_low_s": 1e-3}}, "ns3.rdma.cc_params.t_low_s"),
        ({"cc": "dcqcn", "cc_params": {"p_max": 0}}, "ns3.rdma.cc_params.p_max"),
        ({"cc": "hpcc", "window_bytes": 0}, "ns3.rdma.cc"),
    ],
)
def test_a_cc_refuses_a_parameter_it_lacks_or_an_impossible_value(settings, field):
    with pytest.raises(InputError) as err:
        RdmaConfig(**settings)
    expected = field or f"ns3.rdma.cc_params.{next(iter(settings['cc_params']))}"
    assert err.value.field == expected


def test_red_thresholds_above_the_buffer_are_refused_at_the_link_they_hit(simulate):
    """DCQCN's K_max per link rate is checked where the rates are known: building the fabric."""
    cfg = _rdma("dcqcn", cc_params={"k_max_bytes": [[10e9, 9e6]]})
    with pytest.raises(InputError) as err:
        simulate(star(3, 10e9), [Flow(0, 0, 2, 1000, 0.0)], DEFAULT, cfg)
    assert err.value.field == "ns3.rdma.cc_params.k_max_bytes"


@pytest.mark.parametrize("cc", CCS)
def test_the_network_vector_names_the_cc_and_its_parameters(cc):
    """m4's params13: the CC's one-hot and only its own parameters."""
    routing = Routing(chain(10e9), wire=WireFormat())
    vec = dict(zip(PARAMS13, RdmaConfig(cc=cc).params13(routing), strict=True))
    assert [vec[name] for name in CCS] == [float(name == cc) for name in CCS]
    own = {
        "dctcp": {"dctcp_k"},
        "dcqcn": {"dcqcn_k_min", "dcqcn_k_max"},
        "hpcc": {"hpcc_u_tgt", "hpcc_ai"},
        "timely": {"timely_t_low", "timely_t_high"},
    }
    for name in set().union(*own.values()):
        assert (vec[name] != 0) == (name in own[cc]), name
    if cc == "hpcc":
        assert vec["hpcc_u_tgt"] == pytest.approx(95) and vec["hpcc_ai"] == pytest.approx(5)


def _record_rail_scenario(seed: int, index: int) -> dict:
    from hydra import compose, initialize_config_dir

    from m4ray.config import CONF_DIR, register_configs
    from m4ray.sweeps.__main__ import resolve

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("sweep", overrides=["+experiment=datagen_cc"])
    family = resolve(cfg).datagen.families["rail"]
    scenario = family.sample("rail", index, seed, 120.0)
    return {"cc": scenario.ns3.rdma.cc, "flows": scenario.record()["flows"].num_rows}


def test_a_go_back_overtaken_by_late_acks_does_not_stall_a_flow(ray_local):
    """Data cc's rail scenario #76 (TIMELY, SimAI's collectives, four GPUs at 1/10, a 9.4 MB
    buffer that PFC at an eighth per port cannot keep from overflowing): go-back-N after drops,
    then a timeout rewinding the sender while ACKs of the earlier round are still on their way
    back left four flows sending below their acknowledged byte, stalled for good (the window
    arithmetic wrapped), until the wall-clock guard stopped the run. It completes."""
    remote = ray_local.remote(_record_rail_scenario)
    row = ray_local.get(remote.remote(2465215527, 76))
    assert row == {"cc": "timely", "flows": 16864}


def test_each_port_counts_the_packets_it_marked(ray_local):
    """``marked_packets``: the 8:1 incast marks at the receiver's switch port only, and the
    per-port counts add up to the run's marks."""
    flows = [Flow(i, i, 8, 2_000_000, 0.0) for i in range(8)]
    _, marked, total, (path,) = ray_local.get(
        ray_local.remote(per_link).remote(star(9, 100e9), flows, JUMBO, _rdma("dctcp"), [(0, 8)])
    )
    assert total > 0 and marked.sum() == total == marked[path[-1]]  # the port to the receiver
