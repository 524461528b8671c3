"""The gray-failure experiment: N degraded GPUs × reduction R × backends on the rail cluster.

Writes into the run directory: ``results.parquet`` (one row per scenario × backend),
``flows/<run_id>.parquet`` (per-flow FCTs), ``topologies/gray_topo_N{N}_R{R}.txt`` (SimAI format,
for other simulators), ``plots/*.png``, and ``manifest.json`` last.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from m4ray.config import SweepConfig
from m4ray.runtime.rundir import write_manifest, write_results
from m4ray.sim.failures import GrayFailure
from m4ray.sim.scenario import Scenario
from m4ray.sim.topology import Topology, write_topology
from m4ray.sweeps import plots, report
from m4ray.sweeps.grid import expand
from m4ray.sweeps.runner import run_scenarios


def describe_workload(spec: Any, n_hosts: int, algorithm: Any = None) -> str:
    """Name and size, checked: the DAG, or in lockstep only the header (a job of thousands of
    GPUs is never unrolled) and that the collective layer can run in lockstep."""
    from m4ray.workload.simai import SimAIWorkloadSpec, job_groups

    if getattr(spec, "lockstep", False) and algorithm is not None:
        from m4ray.sim.lockstep import check_algorithm

        check_algorithm(algorithm)
    if getattr(spec, "lockstep", False) and isinstance(spec, SimAIWorkloadSpec):
        model = spec.model()
        groups = job_groups(model, source=spec.resolve(), n_hosts=n_hosts)
        name = spec.resolve().stem
        return f"'{name}' in lockstep ({len(model.layers)} layers, {groups.n} ranks)"
    workload = spec.build(n_hosts=n_hosts)
    size = f"{len(workload.nodes)} nodes, {workload.n_ranks} ranks"
    if getattr(spec, "lockstep", False):
        from m4ray.sim.lockstep import symmetric_program

        symmetric_program(workload)  # an asymmetric job is refused before any task
        return f"'{workload.name}' in lockstep ({size})"
    return f"'{workload.name}' ({size})"


SECTIONS: dict[str, type] = {}  # the sweep's own fields only


def scenarios_of(cfg: SweepConfig, backends: list[str] | None = None) -> list[Scenario]:
    """The sweep's scenarios: its grid over its template, for ``backends`` (default: its own)."""
    template = Scenario(
        topology=cfg.topology,
        workload=cfg.workload,
        collective=cfg.collective,
        wire=cfg.wire,
        send_latency_s=cfg.send_latency_s,
    )
    chosen = cfg.backends if backends is None else backends
    return expand(cfg.grid, template, chosen, cfg.backend_options, cfg.seed)


def run(cfg: SweepConfig, raw_config: dict[str, Any]) -> Path:
    started = time.perf_counter()
    run_dir = Path(cfg.paths.run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    scenarios = scenarios_of(cfg)
    base = cfg.topology.build()
    # fail fast on a bad workload, before any task starts
    files = write_topologies(cfg, base, run_dir)
    print(
        f"gray-failure sweep: {len(cfg.grid.n)} N x {len(cfg.grid.r)} R x {cfg.grid.seeds} "
        f"seed(s) x {len(cfg.backends)} backend(s) = {len(scenarios)} runs of "
        f"{describe_workload(cfg.workload, len(base.hosts), cfg.collective.build(base))}"
    )
    rows = run_scenarios(scenarios, run_dir, cfg)
    frame = report.results_frame(rows)
    files.append(write_results(frame, run_dir))
    reference = cfg.reference_backend
    errors = report.errors_vs(frame, reference) if reference in cfg.backends else None
    files += write_plots(frame, errors, reference, run_dir / "plots")
    write_manifest(run_dir, raw_config, files, frame=frame)
    print()
    print(report.summary_text(frame))
    for backend in cfg.backends:
        print()
        print(report.grid_text(frame, backend))
    if errors is not None and len(errors):
        print()
        print(report.error_text(errors, reference))
    print(f"\n{len(frame)} runs in {time.perf_counter() - started:.1f} s; outputs: {run_dir}")
    if not (frame.status == "ok").any():
        sys.exit(1)
    return run_dir


def write_plots(frame, errors, reference: str, plot_dir: Path) -> list[Path]:
    if not (frame.status == "ok").any():
        return []
    speedups = {} if errors is None else errors.groupby("backend").speedup.median().to_dict()
    files = [
        plots.completion_vs_r(frame, plot_dir / "completion_vs_r.png"),
        plots.wall_time(frame, plot_dir / "wall_time.png", speedups),
    ]
    if errors is not None and len(errors):
        files += [
            plots.error_cdf(errors, reference, plot_dir / "error_cdf.png"),
            plots.error_by(errors, "n_degraded", reference, plot_dir / "error_by_n.png"),
            plots.error_by(errors, "reduction", reference, plot_dir / "error_by_r.png"),
        ]
    return files


def _suffix(target: str) -> str:
    return "" if target == "gpus" else f"_{target}"


def write_topologies(cfg: SweepConfig, base: Topology, run_dir: Path) -> list[Path]:
    """The degraded topologies of the grid (over ``base``, the built topology) in SimAI text
    format (this also checks every grid point against the topology before any task starts)."""
    return [
        write_topology(
            GrayFailure(
                n_degraded=n, reduction=r, loss_rate=cfg.grid.loss_rate, target=cfg.grid.target
            ).degraded(base),
            run_dir / "topologies" / f"gray_topo{_suffix(cfg.grid.target)}_N{n}_R{r}.txt",
        )
        for n in cfg.grid.n
        for r in cfg.grid.r
    ]
