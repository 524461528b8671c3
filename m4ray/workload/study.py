"""``+experiment=workload``: grids of synthetic training jobs replayed on a network backend.

Three studies (``reference/workloads.md`` §6), each a list of points fanned out as Ray tasks,
stored one JSON row per point (resumable: finished points are not re-run), then a Parquet table,
PNG plots and a summary:

* ``bubble``: pipeline size × batch per replica (``m`` microbatches of one sample; data
  parallelism fills the cluster): GPU efficiency = compute time / iteration time falls as the
  pipeline grows, and faster for small batches — the bubble ``(p−1)/m``.
* ``scaling``: model size (hidden) × parallel layout × batch: iteration time and efficiency.
* ``straggler``: a data-parallel job on N GPUs with one GPU slowed by ΔS in one microbatch:
  iteration time grows by ΔS and the idle GPU time of the others by ΔS·(N−1), so the waste
  grows with the cluster.

Every point's job is also written as Chakra files when ``write_traces`` is set.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from m4ray.errors import InputError
from m4ray.workload.spec import GpuSpec, JobSpec, ModelSpec, ParallelSpec


@dataclass(kw_only=True, slots=True)
class StudyConfig:
    """The ``workload`` section of the experiment."""

    model: dict[str, Any] = field(default_factory=dict)  # ModelSpec fields shared by all points
    gpu: dict[str, Any] = field(default_factory=dict)
    bubble_pp: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    bubble_microbatches: list[int] = field(default_factory=lambda: [2, 4, 8, 16])
    straggler_gpus: list[int] = field(default_factory=lambda: [4, 8, 16, 32])
    straggler_delay_s: float = 5e-3
    straggler_rank: int = 1
    scaling_hidden: list[int] = field(default_factory=lambda: [1024, 2048, 4096])
    scaling_layouts: list[dict[str, Any]] = field(
        default_factory=lambda: [{"dp": 32}, {"dp": 8, "tp": 4}, {"dp": 4, "tp": 8},
                                 {"dp": 8, "pp": 4, "schedule": "1f1b"}]
    )  # fmt: skip
    scaling_batch: list[int] = field(default_factory=lambda: [64])
    write_traces: bool = False


@dataclass(kw_only=True, slots=True)
class Point:
    """One job of a study: its spec, wrappers, and where it runs."""

    study: str
    job: dict[str, Any]
    wrappers: list[dict[str, Any]]
    labels: dict[str, Any]
    topology: Any
    algorithm: Any
    send_latency_s: float
    write_traces: bool

    @property
    def run_id(self) -> str:
        key = json.dumps(
            {"study": self.study, "job": self.job, "wrappers": self.wrappers,
             "topology": repr(self.topology), "algorithm": repr(self.algorithm),
             "latency": self.send_latency_s},
            sort_keys=True, default=str,
        )  # fmt: skip
        return f"{self.study}-" + hashlib.sha256(key.encode()).hexdigest()[:12]


def points(cfg: StudyConfig, topology, algorithm, send_latency_s: float) -> list[Point]:
    """Every point of both studies; bad combinations fail here, before any task starts."""
    n_hosts = len(topology.build().hosts)
    common = {"topology": topology, "algorithm": algorithm, "send_latency_s": send_latency_s,
              "write_traces": cfg.write_traces}  # fmt: skip
    out = []
    for pp in cfg.bubble_pp:
        for m in cfg.bubble_microbatches:
            # data parallelism fills the cluster; each replica runs m microbatches of 1 sample
            dp = max(1, n_hosts // pp)
            model = {**cfg.model, "batch_size": dp * m, "num_microbatches": m}
            spec = {"model": model, "parallel": {"dp": dp, "pp": pp}, "gpu": cfg.gpu}
            _check(spec, n_hosts, f"bubble pp={pp} microbatches={m}")
            out.append(Point(study="bubble", job=spec, wrappers=[],
                             labels={"pp": pp, "microbatches": m, "dp": dp}, **common))  # fmt: skip
    for hidden in cfg.scaling_hidden:
        for layout in cfg.scaling_layouts:
            for batch in cfg.scaling_batch:
                dp = layout.get("dp", 1)
                model = {**cfg.model, "hidden_size": hidden, "batch_size": batch,
                         "num_microbatches": max(1, batch // dp // 2)}  # fmt: skip
                spec = {"model": model, "parallel": dict(layout), "gpu": cfg.gpu}
                name = _layout_name(layout)
                _check(spec, n_hosts, f"scaling hidden={hidden} {name} batch={batch}")
                out.append(Point(study="scaling", job=spec, wrappers=[],
                                 labels={"hidden": hidden, "layout": name, "batch": batch},
                                 **common))  # fmt: skip
    for n in cfg.straggler_gpus:
        if n > n_hosts:
            raise InputError(f"{n} GPUs but the topology has {n_hosts}", field="straggler_gpus")
        model = {**cfg.model, "batch_size": 2 * n, "num_microbatches": 2}
        spec = {"model": model, "parallel": {"dp": n}, "gpu": cfg.gpu}
        _check(spec, n, f"straggler N={n}")
        slow = {"kind": "gpu", "ranks": [cfg.straggler_rank], "microbatches": [0],
                "passes": ["fwd"], "layers": [0], "seconds": cfg.straggler_delay_s}  # fmt: skip
        for delayed in (False, True):
            out.append(Point(study="straggler", job=spec, wrappers=[slow] if delayed else [],
                             labels={"n_gpus": n, "delayed": delayed}, **common))  # fmt: skip
    return out


def _layout_name(layout: dict[str, Any]) -> str:
    parts = [f"{k}{layout[k]}" for k in ("dp", "tp", "pp", "ep") if layout.get(k, 1) > 1]
    return "".join(parts) + (f"-{layout['schedule']}" if "schedule" in layout else "")


def _check(spec: dict, n_gpus: int, where: str) -> None:
    try:
        _job(spec, n_gpus)
    except InputError as err:
        raise InputError(f"{where}: {err.message}", field=err.field) from err


def _job(spec: dict, n_gpus: int | None = None) -> JobSpec:
    return JobSpec(
        model=ModelSpec(**spec["model"]),
        parallel=ParallelSpec(**spec["parallel"]),
        gpu=GpuSpec(**spec["gpu"]),
        n_gpus=n_gpus,
    )


def run_point(point: Point, run_dir: str) -> dict[str, Any]:
    """Synthesize, (write Chakra,) replay on flowSim; store and return the row (a Ray task)."""
    from m4ray.runtime.fanout import store_row
    from m4ray.sim.flowsim import FlowSimConfig
    from m4ray.sim.replay import Replay
    from m4ray.sim.routing import Routing
    from m4ray.workload import chakra, wrappers
    from m4ray.workload.synth import synthesize

    started = time.perf_counter()
    row: dict[str, Any] = {"run_id": point.run_id, "study": point.study, **point.labels}
    try:
        job = _job(point.job)
        workload = synthesize(job, [wrappers.make(w) for w in point.wrappers])
        if point.write_traces:
            chakra.write(workload, Path(run_dir) / "traces" / point.run_id / "rank",
                         job.gpu.flops_per_s)  # fmt: skip
        topo = point.topology.build()
        routing = Routing(topo)
        backend = FlowSimConfig().build(topo, routing)
        algorithm = point.algorithm.build(topo)
        result = Replay(workload, backend, routing, algorithm,
                        send_latency_s=point.send_latency_s).run()  # fmt: skip
        n = workload.n_ranks
        busy = sum(result.rank_compute_s)
        row.update(
            status="ok",
            error="",
            n_nodes=len(workload.nodes),
            n_flows=len(result.flows.flow_id),
            iteration_s=result.completion_time_s,
            compute_s=max(result.rank_compute_s),
            efficiency=busy / (n * result.completion_time_s),
            idle_gpu_s=n * result.completion_time_s - busy,
        )
    except Exception as err:  # recorded, the sweep goes on
        row.update(status="failed", error=f"{type(err).__name__}: {err}")
    row["wall_s"] = time.perf_counter() - started
    store_row(Path(run_dir), point, row)
    return row


def crashed_point(point: Point, err: BaseException) -> dict[str, Any]:
    from m4ray.runtime.fanout import crash_reason

    return {"run_id": point.run_id, "study": point.study, **point.labels, "status": "failed",
            "error": crash_reason(err), "wall_s": float("nan")}  # fmt: skip


def summary_text(frame: pd.DataFrame, cfg: StudyConfig) -> str:
    ok = frame[frame.status == "ok"]
    lines = ["pipeline bubble: GPU efficiency (compute / iteration time)"]
    bubble = ok[ok.study == "bubble"]
    if len(bubble):
        table = bubble.pivot_table(index="pp", columns="microbatches", values="efficiency")
        lines.append("  pp \\ m" + "".join(f"{int(b):>9}" for b in table.columns))
        for pp, values in table.iterrows():
            lines.append(f"  {int(pp):>6}" + "".join(f"{v:>9.3f}" for v in values))
    scaling = ok[ok.study == "scaling"]
    if len(scaling):
        lines.append("\nmodel size x layout: iteration ms (GPU efficiency)")
        table = scaling.pivot_table(index="hidden", columns="layout", values="iteration_s")
        eff = scaling.pivot_table(index="hidden", columns="layout", values="efficiency")
        lines.append(f"  {'hidden':>7}" + "".join(f"{c:>22}" for c in table.columns))
        for hidden in table.index:
            lines.append(
                f"  {int(hidden):>7}"
                + "".join(
                    f"{table.loc[hidden, c] * 1e3:>14.2f} ({eff.loc[hidden, c]:.2f})"
                    for c in table.columns
                )
            )
    strag = ok[ok.study == "straggler"]
    if len(strag):
        lines.append(f"\nstraggler: +{cfg.straggler_delay_s * 1e3:g} ms on one GPU, one microbatch")
        lines.append(f"  {'GPUs':>6}{'iter ms':>10}{'Δiter ms':>10}{'Δidle GPU·ms':>14}")
        for n, group in strag.groupby("n_gpus"):
            base = group[~group.delayed.astype(bool)]
            slow = group[group.delayed.astype(bool)]
            if len(base) and len(slow):
                b, s = base.iloc[0], slow.iloc[0]
                lines.append(
                    f"  {int(n):>6}{s.iteration_s * 1e3:>10.3f}"
                    f"{(s.iteration_s - b.iteration_s) * 1e3:>10.3f}"
                    f"{(s.idle_gpu_s - b.idle_gpu_s) * 1e3:>14.3f}"
                )
    return "\n".join(lines)


def plot(frame: pd.DataFrame, run_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = frame[frame.status == "ok"]
    out = []
    bubble = ok[ok.study == "bubble"]
    if len(bubble):
        fig, ax = plt.subplots(figsize=(6, 4.5))
        for m, group in bubble.groupby("microbatches"):
            line = group.sort_values("pp")
            ax.plot(line.pp, line.efficiency, marker="o", label=f"m = {int(m)}")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(bubble.pp.unique()), [str(int(p)) for p in sorted(bubble.pp.unique())])
        ax.set_xlabel("pipeline stages p")
        ax.set_ylabel("GPU efficiency (compute / iteration)")
        ax.set_title("Pipeline bubble: smaller batches lose more")
        ax.grid(alpha=0.3)
        ax.legend()
        out.append(_save(fig, run_dir / "plots" / "pipeline_bubble.png"))
    scaling = ok[ok.study == "scaling"]
    if len(scaling):
        fig, ax = plt.subplots(figsize=(6, 4.5))
        for layout, group in scaling.groupby("layout"):
            line = group.groupby("hidden").efficiency.mean()
            ax.plot(line.index, line.to_numpy(), marker="o", label=layout)
        ax.set_xscale("log", base=2)
        ticks = sorted(scaling.hidden.unique())
        ax.set_xticks(ticks, [str(int(t)) for t in ticks])
        ax.set_xlabel("hidden size")
        ax.set_ylabel("GPU efficiency (compute / iteration)")
        ax.set_title("Model size x parallel layout")
        ax.grid(alpha=0.3)
        ax.legend()
        out.append(_save(fig, run_dir / "plots" / "scaling.png"))
    strag = ok[ok.study == "straggler"]
    if len(strag):
        pivot = strag.pivot_table(
            index="n_gpus", columns="delayed", values=["iteration_s", "idle_gpu_s"]
        )
        fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
        n = pivot.index.to_numpy()
        a.plot(n, (pivot["iteration_s"][True] - pivot["iteration_s"][False]) * 1e3, marker="o")
        a.set_xlabel("GPUs (data parallel)")
        a.set_ylabel("Δ iteration time (ms)")
        b.plot(n, (pivot["idle_gpu_s"][True] - pivot["idle_gpu_s"][False]) * 1e3, marker="o")
        b.set_xlabel("GPUs (data parallel)")
        b.set_ylabel("Δ idle GPU time (GPU·ms)")
        for ax in (a, b):
            ax.grid(alpha=0.3)
        fig.suptitle("One straggling GPU in one microbatch")
        out.append(_save(fig, run_dir / "plots" / "straggler.png"))
    return out


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


__all__ = ["Point", "StudyConfig", "points", "run_point"]
