"""The scale ladder (``+experiment=scale``): one training iteration of a GPT-13B-class job and of
a mixture-of-experts job on SimAI cluster templates of growing size, on flowSim and m4.

Every rung × workload × backend is one Ray task that builds the topology from its template,
synthesizes the job for that many GPUs (tensor parallel inside a server, data parallel across
them; expert parallel for the MoE job), replays it and records the wall time, the peak resident
memory the task reached, the flows and events simulated, and the iteration's completion time.
The report puts m4 beside flowSim per rung and draws wall time against GPUs on log-log axes.

Writes ``results.parquet``, ``runs/<run_id>.json`` (resumable), ``plots/scale_wall.png`` and
``manifest.json`` into the run directory.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from m4ray.errors import InputError
from m4ray.fingerprint import fingerprint
from m4ray.runtime.rundir import write_manifest, write_results

DEFAULT_RUNGS = [
    {"template": "spectrum_x", "gpus": 32},
    {"template": "spectrum_x", "gpus": 128},
    {"template": "spectrum_x", "gpus": 512},
    {"template": "spectrum_x", "gpus": 1024},
    {"template": "alibaba_hpn", "gpus": 1024},
]


@dataclass(kw_only=True, slots=True)
class LadderConfig:
    """``rungs``: ``{template, gpus}`` (any :class:`~m4ray.sim.templates.ClusterTemplateSpec`
    field); ``workloads``: name → ``{model, parallel, batch_per_replica}``, where ``parallel``
    leaves out ``dp`` (the rung's GPUs ÷ tp·pp) and ``model.batch_size`` is
    ``batch_per_replica`` · dp, or name → ``{simai: <file>, lockstep: bool}``, a SimAI/AICB
    text workload (``lockstep``: replayed by rank symmetry, :mod:`m4ray.sim.lockstep`; a file
    without ``all_gpus`` spans the rung); ``backends``: names in ``backend_options``;
    ``scale`` multiplies message sizes (1 = the real job)."""

    rungs: list[dict[str, Any]] = field(default_factory=lambda: [dict(r) for r in DEFAULT_RUNGS])
    workloads: dict[str, dict[str, Any]] = field(default_factory=dict)  # conf/experiment/scale
    backends: list[str] = field(default_factory=lambda: ["flowsim", "m4"])
    scale: float = 1.0


@dataclass(kw_only=True, slots=True)
class Rung:
    """One simulation of the ladder (what crosses the Ray boundary)."""

    topology: Any
    workload: Any
    workload_name: str
    backend: str
    backend_config: Any
    collective: Any
    wire: Any
    send_latency_s: float
    labels: dict[str, Any]

    @property
    def run_id(self) -> str:
        key = [self.topology, self.workload, self.backend_config, self.collective, self.wire]
        return f"{self.labels['template']}-{self.labels['gpus']}-{self.workload_name}-" + (
            f"{self.backend}-{fingerprint([*key, self.send_latency_s], 8)}"
        )


def rungs(cfg) -> list[Rung]:
    """Every rung × workload × backend, checked (topology sizes, layouts) before any task."""
    from m4ray.sim.templates import ClusterTemplateSpec

    ladder: LadderConfig = cfg.ladder
    for name in ladder.backends:
        if name not in cfg.backend_options:
            raise InputError(
                f"unknown backend '{name}' (have: {', '.join(cfg.backend_options)})",
                field="ladder.backends",
            )
    if not ladder.workloads or not ladder.rungs or not ladder.backends:
        raise InputError("needs rungs, workloads and backends", field="ladder")
    out = []
    for i, rung in enumerate(ladder.rungs):
        try:
            spec = ClusterTemplateSpec(**rung)
        except TypeError as err:
            raise InputError(str(err), field=f"ladder.rungs[{i}]") from None
        topo = spec.build()  # raises InputError on sizes the template cannot take
        for name, w in ladder.workloads.items():
            if "simai" in w:
                workload = simai_workload(name, w, spec.gpus, ladder.scale)
            else:
                workload = synthetic_workload(name, w, spec.gpus, ladder.scale)
            for backend in ladder.backends:
                out.append(
                    Rung(
                        topology=spec,
                        workload=workload,
                        workload_name=name,
                        backend=backend,
                        backend_config=cfg.backend_options[backend],
                        collective=cfg.collective,
                        wire=cfg.wire,
                        send_latency_s=cfg.send_latency_s,
                        labels={
                            "template": spec.template,
                            "gpus": spec.gpus,
                            "nodes": topo.n_nodes,
                            "links": len(topo.cables),
                            "workload": name,
                            "replay": "lockstep"
                            if getattr(workload, "lockstep", False)
                            else "full",
                            "backend": backend,
                        },
                    )
                )
    return out


def synthetic_workload(name: str, w: dict[str, Any], gpus: int, scale: float):
    """The synthetic job of a ladder entry sized for ``gpus`` (dp fills the rung), checked."""
    from m4ray.workload.synth import SyntheticWorkloadSpec

    parallel = dict(w.get("parallel", {}))
    tp, pp = parallel.get("tp", 1), parallel.get("pp", 1)
    if gpus % (tp * pp):
        raise InputError(
            f"{gpus} GPUs do not split into tp {tp} x pp {pp}",
            field=f"ladder.workloads.{name}.parallel",
        )
    parallel["dp"] = gpus // (tp * pp)
    model = {**w.get("model", {})}
    model["batch_size"] = w.get("batch_per_replica", 1) * parallel["dp"]
    lockstep = bool(w.get("lockstep", False))
    workload = SyntheticWorkloadSpec(model=model, parallel=parallel, scale=scale, lockstep=lockstep)
    workload.job()  # checks the layout (ep, batch) before any task: InputError
    return workload


def simai_workload(name: str, w: dict[str, Any], gpus: int, scale: float):
    """A SimAI/AICB file of a ladder entry, checked against the rung: its header parses, its
    layout splits, and its job fits the rung's GPUs."""
    from m4ray.workload.simai import SimAIWorkloadSpec, job_groups

    field_name = f"ladder.workloads.{name}"
    unknown = set(w) - {"simai", "lockstep"}
    if unknown:
        raise InputError(
            f"unknown keys {sorted(unknown)} (valid: simai, lockstep)", field=field_name
        )
    spec = SimAIWorkloadSpec(path=str(w["simai"]), scale=scale, lockstep=bool(w.get("lockstep")))
    groups = job_groups(spec.model(), source=spec.resolve(), n_hosts=gpus)
    if groups.n > gpus:
        raise InputError(f"the job needs {groups.n} GPUs, the rung has {gpus}", field=field_name)
    return spec


def run_rung(rung: Rung, run_dir: str) -> dict[str, Any]:
    """Build, synthesize and replay one rung; store and return its row (a Ray task)."""
    from m4ray.runtime.fanout import store_row
    from m4ray.runtime.memory import PeakRss
    from m4ray.sim.lockstep import LockstepReplay
    from m4ray.sim.replay import Replay
    from m4ray.sim.routing import Routing

    row: dict[str, Any] = {"run_id": rung.run_id, **rung.labels}
    started = time.perf_counter()
    try:
        with PeakRss() as memory:
            topo = rung.topology.build()
            routing = Routing(topo, wire=rung.wire)
            algorithm = rung.collective.build(topo)
            if getattr(rung.workload, "lockstep", False):
                lockstep = LockstepReplay.of_spec(
                    rung.workload,
                    topo,
                    routing,
                    rung.backend_config,
                    algorithm,
                    send_latency_s=rung.send_latency_s,
                )
                build_s = time.perf_counter() - started
                result = lockstep.run()
                flows, ranks = result.flows_represented, result.n_ranks
                events = 2 * result.flows_simulated  # the rounds' flows: what actually ran
            else:
                workload = rung.workload.build(n_hosts=len(topo.hosts))
                backend = rung.backend_config.build(topo, routing)
                build_s = time.perf_counter() - started
                replay = Replay(
                    workload, backend, routing, algorithm, send_latency_s=rung.send_latency_s
                )
                result = replay.run()
                flows, ranks = len(result.flows.flow_id), workload.n_ranks
                events = 2 * flows  # an arrival and a completion per flow
        wall = time.perf_counter() - started
        row.update(
            status="ok",
            error="",
            completion_time_s=result.completion_time_s,
            flows=flows,
            ranks=ranks,
            events=events,
            wall_s=wall,
            build_s=build_s,
            events_per_s=events / max(wall - build_s, 1e-9),
            peak_rss_mb=memory.peak,
            rss_growth_mb=memory.peak - memory.start,
        )
    except Exception as err:  # bad input or a bug: the row keeps the reason, the ladder goes on
        row.update(status="failed", error=f"{type(err).__name__}: {err}")
    row.setdefault("wall_s", time.perf_counter() - started)
    store_row(Path(run_dir), rung, row)
    return row


def _crashed(rung: Rung, err: BaseException) -> dict[str, Any]:
    from m4ray.runtime.fanout import crash_reason

    return {"run_id": rung.run_id, **rung.labels, "status": "failed", "error": crash_reason(err)}


def compare(frame: pd.DataFrame, reference: str = "flowsim") -> pd.DataFrame:
    """Per rung and workload: each backend's wall time, memory and completion time, and its
    completion time's difference from ``reference``'s."""
    ok = frame[frame.status == "ok"].copy()
    if ok.empty:
        return ok
    keys = ["template", "gpus", "workload"]
    ref = ok[ok.backend == reference].set_index(keys)["completion_time_s"]
    ok["vs_" + reference] = [
        row.completion_time_s / ref.get(tuple(row[k] for k in keys), float("nan")) - 1
        for _, row in ok.iterrows()
    ]
    return ok.sort_values([*keys, "backend"])


def summary_text(frame: pd.DataFrame) -> str:
    from m4ray.sweeps.report import format_table

    table = compare(frame)
    rows = [
        [
            r.template,
            r.gpus,
            r.nodes,
            r.links,
            r.workload + (" (lockstep)" if getattr(r, "replay", "full") == "lockstep" else ""),
            r.backend,
            r.flows,
            f"{r.completion_time_s * 1e3:.2f}",
            f"{r.vs_flowsim:+.1%}" if pd.notna(r.vs_flowsim) else "",
            f"{r.wall_s:.1f}",
            f"{r.events_per_s:,.0f}",
            f"{r.peak_rss_mb:.0f}",
        ]
        for r in table.itertuples()
    ]
    head = ["template", "GPUs", "nodes", "links", "workload", "backend", "flows"]
    head += ["iteration ms", "vs flowSim", "wall s", "events/s", "peak RSS MB"]
    return format_table(head, rows)


def plot(frame: pd.DataFrame, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = frame[frame.status == "ok"]
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for (template, workload, backend), points in ok.groupby(["template", "workload", "backend"]):
        line = points.sort_values("gpus")
        style = "o-" if backend == "m4" else "s--"
        ax.plot(line.gpus, line.wall_s, style, label=f"{backend} · {workload} · {template}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("GPUs")
    ax.set_ylabel("wall time of one iteration (s)")
    ax.set_title("Simulating one training iteration, 2-core machine")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


SECTIONS = {"ladder": LadderConfig}  # checked before run


def run(cfg, raw_config: dict[str, Any]) -> Path:
    from m4ray.runtime.fanout import read_ok_row, run_many

    started = time.perf_counter()
    todo = rungs(cfg)
    run_dir = Path(cfg.paths.run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    print(
        f"scale ladder: {len(cfg.ladder.rungs)} clusters x {len(cfg.ladder.workloads)} jobs x "
        f"{len(cfg.ladder.backends)} backends = {len(todo)} simulations into {run_dir}"
    )
    rows = run_many(todo, run_dir, cfg.ray, progress=cfg.progress, task=run_rung, load=read_ok_row,
                    crashed=_crashed)  # fmt: skip
    frame = pd.DataFrame(rows)
    files = [write_results(frame, run_dir), plot(frame, run_dir / "plots" / "scale_wall.png")]
    write_manifest(run_dir, raw_config, files, frame=frame)
    print()
    print(summary_text(frame))
    for _, row in frame[frame.status != "ok"].iterrows():
        print(f"  failed {row.run_id}: {row.error}")
    print(
        f"\n{(frame.status == 'ok').sum()}/{len(frame)} ok in "
        f"{time.perf_counter() - started:.1f} s; outputs: {run_dir}"
    )
    if not (frame.status == "ok").any():
        raise SystemExit(1)
    return run_dir


__all__ = ["LadderConfig", "Rung", "compare", "run", "run_rung", "rungs", "summary_text"]
