"""flowSim speed: the full-size microAllReduce on the 32-GPU rail cluster, and 10k-flow traces.

    .venv/bin/python bench/flowsim_speed.py [--repeat 3]

Prints one table: per case the flows, events (arrivals + completions), best wall time of
``--repeat`` runs and events per second. Numbers live here, not in tests.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from m4ray.sim.collectives import HierarchicalSpec, RingSpec
from m4ray.sim.failures import GrayFailure
from m4ray.sim.flows import Flow
from m4ray.sim.flowsim import FlowSimConfig
from m4ray.sim.replay import Replay
from m4ray.sim.routing import Routing
from m4ray.sim.topologies import fat_tree, rail_cluster
from m4ray.sim.trace import run_trace
from m4ray.sweeps.report import format_table
from m4ray.workload.simai import SimAIWorkloadSpec


def replay_case(collective):
    topo = GrayFailure(n_degraded=8, reduction=4).apply(rail_cluster())
    routing = Routing(topo)
    workload = SimAIWorkloadSpec(path="microAllReduce").build()
    backend = FlowSimConfig().build(topo, routing)
    start = time.perf_counter()
    result = Replay(workload, backend, routing, collective.build(topo)).run()
    return time.perf_counter() - start, len(result.flows.flow_id), backend.n_events


def trace_flows(n_flows: int, n_hosts: int, load: float, bandwidth_bps: float, seed: int = 0):
    """Random host pairs, log-normal sizes (mean ~ 50 KB), Poisson arrivals at a target
    per-host load."""
    rng = np.random.default_rng(seed)
    sizes = np.maximum(50, rng.lognormal(np.log(20_000), 1.3, n_flows)).astype(int)
    rate = load * n_hosts * bandwidth_bps / (sizes.mean() * 8)  # flows per second
    starts = np.cumsum(rng.exponential(1 / rate, n_flows))
    pairs = [rng.choice(n_hosts, 2, replace=False) for _ in range(n_flows)]
    return [
        Flow(i, int(s), int(d), int(sizes[i]), float(starts[i])) for i, (s, d) in enumerate(pairs)
    ]


def trace_case(topo, load):
    flows = trace_flows(10_000, len(topo.hosts), load, topo.bandwidth_bps.min())
    routing = Routing(topo)
    events = []

    class Counting(FlowSimConfig):
        def build(self, topology, routing):
            backend = super().build(topology, routing)
            events.append(backend)
            return backend

    start = time.perf_counter()
    run_trace(topo, flows, Counting(), routing)
    return time.perf_counter() - start, len(flows), events[0].n_events


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    cases = {
        "microAllReduce N=8 R=4, hierarchical": lambda: replay_case(HierarchicalSpec()),
        "microAllReduce N=8 R=4, flat ring": lambda: replay_case(RingSpec()),
        "10k-flow trace, fat-tree k=8, load 0.3": lambda: trace_case(fat_tree(k=8), 0.3),
        "10k-flow trace, fat-tree k=8, load 0.6": lambda: trace_case(fat_tree(k=8), 0.6),
    }
    rows = []
    for name, case in cases.items():
        runs = [case() for _ in range(args.repeat)]
        wall, flows, events = min(runs)
        rows.append([name, flows, events, f"{wall:.3f}", f"{events / wall:,.0f}"])
    print(format_table(["case", "flows", "events", "best wall s", "events/s"], rows))


if __name__ == "__main__":
    main()
