"""m4's completion batching of large components (``M4Config.batch_above_flows``): wall time and
per-flow answers against m4 updated at every completion, beside flowSim, in one run.

    .venv/bin/python bench/m4_batching.py                           # MoE, Spectrum-X 512 GPUs
    .venv/bin/python bench/m4_batching.py --gpus 1024               # the issue's rung (~4 min)
    .venv/bin/python bench/m4_batching.py --configs 0:0.5 64:0.5 128:0.5 256:0.5 128:0.5:float64
    .venv/bin/python bench/m4_batching.py --configs 128:0.5 128:0.1:frozen=1024  # the old default
    .venv/bin/python bench/m4_batching.py --gpus 1024 --lockstep    # rounds, not flows (~15 s)

The job is the scale ladder's MoE job (``conf/experiment/scale.yaml``: Mixtral-like, TP 4,
EP 8, data parallel over the rest) on SimAI's Spectrum-X template, replayed in full (per-flow
table) with the jumbo wire, one simulation at a time in this process. Rows: flowSim; m4 with an
update at every completion (the reference, the default before batching; ``--no-reference``
skips it); m4 with each ``--configs`` entry ``above:fraction[:precision][:frozen=N]``
(components of more than ``above`` flows update at arrivals and once ``fraction`` of their
flows completed, their fluid anchor frozen between updates above ``N`` flows; the default is
``128:0.5:frozen=0``, ``128:0.1:frozen=1024`` before 2026-11-29). Per-flow
differences match flows by (DAG node, source, destination, size, occurrence), so a flow that
started earlier or later in one run is still compared with itself. ``--lockstep`` replays the
job by rank symmetry instead (``m4ray.sim.lockstep``: each distinct collective step once, as one
round of every group's flows from time 0): no per-flow table; the table gives the rounds, the
largest round's flows, its seconds and its time, and the iteration.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from composed import ladder_workload, wire  # noqa: E402

from m4ray.sim.collectives import HierarchicalSpec  # noqa: E402
from m4ray.sim.flowsim import FlowSimConfig  # noqa: E402
from m4ray.sim.m4.backend import M4Config  # noqa: E402
from m4ray.sim.replay import Replay  # noqa: E402
from m4ray.sim.routing import Routing  # noqa: E402
from m4ray.sim.templates import ClusterTemplateSpec  # noqa: E402
from m4ray.sweeps.report import format_table  # noqa: E402
from m4ray.sweeps.scale import synthetic_workload  # noqa: E402

MOE = ladder_workload("moe")  # the scale experiment's job and wire, from conf/
JUMBO = wire("jumbo")


def simulate(gpus: int, config) -> dict:
    """One full replay of the MoE job on ``gpus`` GPUs; its wall time and per-flow FCTs."""
    topo = ClusterTemplateSpec(template="spectrum_x", gpus=gpus).build()
    routing = Routing(topo, wire=JUMBO)
    workload = synthetic_workload("moe", MOE, gpus, 1.0).build(n_hosts=len(topo.hosts))
    backend = config.build(topo, routing)
    start = time.perf_counter()
    result = Replay(workload, backend, routing, HierarchicalSpec().build(topo)).run()
    wall = time.perf_counter() - start
    log = result.flows
    seen: dict[tuple, int] = defaultdict(int)
    fct = {}
    for node, src, dst, size, t0, t1 in zip(
        log.node_id, log.src, log.dst, log.size_bytes, log.start_s, log.finish_s, strict=True
    ):
        key = (node, src, dst, size)
        fct[(*key, seen[key])] = t1 - t0
        seen[key] += 1
    engine = getattr(backend, "engine", None)
    return {
        "wall": wall,
        "iteration": result.completion_time_s,
        "fct": fct,
        "stepped": getattr(engine, "n_stepped_flows", None),
    }


def lockstep(gpus: int, config) -> dict:
    """The MoE job in lockstep: wall time, iteration, and each round's flows, seconds and time."""
    from m4ray.sim import lockstep as ls

    topo = ClusterTemplateSpec(template="spectrum_x", gpus=gpus).build()
    routing = Routing(topo, wire=JUMBO)
    spec = synthetic_workload("moe", {**MOE, "lockstep": True}, gpus, 1.0)
    replay = ls.LockstepReplay.of_spec(
        spec, topo, routing, config, HierarchicalSpec().build(topo), send_latency_s=3e-6
    )
    rounds = []
    timer = replay.timer
    run_round = timer._run

    def timed(batch, paths):
        start = time.perf_counter()
        out = run_round(batch, paths)
        rounds.append((len(batch), time.perf_counter() - start, out))
        return out

    timer._run = timed
    start = time.perf_counter()
    result = replay.run()
    return {
        "wall": time.perf_counter() - start,
        "iteration": result.completion_time_s,
        "rounds": rounds,
    }


def lockstep_table(gpus: int, runs: list) -> None:
    rows = []
    for name, config in runs:
        out = lockstep(gpus, config)
        flows, seconds, at = max(out["rounds"])
        rows.append(
            [
                name,
                f"{out['wall']:.2f}",
                len(out["rounds"]),
                f"{flows:,}",
                f"{seconds:.2f}",
                f"{at * 1e6:.2f}",
                f"{out['iteration'] * 1e3:.4f}",
            ]
        )
        print(f"  {name}: {out['wall']:.1f} s", file=sys.stderr, flush=True)
    print(f"MoE job, Spectrum-X {gpus} GPUs, lockstep")
    headers = ["backend", "wall s", "rounds", "largest round", "its s", "its us", "iteration ms"]
    print(format_table(headers, rows))


def parse(entry: str) -> tuple[str, M4Config]:
    above, fraction, *rest = entry.split(":")
    options = {}  # else M4Config's (float32, every batched component's anchor frozen)
    for option in rest:
        if option.startswith("frozen="):
            options["batch_frozen_above"] = int(option.removeprefix("frozen="))
        else:
            options["precision"] = option
    config = M4Config(batch_above_flows=int(above), batch_fraction=float(fraction), **options)
    frozen = config.batch_frozen_above
    return (
        f"m4, batched above {above} flows at {fraction}, anchors frozen above {frozen}, "
        f"{config.precision}",
        config,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpus", type=int, default=512)
    parser.add_argument("--configs", nargs="*", default=["128:0.5", "128:0.1:frozen=1024"])
    parser.add_argument("--no-reference", action="store_true")
    parser.add_argument("--lockstep", action="store_true", help="replay by rank symmetry")
    args = parser.parse_args()

    runs = [("flowSim", FlowSimConfig())]
    if not args.no_reference:
        runs.append(("m4, every completion", M4Config(batch_above_flows=None)))
    runs += [parse(entry) for entry in args.configs]
    simulate(32, M4Config())  # load the model, build the compiled parts
    if args.lockstep:
        lockstep_table(args.gpus, runs)
        return
    out = {}
    for name, config in runs:
        out[name] = simulate(args.gpus, config)
        print(f"  {name}: {out[name]['wall']:.1f} s", file=sys.stderr, flush=True)
    fs_wall = out["flowSim"]["wall"]
    reference = out.get("m4, every completion")
    rows = []
    for name, run in out.items():
        row = [
            name,
            f"{run['wall']:.1f}",
            f"{run['wall'] / fs_wall:.1f}x",
            f"{run['iteration'] * 1e3:.3f}",
            "" if run["stepped"] is None else f"{run['stepped']:,}",
        ]
        if reference is not None and name.startswith("m4"):
            keys = [k for k in reference["fct"] if k in run["fct"]]
            ref = np.array([reference["fct"][k] for k in keys])
            err = np.abs(np.array([run["fct"][k] for k in keys]) / ref - 1)
            row += [
                f"{run['iteration'] / reference['iteration'] - 1:+.3%}",
                f"{len(keys):,}/{len(reference['fct']):,}",
                f"{err.mean():.4f}",
                f"{np.quantile(err, 0.99):.4f}",
                f"{err.max():.3f}",
            ]
        else:
            row += [""] * 5
        rows.append(row)
    print(
        f"MoE job, Spectrum-X {args.gpus} GPUs, full replay ({len(out['flowSim']['fct']):,} flows)"
    )
    print(
        format_table(
            [
                "backend",
                "wall s",
                "vs flowSim",
                "iteration ms",
                "stepped flows",
                "iteration vs every",
                "flows matched",
                "FCT |r-1| mean",
                "p99",
                "max",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
