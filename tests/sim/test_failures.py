from __future__ import annotations

import pytest

from m4ray.errors import InputError
from m4ray.sim.failures import (
    GrayFailure,
    degrade,
    gray_failure_gpus,
    switch_tiers,
    uplink_cables,
)
from m4ray.sim.templates import ClusterTemplateSpec
from m4ray.sim.topologies import FatTreeSpec, rail_cluster

EXPECTED = {  # reference/gray_failure.md §2.1
    2: [0, 8],
    3: [0, 1, 8],
    4: [0, 1, 8, 9],
    5: [0, 1, 2, 8, 9],
    6: [0, 1, 2, 8, 9, 10],
    7: [0, 1, 2, 3, 8, 9, 10],
    8: [0, 1, 2, 3, 8, 9, 10, 11],
    9: [*range(8), 16],
    10: [*range(8), 16, 17],
    16: [*range(8), *range(16, 24)],
}


@pytest.mark.parametrize(("n", "gpus"), sorted(EXPECTED.items()))
def test_degraded_gpu_sets(n, gpus):
    assert list(gray_failure_gpus(n)) == gpus


def test_every_n_has_n_distinct_gpus():
    for n in range(2, 17):
        assert len(set(gray_failure_gpus(n))) == n


@pytest.mark.parametrize(
    ("r", "nvlink_gbps", "nic_gbps"), [(4, 600, 100), (5, 480, 80), (7, 342, 57), (10, 240, 40)]
)
def test_degrade_rates_and_link_counts(r, nvlink_gbps, nic_gbps):
    base = rail_cluster()
    topo = GrayFailure(n_degraded=8, reduction=r).apply(base)
    changed = [(a, b) for a, b in zip(base.cables, topo.cables, strict=True) if a != b]
    assert len(changed) == 16  # NVSwitch + rail link of each of the 8 GPUs
    gpus = set(gray_failure_gpus(8))
    for old, new in changed:
        assert old.a in gpus
        expected = nvlink_gbps if new.b in topo.nvswitches else nic_gbps
        assert new.bandwidth_bps == expected * 1e9
        assert new.latency_s == old.latency_s
    assert all(c.bandwidth_bps == 400e9 for c in topo.cables if 44 in (c.a, c.b))


def test_degrade_changes_both_directions():
    topo = degrade(rail_cluster(), [0], 4)
    bw = topo.bandwidth_bps
    link = next(i for i in range(topo.n_links) if topo.link_src[i] == 0 and topo.link_dst[i] == 36)
    assert bw[link] == bw[link ^ 1] == 100e9


def test_bad_failure_specs():
    with pytest.raises(InputError, match="n_degraded"):
        gray_failure_gpus(17)
    with pytest.raises(InputError, match="reduction"):
        degrade(rail_cluster(), [0], 0)
    with pytest.raises(InputError, match="not hosts"):
        degrade(rail_cluster(), [40], 4)


def test_zero_degraded_is_the_healthy_topology():
    base = rail_cluster()
    assert GrayFailure(n_degraded=0, reduction=4).apply(base) is base


def test_loss_and_onset_options():
    base = rail_cluster()
    lossy = GrayFailure(n_degraded=2, reduction=4, loss_rate=0.01).apply(base)
    assert {c.error_rate for c in lossy.cables if 0 in (c.a, c.b)} == {0.01}
    assert {c.error_rate for c in lossy.cables if 1 in (c.a, c.b)} == {0.0}
    later = GrayFailure(n_degraded=2, reduction=4, onset_s=1e-3)
    assert later.apply(base).cables == base.cables  # nominal rates until the onset
    changes = later.onset_changes(base)
    assert len(changes) == 8  # 2 GPUs x 2 cables x 2 directions
    assert sorted({bw for _, bw in changes}) == [100e9, 600e9]
    with pytest.raises(InputError, match="loss_rate"):
        GrayFailure(n_degraded=2, reduction=4, loss_rate=1.5)


def test_mid_run_rate_drop_in_flowsim():
    from m4ray.sim.flows import Flow
    from m4ray.sim.flowsim import FlowSimConfig
    from m4ray.sim.replays import schedule_onset
    from m4ray.sim.routing import Routing

    base = rail_cluster()
    failure = GrayFailure(n_degraded=2, reduction=4, onset_s=100e-6)
    topo = failure.apply(base)
    routing = Routing(topo)
    backend = FlowSimConfig().build(topo, routing)
    schedule_onset(backend, failure, base)
    done = {}
    backend.send(Flow(0, 0, 8, 10_000_000, 0.0), done.setdefault)
    backend.run()
    bits = routing.wire.wire_bytes(10_000_000) * 8
    fluid = 100e-6 + (bits - 400e9 * 100e-6) / 100e9  # 400 Gbps until the onset, then 100
    delay = routing.delivery_delay(10_000_000, routing.path(0, 8))
    assert done[0] == pytest.approx(fluid + delay, rel=1e-9)


def test_switch_tiers_and_uplinks_of_rail_template_and_fat_tree():
    rail = rail_cluster()  # 8 rail ASWs (36-43), one spine (44)
    assert switch_tiers(rail) == {**dict.fromkeys(range(36, 44), 1), 44: 2}
    assert [(rail.cables[i].a, rail.cables[i].b) for i in uplink_cables(rail, 1)] == [
        (asw, 44) for asw in range(36, 44)
    ]
    assert uplink_cables(rail, 2) == []
    spectrum = ClusterTemplateSpec(template="spectrum_x", gpus=128).build()
    assert len(uplink_cables(spectrum, 1)) == 8 * 64  # every ASW to every PSW of its plane
    tree = FatTreeSpec(k=4).build()  # edge, aggregation and core switches: 8, 8 and 4
    tiers = switch_tiers(tree)
    assert sorted(tiers.values()) == [1] * 8 + [2] * 8 + [3] * 4
    assert len(uplink_cables(tree, 1)) == 16 and len(uplink_cables(tree, 2)) == 16


@pytest.mark.parametrize(
    ("topology", "target", "n"),
    [(rail_cluster(), "asw_uplinks", 3), (FatTreeSpec(k=4).build(), "spine_uplinks", 5)],
)
def test_switch_level_faults_degrade_the_first_n_uplinks_both_ways(topology, target, n):
    failure = GrayFailure(n_degraded=n, reduction=4, target=target, loss_rate=0.01)
    slow = failure.degraded(topology)
    changed = [
        i for i, (a, b) in enumerate(zip(topology.cables, slow.cables, strict=True)) if a != b
    ]
    tier = 1 if target == "asw_uplinks" else 2
    assert changed == sorted(uplink_cables(topology, tier)[:n])
    for i in changed:
        assert slow.cables[i].bandwidth_bps == topology.cables[i].bandwidth_bps / 4
        assert slow.cables[i].error_rate == 0.01
    hosts = set(topology.hosts)
    assert not any({c.a, c.b} & hosts for c in (slow.cables[i] for i in changed))
    # both directions of each cable run at the reduced rate
    link_bw, base_bw = slow.bandwidth_bps, topology.bandwidth_bps
    assert (link_bw != base_bw).sum() == 2 * n


def test_bad_switch_fault_parameters_are_clear_errors():
    with pytest.raises(InputError, match="target"):
        GrayFailure(n_degraded=1, reduction=4, target="core")
    with pytest.raises(InputError, match=r"0\.\.8: the topology has 8 ASW"):
        GrayFailure(n_degraded=9, reduction=4, target="asw_uplinks").degraded(rail_cluster())
    with pytest.raises(InputError, match="has 0 spine"):
        GrayFailure(n_degraded=1, reduction=4, target="spine_uplinks").degraded(rail_cluster())
