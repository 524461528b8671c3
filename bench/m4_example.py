"""m4ray's ns-3 (and flowSim) against the HPCC ns-3 on the m4-style example scenario.

    .venv/bin/python bench/m4_example.py ../shared/data/m4_example            # rdma + flowSim
    .venv/bin/python bench/m4_example.py ../shared/data/m4_example --tcp      # + TCP DCTCP (slow)
    .venv/bin/python bench/m4_example.py ../shared/data/m4_example --m4 m4-small m4-v2

The folder holds ``topology.txt`` (ns-3 format), ``flows.txt``, the HPCC run's per-flow result
``fct_topology_flows_dctcp.txt`` (``id sip dip sport dport size start_ns fct_ns ideal_ns``) and
its ``config_topology_flows_dctcp.txt``, whose DCTCP settings are mapped onto ours (window
``FIXED_WIN``, ``VAR_WIN``, K from ``KMAX_MAP``, g ``EWMA_GAIN``, ``DCTCP_RATE_AI``, ``MIN_RATE``,
``BUFFER_SIZE`` MB per switch, 1000 B payload + 48 B headers). Prints, per size bucket (<10 KB,
10 KB–1 MB, ≥1 MB) and overall, the mean, median and p90 of |FCT ratio − 1| against HPCC for each
backend, the p99 slowdown per bucket against HPCC's, mean slowdowns, our ideal FCT against their
``standalone_fct``, and wall times.
Paths are m4ray's own per-flow ECMP (same lengths as HPCC's, not the same hash).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

BUCKETS = (("<10KB", 0, 10_000), ("10KB-1MB", 10_000, 1_000_000), (">=1MB", 1_000_000, None))


def read_config(path: Path) -> dict[str, list[str]]:
    out = {}
    for line in path.read_text().splitlines():
        fields = line.split()
        if fields:
            out[fields[0]] = fields[1:]
    return out


def rate(text: str) -> float:
    from m4ray.sim.units import parse_rate

    return parse_rate(text.replace("b/s", "bps"))


def network(cfg: dict[str, list[str]]):
    """Our RDMA settings from the HPCC config (the fields named in the module docstring)."""
    from m4ray.sim.ns3.backend import Ns3Config
    from m4ray.sim.ns3.transports import RdmaConfig

    kmax = cfg["KMAX_MAP"]
    points = [[float(kmax[1 + 2 * i]), float(kmax[2 + 2 * i]) * 1000] for i in range(int(kmax[0]))]
    buffer = int(float(cfg["BUFFER_SIZE"][0]) * 1_000_000)
    return Ns3Config(
        rdma=RdmaConfig(
            window_bytes=int(cfg["FIXED_WIN"][0]) if cfg["HAS_WIN"][0] == "1" else 0,
            var_window=cfg["VAR_WIN"][0] == "1",
            ecn_k_bytes=points,
            dctcp_gain=float(cfg["EWMA_GAIN"][0]),
            rate_ai_bps=rate(cfg["DCTCP_RATE_AI"][0]),
            min_rate_bps=rate(cfg["MIN_RATE"][0]),
            buffer_bytes=buffer,
            pfc_threshold_bytes=buffer // 8,
        )
    )


def reference(path: Path) -> dict[int, tuple[int, float, float]]:
    """HPCC result: flow id -> (size, FCT s, standalone FCT s)."""
    out = {}
    for line in path.read_text().splitlines():
        f = line.split()
        out[int(f[0])] = (int(f[5]), int(f[7]) * 1e-9, int(f[8]) * 1e-9)
    return out


def run(topo, flows, backend_cfg, routing):
    from m4ray.sim.trace import run_trace

    t0 = time.perf_counter()
    table = run_trace(topo, flows, backend_cfg, routing)
    wall = time.perf_counter() - t0
    ids, fcts = table.column("flow_id").to_pylist(), table.column("fct_s").to_pylist()
    fct = dict(zip(ids, fcts, strict=True))
    return fct, wall


def print_table(head: list[str], rows: list[list[str]]) -> None:
    """Left-aligned columns, as wide as their widest cell."""
    widths = [max(len(r[c]) for r in [head, *rows]) for c in range(len(head))]
    for row in [head, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))


def describe(name: str, ratio: np.ndarray, size: np.ndarray) -> list[str]:
    cells = [name]
    for _, lo, hi in (("all", 0, None), *BUCKETS):
        sel = (size >= lo) & (size < hi if hi else True)
        err = np.abs(ratio[sel] - 1)
        cells.append(f"{err.mean():6.2%} / {np.median(err):6.2%} / {np.quantile(err, 0.9):6.2%}")
    return cells


def tail_row(name: str, slowdown: np.ndarray, size: np.ndarray, ref: np.ndarray | None):
    cells = [name]
    for _, lo, hi in (("all", 0, None), *BUCKETS):
        sel = (size >= lo) & (size < hi if hi else True)
        p99 = np.quantile(slowdown[sel], 0.99)
        cell = f"{p99:6.3f}"
        if ref is not None:
            cell += f" ({p99 / np.quantile(ref[sel], 0.99) - 1:+6.1%})"
        cells.append(cell)
    return cells


def m4_config(entry: str, network):
    """``--m4``'s ``checkpoint[:precision][:fifo]`` as an m4 backend imitating ``network``
    (``fifo``: on a FIFO anchor, ``M4Config.anchor``)."""
    from m4ray.sim.m4.backend import M4Config

    checkpoint, *rest = entry.split(":")
    options = {"anchor": "fifo"} if "fifo" in rest else {}
    precision = [r for r in rest if r != "fifo"]
    if precision:
        options["precision"] = precision[0]
    return M4Config(checkpoint=checkpoint, network=network, **options)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="the m4_example folder (shared/data)")
    parser.add_argument("--tcp", action="store_true", help="also run ns-3 TCP DCTCP (~10 min)")
    parser.add_argument(
        "--m4",
        nargs="+",
        default=[],
        metavar="CHECKPOINT[:PRECISION][:fifo]",
        help="also run these m4 checkpoints (m4-v2:float64 for its float64 pass, m4-v2:fifo on "
        "a FIFO anchor)",
    )
    args = parser.parse_args()

    from m4ray.sim.flows import read_flows
    from m4ray.sim.flowsim import FlowSimConfig, StandingQueues
    from m4ray.sim.fluidcc import FluidDctcpConfig
    from m4ray.sim.routing import Routing, WireFormat
    from m4ray.sim.topology import read_topology

    topo = read_topology(args.folder / "topology.txt")
    flows = read_flows(args.folder / "flows.txt", frozenset(topo.hosts))
    t0 = min(f.start_s for f in flows)  # HPCC starts traffic at 1 s; ours at the first flow
    flows = [type(f)(f.id, f.src, f.dst, f.size_bytes, f.start_s - t0) for f in flows]
    cfg = read_config(args.folder / "config_topology_flows_dctcp.txt")
    ref = reference(args.folder / "fct_topology_flows_dctcp.txt")
    wire = WireFormat(mtu_bytes=int(cfg["PACKET_PAYLOAD_SIZE"][0]), header_bytes=48)
    routing = Routing(topo, wire=wire)
    ns3 = network(cfg)
    backends = {
        "ns-3 rdma": ns3,
        "flowSim": FlowSimConfig(),
        "flowSim+window": FlowSimConfig.windowed(ns3, routing),
        "flowSim+window+ACKs": FlowSimConfig.windowed(ns3, routing, acks=True),
        "flowSim+queues": FlowSimConfig(queues=StandingQueues.of(ns3, routing)),
        "flowSim+bursts": FlowSimConfig(queues=StandingQueues.of(ns3, routing, bursts=True)),
        "flowSim FIFO up to the window": FlowSimConfig(
            service="fifo", fifo_bytes=ns3.rdma.window(routing)
        ),
        "flowSim FIFO up to the window+bursts": FlowSimConfig(
            service="fifo",
            fifo_bytes=ns3.rdma.window(routing),
            queues=StandingQueues.of(ns3, routing, bursts=True),
        ),
        "flowSim FIFO": FlowSimConfig(service="fifo"),
        "fluid DCTCP": FluidDctcpConfig(network=ns3),
    }
    if args.tcp:
        import dataclasses

        backends["ns-3 tcp"] = dataclasses.replace(ns3, transport="tcp")
    backends.update({f"m4 ({entry})": m4_config(entry, ns3) for entry in args.m4})

    ids = [f.id for f in flows]
    size = np.array([ref[i][0] for i in ids])
    hpcc = np.array([ref[i][1] for i in ids])
    standalone = np.array([ref[i][2] for i in ids])
    ideal = np.array(
        [routing.ideal_fct(f.size_bytes, routing.path(f.src, f.dst, f.id)) for f in flows]
    )

    print(f"m4_example: {len(flows)} flows, {size.sum() / 1e9:.2f} GB, {len(topo.hosts)} hosts")
    head = ["backend", "all", *(b[0] for b in BUCKETS)]
    rows = []
    extra = []
    tails = [tail_row("HPCC ns-3 (reference)", hpcc / standalone, size, None)]
    for name, backend_cfg in backends.items():
        fct, wall = run(topo, flows, backend_cfg, routing)
        ours = np.array([fct[i] for i in ids])
        ratio = ours / hpcc
        rows.append(describe(name, ratio, size))
        tails.append(tail_row(name, ours / ideal, size, hpcc / standalone))
        extra.append(
            f"{name}: wall {wall:.1f} s; mean slowdown {np.mean(ours / ideal):.3f} "
            f"(HPCC {np.mean(hpcc / standalone):.3f}); FCT ratio to HPCC p10/p50/p90 "
            f"{np.quantile(ratio, 0.1):.2f}/{np.median(ratio):.2f}/{np.quantile(ratio, 0.9):.2f}"
        )
    print("\nmean / median / p90 of |FCT ratio - 1| against the HPCC ns-3, by flow size:\n")
    print_table(head, rows)
    print()
    print("\n".join(extra))
    print("\np99 slowdown by flow size (ours: FCT / our ideal; HPCC: FCT / its standalone),")
    print("and its error against HPCC's:\n")
    print_table(head, tails)
    dev = np.abs(ideal / standalone - 1)
    print(
        f"\nideal FCT vs HPCC standalone_fct: max |ratio - 1| {dev.max():.3%}, "
        f"median {np.median(dev):.3%}, flows within 2 %: {np.mean(dev <= 0.02):.1%}"
    )


if __name__ == "__main__":
    main()
