"""How busy ns-3 keeps each kind of link in one gray-failure scenario: where the packet-level run
loses time that the fluid models do not.

    .venv/bin/python bench/ns3_utilisation.py 16 4          # full size, the study's ns-3 (~3 min)
    .venv/bin/python bench/ns3_utilisation.py 8 4 --scale 0.08 wire=jumbo

Runs the scenario ``+experiment=gray_failure`` makes for (N, R) (extra arguments are Hydra
overrides; default ``workload.scale=1 wire=default``, the full-size study) on ns-3 and flowSim,
and prints, per kind of directed link of the reported group (ranks 0-15: GPU to NVSwitch and
back, GPU to rail switch and back, rail to spine and back; degraded GPUs apart), the share of
the run each kept its wire busy: ``8 * bytes sent / (bandwidth * completion time)`` (ns-3 counts
every frame it sends, ACKs included; flowSim's bytes are its flows' wire bytes). A link that must
carry the same bytes in both and is busy for a smaller share in ns-3 sat idle for the rest.
Beside it, how many data packets ns-3's ports of each kind marked CE (all links of the kind),
and under the table ns-3's transport counters (PFC pauses, drops, marks, ...) and rank 0's
finish beside the last rank's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from composed import resolved

from m4ray.sim.failures import gray_failure_gpus
from m4ray.sim.scenario import simulate
from m4ray.sweeps.gray_failure import scenarios_of
from m4ray.sweeps.report import format_table

GROUP = range(16)  # the reported group's ranks (EndToEnd.csv is rank 0's)


def link_kinds(topo, degraded: set[int]) -> dict[int, str]:
    """Each directed link of the group's GPUs (and every rail-spine link) by kind."""
    hosts, nvs = set(topo.hosts), set(topo.nvswitches)
    kinds = {}
    for link, (a, b) in enumerate(zip(topo.link_src.tolist(), topo.link_dst.tolist(), strict=True)):
        gpu = a if a in hosts else b if b in hosts else None
        if gpu is None:
            kinds[link] = "rail <-> spine"
            continue
        if gpu not in GROUP:
            continue
        peer = "NVSwitch" if (b if gpu == a else a) in nvs else "rail"
        arrow = f"GPU -> {peer}" if gpu == a else f"{peer} -> GPU"
        kinds[link] = f"{arrow} ({'degraded' if gpu in degraded else 'healthy'})"
    return kinds


def report(busy: dict, backends: list[str], counters: dict, title: str) -> None:
    """The table of busy shares per link kind, then ns-3's counters."""
    rows = []
    for kind, per in busy.items():
        cells = []
        for name in backends:
            value, _ = per[name]
            cells.append(f"{value:.2f}" if kind.endswith("(ms)") else f"{value:.0%}")
        if kind.endswith("(ms)"):
            cells += ["", ""]
        else:
            ratio = per["ns3"][1] / per["flowsim"][1] if per["flowsim"][1] else float("nan")
            cells += [f"{ratio:.3f}", f"{per['marks'][0]:,.0f}"]
        rows.append([kind, *cells])
    print(f"{title}: busy share of the run per link kind")
    header = ["link kind", "ns-3 busy", "flowSim busy", "bytes ns-3 / flowSim", "ns-3 CE marks"]
    print(format_table(header, rows))
    print("ns-3 counters:", ", ".join(f"{k} {v:,}" for k, v in counters.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("n", type=int)
    parser.add_argument("r", type=int)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("overrides", nargs="*", default=["wire=default"])
    args = parser.parse_args()
    cfg = resolved(
        "+experiment=gray_failure",
        f"grid.n=[{args.n}]",
        f"grid.r=[{args.r}]",
        f"workload.scale={args.scale}",
        *args.overrides,
    )
    backends = ["ns3", "flowsim"]
    scenarios = scenarios_of(cfg, backends)
    built = {}
    busy = {}
    for scenario in scenarios:
        config = scenario.backend_config
        build = type(config).build

        def spy(self, topo, routing, build=build, name=scenario.backend):
            built[name] = (build(self, topo, routing), topo, routing)
            return built[name][0]

        type(config).build = spy
        try:
            row, flows = simulate(scenario)
        finally:
            type(config).build = build
        backend, topo, routing = built[scenario.backend]
        if scenario.backend == "ns3":
            sent = backend.sent_bytes().astype(float)
            marked = backend.marked_packets()
            counters = backend.counters()
        else:  # the flows' wire bytes on every link of their paths
            sent = np.zeros(topo.n_links)
            for src, dst, size, fid in zip(
                flows.column("src").to_pylist(),
                flows.column("dst").to_pylist(),
                flows.column("size_bytes").to_pylist(),
                flows.column("flow_id").to_pylist(),
                strict=True,
            ):
                sent[list(routing.path(src, dst, fid).links)] += routing.wire.wire_bytes(size)
        t = row["completion_time_s"]
        share = 8 * sent / (topo.bandwidth_bps * t)
        kinds = link_kinds(topo, set(gray_failure_gpus(args.n)))
        for kind in sorted(set(kinds.values())):
            links = [link for link, k in kinds.items() if k == kind]
            busy.setdefault(kind, {})[scenario.backend] = (share[links].mean(), sent[links].mean())
            if scenario.backend == "ns3":
                busy[kind]["marks"] = (float(marked[links].sum()), None)
        busy.setdefault("completion (ms)", {})[scenario.backend] = (t * 1e3, None)
        busy.setdefault("rank 0's finish (ms)", {})[scenario.backend] = (
            row["rank0_time_s"] * 1e3,
            None,
        )
    report(busy, backends, counters, f"N = {args.n}, R = {args.r}, scale {args.scale}")


if __name__ == "__main__":
    main()
