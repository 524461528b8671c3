"""Synthetic workload cost: synthesis time, DAG size and Chakra size for a 64-GPU and a
1,024-GPU job, and replay time of the 64-GPU job on flowSim (rail cluster, 8 servers × 8 GPUs).

    .venv/bin/python bench/workload_speed.py [--skip-replay]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from m4ray.sim.collectives import HierarchicalSpec
from m4ray.sim.flowsim import FlowSimConfig
from m4ray.sim.replay import Replay
from m4ray.sim.routing import Routing
from m4ray.sim.topologies import RailClusterSpec
from m4ray.workload import chakra
from m4ray.workload.spec import JobSpec
from m4ray.workload.synth import synthesize

GPT = {"hidden_size": 4096, "num_heads": 32, "sequence_len": 2048, "vocab_size": 50257}
CASES = {
    "64 GPUs (dp4 tp8 pp2, 16 layers, m=4)": JobSpec(
        model={**GPT, "num_layers": 16, "batch_size": 16, "num_microbatches": 4},
        parallel={"dp": 4, "tp": 8, "pp": 2, "schedule": "1f1b"},
        gpu={},
    ),
    "1024 GPUs (dp32 tp8 pp4, 32 layers, m=8)": JobSpec(
        model={**GPT, "num_layers": 32, "batch_size": 256, "num_microbatches": 8},
        parallel={"dp": 32, "tp": 8, "pp": 4, "schedule": "1f1b"},
        gpu={},
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-replay", action="store_true")
    args = parser.parse_args()
    rows = []
    first = None
    with tempfile.TemporaryDirectory() as tmp:
        for name, job in CASES.items():
            start = time.perf_counter()
            workload = synthesize(job)
            synth_s = time.perf_counter() - start
            start = time.perf_counter()
            paths = chakra.write(workload, Path(tmp) / name.split()[0] / "et", job.gpu.flops_per_s)
            write_s = time.perf_counter() - start
            size = sum(p.stat().st_size for p in paths)
            start = time.perf_counter()
            chakra.read(Path(tmp) / name.split()[0] / "et")
            read_s = time.perf_counter() - start
            rows.append((name, len(workload.nodes), synth_s, write_s, read_s, size))
            first = first or workload
    print(f"{'job':<42}{'nodes':>10}{'synth s':>9}{'write s':>9}{'read s':>9}{'Chakra MB':>11}")
    for name, nodes, synth_s, write_s, read_s, size in rows:
        print(
            f"{name:<42}{nodes:>10}{synth_s:>9.2f}{write_s:>9.2f}{read_s:>9.2f}{size / 1e6:>11.1f}"
        )
    if args.skip_replay:
        return
    spec = RailClusterSpec(servers=8)
    topo = spec.build()
    routing = Routing(topo)
    backend = FlowSimConfig().build(topo, routing)
    algorithm = HierarchicalSpec().build(topo)
    start = time.perf_counter()
    result = Replay(first, backend, routing, algorithm).run()
    wall = time.perf_counter() - start
    n_flows = len(result.flows.flow_id)
    print(
        f"\nreplay of the 64-GPU job on flowSim (rail, 8 x 8 GPUs): {wall:.1f} s wall, "
        f"{n_flows} flows ({n_flows / wall:,.0f} flows/s), iteration "
        f"{result.completion_time_s * 1e3:.2f} ms, exposed comm "
        f"{result.exposed_comm_s * 1e3:.2f} ms"
    )


if __name__ == "__main__":
    main()
