from __future__ import annotations

import dataclasses
import json

import pyarrow.parquet as pq

from m4ray.runtime.cluster import RayConfig
from m4ray.runtime.fanout import row_path, run_many
from m4ray.sim.scenario import Scenario
from m4ray.sim.simai import SimAIWorkloadSpec
from m4ray.sweeps.grid import GridConfig, expand
from m4ray.sweeps.runner import flows_path, load_done, run_and_store

SMALL = SimAIWorkloadSpec(path="microAllReduce", scale=0.01)


def scenarios():
    template = Scenario(workload=SMALL)
    return expand(
        GridConfig(n=[2, 8], r=[4]),
        template,
        ["flowsim"],
        {"flowsim": template.backend_config},
        root_seed=0,
    )


def test_runs_resumes_and_records_failures(ray_local, tmp_path):
    todo = scenarios()
    rows = run_many(todo, tmp_path, RayConfig(), progress=False, task=run_and_store, load=load_done)
    assert [r["status"] for r in rows] == ["ok", "ok"]
    assert [r["n_flows"] for r in rows] == [1280, 1280]  # hierarchical all-reduce, 2 layers
    table = pq.read_table(flows_path(tmp_path, todo[0]))
    assert table.num_rows == rows[0]["n_flows"] > 0
    stamps = [row_path(tmp_path, s).stat().st_mtime_ns for s in todo]

    # a re-run skips what is done; a removed row is recomputed, identically
    row_path(tmp_path, todo[1]).unlink()
    again = run_many(
        todo, tmp_path, RayConfig(), progress=False, task=run_and_store, load=load_done
    )
    assert row_path(tmp_path, todo[0]).stat().st_mtime_ns == stamps[0]
    assert row_path(tmp_path, todo[1]).exists()
    assert again[1]["completion_time_s"] == rows[1]["completion_time_s"]

    # a failing scenario becomes a row with its reason; the others still run
    broken = dataclasses.replace(todo[0], workload=SimAIWorkloadSpec(path="/no/such.txt"))
    mixed = run_many(
        [broken, *todo], tmp_path, RayConfig(), progress=False, task=run_and_store, load=load_done
    )
    assert [r["status"] for r in mixed] == ["failed", "ok", "ok"]
    assert "/no/such.txt" in mixed[0]["error"]
    assert json.loads(row_path(tmp_path, broken).read_text())["status"] == "failed"


class CrashingBackend:
    """A backend config whose build kills its process, as an ns-3 assertion does."""

    def build(self, topology, routing):
        import os

        os._exit(134)


def test_a_crashed_worker_becomes_a_failed_row(ray_local, tmp_path):
    good = scenarios()[0]
    crash = dataclasses.replace(good, backend="crash", backend_config=CrashingBackend())
    rows = run_many(
        [crash, good], tmp_path, RayConfig(), progress=False, task=run_and_store, load=load_done
    )
    assert [r["status"] for r in rows] == ["failed", "ok"]
    assert rows[0]["error"].startswith("worker failed")
    assert json.loads(row_path(tmp_path, crash).read_text())["status"] == "failed"
