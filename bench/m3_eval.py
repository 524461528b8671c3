"""m3 against ns-3 on workloads it did not train on: network-wide p99 FCT slowdown per size bucket.

    .venv/bin/python bench/m3_eval.py                                   # held-out fat-trees
    .venv/bin/python bench/m3_eval.py --shared ../shared/data          # + m4_example vs HPCC
    .venv/bin/python bench/m3_eval.py --flows 5000 --oversub 1 --mean 20000   # smaller
    .venv/bin/python bench/m3_eval.py --ccs dcqcn hpcc timely --checkpoint checkpoints/m3-v3
    .venv/bin/python bench/m3_eval.py --ccs timely --cc-params '{"t_low_s": 3e-5}' ...

Held-out scenarios: k=8 fat-trees with 10 Gbps hosts and a 40 Gbps fabric at 1:1 (128 hosts) and
2:1 (256 hosts), web-search flow sizes scaled to a mean of 20 KB and 100 KB (the training lots
draw exponential, log-normal, Pareto and Gaussian sizes with means of 1-100 KB, never this CDF),
log-normal arrivals at 50 % max link load; ns-3 under each of ``--ccs`` (``M3Network(cc=...)``:
each CC's defaults, DCQCN's RED from K to 4 K). m4_example: its 256-host
topology and 2,000 flows with the DCTCP settings of its HPCC config; its HPCC result is a fifth
column. For each: m3 (the checkpoint's correction over 500 sampled paths), path flowSim (the same
paths uncorrected; with standing queues where the checkpoint was trained so), network-wide
flowSim, classic and with standing queues, and m4ray's ns-3; p99 per bucket, |p99 error| vs our
ns-3, and wall times (m3: routing + sampling + path simulations + inference, on warm Ray workers;
ns-3: its simulation, after the library has loaded).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
WEBSEARCH = [[0, 0], [10000, 0.15], [20000, 0.2], [30000, 0.3], [50000, 0.4], [80000, 0.53],
             [200000, 0.6], [1000000, 0.7], [2000000, 0.8], [5000000, 0.9], [10000000, 0.97],
             [30000000, 1.0]]  # fmt: skip


def scenarios(args):
    from m4ray.m3.estimate import M3Network, M3Workload
    from m4ray.sim.topologies import fat_tree

    for cc in args.ccs:
        for mean in args.mean:
            for oversub in args.oversub:
                topo = fat_tree(
                    k=8, bandwidth_bps=10e9, fabric_bandwidth_bps=40e9, oversubscription=oversub
                )
                workload = M3Workload(
                    n_flows=args.flows,
                    size={"kind": "empirical", "cdf": WEBSEARCH},
                    size_mean_bytes=mean,
                    max_load=0.5,
                )
                name = f"fat-tree {oversub}:1 websearch {mean / 1000:g}KB"
                name += "" if cc == "dctcp" else f" {cc}"
                name += f" {args.cc_params}" if args.cc_params else ""
                network = M3Network(cc=cc, cc_params=json.loads(args.cc_params or "null"))
                yield name, topo, workload, network, None
    if args.shared:
        sys.path.insert(0, str(BENCH))
        import m4_example  # the HPCC config mapping and result reader

        from m4ray.sim.topology import read_topology

        folder = Path(args.shared) / "m4_example"
        ns3 = m4_example.network(m4_example.read_config(folder / "config_topology_flows_dctcp.txt"))
        rdma = ns3.rdma
        net = M3Network(
            buffer_bytes=rdma.buffer_bytes,
            window_bytes=rdma.window_bytes,
            ecn_k_bytes=int(min(rdma.ecn_k_bytes)[1]),
            pfc=rdma.pfc,
        )
        hpcc = m4_example.reference(folder / "fct_topology_flows_dctcp.txt")
        workload = M3Workload(flows_file=str(folder / "flows.txt"))
        yield "m4_example (HPCC)", read_topology(folder / "topology.txt"), workload, net, hpcc


def report(title: str, est: dict, walls: dict):
    """Print one scenario's table; returns the overall and per-bucket |p99 err| vs ns-3."""
    print(f"\n## {title}")
    methods = list(est)
    buckets = ["overall", *est["ns3"].buckets]
    print(f"{'p99 slowdown':<14}" + "".join(f"{m:>13}" for m in methods))
    for b in buckets:
        row = [(e.overall if b == "overall" else e.buckets.get(b)) for e in est.values()]
        print(f"{b:<14}" + "".join(
            f"{float(r.quantile(0.99)):>13.3f}" if r is not None else f"{'-':>13}" for r in row
        ))  # fmt: skip
    ns3_p99 = float(est["ns3"].overall.quantile(0.99))
    errs = {m: abs(float(est[m].overall.quantile(0.99)) / ns3_p99 - 1) for m in methods}
    per_bucket = {
        m: np.mean([
            abs(float(est[m].buckets[b].quantile(0.99))
                / float(est["ns3"].buckets[b].quantile(0.99)) - 1)
            for b in est["ns3"].buckets if b in est[m].buckets
        ])
        for m in methods
    }  # fmt: skip
    print(f"{'|p99 err|':<14}" + "".join(f"{errs[m]:>13.1%}" for m in methods))
    for b in est["ns3"].buckets:  # per size bucket, vs ns-3's p99 of that bucket
        ref = float(est["ns3"].buckets[b].quantile(0.99))
        print(f"{'  ' + b:<14}" + "".join(
            f"{abs(float(est[m].buckets[b].quantile(0.99)) / ref - 1):>13.1%}"
            if b in est[m].buckets else f"{'-':>13}" for m in methods
        ))  # fmt: skip
    print(f"{'bucket mean':<14}" + "".join(f"{per_bucket[m]:>13.1%}" for m in methods))
    print(f"{'wall s':<14}" + "".join(
        f"{walls[m]:>13.2f}" if m in walls else f"{'-':>13}" for m in methods
    ))  # fmt: skip
    return errs, per_bucket


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", help="the shared data folder (for m4_example)")
    parser.add_argument("--checkpoint", default="checkpoints/m3-v2")
    parser.add_argument("--flows", type=int, default=20_000)
    parser.add_argument(
        "--mean", type=float, nargs="*", default=[20_000.0, 100_000.0], help="mean flow sizes (B)"
    )
    parser.add_argument("--oversub", type=int, nargs="*", default=[1, 2])
    parser.add_argument(
        "--ccs", nargs="+", default=["dctcp"], help="congestion controls of the fat-trees' ns-3"
    )
    parser.add_argument(
        "--cc-params",
        help="JSON cc_params for the CC(s) of --ccs, e.g. a range m3 was not trained on: "
        "'{\"t_low_s\": 3e-5}' with --ccs timely",
    )
    parser.add_argument("--paths", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="outputs/bench/m3_eval")
    return parser.parse_args()


def main() -> None:
    args = parse_args()

    from m4ray.errors import InputError
    from m4ray.m3.aggregate import empirical
    from m4ray.m3.estimate import M3Config, checkpoint_queues, estimate, load_model, reference_run
    from m4ray.m3.paths import RoutedFlows
    from m4ray.runtime.cluster import RayConfig, start_ray
    from m4ray.sim.routing import Routing, WireFormat

    ray = start_ray(RayConfig())
    wire = WireFormat()
    summary = []
    for name, topo, workload, network, hpcc in scenarios(args):
        cfg = M3Config(workload=workload, network=network, n_paths=args.paths,
                       checkpoint=args.checkpoint)  # fmt: skip
        try:
            model, info = load_model(cfg.checkpoint, network.cc)
        except InputError as err:  # a CC the checkpoint was not trained on
            print(f"\n## {name}: skipped ({err})")
            continue
        queues = checkpoint_queues(cfg, topo, info)  # path flowSim as the checkpoint was trained
        routing = Routing(topo, seed=args.seed, wire=wire)
        flows = workload.flows(routing, args.seed)
        # warm the Ray workers (imports, the compiled path flowSim) on a few paths, as in any
        # session after its first estimate; ns-3's clock likewise starts after it has loaded
        warm = dataclasses.replace(cfg, n_paths=2 * cfg.tasks)
        kw = {"seed": args.seed, "ray": ray, "model": model, "wire": wire, "queues": queues}
        estimate(RoutedFlows(flows, routing), warm, **kw)
        began = time.perf_counter()
        routed = RoutedFlows(flows, routing)
        est = estimate(routed, cfg, **kw)
        walls = {"m3": time.perf_counter() - began}
        cache = Path(args.out) / "cache"
        for ref in ("flowsim", "flowsim_queues", "flowsim_bursts", "ns3"):
            slowdown, walls[ref] = reference_run(
                ref, topo, flows, routing, cfg=cfg, cache=cache, ray=ray
            )
            est[ref] = empirical(slowdown, routed.size_bytes)
        if hpcc is not None:
            ids = [f.id for f in flows]
            est["hpcc"] = empirical(
                np.array([hpcc[i][1] / hpcc[i][2] for i in ids]), routed.size_bytes
            )
        errs, per_bucket = report(f"{name}: {len(topo.hosts)} hosts, {len(flows)} flows, "
                                  f"{len(routed.by_path)} paths", est, walls)  # fmt: skip
        summary.append((name, errs, per_bucket, walls))
    print("\n## summary: overall |p99 err| vs m4ray ns-3, and m3's speed-up over ns-3")
    head = ["m3", "pathFS", "flowSim", "FS+queue", "FS+burst", "m3 s", "ns-3 s", "speedup"]
    print(f"{'scenario':<36}" + "".join(f"{h:>9}" for h in head))
    for name, errs, _, walls in summary:
        fluid = ("m3", "path_flowsim", "flowsim", "flowsim_queues", "flowsim_bursts")
        cells = [f"{errs[m]:>9.1%}" for m in fluid]
        cells += [f"{walls['m3']:>9.2f}", f"{walls['ns3']:>9.1f}"]
        cells.append(f"{walls['ns3'] / walls['m3']:>8.0f}x")
        print(f"{name:<36}" + "".join(cells))


if __name__ == "__main__":
    main()
