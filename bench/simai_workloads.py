"""Every real SimAI/AICB workload file under a folder: parsed and replayed on flowSim, in full
and in lockstep (``m4ray.sim.lockstep``), side by side.

    .venv/bin/python bench/simai_workloads.py ../shared/data
    .venv/bin/python bench/simai_workloads.py ../shared/data --max-gpus 1024 --scale 0.1
    .venv/bin/python bench/simai_workloads.py ../shared/data --failure 8 4 --scale 1

Looks for ``*.txt`` under ``<data>/simai_workloads/`` and ``<data>/simai/workload/``. Each file is
parsed (header, policy, groups, comm types) and replayed on flowSim (``workload.scale`` =
``--scale``, hierarchical collectives, the jumbo wire) over the SimAI template that fits it:
Spectrum-X up to 4,096 GPUs, AlibabaHPN beyond (``--failure N R``: N GPUs' links at 1/R). A
file without ``all_gpus`` (old AICB header) runs on 32 GPUs, the way it would span a user's
topology. Jobs of at most ``--max-gpus`` GPUs (default 256) are replayed both ways, the full
per-rank DAG and lockstep, and the table gives their difference; larger ones (the 9,216-GPU
``workload_analytical.txt``: ~10^8 DAG nodes) in lockstep only. Prints one row per file.
"""

from __future__ import annotations

import argparse
import logging
import math
import time
from pathlib import Path

OLD_HEADER_GPUS = 32
# Published totals of other tools for a file, printed beside ours (not checked; different models)
PUBLISHED_S = {
    "workload_analytical.txt": (
        7.545619,
        "SimAI_analytical -g 9216 -nv 360 -nic 48.5 -n_p_s 8 -g_p_s 8 (SimAI PR #294, "
        "reference/scale.md; unit taken as us): bus-bandwidth formulas, no congestion, and the "
        "PP bubble and exposed PP added",
    ),
}


def setup(n_gpus: int, failure: tuple[int, int]):
    """A fresh topology and routing (each replay builds its own, so neither's wall time gains
    from the other's warmed path caches)."""
    from m4ray.sim.collectives import HierarchicalSpec
    from m4ray.sim.failures import GrayFailure
    from m4ray.sim.routing import Routing, WireFormat
    from m4ray.sim.templates import ClusterTemplateSpec

    template = "spectrum_x" if n_gpus <= 4096 else "alibaba_hpn"
    gpus = max(8, math.ceil(n_gpus / 8) * 8)
    topo = ClusterTemplateSpec(template=template, gpus=gpus).build()
    topo = GrayFailure(n_degraded=failure[0], reduction=failure[1]).apply(topo)
    routing = Routing(topo, wire=WireFormat(mtu_bytes=8948, header_bytes=54))
    return f"{template} {gpus}", topo, routing, HierarchicalSpec().build(topo)


def full(path: Path, n_gpus: int, scale: float, failure: tuple[int, int]) -> dict:
    from m4ray.sim.flowsim import FlowSimConfig
    from m4ray.sim.replay import Replay
    from m4ray.workload.simai import SimAIWorkloadSpec

    _, topo, routing, algorithm = setup(n_gpus, failure)
    t0 = time.perf_counter()
    workload = SimAIWorkloadSpec(path=str(path), scale=scale).build(n_hosts=n_gpus)
    backend = FlowSimConfig().build(topo, routing)
    result = Replay(workload, backend, routing, algorithm).run()
    return {
        "flows": len(result.flows.flow_id),
        "iteration_s": result.completion_time_s,
        "wall_s": time.perf_counter() - t0,
    }


def lockstep(path: Path, n_gpus: int, scale: float, failure: tuple[int, int]) -> dict:
    from tqdm.auto import tqdm

    from m4ray.sim.flowsim import FlowSimConfig
    from m4ray.sim.lockstep import LockstepReplay
    from m4ray.workload.simai import SimAIProgram, parse_simai

    name, topo, routing, algorithm = setup(n_gpus, failure)
    t0 = time.perf_counter()
    program = SimAIProgram(parse_simai(path), n_hosts=len(topo.hosts), scale=scale, source=path)
    result = LockstepReplay(
        program,
        topo,
        routing,
        FlowSimConfig(),
        algorithm,
        progress=lambda items: tqdm(items, desc=f"{path.name} collectives", leave=False),
    ).run()
    return {
        "topology": name,
        "flows": result.flows_represented,
        "simulated": result.flows_simulated,
        "iteration_s": result.completion_time_s,
        "wall_s": time.perf_counter() - t0,
        "result": result,
    }


def print_big(big: list) -> None:
    """The lockstep-only jobs: their iteration split, a published total, their collectives."""
    from m4ray.sim.lockstep import describe
    from m4ray.sweeps.report import format_table

    for name, result in big:
        ours = result.completion_time_s
        print(
            f"\n{name}: iteration {ours:.3f} s = compute {result.compute_s:.3f} s + exposed "
            f"communication {result.exposed_comm_s:.3f} s"
        )
        published = PUBLISHED_S.get(Path(name).name)
        if published:
            print(f"  published: {published[0]:.3f} s (ours {ours / published[0] - 1:+.1%}),")
            print(f"  {published[1]}")
        print(f"{name}: its collectives, slowest first (per call, all groups together)")
        head = ["kind", "group", "bytes", "groups", "calls", "steps", "flows", "ms"]
        print(format_table(head, describe(result)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data", type=Path, help="the shared data folder")
    parser.add_argument("--max-gpus", type=int, default=256, help="largest job replayed in full")
    parser.add_argument("--scale", type=float, default=0.01, help="message scale for replays")
    parser.add_argument("--failure", type=int, nargs=2, default=(0, 1), metavar=("N", "R"))
    parser.add_argument("--only", default="", help="files whose name contains this")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # the parser's warnings are summarised per row

    from m4ray.sweeps.report import format_table
    from m4ray.workload.simai import parse_simai

    files = sorted((args.data / "simai_workloads").rglob("*.txt"))
    files += sorted((args.data / "simai" / "workload").glob("*.txt"))
    files = [f for f in files if args.only in f.name]
    failure = tuple(args.failure)
    rows, big = [], []
    for path in files:
        name = str(path.relative_to(args.data))
        try:
            model = parse_simai(path)
        except Exception as err:  # a file that does not load is the finding: report it
            rows.append([name, "", "", "", "", "", f"parse failed: {err}", "", "", ""])
            continue
        p = model.params
        n = p.get("all_gpus") or OLD_HEADER_GPUS
        layout = f"tp{p.get('model_parallel_NPU_group', 1)} ep{p.get('ep', 1)} pp{p.get('pp', 1)}"
        header = "new" if "all_gpus" in p else "old"
        cells = [name, f"{model.policy} ({header})", f"{n:,}", layout, f"{len(model.layers):,}"]
        try:
            lock = lockstep(path, n, args.scale, failure)
            cells += [
                lock["topology"],
                f"{lock['flows']:,} ({lock['simulated']:,} run)",
                f"{lock['iteration_s'] * 1e3:.3f}",
                f"{lock['wall_s']:.1f}",
            ]
            if n <= args.max_gpus:
                ref = full(path, n, args.scale, failure)
                diff = lock["iteration_s"] / ref["iteration_s"] - 1
                cells.append(
                    f"{ref['iteration_s'] * 1e3:.3f} ms in {ref['wall_s']:.1f} s: {diff:+.2%}"
                )
            else:
                cells.append(f"(> {args.max_gpus} GPUs: lockstep only)")
                big.append((name, lock["result"]))
        except Exception as err:
            cells += ["", "", "", "", f"replay failed: {type(err).__name__}: {err}"]
        rows.append(cells)
        print(f"  {name}: {' | '.join(cells[5:])}", flush=True)
    print()
    head = [
        "file",
        "policy (header)",
        "GPUs",
        "layout",
        "rows",
        "topology",
        "flows (lockstep ran)",
        "lockstep iteration ms",
        "lockstep wall s",
        "full replay: iteration, wall, lockstep diff",
    ]
    print(f"flowSim, workload.scale {args.scale:g}, failure N={failure[0]} R={failure[1]}:")
    print(format_table(head, rows))
    print_big(big)


if __name__ == "__main__":
    main()
