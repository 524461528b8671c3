"""The queues at the GPUs' rail ports over time in one point of a gray-failure sweep: ns-3's
against each fluid backend's, both run on ns-3's own flows at ns-3's own start times.

    .venv/bin/python bench/study_queues.py outputs/<full-size run> 16 4           # ~4 min of ns-3
    .venv/bin/python bench/study_queues.py outputs/<run> 16 4 --backends fluid_dctcp \
        --every-us 2 --plot outputs/<run>/plots/queues_N16_R4.png

The folder is a sweep's run directory with ns-3 among its backends (``results.parquet``,
``flows/`` and ``topologies/``). Each backend runs the point's flows in trace mode (as
``bench/study_perflow.py --given-arrivals`` does) and is sampled every ``--every-us`` of
simulated time: the bytes queued at each egress port toward a GPU of the reported group (ranks
0-15) on its rail switch, and at each GPU's own NIC toward its rail (ns-3's ``Backlog``: queue
disc and device queue; the fluid's ``queue_bytes``). Per kind of port (``link_kinds`` of
``bench/ns3_utilisation.py``: degraded GPU or healthy), the table gives the mean queue, the share
of samples with more than 1 KB queued and the p50 / p90 / p99 / max of those. ``--plot`` draws
the degraded ports' summed queue over time.

On the study's N = 16, R = 4 (2026-12-07) ns-3 held a mean 71 KB at the degraded GPUs' rail
ports (p90 310 KB, p99 663 KB, max 1.23 MB) where the fluid held 47 KB (186 / 395 KB / 837 KB):
the chunks from the healthy server reached those ports late, held at the shared rail-to-spine
uplink. With the fluid's ``backlog`` (docs/gray_failure_study.md, "The fluid's backlog"), which
passes what that uplink holds on, 67 KB (295 / 554 KB / 1.11 MB), and the summed queue follows
ns-3's over the whole iteration.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ns3_utilisation import link_kinds
from study_perflow import _trace, arrivals_configs, point

from m4ray.sim.routing import Routing
from m4ray.sim.trace import run_trace
from m4ray.sweeps.report import format_table


def rail_ports(topo, degraded: list[int]) -> dict[int, str]:
    """The group's GPUs' rail links (``ns3_utilisation.link_kinds`` less NVLinks and spines):
    each GPU's NIC and its rail switch's port toward it, by kind."""
    kinds = link_kinds(topo, set(degraded))
    return {link: kind for link, kind in kinds.items() if "rail" in kind and "spine" not in kind}


def sampled(topo, trace, backend_and_wire, links: np.ndarray, every_s: float):
    """One backend (its config and wire) run on ``trace`` (``run_trace``, as the other views
    run it): sample times and bytes queued at ``links`` (rows)."""
    config, wire = backend_and_wire
    times, rows = [], []

    def probe(backend, unfinished) -> None:
        net = getattr(backend, "net", None)  # ns-3's C++ network: its ports' backlogs

        def tick() -> None:
            times.append(backend.now())
            if net is not None:
                rows.append([net.Backlog(int(link)) for link in links])
            else:
                rows.append(backend.queue_bytes()[links])
            if unfinished() > 0:
                backend.schedule(every_s, tick)

        backend.schedule(0.0, tick)

    run_trace(topo, trace, config, Routing(topo, wire=wire), probe=probe)
    return np.asarray(times), np.asarray(rows, dtype=np.float64)


def summary(queues: np.ndarray) -> list[str]:
    """Mean, share above 1 KB, and p50 / p90 / p99 / max of those samples (KB)."""
    kb = queues / 1e3
    busy = kb[kb > 1.0]
    cuts = np.percentile(busy, [50, 90, 99]) if len(busy) else np.zeros(3)
    return [
        f"{kb.mean():.0f}",
        f"{(kb > 1.0).mean():.2f}",
        " / ".join(f"{v:.0f}" for v in (*cuts, kb.max())),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("n", type=int)
    parser.add_argument("r", type=int)
    parser.add_argument("--backends", nargs="*", default=["fluid_dctcp"])
    parser.add_argument("--wire", default="default", help="packets (as the sweep's wire=)")
    parser.add_argument("--every-us", type=float, default=2.0, help="sampling period")
    parser.add_argument("--plot", type=Path, default=None, help="PNG of the degraded ports")
    args = parser.parse_args()
    results = pd.read_parquet(args.run_dir / "results.parquet")
    runs = results[
        (results.n_degraded == args.n) & (results.reduction == args.r) & (results.status == "ok")
    ]
    by = dict(zip(runs.backend, runs.run_id, strict=True))
    if "ns3" not in by:
        raise SystemExit(f"{args.run_dir}: no ns-3 run at N = {args.n}, R = {args.r}")
    topo, degraded = point(args.run_dir, runs, args.n)
    kinds = rail_ports(topo, degraded)
    links = np.array(sorted(kinds))
    trace = _trace(pd.read_parquet(args.run_dir / "flows" / f"{by['ns3']}.parquet"))
    configs = arrivals_configs(["ns3", *args.backends], args.wire)
    series = {
        name: sampled(topo, trace, pair, links, args.every_us * 1e-6)
        for name, pair in configs.items()
    }
    rows = []
    for kind in sorted(set(kinds.values())):
        cols = [i for i, link in enumerate(links) if kinds[link] == kind]
        for name, (_, queues) in series.items():
            rows.append([kind, name, str(len(cols)), *summary(queues[:, cols])])
    print(f"N = {args.n}, R = {args.r}: bytes queued per port, sampled every {args.every_us:g} us")
    header = ["port", "backend", "ports", "mean KB", "share > 1 KB", "p50 / p90 / p99 / max KB"]
    print(format_table(header, rows))
    if args.plot is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        cols = [i for i, link in enumerate(links) if kinds[link] == "rail -> GPU (degraded)"]
        fig, ax = plt.subplots(figsize=(9, 3.5))
        for name, (times, queues) in series.items():
            ax.plot(times * 1e3, queues[:, cols].sum(axis=1) / 1e3, label=name, lw=0.8)
        ax.set_xlabel("simulated time (ms)")
        ax.set_ylabel("KB queued toward degraded GPUs")
        ax.set_title(f"N = {args.n}, R = {args.r}: rail ports toward the degraded GPUs")
        ax.legend()
        fig.tight_layout()
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.plot, dpi=120)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
