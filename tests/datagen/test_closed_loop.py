"""The closed-loop replay of a dataset's collective scenarios (m4ray.datagen.closed_loop)."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from m4ray.errors import InputError
from m4ray.sim.flowsim import FlowSimConfig


def test_closed_loop_redraws_the_recorded_scenarios_and_ns3_finishes_as_recorded(
    tiny_dataset, tmp_path
):
    """The scenarios are drawn again from the run's manifest: replayed in closed loop on their
    own ns-3 network they finish exactly when the dataset recorded (so the DAG, seeds and
    network are the recorded ones); flowSim answers with a completion of its own; open-loop
    scenarios are skipped; a folder without a manifest is a clear error naming the file."""
    from m4ray.datagen.closed_loop import closed_loop

    run_dir, _ = tiny_dataset
    result = closed_loop(
        run_dir, {"ns3": lambda network: network, "flowsim": lambda network: FlowSimConfig()}
    )
    table = pq.read_table(run_dir / "dataset" / "scenarios.parquet").to_pandas()
    collectives = table[(table.status == "ok") & (table.family == "rail")]
    assert len(collectives) >= 1
    assert [r["scenario"] for r in result.rows] == list(collectives.scenario_id)
    assert {r["family"] for r in result.rows} == {"rail"}  # the fabric's open loop is skipped
    for row in result.rows:
        assert row["ns3"] == pytest.approx(1.0, abs=1e-9)
        assert 0.2 < row["flowsim"] < 5.0
    assert len(result.errors("flowsim")) == len(result.rows)
    one = closed_loop(run_dir, {"flowsim": lambda network: FlowSimConfig()}, limit=1)
    assert len(one.rows) == 1
    with pytest.raises(InputError, match=r"manifest\.json"):
        closed_loop(tmp_path, {})


def test_the_fluid_variants_replay_in_closed_loop_on_each_scenarios_network(tiny_dataset):
    """The named flowSim variants build on each scenario's own network and routing (FIFO up to
    its window; standing queues and bursts from its CC's levels), as do m4 on a FIFO anchor and
    the fluid DCTCP: each answers every collective scenario, and an unknown name is refused
    before anything runs."""
    from m4ray.datagen.closed_loop import backends, closed_loop

    run_dir, _ = tiny_dataset
    names = ["flowsim", "flowsim_fifo", "flowsim_bursts", "flowsim_fifo_bursts", "m4_fifo"]
    names.append("fluid_dctcp")
    result = closed_loop(run_dir, backends(names))
    assert result.rows
    for name in names:
        assert len(result.errors(name)) == len(result.rows)
        assert all(0.2 < r[name] < 5.0 for r in result.rows)
    with pytest.raises(InputError, match="flowsim_lifo"):
        backends(["flowsim_lifo"])
