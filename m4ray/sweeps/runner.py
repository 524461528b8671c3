"""Fan-out: run scenarios as Ray tasks, resumably, with a progress bar.

Each task runs one Scenario and writes its per-flow Parquet table and then its result row
(``runs/<run_id>.json``, written last and atomically) into the run directory; the driver only
collects small rows. A scenario whose row exists with ``status == "ok"`` is skipped on a re-run,
so an interrupted sweep resumes where it stopped; failed scenarios are retried. A scenario that
raises, or whose worker process dies, becomes a row with ``status == "failed"`` and the reason.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from tqdm.auto import tqdm

from m4ray.sim.scenario import Scenario, failed_row, simulate
from m4ray.sim.textio import atomic_write_text
from m4ray.sweeps.cluster import RayConfig, start_ray


def row_path(run_dir: Path, scenario: Scenario) -> Path:
    return run_dir / "runs" / f"{scenario.run_id}.json"


def flows_path(run_dir: Path, scenario: Scenario) -> Path:
    return run_dir / "flows" / f"{scenario.run_id}.parquet"


def read_row(run_dir: Path, scenario: Any) -> dict[str, Any] | None:
    """The stored row of a scenario, or None if absent or unreadable (an interrupted write)."""
    path = row_path(run_dir, scenario)
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        return None


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


def store_row(run_dir: Path, scenario: Scenario, row: dict[str, Any]) -> None:
    atomic_write_text(row_path(run_dir, scenario), json.dumps(row, indent=1, default=float))


def run_many(
    scenarios: list[Any],
    run_dir: Path,
    ray_cfg: RayConfig,
    progress: bool = True,
    *,
    task: Callable[[Any, str], dict[str, Any]] = run_and_store,
    load: Callable[[Path, Any], dict[str, Any] | None] = load_done,
    crashed: Callable[[Any, BaseException], dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Rows for every scenario, in input order; runs only those not already done.

    ``task(scenario, run_dir)`` runs in a Ray worker, stores its outputs and returns the row;
    ``load`` returns the stored row of a scenario that already succeeded; ``crashed`` makes the
    row of a scenario whose worker died. Scenarios need a ``run_id``.
    """
    crashed = crashed or crashed_row
    rows: dict[int, dict[str, Any]] = {}
    todo = []
    for index, scenario in enumerate(scenarios):
        done = load(run_dir, scenario)
        if done is not None:
            rows[index] = done
        else:
            todo.append(index)
    bar = tqdm(
        total=len(scenarios),
        initial=len(rows),
        desc="scenarios",
        unit="run",
        disable=not progress,
        dynamic_ncols=True,
    )
    if todo:
        ray = start_ray(ray_cfg)
        remote = ray.remote(task).options(num_cpus=ray_cfg.task_cpus, max_retries=0)
        pending = {remote.remote(scenarios[i], str(run_dir)): i for i in todo}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            index = pending.pop(ready[0])
            try:
                rows[index] = ray.get(ready[0])
            except Exception as err:  # the worker died (a crash in native code, OOM, ...)
                rows[index] = crashed(scenarios[index], err)
                store_row(run_dir, scenarios[index], rows[index])
            bar.update(1)
            bar.set_postfix(failed=sum(r["status"] != "ok" for r in rows.values()))
    bar.close()
    return [rows[i] for i in range(len(scenarios))]


def crash_reason(err: BaseException) -> str:
    reason = str(err).strip().splitlines()
    return f"worker failed: {type(err).__name__}: {reason[-1] if reason else ''}"


def crashed_row(scenario: Scenario, err: BaseException) -> dict[str, Any]:
    return failed_row(scenario.describe(), crash_reason(err), float("nan"))
