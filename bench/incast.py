"""k:1 incasts on m4's training fabric: ns-3 (RDMA) against flowSim and m4, per fan-in.

    .venv/bin/python bench/incast.py [--k 2 4 8 16] [--size 200000] [--m4 m4-small m4-v2]

One round of k senders starting together (within 1 µs) towards one receiver, flows of
``--size`` bytes, 1000 B packets as in m4's data; mean and max slowdown (FCT / ideal) per
backend, and each model's mean slowdown relative to ns-3's. The m4 issue's bar: a 4:1 incast
within 25 % of ns-3's slowdown.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from m4ray.datagen.traffic import IncastTraffic
from m4ray.sim.flowsim import FlowSimConfig
from m4ray.sim.m4 import M4Config
from m4ray.sim.ns3.backend import Ns3Config
from m4ray.sim.ns3.transports import RdmaConfig
from m4ray.sim.routing import Routing, WireFormat
from m4ray.sim.topologies import M4FabricSpec
from m4ray.sim.trace import run_trace
from m4ray.sweeps.report import format_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--k", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--size", type=int, default=200_000)
    parser.add_argument("--m4", nargs="+", default=["m4-small"], help="checkpoints (names or dirs)")
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args()
    topo = M4FabricSpec().build()
    routing = Routing(topo, seed=args.seed, wire=WireFormat(mtu_bytes=1000, header_bytes=48))
    network = Ns3Config(transport="rdma", rdma=RdmaConfig(window_bytes=10_000))
    backends = {
        "ns-3 rdma": network,
        "flowSim": FlowSimConfig(),
        "flowSim+window": FlowSimConfig.windowed(network, routing),
        "flowSim+window+ACKs": FlowSimConfig.windowed(network, routing, acks=True),
    }
    for checkpoint in args.m4:
        backends[checkpoint] = M4Config(checkpoint=checkpoint, network=network, window_us=None)
    rows = []
    for k in args.k:
        flows = IncastTraffic(rounds=1, k=k, size_bytes=args.size, gap_s=1.0).flows(
            routing, args.seed
        )
        means = {}
        for name, config in backends.items():
            start = time.perf_counter()
            table = run_trace(topo, flows, config, routing)
            wall = time.perf_counter() - start
            slowdown = table.column("fct_s").to_numpy() / table.column("ideal_fct_s").to_numpy()
            means[name] = float(np.mean(slowdown))
            ref = means.get("ns-3 rdma")
            rows.append(
                [
                    f"{k}:1",
                    name,
                    f"{np.mean(slowdown):.2f}",
                    f"{np.max(slowdown):.2f}",
                    f"{means[name] / ref - 1:+.0%}" if ref else "",
                    f"{wall:.2f}",
                ]
            )
    print(f"one round of k:1 incast, {args.size:,} B per flow, m4's fabric (1000 B packets)")
    head = ["incast", "backend", "mean slowdown", "max slowdown", "mean vs ns-3", "wall s"]
    print(format_table(head, rows))


if __name__ == "__main__":
    main()
