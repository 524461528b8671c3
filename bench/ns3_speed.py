"""ns-3 backend speed per transport (RDMA, TCP) and a full-scale gray-failure scenario, ns-3 next
to flowSim.

    .venv/bin/python bench/ns3_speed.py            # all cases (~10 min on 2 cores)
    .venv/bin/python bench/ns3_speed.py --quick    # skip the full-scale scenario

Each case runs in a fresh subprocess so its CPU time and peak memory are its own. Prints one table:
payload MB per CPU-second (the cost per payload byte), ns-3 events per second, median slowdown and
peak RSS for a 100-flow trace on the 32-GPU rail cluster at MTU 1500 and 9000, for each transport
side by side with the RDMA/TCP speed ratio; then the wall time of the full-size microAllReduce
with N=8, R=4 on ns-3 (both transports) and on flowSim with the ratios.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import numpy as np


def trace_case(mtu_payload: int, transport: str) -> dict:
    from m4ray.sim.flows import Flow
    from m4ray.sim.ns3.backend import Ns3Config
    from m4ray.sim.ns3.loader import load
    from m4ray.sim.routing import Routing, WireFormat
    from m4ray.sim.topologies import rail_cluster
    from m4ray.sim.trace import run_trace

    rng = np.random.default_rng(0)
    topo = rail_cluster()
    pairs = [rng.choice(32, 2, replace=False) for _ in range(100)]
    flows = [
        Flow(
            i, int(s), int(d), int(rng.integers(1_000_000, 10_000_000)), float(rng.uniform(0, 1e-3))
        )
        for i, (s, d) in enumerate(pairs)
    ]
    routing = Routing(topo, wire=WireFormat(mtu_bytes=mtu_payload, header_bytes=54))
    ns = load()
    cpu0 = time.process_time()
    table = run_trace(topo, flows, Ns3Config(transport=transport), routing)
    cpu = time.process_time() - cpu0
    payload_mb = sum(f.size_bytes for f in flows) / 1e6
    return {
        "case": f"100-flow trace, rail32, MTU {mtu_payload + 52}, {transport}",
        "cpu_s": cpu,
        "events": int(ns.Simulator.GetEventCount()),
        "mb_per_cpu_s": payload_mb / cpu,
        "slowdown_p50": float(np.median(table.column("slowdown").to_numpy())),
        "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def scenario_case(backend: str) -> dict:
    from m4ray.sim.failures import GrayFailure
    from m4ray.sim.flowsim import FlowSimConfig
    from m4ray.sim.ns3.backend import Ns3Config
    from m4ray.sim.routing import WireFormat
    from m4ray.sim.scenario import Scenario, simulate
    from m4ray.workload.simai import SimAIWorkloadSpec

    config = {
        "ns3": Ns3Config(),
        "ns3-tcp": Ns3Config(transport="tcp"),
        "flowsim": FlowSimConfig(),
    }[backend]
    scenario = Scenario(
        workload=SimAIWorkloadSpec(path="microAllReduce"),
        failure=GrayFailure(n_degraded=8, reduction=4),
        backend=backend.split("-", maxsplit=1)[0],
        backend_config=config,
        wire=WireFormat(mtu_bytes=8948, header_bytes=54),
    )
    cpu0 = time.process_time()
    row, _ = simulate(scenario)
    return {
        "case": f"microAllReduce N=8 R=4 scale 1, {backend}",
        "wall_s": row["wall_s"],
        "cpu_s": time.process_time() - cpu0,
        "completion_ms": row["completion_time_s"] * 1e3,
        "status": row["status"],
        "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def run_isolated(args: list[str]) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, *args], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="skip the full-scale scenario")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        kind, *values = args.case.split(":")
        if kind == "trace":
            result = trace_case(int(values[0]), values[1])
        else:
            result = scenario_case(values[0])
        print(json.dumps(result))
        return
    from m4ray.sweeps.report import format_table

    rows = []
    for payload in (1448, 8948):
        speed = {}
        for transport in ("rdma", "tcp"):
            r = run_isolated(["--case", f"trace:{payload}:{transport}"])
            speed[transport] = r["mb_per_cpu_s"]
            rows.append(
                [
                    r["case"],
                    f"{r['cpu_s']:.1f}",
                    f"{r['events']:,}",
                    f"{r['events'] / r['cpu_s']:,.0f}",
                    f"{r['mb_per_cpu_s']:.1f}",
                    f"{r['slowdown_p50']:.2f}",
                    f"{r['rss_mb']:.0f}",
                    f"{speed['rdma'] / speed['tcp']:.1f}x" if transport == "tcp" else "",
                ]
            )
    head = ["ns-3 case", "CPU s", "events", "events/CPU-s", "payload MB/CPU-s", "p50 sldn"]
    print(format_table([*head, "peak RSS MB", "rdma speed / tcp"], rows))
    if args.quick:
        return
    results = {b: run_isolated(["--case", f"scenario:{b}"]) for b in ("ns3", "ns3-tcp", "flowsim")}
    rows = [
        [
            r["case"],
            r["status"],
            f"{r['completion_ms']:.3f}",
            f"{r['wall_s']:.2f}",
            f"{r['rss_mb']:.0f}",
        ]
        for r in results.values()
    ]
    print()
    print(
        format_table(
            ["full-scale scenario", "status", "completion ms", "wall s", "peak RSS MB"], rows
        )
    )
    for name in ("ns3", "ns3-tcp"):
        ratio = results[name]["wall_s"] / results["flowsim"]["wall_s"]
        print(f"flowSim is {ratio:,.0f}x faster than {name} on this scenario")


if __name__ == "__main__":
    main()
