"""Every real SimAI/AICB workload file under a folder: parsed, unrolled and replayed on flowSim.

    .venv/bin/python bench/simai_workloads.py ../shared/data
    .venv/bin/python bench/simai_workloads.py ../shared/data --max-gpus 1024 --scale 0.1

Looks for ``*.txt`` under ``<data>/simai_workloads/`` and ``<data>/simai/workload/``. Each file is
parsed (header, policy, groups, comm types); jobs of at most ``--max-gpus`` GPUs (default 256)
are unrolled into the per-rank DAG and replayed on flowSim over a rail cluster just big enough
(8 GPUs per server, ``workload.scale`` = ``--scale``); a file without ``all_gpus`` (old AICB
header) runs on 32 GPUs, the way it would span a user's topology. Larger jobs are parsed and
sized only: their DAG (ranks × rows × columns) does not fit this machine's memory in Python
(the scale issue's remaining work). Prints one row per file.
"""

from __future__ import annotations

import argparse
import logging
import math
import time
from pathlib import Path

OLD_HEADER_GPUS = 32


def replay(path: Path, n_gpus: int, scale: float) -> dict:
    from m4ray.sim.collectives import HierarchicalSpec
    from m4ray.sim.flowsim import FlowSimConfig
    from m4ray.sim.replay import Replay
    from m4ray.sim.routing import Routing, WireFormat
    from m4ray.sim.simai import SimAIWorkloadSpec
    from m4ray.sim.topologies import rail_cluster

    topo = rail_cluster(servers=max(1, math.ceil(n_gpus / 8)))
    routing = Routing(topo, wire=WireFormat(mtu_bytes=8948, header_bytes=54))
    t0 = time.perf_counter()
    workload = SimAIWorkloadSpec(path=str(path), scale=scale).build(n_hosts=n_gpus)
    backend = FlowSimConfig().build(topo, routing)
    result = Replay(workload, backend, routing, HierarchicalSpec().build(topo)).run()
    return {
        "nodes": len(workload.nodes),
        "flows": len(result.flows.flow_id),
        "iteration_ms": result.completion_time_s * 1e3,
        "wall_s": time.perf_counter() - t0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data", type=Path, help="the shared data folder")
    parser.add_argument("--max-gpus", type=int, default=256)
    parser.add_argument("--scale", type=float, default=0.01, help="message scale for replays")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # the parser's warnings are summarised per row

    from m4ray.sim.simai import parse_simai
    from m4ray.sweeps.report import format_table

    files = sorted((args.data / "simai_workloads").rglob("*.txt"))
    files += sorted((args.data / "simai" / "workload").glob("*.txt"))
    rows = []
    for path in files:
        name = str(path.relative_to(args.data))
        try:
            model = parse_simai(path)
        except Exception as err:  # a file that does not load is the finding: report it
            rows.append([name, "", "", "", "", f"parse failed: {err}"])
            continue
        p = model.params
        n = p.get("all_gpus") or OLD_HEADER_GPUS
        layout = f"tp{p.get('model_parallel_NPU_group', 1)} ep{p.get('ep', 1)} pp{p.get('pp', 1)}"
        header = "new" if "all_gpus" in p else "old"
        cells = [name, f"{model.policy} ({header})", f"{n:,}", layout, f"{len(model.layers):,}"]
        if n > args.max_gpus:
            cells.append(f"parsed; DAG not built (> {args.max_gpus} GPUs)")
        else:
            try:
                r = replay(path, n, args.scale)
                cells.append(
                    f"{r['flows']:,} flows, iteration {r['iteration_ms']:.3f} ms, "
                    f"{r['wall_s']:.1f} s wall"
                )
            except Exception as err:
                cells.append(f"replay failed: {err}")
        rows.append(cells)
        print(f"  {name}: {cells[-1]}", flush=True)
    print()
    head = ["file", "policy (header)", "GPUs", "layout", "rows", f"flowSim, scale {args.scale:g}"]
    print(format_table(head, rows))


if __name__ == "__main__":
    main()
