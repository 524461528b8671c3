from __future__ import annotations

import dataclasses
import json
import time
from types import SimpleNamespace

import numpy as np
import pyarrow.parquet as pq
import pytest

from m4ray.runtime.cluster import RayConfig
from m4ray.runtime.fanout import groups, row_path, run_many
from m4ray.sim.m4 import M4Config
from m4ray.sim.scenario import Scenario
from m4ray.sweeps.grid import GridConfig, expand
from m4ray.sweeps.runner import (
    flows_path,
    load_done,
    run_and_store,
    run_and_store_together,
    share_group,
)
from m4ray.workload.simai import SimAIWorkloadSpec

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

    replay = "dag"

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


def test_m4_scenarios_run_in_groups_with_the_answers_they_get_alone(ray_local, tmp_path):
    template = Scenario(workload=SMALL, backend="m4", backend_config=M4Config(share_steps=3))
    grid = GridConfig(n=[2, 4, 8], r=[4, 10])
    todo = expand(grid, template, ["m4"], {"m4": template.backend_config}, root_seed=0)
    kw = {"progress": False, "task": run_and_store, "load": load_done}
    grouped = run_many(
        todo,
        tmp_path / "grouped",
        RayConfig(),
        group=share_group,
        task_group=run_and_store_together,
        **kw,
    )
    alone = [run_and_store(s, str(tmp_path / "alone")) for s in todo]
    assert all(r["status"] == "ok" for r in grouped + alone)
    assert [r["shared_by"] for r in grouped] == [3] * 6  # 6 scenarios, at most 3 per group
    # a group's forward passes multiply larger matrices than a lone scenario's, and BLAS's
    # rounding may depend on the shape (and the CPU): the promise is agreement far below the
    # picosecond predicted times are rounded to, not bit equality (README)
    for scenario, g, a in zip(todo, grouped, alone, strict=True):
        assert g["completion_time_s"] == pytest.approx(a["completion_time_s"], rel=1e-9)
        ours = pq.read_table(flows_path(tmp_path / "grouped", scenario)).column("finish_s")
        theirs = pq.read_table(flows_path(tmp_path / "alone", scenario)).column("finish_s")
        np.testing.assert_allclose(ours.to_numpy(), theirs.to_numpy(), rtol=1e-9, atol=1e-12)
    # a re-run finds them all done; a lost row is redone within a group of one
    row_path(tmp_path / "grouped", todo[4]).unlink()
    again = run_many(
        todo,
        tmp_path / "grouped",
        RayConfig(),
        group=share_group,
        task_group=run_and_store_together,
        **kw,
    )
    assert again[4]["completion_time_s"] == pytest.approx(alone[4]["completion_time_s"], rel=1e-9)
    assert [r.get("shared_by") for r in again] == [3, 3, 3, 3, 1, 3]


def test_groups_split_evenly_interleave_and_fill_the_slots():
    records = list(range(10))
    by_parity = lambda r: (("even" if r % 2 == 0 else "odd"), 2)  # noqa: E731
    units = groups(records, list(range(10)), by_parity, slots=1)
    assert sorted(len(u) for u in units) == [1, 1, 2, 2, 2, 2]  # 5 per key: 3 groups of <= 2
    assert sorted(i for u in units for i in u) == records
    one_key = lambda r: ("all", 100)  # noqa: E731
    assert groups(records, records, one_key, slots=4) == [[0, 4, 8], [1, 5, 9], [2, 6], [3, 7]]
    assert groups(records, [3], one_key, slots=4) == [[3]]
    solo = lambda r: None if r < 8 else ("late", 8)  # noqa: E731
    # groups spread among the single runs, the first one first
    assert groups(records, records, solo, slots=2) == [[8], 0, 1, 2, 3, [9], 4, 5, 6, 7]


def test_groups_run_side_by_side_among_single_runs(ray_local, tmp_path):
    """Units run in the order :func:`groups` gives them (one remote function, one queue): the
    first group starts at once, the second a share of the single runs later, so the two long
    units overlap instead of the last one running alone at the end."""
    records = [SimpleNamespace(run_id=f"r{i}", grouped=i >= 6) for i in range(8)]

    def single(record, run_dir):
        start = time.time()
        time.sleep(0.05)
        return {"status": "ok", "start": start}

    def together(members, run_dir):
        start = time.time()
        time.sleep(1.0)
        return [{"status": "ok", "start": start} for _ in members]

    rows = run_many(
        records,
        tmp_path,
        RayConfig(),
        progress=False,
        task=single,
        load=lambda run_dir, record: None,
        group=lambda record: ("g", 1) if record.grouped else None,
        task_group=together,
    )
    grouped = [row["start"] for row, record in zip(rows, records, strict=True) if record.grouped]
    alone = [row["start"] for row, record in zip(rows, records, strict=True) if not record.grouped]
    assert min(grouped) <= min(alone) + 0.2  # the first group starts at once
    assert max(grouped) - min(grouped) < 0.6  # the second soon after: side by side
    assert max(alone) > max(grouped) + 0.5  # the rest of the single runs after it
