"""m3 against the reference simulator's own results: p99 FCT slowdown per size bucket on the HPCC
simulator's HPCC and TIMELY runs (``ns3_cc/hpcc_fat_websearch`` in the shared data folder).

    .venv/bin/python bench/m3_field.py ../shared/data/ns3_cc [--checkpoint checkpoints/m3-v4]

The runs: the HPCC paper's 320-host fat tree (100 Gbit/s hosts, 400 Gbit/s fabric: ten times
the link rates m3 was trained on), all 70,001 WebSearch flows at 30 % load, each run's own
settings (``bench/ns3_cc.py``'s mapping; the window the network's largest bandwidth-delay
product where the run has one). m3 estimates each over ``--draws`` draws of ``--paths`` paths,
beside path flowSim (the same paths, uncorrected), and each is compared with the reference's
p99 per bucket: the mean error over the draws and its rms. The reference's FCT ends at the
sender's last ACK and its slowdowns use its standalone FCT; ours end at the last byte in, so each
reference flow has its ACK's way back (``ns3_cc.ack_way_back``) taken off both.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from m3_sampling import COLUMNS, p99s  # noqa: E402
from ns3_cc import FAT_RUNS, ack_way_back, fat_flows, fat_results, network, read_config  # noqa: E402


def main() -> None:  # noqa: PLR0915 (one bench, read top to bottom)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="the ns3_cc folder (shared/data)")
    parser.add_argument("--checkpoint", default="checkpoints/m3-v4")
    parser.add_argument("--runs", nargs="+", default=list(FAT_RUNS), choices=list(FAT_RUNS))
    parser.add_argument("--paths", type=int, default=500)
    parser.add_argument("--draws", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from m4ray.m3.aggregate import empirical
    from m4ray.m3.estimate import M3Config, M3Network, estimate, load_model, trained_queues
    from m4ray.m3.paths import RoutedFlows
    from m4ray.runtime.cluster import RayConfig, start_ray
    from m4ray.sim.routing import Routing, WireFormat
    from m4ray.sim.topology import read_topology
    from m4ray.sweeps.report import format_table

    base = args.folder / "hpcc_fat_websearch"
    topo = read_topology(base / "fat.txt")
    flows, key = fat_flows(base, 10**9)
    size = np.array([f.size_bytes for f in flows])
    wire = WireFormat(mtu_bytes=1000, header_bytes=48)
    routing = Routing(topo, wire=wire)
    routed = RoutedFlows(flows, routing)
    ray = start_ray(RayConfig())
    rows = []
    for label in args.runs:
        config, result = FAT_RUNS[label]
        cfg = read_config(base / config)
        cc = label.split()[0]
        ns3 = network(cfg, cc, buffer_bytes=int(cfg["BUFFER_SIZE"][0]) << 20, window=None,
                      fork=False)  # fmt: skip
        rdma = ns3.rdma
        if rdma.window_bytes is None:  # the run's window: the network's largest BDP
            rdma = dataclasses.replace(rdma, window_bytes=rdma.window(routing))
        model, info = load_model(args.checkpoint, cc)
        queues = trained_queues(rdma, info)
        net = M3Network(
            buffer_bytes=rdma.buffer_bytes,
            window_bytes=rdma.window_bytes,
            ecn_k_bytes=int(min(rdma.ecn_k_bytes)[1]),
            pfc=rdma.pfc,
            cc=cc,
        )
        m3 = M3Config(network=net, n_paths=args.paths, checkpoint=args.checkpoint)
        theirs, ideal = fat_results(base / result, key, len(flows))
        done = np.isfinite(theirs)
        back = np.array([ack_way_back(routing, f, rdma.ack_bytes) for f in flows])
        ref = (theirs - back)[done] / (ideal - back)[done]  # m4ray's FCT: to the last byte in
        want = p99s(empirical(ref, size[done]))
        errors: dict[str, list[np.ndarray]] = {"m3": [], "path_flowsim": []}
        for k in range(args.draws):
            seed = int(np.random.SeedSequence([args.seed, 4, k]).generate_state(1)[0])
            est = estimate(routed, m3, seed=seed, ray=ray, model=model, wire=wire, queues=queues)
            for name, listed in errors.items():
                listed.append(p99s(est[name]) / want - 1)
            print(f"  {label}: draw {k + 1}/{args.draws}", file=sys.stderr, flush=True)
        rows.append([label, "reference p99", *(f"{w:.2f}" for w in want)])
        for name, listed in errors.items():
            errs = np.array(listed)
            mean, rms = errs.mean(axis=0), np.sqrt((errs**2).mean(axis=0))
            rows.append(
                [label, name, *(f"{m:+.1%} / {r:.1%}" for m, r in zip(mean, rms, strict=True))]
            )
    print(
        f"\nHPCC simulator's runs on its 320-host fat tree ({len(flows):,} WebSearch flows): "
        f"p99 error of {args.checkpoint} and path flowSim, mean / rms over {args.draws} draws "
        f"of {args.paths} paths"
    )
    print(format_table(["run", "estimate", *COLUMNS], rows))


if __name__ == "__main__":
    main()
