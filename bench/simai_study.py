"""The published SimAI gray-failure study's own inputs, replayed on m4ray's backends and compared
with SimAI's packet-level result (its UNISON ns-3).

    .venv/bin/python bench/simai_study.py ../shared/data                 # ns-3 (rdma) + flowSim
    .venv/bin/python bench/simai_study.py ../shared/data --backends ns3 ns3-tcp flowsim m4
    .venv/bin/python bench/simai_study.py ../shared/data --backends ns3 flowsim m4=m4-small m4=m4-v2
    .venv/bin/python bench/simai_study.py ../shared/data --wire jumbo    # 9x fewer packets
    .venv/bin/python bench/simai_study.py ../shared/data --backends ns3 flowsim m4=m4-v2 --lockstep

Inputs are SimAI's own files under ``<data>/simai/``: the degraded topologies
``topologies/gray_topo_N{n}_R{r}.txt`` and the study's workload
``workload/microAllReduce.txt@52ed9ea.txt`` (TP group 16), at full size, through each collective
layer asked for (``--collectives``: ``simai``, SimAI's own NCCL flows, and the rail-aligned
``hierarchical`` by default). ns-3 uses the study's network (``conf/backend/ns3_simai.yaml``:
DCTCP with the RED of the study's SimAI.conf (K_min 1 KB per Gbit/s, K_max 4 K_min,
P_max 0.2), g = 1/16, rate AI 2 Gbit/s, minimum rate 1 Gbit/s, 100 MB
buffers, 1000 B payload; NVSwitches mark no ECN and send no PFC; SimAI's ns-3 timing: ACKs
with the data at switches, whole-ns packets, its DCTCP α and window) on SimAI's 1,040 B packets,
each flow sent 3.01 µs after its parent as SimAI's logs show. SimAI's totals (µs) for three
scenarios are quoted from ``reference/gray_failure.md`` §7 (``results_gray_failures/`` at commit
0c441e75); N=2 R=4 has no published number and is printed for the trend. Ours are rank 0's own
finish (``rank0_time_s``), as SimAI's: rank 0 writes its ``EndToEnd.csv`` (SimAI's shared per-flow
run ends group 0 at its total, 11,684 µs, and group 1 at 12,252), not the last of all 32 ranks
(``completion_time_s``, the job's iteration). Each backend runs each
scenario in this process,
one at a time; wall times are this machine's. ``--lockstep`` adds every flow-level backend again
with ``workload.lockstep`` (``m4ray.sim.lockstep``: each distinct collective step run once).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

UNISON_US = {
    (8, 4): 12124.0,
    (8, 10): 24480.8,
    (16, 4): 11865.5,
}  # SimAI's ns-3, gray_failure.md §7
SCENARIOS = ((2, 4), (8, 4), (8, 10), (16, 4))
# SimAI's ns-3 at R = 10 over N (reference/simai_nccl.md §4, ms rounded to 0.1): the N-trend
TREND_US = {
    (2, 10): 24600.0,
    (4, 10): 28400.0,
    (6, 10): 32500.0,
    (8, 10): 24480.8,
    (9, 10): 32300.0,
    (12, 10): 34600.0,
    (16, 10): 31900.0,
}


def backends(names: list[str], preset: str = "ns3_simai") -> dict:
    from simai_flows import study_ns3

    from m4ray.sim.flowsim import FlowSimConfig
    from m4ray.sim.fluidcc import FluidDctcpConfig
    from m4ray.sim.m4.backend import M4Config

    rdma = study_ns3(preset=preset)
    every = {
        "ns3": ("ns3", rdma),
        "ns3-tcp": ("ns3", dataclasses.replace(rdma, transport="tcp")),
        "flowsim": ("flowsim", FlowSimConfig()),
        "flowsim_fifo": ("flowsim", FlowSimConfig(service="fifo", fifo_bytes="window")),
        "fluid_dctcp": ("fluid_dctcp", FluidDctcpConfig(network=rdma)),
    }
    out = {}
    for name in names:
        if name.split("=")[0] == "m4":  # m4 or m4=<checkpoint>, told the study's network
            checkpoint = name.partition("=")[2] or "m4-small"
            out[checkpoint] = ("m4", M4Config(checkpoint=checkpoint, network=rdma))
        else:
            out[name] = every[name]
    return out


def compare_results(path: Path) -> str:
    """A sweep's completion times (µs) at SimAI's published points, each backend's error against
    SimAI's ns-3 and against the sweep's own ns-3."""
    import pandas as pd

    from m4ray.sweeps.report import format_table

    frame = pd.read_parquet(path)
    frame = frame[frame.status == "ok"]
    column = reported_column(frame)
    times = frame.pivot_table(index=["n_degraded", "reduction"], columns="backend", values=column)
    published = {**TREND_US, **UNISON_US}
    known = ("ns3", "flowsim", "flowsim_acks", "flowsim_fifo", "fluid_dctcp", "m4")
    backends = [b for b in known if b in times.columns]
    rows = []
    for (n, r), ours in times.iterrows():
        ref = published.get((n, r))
        row = [f"N={n} R={r}", f"{ref:,.1f}" if ref else "—"]
        for b in backends:
            us = ours[b] * 1e6
            vs_simai = f" ({us / ref - 1:+.1%})" if ref else ""
            vs_ns3 = f" [{ours[b] / ours['ns3'] - 1:+.1%}]" if b != "ns3" and "ns3" in ours else ""
            row.append(f"{us:,.1f}{vs_simai}{vs_ns3}")
        rows.append(row)
    header = ["scenario", "SimAI ns-3 (us)", *backends]
    note = f"{column} (vs SimAI's ns-3) [vs our ns-3]"
    return f"{format_table(header, rows)}\n{note}"


def reported_column(frame) -> str:
    """Rank 0's finish where the results have it (sweeps from 2026-11-27 on), else the last
    rank's, named in the output."""
    has = "rank0_time_s" in frame.columns and frame["rank0_time_s"].notna().all()
    return "rank0_time_s" if has else "completion_time_s"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data", type=Path, help="the shared data folder (holding simai/)")
    parser.add_argument("--backends", nargs="+", default=["ns3", "flowsim"])
    parser.add_argument(
        "--wire",
        choices=["simai", "default", "jumbo"],
        default="simai",
        help="packets: SimAI's 1,040 B (simai), 1,048 B (default) or 9,002 B (jumbo)",
    )
    parser.add_argument(
        "--send-latency-us",
        type=float,
        default=3.01,
        help="each flow's wait after its parent: AS_SEND_LAT 3 us plus astra-sim's 10 ns "
        "memory-bus event, what SimAI's logs show",
    )
    parser.add_argument(
        "--collectives",
        nargs="+",
        choices=["simai", "hierarchical", "ring"],
        default=["simai", "hierarchical"],
        help="collective layers, side by side (simai: SimAI's NCCL flows, the study's)",
    )
    parser.add_argument(
        "--ns3-preset",
        default="ns3_simai_timing",
        help="conf/backend preset for ns-3 (ns3_simai: the gray-failure default; "
        "ns3_simai_timing: with SimAI's ns-3 timing)",
    )
    parser.add_argument(
        "--published", action="store_true", help="only the points SimAI published a total for"
    )
    parser.add_argument(
        "--trend",
        action="store_true",
        help="the R = 10 points over N instead (m4ray's own degraded topologies, same rule)",
    )
    parser.add_argument(
        "--lockstep", action="store_true", help="flow-level backends in lockstep, too"
    )
    parser.add_argument(
        "--results",
        type=Path,
        help="compare a gray-failure sweep's results.parquet with SimAI's published totals "
        "instead of running anything (every published (N, R) it holds)",
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.results:
        print(compare_results(args.results))
        return

    from composed import wire as composed_wire

    from m4ray.sim.collectives import HierarchicalSpec, RingSpec
    from m4ray.sim.failures import GrayFailure
    from m4ray.sim.nccl import SimAISpec
    from m4ray.sim.scenario import Scenario, simulate
    from m4ray.sim.topologies import RailClusterSpec, TopologyFileSpec
    from m4ray.sweeps.report import format_table
    from m4ray.workload.simai import SimAIWorkloadSpec

    simai = args.data / "simai"
    workload = SimAIWorkloadSpec(path=str(simai / "workload" / "microAllReduce.txt@52ed9ea.txt"))
    wire = composed_wire(args.wire)  # conf/wire/<name>.yaml
    layers = {"simai": SimAISpec(), "hierarchical": HierarchicalSpec(), "ring": RingSpec()}
    chosen = {}
    for layer in args.collectives:
        for name, pair in backends(args.backends, args.ns3_preset).items():
            chosen[f"{name} {layer}"] = (*pair, False, layers[layer])
            if args.lockstep and pair[0] != "ns3" and layer != "simai":
                chosen[f"{name} {layer} lockstep"] = (*pair, True, layers[layer])
    rows = []
    published = TREND_US if args.trend else UNISON_US
    points = TREND_US if args.trend else SCENARIOS
    for n, r in [p for p in points if p in published] if args.published else points:
        if args.trend:
            topo = RailClusterSpec()  # failure applied below, SimAI's degraded-GPU rule
        else:
            topo = TopologyFileSpec(path=str(simai / "topologies" / f"gray_topo_N{n}_R{r}.txt"))
        failure = GrayFailure(n_degraded=n if args.trend else 0, reduction=r if args.trend else 1)
        ref = published.get((n, r))
        row = [f"N={n} R={r}", f"{ref:,.1f}" if ref else "—"]
        for name, (backend, config, lockstep, collective) in chosen.items():
            scenario = Scenario(
                topology=topo,
                workload=dataclasses.replace(workload, lockstep=lockstep),
                collective=collective,
                failure=failure,
                backend=backend,
                backend_config=config,
                wire=wire,
                send_latency_s=args.send_latency_us * 1e-6,
            )
            result, _ = simulate(scenario)
            wall = result["wall_s"]
            if result["status"] != "ok":
                row.append(f"failed: {result['error'].strip().splitlines()[-1][:60]}")
                continue
            us = result["rank0_time_s"] * 1e6
            err = f" ({us / ref - 1:+.1%})" if ref else ""
            row.append(f"{us:,.1f}{err} in {wall:.1f} s")
            print(f"  {n=} {r=} {name}: {us:,.1f} us, {wall:.1f} s wall", flush=True)
        rows.append(row)
    print()
    print(format_table(["scenario", "SimAI ns-3 (us)", *chosen], rows))


if __name__ == "__main__":
    main()
