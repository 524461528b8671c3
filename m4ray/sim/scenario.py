"""Scenario: the plain record that describes one simulation, and ``simulate`` that runs it.

A Scenario is picklable and hashable by content: ``scenario_id`` names the network + workload +
seed (shared by every backend, so results join across backends) and ``run_id`` adds the backend
and its settings. It is what crosses a Ray boundary; ``simulate`` returns one small result row and
the per-flow table.
"""

from __future__ import annotations

import json
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from m4ray.errors import M4rayError
from m4ray.fingerprint import fingerprint
from m4ray.sim.collectives import HierarchicalSpec
from m4ray.sim.failures import GrayFailure
from m4ray.sim.flowsim import FlowSimConfig
from m4ray.sim.replay import FlowLog, Replay
from m4ray.sim.replays import REPLAYS, Setting, replay_of
from m4ray.sim.routing import Routing, WireFormat
from m4ray.sim.topologies import RailClusterSpec


@dataclass(kw_only=True, slots=True)
class Scenario:
    """One simulation: network, failure, workload, collective algorithm, backend, seed."""

    topology: Any = field(default_factory=RailClusterSpec)
    failure: GrayFailure = field(default_factory=lambda: GrayFailure(n_degraded=0, reduction=1))
    workload: Any  # a workload spec (m4ray.workload: SimAI, Chakra, synthetic)
    collective: Any = field(default_factory=HierarchicalSpec)
    backend: str = "flowsim"
    backend_config: Any = field(default_factory=FlowSimConfig)
    wire: WireFormat = field(default_factory=WireFormat)
    send_latency_s: float = 3e-6
    seed: int = 0

    @property
    def scenario_id(self) -> str:
        return fingerprint(
            [
                self.topology,
                self.failure,
                self.workload,
                self.collective,
                self.wire,
                self.send_latency_s,
                self.seed,
            ]
        )

    @property
    def run_id(self) -> str:
        return f"{self.scenario_id}-{self.backend}-{fingerprint(self.backend_config, 6)}"

    def describe(self) -> dict[str, Any]:
        """The identifying columns of a result row."""
        return {
            "scenario_id": self.scenario_id,
            "run_id": self.run_id,
            "n_degraded": self.failure.n_degraded,
            "reduction": self.failure.reduction,
            "loss_rate": self.failure.loss_rate,
            "onset_s": self.failure.onset_s,
            "seed": self.seed,
            "backend": self.backend,
        }


def simulate(scenario: Scenario) -> tuple[dict[str, Any], pa.Table | None]:
    """Run one scenario with its replay (:mod:`m4ray.sim.replays`); a failure becomes a row with
    ``status='failed'`` and the reason, with the flows delivered before it where there are."""
    row = scenario.describe()
    start = time.perf_counter()
    kept: list[Replay] = []
    try:
        replay = REPLAYS[replay_of(scenario)]
        base = scenario.topology.build()
        topo = scenario.failure.apply(base)
        routing = Routing(topo, seed=scenario.seed, wire=scenario.wire)
        algorithm = scenario.collective.build(topo)
        setting = Setting(
            scenario=scenario, base=base, topo=topo, routing=routing, algorithm=algorithm
        )
        done = replay(setting, kept.append)
    except Exception as err:  # keep what completed: the flows delivered before the failure
        reason = (
            f"{type(err).__name__}: {err}"
            if isinstance(err, M4rayError)
            else "".join(traceback.format_exception(err))  # a bug: keep the traceback
        )
        row = failed_row(row, reason, time.perf_counter() - start)
        if not kept:
            return row, None
        partial = flow_table(kept[0].flows)
        row["n_flows"] = partial.num_rows
        return row, partial
    if done.flows is None:
        return _ok(row, done.result, done.represented, np.zeros(0), start), None
    flows = flow_table(done.flows)
    if hasattr(scenario.workload, "job_times"):  # several jobs: who each row and flow belongs to
        row, flows = _label_jobs(scenario.workload, row, flows, done.result, base)
    return _ok(row, done.result, flows.num_rows, flows.column("slowdown").to_numpy(), start), flows


def _ok(row: dict[str, Any], result, n_flows: int, slowdown: np.ndarray, start: float) -> dict:
    """The row of a finished replay (slowdowns empty: no per-flow table, NaN)."""
    row.update(
        status="ok",
        error="",
        completion_time_s=result.completion_time_s,
        rank0_time_s=result.rank0_time_s,
        exposed_comm_s=result.exposed_comm_s,
        n_flows=n_flows,
        mean_slowdown=float(slowdown.mean()) if len(slowdown) else float("nan"),
        p99_slowdown=float(np.quantile(slowdown, 0.99)) if len(slowdown) else float("nan"),
        wall_s=time.perf_counter() - start,
    )
    return row


def _label_jobs(spec, row: dict[str, Any], flows: pa.Table, result, base):
    """A multi-job run (:mod:`m4ray.workload.multi`): each job's mean iteration time in the row
    (``job_iteration_s``, JSON by job name) and each flow's job in the per-flow table (``job``)."""
    n = len(base.hosts)
    times = spec.job_times(result.rank_finish_s, n)
    row["job_iteration_s"] = json.dumps({name: t["iteration_s"] for name, t in times.items()})
    index_of = np.full(base.n_nodes, -1, dtype=np.int64)
    index_of[list(base.hosts)] = np.arange(n)
    owner = spec.job_of_host(n)
    names = np.array([j.name for j in spec.jobs], dtype=object)
    src = index_of[flows.column("src").to_numpy()]
    return row, flows.append_column("job", pa.array(names[owner[src]].tolist(), pa.string()))


def failed_row(row: dict[str, Any], error: str, wall_s: float) -> dict[str, Any]:
    """``row`` (from :meth:`Scenario.describe`) completed as a failure with its reason."""
    nan = float("nan")
    row.update(
        status="failed",
        error=error,
        completion_time_s=nan,
        rank0_time_s=nan,
        exposed_comm_s=nan,
        n_flows=0,
        mean_slowdown=nan,
        p99_slowdown=nan,
        wall_s=wall_s,
    )
    return row


def flow_table(log: FlowLog) -> pa.Table:
    """The per-flow table: ids, hosts, bytes, start/finish/FCT/ideal FCT (s), slowdown, the flow
    whose delivery released it (``parent_id``, -1: none) and when the replay counted it done
    (``done_s``: its last ACK under SimAI's collectives, else its delivery)."""
    start = np.asarray(log.start_s, dtype=np.float64)
    finish = np.asarray(log.finish_s, dtype=np.float64)
    ideal = np.asarray(log.ideal_fct_s, dtype=np.float64)
    fct = finish - start
    n = len(start)
    parent = log.parent_id if len(log.parent_id) == n else [-1] * n
    done = np.asarray(log.done_s, dtype=np.float64) if len(log.done_s) == n else finish
    return pa.table(
        {
            "flow_id": pa.array(log.flow_id, pa.int64()),
            "node_id": pa.array(log.node_id, pa.int64()),
            "src": pa.array(log.src, pa.int32()),
            "dst": pa.array(log.dst, pa.int32()),
            "size_bytes": pa.array(log.size_bytes, pa.int64()),
            "start_s": start,
            "finish_s": finish,
            "fct_s": fct,
            "ideal_fct_s": ideal,
            "slowdown": fct / ideal,
            "parent_id": pa.array(parent, pa.int64()),
            "done_s": done,
        }
    )
