from __future__ import annotations

import dataclasses

import pytest

from m4ray.errors import InputError
from m4ray.sim.flowsim import FlowSimConfig
from m4ray.sim.scenario import Scenario
from m4ray.sweeps.grid import GridConfig, child_seeds, expand
from m4ray.workload.simai import SimAIWorkloadSpec

TEMPLATE = Scenario(workload=SimAIWorkloadSpec(path="microAllReduce"))
OPTIONS = {"flowsim": FlowSimConfig(), "capped": FlowSimConfig(rate_cap_bps=1e9)}


def test_default_grid_is_the_105_topology_study():
    scenarios = expand(GridConfig(), TEMPLATE, ["flowsim"], OPTIONS, root_seed=0)
    assert len(scenarios) == 105
    assert {(s.failure.n_degraded, s.failure.reduction) for s in scenarios} == {
        (n, r) for n in range(2, 17) for r in range(4, 11)
    }
    assert len({s.run_id for s in scenarios}) == 105


def test_backends_share_scenario_ids_and_seeds_differ():
    grid = GridConfig(n=[8], r=[4], seeds=2)
    scenarios = expand(grid, TEMPLATE, ["flowsim", "capped"], OPTIONS, root_seed=5)
    assert [s.backend for s in scenarios] == ["flowsim", "capped"] * 2
    assert scenarios[0].scenario_id == scenarios[1].scenario_id
    assert scenarios[0].run_id != scenarios[1].run_id
    assert scenarios[0].seed != scenarios[2].seed
    assert [s.seed for s in scenarios[::2]] == child_seeds(5, 2)


def test_ids_are_content_hashes():
    a = expand(GridConfig(n=[2], r=[4]), TEMPLATE, ["flowsim"], OPTIONS, root_seed=0)[0]
    b = expand(GridConfig(n=[2], r=[4]), TEMPLATE, ["flowsim"], OPTIONS, root_seed=0)[0]
    c = expand(
        GridConfig(n=[2], r=[4]),
        dataclasses.replace(TEMPLATE, send_latency_s=6e-6),
        ["flowsim"],
        OPTIONS,
        0,
    )[0]
    assert a.run_id == b.run_id and a.scenario_id != c.scenario_id


@pytest.mark.parametrize(
    ("grid", "backends", "message"),
    [
        (GridConfig(n=[2]), ["nope"], "unknown backend 'nope'; valid choices: capped, flowsim"),
        (GridConfig(n=[]), ["flowsim"], "empty"),
        (GridConfig(n=[2, 2]), ["flowsim"], "repeated"),
        (GridConfig(seeds=0), ["flowsim"], "seeds"),
        (GridConfig(), [], "no backend"),
    ],
)
def test_bad_grids(grid, backends, message):
    with pytest.raises(InputError, match=message):
        expand(grid, TEMPLATE, backends, OPTIONS, root_seed=0)
