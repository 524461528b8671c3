"""The sweeps' scenario tasks for the runtime's fan-out: simulate one Scenario in a Ray worker,
write its per-flow table and its row; a scenario that succeeded before is loaded instead. m4
scenarios run in groups sharing their forward passes (:mod:`m4ray.sim.m4.shared`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from m4ray.runtime.fanout import crash_reason, read_row, row_path, store_row
from m4ray.sim.scenario import Scenario, failed_row, simulate


def flows_path(run_dir: Path, scenario: Scenario) -> Path:
    return run_dir / "flows" / f"{scenario.run_id}.parquet"


def load_done(run_dir: Path, scenario: Scenario) -> dict[str, Any] | None:
    """The stored row of a scenario that already succeeded, else None."""
    row = read_row(run_dir, scenario)
    if row is None or row.get("status") != "ok":
        return None
    return row if flows_path(run_dir, scenario).exists() else None


def store(run_dir: Path, scenario: Scenario, row: dict[str, Any], flows) -> None:
    """The per-flow table, then the row (the row says the scenario is done)."""
    if flows is not None:
        path = flows_path(run_dir, scenario)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        pq.write_table(flows, tmp)
        tmp.replace(path)
    store_row(run_dir, scenario, row)


def run_and_store(scenario: Scenario, run_dir: str) -> dict[str, Any]:
    """Simulate one scenario and persist its outputs (runs inside a Ray worker)."""
    row, flows = simulate(scenario)
    store(Path(run_dir), scenario, row, flows)
    return row


def share_group(scenario: Scenario):
    """The fan-out's grouping: m4 scenarios with the same model share a process (else None)."""
    group = getattr(scenario.backend_config, "group", None)
    return group() if group is not None else None


def run_and_store_together(scenarios: list[Scenario], run_dir: str) -> list[dict[str, Any]]:
    """Simulate a group of m4 scenarios concurrently, sharing forward passes; each is stored as
    soon as it ends. Their ``wall_s`` then becomes the group's wall time ÷ its size (what one
    scenario costs at this throughput; ``shared_by`` says how many shared it)."""
    from m4ray.sim.m4.shared import simulate_together  # torch: only where m4 runs

    run_dir_path = Path(run_dir)
    stepper = scenarios[0].backend_config.shared_stepper()
    start = time.perf_counter()

    def done(index: int, result) -> None:
        row, flows = result
        row["shared_by"] = len(scenarios)
        store(run_dir_path, scenarios[index], row, flows)

    results = simulate_together(scenarios, stepper, simulate, on_done=done)
    per_scenario = (time.perf_counter() - start) / len(scenarios)
    rows = []
    for scenario, (row, _) in zip(scenarios, results, strict=True):
        row["wall_s"] = per_scenario
        store_row(run_dir_path, scenario, row)
        rows.append(row)
    return rows


def run_scenarios(scenarios: list[Scenario], run_dir: Path, cfg) -> list[dict[str, Any]]:
    """Scenarios through the runtime's fan-out as the sweeps run them: stored as they end,
    loaded where they succeeded before, m4 scenarios in groups (``cfg``: the sweep's ``ray``
    and ``progress``)."""
    from m4ray.runtime.fanout import run_many

    return run_many(
        scenarios,
        run_dir,
        cfg.ray,
        progress=cfg.progress,
        task=run_and_store,
        load=load_done,
        group=share_group,
        task_group=run_and_store_together,
        crashed=crashed_scenario,
    )


def crashed_scenario(scenario: Scenario, err: BaseException) -> dict[str, Any]:
    """The failed row of a scenario whose worker died (NaN results, the reason)."""
    return failed_row(scenario.describe(), crash_reason(err), float("nan"))


__all__ = [
    "crashed_scenario",
    "flows_path",
    "load_done",
    "row_path",
    "run_and_store",
    "run_and_store_together",
    "run_scenarios",
    "share_group",
]
