"""The sweeps' scenario tasks for the runtime's fan-out: simulate one Scenario in a Ray worker,
write its per-flow table and its row; a scenario that succeeded before is loaded instead."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from m4ray.runtime.fanout import read_row, row_path, store_row
from m4ray.sim.scenario import Scenario, simulate


def flows_path(run_dir: Path, scenario: Scenario) -> Path:
    return run_dir / "flows" / f"{scenario.run_id}.parquet"


def load_done(run_dir: Path, scenario: Scenario) -> dict[str, Any] | None:
    """The stored row of a scenario that already succeeded, else None."""
    row = read_row(run_dir, scenario)
    if row is None or row.get("status") != "ok":
        return None
    return row if flows_path(run_dir, scenario).exists() else None


def run_and_store(scenario: Scenario, run_dir: str) -> dict[str, Any]:
    """Simulate one scenario and persist its outputs (runs inside a Ray worker)."""
    run_dir_path = Path(run_dir)
    row, flows = simulate(scenario)
    if flows is not None:
        path = flows_path(run_dir_path, scenario)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        pq.write_table(flows, tmp)
        tmp.replace(path)
    store_row(run_dir_path, scenario, row)
    return row


__all__ = ["flows_path", "load_done", "row_path", "run_and_store"]
