from __future__ import annotations

import pytest

from m4ray.errors import InputError
from m4ray.sim.failures import GrayFailure, degrade, gray_failure_gpus
from m4ray.sim.topologies import rail_cluster

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
