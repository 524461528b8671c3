"""m4 on topologies and traffic it never trained on: per-flow slowdown error against ns-3.

    .venv/bin/python bench/m4_holdout.py [--m4 m4-small m4-v2] [--scenarios 4] [--flows 2000]

Held-out topologies (none is in ``+experiment=datagen_v2``): a k=8 fat-tree at 2:1 (256 hosts,
10 Gbps hosts, 40 Gbps fabric) and the rail cluster (32 GPUs), both under the m4 fabric family's
open-loop traffic (its size distributions, loads and network ranges, read from
``conf/family/m4_fabric.yaml``), ``--scenarios`` seeds each. For every flow: |ŝ/s − 1| with s the
ns-3 (RDMA) slowdown; mean / p90 / p99 per model and flowSim, and each model's mean and p90 as a
fraction of flowSim's (issue 14's bars: <= 0.6 and <= 0.7). ``flowSim+window`` is flowSim with the
scenario's RDMA window (:class:`~m4ray.models.fairshare.Window`), the anchor of window-anchored m4
models: the row that says how much of a model's gain the window alone explains.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import numpy as np
from hydra.utils import instantiate
from omegaconf import OmegaConf

from m4ray.datagen.families import OpenLoopFamily
from m4ray.sim.flowsim import FlowSimConfig
from m4ray.sim.m4 import M4Config
from m4ray.sim.routing import Routing
from m4ray.sim.topologies import FatTreeSpec, RailClusterSpec
from m4ray.sim.trace import run_trace
from m4ray.sweeps.report import format_table

ROOT = Path(__file__).resolve().parents[1]
HELD_OUT = {
    "fat-tree 2:1 (256 hosts)": FatTreeSpec(
        k=8, bandwidth_bps=10e9, fabric_bandwidth_bps=40e9, oversubscription=2
    ),
    "rail cluster (32 GPUs)": RailClusterSpec(),
}


def family(topology, n_flows: int) -> OpenLoopFamily:
    """The m4 fabric family's traffic and network ranges, on ``topology``."""
    spec = OmegaConf.load(ROOT / "conf/family/m4_fabric.yaml")
    del spec["topology"]  # a kwarg would be merged into the YAML's node, not replace it
    fam = instantiate(spec, n_flows=[n_flows, n_flows], _convert_="all")
    return dataclasses.replace(fam, topology=topology)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--m4", nargs="+", default=["m4-small"], help="checkpoints")
    parser.add_argument("--scenarios", type=int, default=4, help="seeds per topology")
    parser.add_argument("--flows", type=int, default=2000)
    args = parser.parse_args()
    rows, totals = [], {}
    for title, topology in HELD_OUT.items():
        fam = family(topology, args.flows)
        errors: dict[str, list] = {}
        walls: dict[str, float] = {}
        for i in range(args.scenarios):
            scn = fam.sample("holdout", i, 1000 + i, 600.0)
            topo = scn.build_topology()
            routing = Routing(topo, seed=scn.seed, wire=scn.wire)
            flows = scn.traffic.flows(routing, scn.seed)
            backends = {
                "ns-3": scn.ns3,
                "flowSim": FlowSimConfig(),
                "flowSim+window": FlowSimConfig.windowed(scn.ns3, routing),
                "flowSim+window+ACKs": FlowSimConfig.windowed(scn.ns3, routing, acks=True),
            }
            backends |= {m: M4Config(checkpoint=m, network=scn.ns3) for m in args.m4}
            slowdown = {}
            for name, config in backends.items():
                began = time.perf_counter()
                table = run_trace(topo, flows, config, routing)
                walls[name] = walls.get(name, 0.0) + time.perf_counter() - began
                slowdown[name] = table.column("slowdown").to_numpy()
            for name in backends:
                if name != "ns-3":
                    err = np.abs(slowdown[name] / slowdown["ns-3"] - 1)
                    errors.setdefault(name, []).append(err)
        for name, parts in errors.items():
            err = np.concatenate(parts)
            totals.setdefault(name, []).append(err)
            rows.append(_row(title, name, err, np.concatenate(errors["flowSim"]), walls[name]))
        rows.append([title, "ns-3", "", "", "", "", "", f"{walls['ns-3']:.1f}"])
    fs = np.concatenate(totals["flowSim"])
    for name, parts in totals.items():
        rows.append(_row("all held-out", name, np.concatenate(parts), fs, float("nan")))
    print(f"per-flow |slowdown err| vs ns-3, {args.scenarios} x {args.flows} flows per topology")
    head = ["topology", "backend", "mean", "p90", "p99", "mean/flowSim", "p90/flowSim", "wall s"]
    print(format_table(head, rows))


def _row(title, name, err, flowsim, wall) -> list:
    mean, p90, p99 = err.mean(), np.quantile(err, 0.9), np.quantile(err, 0.99)
    return [
        title,
        name,
        f"{mean:.3f}",
        f"{p90:.3f}",
        f"{p99:.3f}",
        f"{mean / flowsim.mean():.2f}",
        f"{p90 / np.quantile(flowsim, 0.9):.2f}",
        "" if np.isnan(wall) else f"{wall:.1f}",
    ]


if __name__ == "__main__":
    main()
