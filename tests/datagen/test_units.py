"""Training-data pieces without ns-3: the fabric, traffic, busy periods, sampling, config checks."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest

from m4ray.datagen.families import CollectiveFamily, NetworkRanges, OpenLoopFamily
from m4ray.datagen.job import DatagenConfig, expand, family_seeds
from m4ray.datagen.periods import ack_coupled, busy_periods
from m4ray.datagen.traffic import OpenLoopTraffic, SizeDistribution
from m4ray.errors import InputError
from m4ray.fingerprint import canonical, fingerprint
from m4ray.sim.routing import Routing
from m4ray.sim.topologies import m4_fabric
from m4ray.sweeps.grid import child_seeds

WEBSEARCH = [[0, 0], [10000, 0.15], [20000, 0.2], [50000, 0.4], [1000000, 0.7], [30000000, 1.0]]


def test_m4_fabric_matches_the_reference():
    topo = m4_fabric()
    assert topo.n_nodes == 46 and len(topo.hosts) == 32 and topo.n_links == 96
    assert set(topo.bandwidth_bps) == {10e9}
    routing = Routing(topo)
    assert len(routing.path(0, 3).links) == 2  # same rack
    assert len(routing.path(0, 15).links) == 4  # same pod (ToRs 32-35 under aggregation 40)
    assert len(routing.path(0, 16).links) == 6  # across pods, through a core
    tors = {topo.link_dst[routing.path(h, (h + 16) % 32).links[0]] for h in range(32)}
    assert tors == set(range(32, 40))


@pytest.mark.parametrize(
    ("kind", "extra", "tol"),
    [
        ("exponential", {}, 0.05),
        ("lognormal", {"sigma": 1.0}, 0.05),
        ("pareto", {"alpha": 2.5}, 0.1),
        ("gaussian", {"cv": 0.3}, 0.02),
        ("empirical", {"cdf": WEBSEARCH}, 0.05),
    ],
)
def test_size_distributions_hit_the_requested_mean(kind, extra, tol):
    dist = SizeDistribution(kind=kind, **extra)
    sizes = dist.sample(np.random.default_rng(1), 20_000.0, 200_000, 50)
    assert sizes.dtype == np.int64 and sizes.min() >= 50
    assert sizes.mean() == pytest.approx(20_000.0, rel=tol)


def test_open_loop_arrivals_load_the_busiest_link_as_asked():
    routing = Routing(m4_fabric())
    traffic = OpenLoopTraffic(
        n_flows=20_000,
        size_name="exponential",
        size=SizeDistribution(kind="exponential"),
        size_mean_bytes=10_000,
        sigma=1.0,
        max_load=0.5,
    )
    flows = traffic.flows(routing, seed=3)
    assert [f.id for f in flows] == list(range(20_000))
    assert all(f.src != f.dst for f in flows)
    assert all(b.start_s >= a.start_s for a, b in pairwise(flows))
    bits = np.zeros(routing.topo.n_links)
    for f in flows:
        bits[list(routing.path(f.src, f.dst, f.id).links)] += (
            routing.wire.wire_bytes(f.size_bytes) * 8
        )
    span = flows[-1].start_s - flows[0].start_s
    busiest = (bits / span / routing.topo.bandwidth_bps).max()
    assert busiest == pytest.approx(0.5, rel=0.1)
    assert traffic.flows(routing, seed=3) == flows  # deterministic in the seed


def _periods(events, links):
    flows = np.array([f for f, _ in events])
    kinds = np.array([k for _, k in events])
    return busy_periods(flows, kinds, links)


def test_busy_periods_are_connected_components_in_time():
    links = [(0, 1), (1, 2), (5,), (2, 3), (0,)]
    # f0 and f1 share link 1 while both active; f3 shares link 2 with f1 (joins the period);
    # f2 is alone on link 5; f4 arrives on link 0 after the first period ended: a new period
    events = [(0, 0), (1, 0), (2, 0), (0, 1), (3, 0), (2, 1), (1, 1), (3, 1), (4, 0), (4, 1)]
    p = _periods(events, links)
    assert p.period_of_flow.tolist() == [0, 0, 1, 0, 2]
    assert p.n_flows.tolist() == [3, 1, 1]
    assert p.max_active.tolist() == [2, 1, 1]
    assert p.first_event.tolist() == [0, 2, 8] and p.last_event.tolist() == [7, 5, 9]


def test_busy_periods_merge_on_arrival_and_never_split():
    links = [(0,), (1,), (0, 1)]
    # f0 on link 0 and f1 on link 1 are separate until f2 touches both: one period of three
    events = [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)]
    p = _periods(events, links)
    assert p.period_of_flow.tolist() == [0, 0, 0] and p.n_flows.tolist() == [3]


def test_ack_coupled_periods_join_flows_on_each_others_reverse_links():
    # a ring step on a switch: 0 -> 1 on links (0, 2), 1 -> 2 on (3, 4); link 3 is link 2's
    # reverse (the cable sw-1 the other way), where flow 0's ACKs meet flow 1's data
    links = [(0, 2), (3, 4), (7, 9)]
    events = [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)]
    assert _periods(events, links).period_of_flow.tolist() == [0, 1, 2]
    assert ack_coupled(links) == [(0, 2, 1, 3), (3, 4, 2, 5), (7, 9, 6, 8)]
    assert _periods(events, ack_coupled(links)).period_of_flow.tolist() == [0, 0, 1]


def test_random_busy_periods_partition_the_flows():
    rng = np.random.default_rng(0)
    n = 300
    start = np.sort(rng.uniform(0, 1, n))
    end = start + rng.exponential(0.01, n)
    links = [tuple(rng.choice(20, 3, replace=False).tolist()) for _ in range(n)]
    order = sorted([(start[i], 0, i) for i in range(n)] + [(end[i], 1, i) for i in range(n)])
    p = _periods([(i, k) for _, k, i in order], links)
    assert sorted(np.bincount(p.period_of_flow).tolist()) == sorted(p.n_flows.tolist())
    assert p.n_flows.sum() == n
    for period in range(len(p.n_flows)):  # no flow of another period overlaps on a shared link
        inside = np.flatnonzero(p.period_of_flow == period)
        lo, hi = start[inside].min(), end[inside].max()
        used = {link for i in inside for link in links[i]}
        for j in np.flatnonzero(p.period_of_flow != period):
            if start[j] < hi and end[j] > lo and used & set(links[j]):
                assert not any(
                    start[i] < end[j] and start[j] < end[i] and set(links[i]) & set(links[j])
                    for i in inside
                )


def test_sampling_is_seeded_and_records_params13():
    family = OpenLoopFamily(
        sizes={"exponential": {}, "websearch": {"kind": "empirical", "cdf": WEBSEARCH}}
    )
    a, b = family.sample("fabric", 0, 7, 60.0), family.sample("fabric", 0, 7, 60.0)
    assert a == b and a.scenario_id == b.scenario_id
    assert family.sample("fabric", 0, 8, 60.0).scenario_id != a.scenario_id
    assert family.sample("fabric", 0, 7, 1.0).scenario_id == a.scenario_id  # guard is not content
    p = a.params13()
    assert len(p) == 13 and p[2] == 1.0 and p[3:6] == [0, 0, 0] and p[7:] == [0] * 6
    assert 100 <= p[0] <= 400 and 5 <= p[1] <= 15 and 10 <= p[6] <= 30  # 10 KB, KB, KB
    rdma = a.ns3.rdma
    assert a.ns3.transport == "rdma" and rdma.ecn_k_bytes[0][1] < rdma.pfc_threshold_bytes
    assert p[1] == rdma.window_bytes / 1000 and p[0] == rdma.buffer_bytes / 10_000


def test_collective_family_draws_random_degraded_gpus_and_valid_groups():
    family = CollectiveFamily(layouts=["all", "rails", "servers", "random", "server_pairs"])
    for seed in range(30):
        sc = family.sample("rail", seed, seed, 60.0)
        assert len(set(sc.degraded)) == len(sc.degraded) <= 16
        assert (sc.reduction == 1) == (not sc.degraded)
        workload = sc.traffic.workload(32)  # validates the DAG
        assert len(workload.nodes) == sum(len(g) for p in sc.traffic.phases for g in p.groups)
        for phase in sc.traffic.phases:
            for group in phase.groups:
                per_server = np.bincount(np.array(group) // 8)
                assert len(set(per_server[per_server > 0])) == 1  # hierarchical-friendly


def test_server_aligned_failures_follow_the_sweeps_rule_on_servers_in_random_order():
    """failure_layouts [servers]: the degraded GPUs are the gray-failure sweep's set
    (gray_failure_gpus: half of N on each of two servers up to 8, then a whole server and the
    rest on a third) with the servers drawn in random order; one layout draws nothing more, so
    the default family's scenarios and ids are those it had before the field."""
    from m4ray.sim.failures import gray_failure_gpus

    aligned = CollectiveFamily(failure_layouts=["servers"], degraded_gpus=[1, 16])
    seen = set()
    for seed in range(40):
        sc = aligned.sample("rail_servers", seed, seed, 60.0)
        n = len(sc.degraded)
        per_server = np.bincount(np.array(sc.degraded) // 8, minlength=4)
        servers_hit = np.flatnonzero(per_server)
        rule = np.bincount(np.array(gray_failure_gpus(n, 8, 4)) // 8, minlength=4)
        assert sorted(per_server) == sorted(rule)  # the rule's shape, on some servers
        for s in servers_hit:  # each server's first GPUs, as the rule takes them
            local = sorted(h % 8 for h in sc.degraded if h // 8 == s)
            assert local == list(range(len(local)))
        seen.add(tuple(servers_hit))
    assert len(seen) > 4  # servers in random order, not always 0 and 1
    from m4ray.datagen.sampling import integer

    plain = CollectiveFamily()
    hosts = plain.topology.build().hosts
    for seed in range(5):  # the draws before the field: the GPU count, then the GPUs
        rng = np.random.default_rng(seed)
        n = min(integer(rng, plain.degraded_gpus), len(hosts))
        before = tuple(sorted(int(h) for h in rng.choice(hosts, n, replace=False)))
        assert plain.sample("rail", seed, seed, 60.0).degraded == before
    with pytest.raises(InputError, match="failure layout"):
        CollectiveFamily(failure_layouts=["racks"])


def test_dataset_seeds_never_meet_the_evaluation_sweep():
    cfg = DatagenConfig(
        scenarios=400,
        families={"a": OpenLoopFamily(), "b": CollectiveFamily()},
        weights={"a": 1, "b": 1},
    )
    scenarios = expand(cfg, root_seed=0)
    seeds = {s.seed for s in scenarios}
    assert len(seeds) == 400
    for root in (0, 1, 2):  # the evaluation sweep's replicate seeds for a few root seeds
        assert not seeds & set(child_seeds(root, 1000))
    # more scenarios extend the same dataset: seeds are stable prefixes
    assert family_seeds(0, "a", 5) == family_seeds(0, "a", 50)[:5]
    assert family_seeds(0, "a", 5) != family_seeds(0, "b", 5)


def test_weights_split_the_scenarios():
    fams = {"a": OpenLoopFamily(), "b": OpenLoopFamily(), "c": OpenLoopFamily()}
    cfg = DatagenConfig(scenarios=10, families=fams, weights={"a": 0.5, "b": 0.3, "c": 0.2})
    assert cfg.counts() == {"a": 5, "b": 3, "c": 2}
    cfg = DatagenConfig(scenarios=7, families=fams, weights={"a": 1, "b": 1, "c": 0})
    assert cfg.counts() == {"a": 4, "b": 3, "c": 0}


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: OpenLoopFamily(max_load=[0.3, 1.2]), "max_load"),
        (lambda: OpenLoopFamily(max_load=[0.0, 0.5]), "max_load"),
        (lambda: OpenLoopFamily(sizes={"zipf": {}}), None),
        (lambda: OpenLoopFamily(sizes={"p": {"kind": "pareto", "alpha": 0.9}}), "alpha"),
        (lambda: OpenLoopFamily(n_flows=[10, 5]), "n_flows"),
        (
            lambda: OpenLoopFamily(sizes={"e": {"kind": "empirical", "cdf": [[0, 0], [5, 0.5]]}}),
            "cdf",
        ),
        (lambda: NetworkRanges(ecn_k_kb=[10, 200]), "network.ecn_k_kb"),
        (lambda: NetworkRanges(window_kb=[0, 10]), "network.window_kb"),
        (lambda: CollectiveFamily(kinds=["gather"]), None),
        (
            lambda: DatagenConfig(families={"a": OpenLoopFamily()}, weights={"b": 1.0}),
            "datagen.weights",
        ),
    ],
)
def test_bad_ranges_are_rejected_with_the_field(make, field):
    with pytest.raises(InputError) as err:
        make()
    if field:
        assert err.value.field == field
    else:
        assert "valid choices" in str(err.value)


def test_a_failing_scenario_is_recorded_and_writes_no_partitions(tmp_path):
    import copy
    import dataclasses
    import json

    from m4ray.datagen.job import load_done, run_scenario

    scenario = OpenLoopFamily().sample("fabric", 0, 5, 60.0)
    ns3 = copy.deepcopy(scenario.ns3)
    ns3.rdma.pfc_threshold_bytes = 2 * ns3.rdma.buffer_bytes  # (validated again by the backend)
    broken = dataclasses.replace(scenario, ns3=ns3)
    row = run_scenario(broken, str(tmp_path))  # fails before ns-3 is even loaded
    assert row["status"] == "failed" and "pfc_threshold_bytes" in row["error"]
    stored = json.loads((tmp_path / "runs" / f"{broken.run_id}.json").read_text())
    assert stored["status"] == "failed" and stored["params13"] == broken.params13()
    assert not (tmp_path / "dataset").exists()
    assert load_done(tmp_path, broken) is None  # retried on the next run


def test_incast_rounds_send_k_flows_to_one_receiver():
    from m4ray.datagen.families import IncastFamily
    from m4ray.sim.routing import Routing

    family = IncastFamily(k=[4, 4], rounds=[3, 3], size_bytes=[50_000, 50_000])
    scenario = family.sample("incast", 0, 11, 60.0)
    assert scenario == family.sample("incast", 0, 11, 60.0)  # seeded
    traffic = scenario.traffic
    flows = traffic.flows(Routing(scenario.build_topology()), scenario.seed)
    assert len(flows) == 12 and {f.size_bytes for f in flows} == {50_000}
    by_round: dict[int, list] = {}
    for f in flows:
        by_round.setdefault(round(f.start_s / traffic.gap_s), []).append(f)
    assert sorted(by_round) == [0, 1, 2]
    for group in by_round.values():
        assert len(group) == 4 and len({f.dst for f in group}) == 1  # 4 senders, one receiver
        assert len({f.src for f in group}) == 4 and group[0].dst not in {f.src for f in group}
    params = scenario.params()
    assert params["traffic"] == "incast" and params["incast_k"] == 4


def test_an_incast_wider_than_the_topology_is_refused():
    from m4ray.datagen.traffic import IncastTraffic
    from m4ray.sim.routing import Routing
    from m4ray.sim.topologies import M4FabricSpec

    routing = Routing(M4FabricSpec().build())
    with pytest.raises(InputError, match="needs 33 hosts"):
        IncastTraffic(rounds=1, k=32, size_bytes=1000, gap_s=1e-6).flows(routing, 0)


def test_an_incast_family_wider_than_its_topology_fails_before_any_task():
    from m4ray.datagen.families import IncastFamily

    with pytest.raises(InputError, match=r"32:1 incast needs 33 hosts, the topology has 32"):
        IncastFamily(k=[2, 32])
    assert IncastFamily().k == [2, 31]  # the default fits m4's 32-host fabric


def test_networks_draw_every_listed_congestion_control_with_its_own_parameters():
    """``network.cc.ccs`` lists the CCs drawn; each scenario's RDMA config carries its CC and
    parameters from their ranges (a one-CC list draws nothing, so DCTCP data keep their ids)."""
    ranges = NetworkRanges(cc={"ccs": ["dctcp", "dcqcn", "hpcc", "timely"]})
    seen = {}
    for seed in range(40):
        rdma = ranges.sample(np.random.default_rng(seed), 60.0).rdma
        seen.setdefault(rdma.cc, rdma)
    assert set(seen) == {"dctcp", "dcqcn", "hpcc", "timely"}
    assert seen["dctcp"].cc_params is None
    hpcc = seen["hpcc"].cc_config()
    assert 0.70 <= hpcc.target_utilization <= 0.95 and 50e6 <= hpcc.rate_ai_bps <= 100e6
    timely = seen["timely"].cc_config()
    assert 40e-6 <= timely.t_low_s <= 60e-6 and 100e-6 <= timely.t_high_s <= 150e-6
    kmin, kmax = seen["dcqcn"].cc_config().red(25e9)
    assert 10_000 <= kmin <= 30_000 and 30_000 <= kmax <= 50_000
    one = NetworkRanges()
    assert [one.sample(np.random.default_rng(s), 60.0).rdma for s in range(3)] == [
        NetworkRanges(cc={"ccs": ["dctcp"]}).sample(np.random.default_rng(s), 60.0).rdma
        for s in range(3)
    ]
    with pytest.raises(InputError) as err:
        NetworkRanges(cc={"ccs": ["reno"]})
    assert err.value.field == "network.cc.ccs"


def test_a_red_share_draws_the_study_marking_and_none_keeps_every_draw_and_id():
    """``network.red_share``: that share of DCTCP scenarios mark with the SimAI study's RED
    (K_min per Gbit/s drawn, K_max = 4 K_min, P_max 0.2); at 0 the draws, the configs and the
    family's fingerprint are what they were before the option existed."""
    red = NetworkRanges(red_share=1.0, red_kb_per_gbps=[1.0, 1.0])
    rdma = red.sample(np.random.default_rng(0), 60.0).rdma
    assert rdma.red_marking(40e9) == (40_000, 160_000, 0.2, "ecn_k_max_bytes")
    assert rdma.red_marking(400e9)[:2] == (400_000, 1_600_000)
    shares = [
        NetworkRanges(red_share=0.5).sample(np.random.default_rng(s), 60.0).rdma.ecn_k_max_bytes
        for s in range(40)
    ]
    assert 5 < sum(k is not None for k in shares) < 35
    for seed in range(3):
        a, b = np.random.default_rng(seed), np.random.default_rng(seed)
        assert NetworkRanges().sample(a, 60.0) == NetworkRanges(red_share=0.0).sample(b, 60.0)
        assert a.random() == b.random()  # nothing more drawn
    assert {"red_share", "red_kb_per_gbps"}.isdisjoint(canonical(NetworkRanges(red_share=0.0)))
    assert fingerprint(NetworkRanges()) != fingerprint(red)
    bad_values = [
        ({"red_share": 1.5}, "red_share"),
        ({"red_kb_per_gbps": [0, 1]}, "red_kb_per_gbps"),
    ]
    for bad, name in bad_values:
        with pytest.raises(InputError) as err:
            NetworkRanges(**bad)
        assert err.value.field == f"network.{name}"
