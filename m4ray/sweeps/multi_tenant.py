"""Several jobs on one cluster (``+experiment=multi_tenant``): which job a gray failure hurts, by
how much, and whether another placement would have avoided it.

For every placement policy in ``tenants.policies`` (applied to each job that names no GPU list)
the jobs of the config's multi-job workload (:mod:`m4ray.workload.multi`) run:

* together on the healthy cluster (``shared``);
* each alone on the GPUs it has under that policy (``alone``);
* together with each failure of ``tenants.failures`` at each reduction of ``tenants.r``
  (``failed``): a fault at named GPUs (their NIC and NVLink), rail-switch uplinks or spines
  (:class:`~m4ray.sim.failures.GrayFailure`'s ``at``).

Per job, backend and policy: its mean iteration time alone, shared and under each failure; the
slowdown due to its neighbours (shared / alone − 1) and due to each failure (failed / shared − 1),
separately. Every scenario is an ordinary :class:`~m4ray.sim.scenario.Scenario` on the runtime's
fan-out (local Ray or a cluster; an interrupted run resumes). ``tenants.subset`` limits a slow
backend to some policies (e.g. ns-3 on ``packed`` only).

Writes ``results.parquet`` (one row per run), ``jobs.parquet`` (one row per job × run),
``flows/<run_id>.parquet`` (per-flow, with each flow's ``job``), ``plots/blast_radius.png`` (the
heat map failure × job → slowdown, one panel per policy) and ``plots/placement.png`` (neighbour
and failure slowdowns per job, by policy), and ``manifest.json`` last.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from m4ray.config import SweepConfig
from m4ray.errors import InputError
from m4ray.runtime.rundir import write_manifest, write_results
from m4ray.sim.failures import TARGETS, GrayFailure
from m4ray.sim.scenario import Scenario
from m4ray.sweeps import report
from m4ray.sweeps.runner import run_scenarios
from m4ray.workload.multi import POLICIES, MultiJobSpec

HEALTHY = GrayFailure(n_degraded=0, reduction=1)


@dataclass(kw_only=True, slots=True)
class FailureSite:
    """Where a fault sits: ``target`` (a :class:`GrayFailure` target) and the elements ``at``."""

    name: str
    target: str = "gpus"
    at: list[int] = field(default_factory=list)


@dataclass(kw_only=True, slots=True)
class TenantsConfig:
    """``policies``: placement policies compared; ``failures``: fault sites; ``r``: reductions;
    ``subset``: backend → the policies it runs (others: all)."""

    policies: list[str] = field(default_factory=lambda: ["packed", "spread"])
    failures: list[FailureSite] = field(default_factory=list)
    r: list[int] = field(default_factory=lambda: [4])
    subset: dict[str, list[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.failures = [
            f if isinstance(f, FailureSite) else FailureSite(**f) for f in self.failures
        ]
        for i, policy in enumerate(self.policies):
            if policy not in POLICIES:
                raise InputError(
                    f"unknown placement policy '{policy}' ({', '.join(POLICIES)})",
                    field=f"tenants.policies[{i}]",
                )
        for i, site in enumerate(self.failures):
            if site.target not in TARGETS:
                raise InputError(
                    f"unknown target '{site.target}' ({', '.join(TARGETS)})",
                    field=f"tenants.failures[{i}].target",
                )
            if not site.at:
                raise InputError(
                    f"failure '{site.name}' names no element (at: [...])",
                    field=f"tenants.failures[{i}].at",
                )
        names = [f.name for f in self.failures]
        if len(set(names)) != len(names):
            raise InputError("failure names repeat", field="tenants.failures")
        if not self.r or any(r < 1 for r in self.r):
            raise InputError(f"needs reductions >= 1, got {self.r}", field="tenants.r")

    def failure(self, site: FailureSite, r: int) -> GrayFailure:
        return GrayFailure(
            n_degraded=len(site.at), reduction=int(r), target=site.target, at=tuple(site.at)
        )


SECTIONS: dict[str, type] = {"tenants": TenantsConfig}


def with_policy(spec: MultiJobSpec, policy: str) -> MultiJobSpec:
    """``spec`` with every job that names no GPU list placed by ``policy``."""
    jobs = [
        dataclasses.replace(j, placement=policy) if isinstance(j.placement, str) else j
        for j in spec.jobs
    ]
    return dataclasses.replace(spec, jobs=jobs)


def plan(cfg: SweepConfig) -> tuple[list[Scenario], dict[str, dict[str, Any]]]:
    """Every run (checked before any task: placements, groups on the collective layer, failure
    sites on the topology) and its labels by run id."""
    spec, tenants = cfg.workload, cfg.tenants
    if not isinstance(spec, MultiJobSpec):
        raise InputError(
            "this experiment replays a multi-job workload (m4ray.workload.multi.MultiJobSpec)",
            field="workload",
        )
    base = cfg.topology.build()
    n = len(base.hosts)
    if spec.gpus_per_server != base.gpus_per_server:
        raise InputError(
            f"{spec.gpus_per_server}, but the topology has {base.gpus_per_server} GPUs per server",
            field="workload.gpus_per_server",
        )
    algorithm = cfg.collective.build(base)
    for i, site in enumerate(tenants.failures):
        try:
            tenants.failure(site, max(tenants.r)).degraded(base)
        except InputError as err:
            raise InputError(
                f"failure '{site.name}': {err.message}", field=f"tenants.failures[{i}].{err.field}"
            ) from None
    for name in cfg.backends:
        if name not in cfg.backend_options:
            raise InputError(f"unknown backend '{name}'", field="backends")
    scenarios, labels = [], {}
    template = Scenario(
        topology=cfg.topology,
        workload=spec,
        collective=cfg.collective,
        wire=cfg.wire,
        send_latency_s=cfg.send_latency_s,
        seed=cfg.seed,
    )
    for policy in tenants.policies:
        placed = with_policy(spec, policy)
        placed.check_groups(n, algorithm)
        runs: list[tuple[str, str, int, Any, GrayFailure]] = [("shared", "", 1, placed, HEALTHY)]
        runs += [("alone", "", 1, placed.alone(j, n), HEALTHY) for j in range(len(spec.jobs))]
        runs += [
            ("failed", site.name, r, placed, tenants.failure(site, r))
            for site in tenants.failures
            for r in tenants.r
        ]
        for backend in cfg.backends:
            if policy not in tenants.subset.get(backend, tenants.policies):
                continue
            for kind, site, r, workload, failure in runs:
                s = dataclasses.replace(
                    template,
                    workload=workload,
                    failure=failure,
                    backend=backend,
                    backend_config=cfg.backend_options[backend],
                )
                scenarios.append(s)
                labels[s.run_id] = {"policy": policy, "kind": kind, "failure": site, "r": r}
    return scenarios, labels


def job_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per job × run: its mean iteration time (s)."""
    rows = []
    for rec in frame[frame.status == "ok"].to_dict("records"):
        for job, seconds in json.loads(rec["job_iteration_s"]).items():
            rows.append(
                {
                    **{k: rec[k] for k in ("run_id", "backend", "policy", "kind", "failure", "r")},
                    "job": job,
                    "iteration_s": seconds,
                }
            )
    return pd.DataFrame(rows)


def slowdowns(jobs: pd.DataFrame) -> pd.DataFrame:
    """Per backend, policy and job: iteration alone and shared (ms), the neighbour slowdown, and
    per failure × R the failure slowdown (fractions)."""
    out = []
    key = ["backend", "policy", "job"]
    for (backend, policy, job), part in jobs.groupby(key, sort=False):
        alone = part[part.kind == "alone"].iteration_s
        shared = part[part.kind == "shared"].iteration_s
        if alone.empty or shared.empty:
            continue
        row = {
            "backend": backend,
            "policy": policy,
            "job": job,
            "alone_ms": alone.iloc[0] * 1e3,
            "shared_ms": shared.iloc[0] * 1e3,
            "neighbours": shared.iloc[0] / alone.iloc[0] - 1,
        }
        for rec in part[part.kind == "failed"].to_dict("records"):
            row[f"{rec['failure']} R{rec['r']}"] = rec["iteration_s"] / shared.iloc[0] - 1
        out.append(row)
    return pd.DataFrame(out)


def table_text(table: pd.DataFrame) -> str:
    header = list(table.columns)
    rows = []
    for rec in table.to_dict("records"):
        cells = []
        for k in header:
            v = rec[k]
            if k.endswith("_ms"):
                cells.append(f"{v:.3f}")
            elif isinstance(v, float):
                cells.append(f"{v:+.1%}")
            else:
                cells.append(str(v))
        rows.append(cells)
    return report.format_table(header, rows)


def run(cfg: SweepConfig, raw_config: dict[str, Any]) -> Path:
    started = time.perf_counter()
    run_dir = Path(cfg.paths.run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    scenarios, labels = plan(cfg)
    spec: MultiJobSpec = cfg.workload
    names = ", ".join(f"{j.name} {j.gpus} GPUs" for j in spec.jobs)
    print(
        f"multi-tenant: {len(spec.jobs)} jobs ({names})"
        f" x {len(cfg.tenants.policies)} placement(s) x {len(cfg.tenants.failures)} failure(s) x "
        f"{len(cfg.tenants.r)} R on {len(cfg.topology.build().hosts)} GPUs: {len(scenarios)} runs"
    )
    rows = run_scenarios(scenarios, run_dir, cfg)
    for row in rows:
        row.update(labels[row["run_id"]])
    frame = report.results_frame(rows)
    files = [write_results(frame, run_dir)]
    jobs = job_frame(frame)
    table = slowdowns(jobs) if len(jobs) else pd.DataFrame()
    if len(jobs):
        files.append(write_results(jobs, run_dir, "jobs.parquet"))
        from m4ray.sweeps.plots import blast_radius, placement_effect

        files += [
            blast_radius(table, run_dir / "plots" / "blast_radius.png"),
            placement_effect(table, run_dir / "plots" / "placement.png"),
        ]
    write_manifest(run_dir, raw_config, files, frame=frame)
    print()
    print(report.summary_text(frame))
    if len(table):
        print(
            "\nper job: iteration alone and shared (ms), slowdown by neighbours and by each failure"
        )
        print(table_text(table))
    print(f"\n{len(frame)} runs in {time.perf_counter() - started:.1f} s; outputs: {run_dir}")
    if not (frame.status == "ok").any():
        sys.exit(1)
    return run_dir


__all__ = ["SECTIONS", "FailureSite", "TenantsConfig", "job_frame", "plan", "run", "slowdowns"]
