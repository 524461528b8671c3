"""Standalone flow-trace mode: a list of flows with start times, no workload DAG.

The interop path for m4/HPCC data: read a topology and a ``flows.txt``, drive any backend through
the same ``NetworkBackend`` protocol, and write one row per flow
(``flow_id, src, dst, size_bytes, start_s, fct_s, ideal_fct_s, slowdown``) as CSV or Parquet.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from m4ray.errors import InputError, SimulationError
from m4ray.sim.backend import BackendConfig
from m4ray.sim.flows import Flow
from m4ray.sim.routing import Routing
from m4ray.sim.topology import Topology

COLUMNS = ("flow_id", "src", "dst", "size_bytes", "start_s", "fct_s", "ideal_fct_s", "slowdown")


def run_trace(
    topology: Topology,
    flows: list[Flow],
    backend_config: BackendConfig,
    routing: Routing,
    *,
    probe: Callable[[Any, Callable[[], int]], None] | None = None,
) -> pa.Table:
    """Simulate ``flows`` (started at their ``start_s``) and return the per-flow FCT table.
    ``probe(backend, unfinished)``, called once before the run, may schedule its own events on
    the backend (a bench sampling its queues; ``unfinished()``: flows not yet done)."""
    paths = []
    for flow in flows:  # route everything first so a bad pair fails before simulating
        try:
            paths.append(routing.path(flow.src, flow.dst, flow.id))
        except InputError as err:
            raise InputError(f"flow {flow.id}: {err.message}", field=err.field) from None
    backend = backend_config.build(topology, routing)
    finish: dict[int, float] = {}

    def record(flow_id: int, t: float) -> None:
        finish[flow_id] = t

    for flow in sorted(flows, key=lambda f: (f.start_s, f.id)):
        backend.schedule(flow.start_s, lambda f=flow: backend.send(f, record))
    if probe is not None:
        probe(backend, lambda: len(flows) - len(finish))
    backend.run()
    if len(finish) != len(flows):
        raise SimulationError(f"{len(flows) - len(finish)} flows never completed")
    start = np.array([f.start_s for f in flows])
    fct = np.array([finish[f.id] for f in flows]) - start
    ideal = np.array(
        [routing.ideal_fct(f.size_bytes, p) for f, p in zip(flows, paths, strict=True)]
    )
    return pa.table(
        {
            "flow_id": pa.array([f.id for f in flows], pa.int64()),
            "src": pa.array([f.src for f in flows], pa.int32()),
            "dst": pa.array([f.dst for f in flows], pa.int32()),
            "size_bytes": pa.array([f.size_bytes for f in flows], pa.int64()),
            "start_s": start,
            "fct_s": fct,
            "ideal_fct_s": ideal,
            "slowdown": fct / ideal,
        }
    )


def write_table(table: pa.Table, path: str | Path) -> Path:
    """Write CSV (``.csv``) or Parquet (anything else) atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        if path.suffix == ".csv":
            pacsv.write_csv(table, tmp)
        else:
            pq.write_table(table, tmp)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


__all__ = ["COLUMNS", "run_trace", "write_table"]
