"""flowSim's standing queues under each congestion control: p99 FCT slowdown per size bucket,
against packet-level results we did not produce and against our ns-3.

    .venv/bin/python bench/flowsim_queues_cc.py ../shared/data/ns3_cc               # both
    .venv/bin/python bench/flowsim_queues_cc.py ../shared/data/ns3_cc --only field
    .venv/bin/python bench/flowsim_queues_cc.py ../shared/data/ns3_cc --flows 50000 --ccs dcqcn

* ``field``: the HPCC simulator's own HPCC and three TIMELY runs (``hpcc_fat_websearch/``: the
  HPCC paper's 320-host fat tree at 100/400 Gbit/s, all 70,001 WebSearch flows at 30 % load).
  Their FCT ends at the sender's last ACK, ours at the last byte in: each flow gets its ACK's way
  back added (``ns3_cc.ack_way_back``); slowdowns use their standalone FCT. The queue levels
  come from each run's own settings (:func:`m4ray.sim.flowsim.standing_levels`: TIMELY's built-in
  T_low 50 µs less the network's largest base round trip; HPCC none), fitted to nothing here.
* ``field`` also: m3's eight 2-hop shards (``m3_pl3/``, two per CC, DCQCN's only field
  results), p90 and p99 of 300 flows each (too few for size buckets).
* ``ours``: m4ray's ns-3 under DCTCP, DCQCN, HPCC and TIMELY (``M3Network(cc=...)``, each CC's
  defaults; DCQCN's RED from K_min = K to 4 K) on m3's held-out workload: a k = 8 fat tree
  (10 Gbit/s hosts, 40 Gbit/s fabric), web-search sizes scaled to a 20 KB mean, log-normal
  arrivals at 50 % peak link load. ns-3 runs are cached by content under ``--out``.

For each: the reference's p99 slowdown per bucket, then the p99 error against it of flowSim,
flowSim with standing queues and flowSim with first windows over them (``flowsim_bursts``)
(also drawn, ``<out>/p99_errors.png``), and under DCQCN that with DCQCN's rates
(``flowsim_rates``: :class:`m4ray.sim.flowsim.DcqcnRates`, the CC's own timers and gain); and
the per-flow median |slowdown error| (queues do not help there: they charge mean-field waits
some flows never had).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import time
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from m3_eval import WEBSEARCH  # noqa: E402  (bench/ beside us)
from m4_example import print_table  # noqa: E402
from ns3_cc import (  # noqa: E402
    FAT_RUNS,
    ack_way_back,
    fat_flows,
    fat_results,
    m3_shard,
    network,
    read_config,
)

BACKENDS = ("flowsim", "flowsim_queues", "flowsim_bursts")
RATES = "flowsim_rates"  # flowsim_bursts with DCQCN's rates (DCQCN networks only)


def p99s(slowdown: np.ndarray, size: np.ndarray) -> dict[str, float]:
    """p99 overall and per m3 size bucket (``m4ray.m3.aggregate.BUCKET_NAMES``)."""
    from m4ray.m3.aggregate import empirical

    est = empirical(slowdown, size)
    out = {"overall": float(est.overall.quantile(0.99))}
    out.update({b: float(m.quantile(0.99)) for b, m in est.buckets.items()})
    return out


def rows_for(
    where: str, ref_name: str, ref: np.ndarray, ours: dict, size: np.ndarray, *, rows, errors
):
    """One reference row (its p99s) and one error row per backend (``errors``: the same as
    numbers, ``{where: {backend: {bucket: error}}}``, for the plot)."""
    want = p99s(ref, size)
    counts = {"overall": len(size)}
    from m4ray.m3.aggregate import BUCKET_NAMES, OUT_EDGES

    bucket = np.digitize(size, OUT_EDGES)
    counts.update({b: int((bucket == i).sum()) for i, b in enumerate(BUCKET_NAMES)})
    rows.append([where, f"{ref_name} p99", *(f"{want[b]:.2f} ({counts[b]})" for b in want), "-"])
    for name, slowdown in ours.items():
        got = p99s(slowdown, size)
        cells = [f"{got[b] / want[b] - 1:+.1%}" if b in got else "-" for b in want]
        errors.setdefault(where, {})[name] = {b: got[b] / want[b] - 1 for b in want if b in got}
        median = float(np.median(np.abs(slowdown / ref - 1)))
        rows.append([where, name, *cells, f"{median:.1%}"])
    return list(want)


def field(folder: Path, rows: list, notes: list, errors: dict) -> list[str]:
    from m4ray.sim.flowsim import FlowSimConfig, StandingQueues
    from m4ray.sim.routing import Routing, WireFormat
    from m4ray.sim.topology import read_topology
    from m4ray.sim.trace import run_trace

    base = folder / "hpcc_fat_websearch"
    topo = read_topology(base / "fat.txt")
    flows, key = fat_flows(base, 10**9)
    size = np.array([f.size_bytes for f in flows])
    routing = Routing(topo, wire=WireFormat(mtu_bytes=1000, header_bytes=48))

    def fcts(name: str, cfg) -> np.ndarray:
        t0 = time.perf_counter()
        table = run_trace(topo, flows, cfg, routing)
        fct = dict(
            zip(table.column("flow_id").to_pylist(), table.column("fct_s").to_pylist(), strict=True)
        )
        notes.append(f"field: {name}, {len(flows)} flows in {time.perf_counter() - t0:.1f} s")
        return np.array([fct[f.id] for f in flows])

    classic = fcts("flowSim", FlowSimConfig())
    buckets = []
    for label, (config, result) in FAT_RUNS.items():
        cfg = read_config(base / config)
        ns3 = network(cfg, label.split()[0], buffer_bytes=int(cfg["BUFFER_SIZE"][0]) << 20,
                      window=None, fork=False)  # fmt: skip
        theirs, ideal = fat_results(base / result, key, len(flows))
        done = np.isfinite(theirs)
        back = np.array([ack_way_back(routing, f, ns3.rdma.ack_bytes) for f in flows])
        queues = StandingQueues.of(ns3, routing)
        levels = ", ".join(f"{r / 1e9:g}G {b / 1e3:.0f} KB" for r, b in queues.k_bytes)
        notes.append(f"field {label}: window {queues.window_bytes} B, queue levels {levels}; "
                     f"{done.sum()} of {len(flows)} flows finished in the reference")  # fmt: skip
        bursts = StandingQueues.of(ns3, routing, bursts=True)
        ours = {
            "flowsim": classic,
            "flowsim_queues": fcts(label, FlowSimConfig(queues=queues)),
            "flowsim_bursts": fcts(f"{label} bursts", FlowSimConfig(queues=bursts)),
            "flowsim_fifo": fcts(  # links serve the run's window-sized flows in order
                f"{label} FIFO", FlowSimConfig(service="fifo", fifo_bytes=queues.window_bytes)
            ),
        }
        slow = {
            name: np.maximum(fct + back, ideal)[done] / ideal[done] for name, fct in ours.items()
        }
        where = f"HPCC simulator {label}"
        buckets = rows_for(
            where,
            "reference",
            theirs[done] / ideal[done],
            slow,
            size[done],
            rows=rows,
            errors=errors,
        )
    return buckets


def shards(folder: Path, notes: list) -> None:
    """m3's eight 2-hop shards (two per CC, 300 flows each: too few for buckets): the
    reference's p90 / p99 slowdown and each fluid model's error at both."""
    from m4ray.sim.flowsim import DcqcnRates, FlowSimConfig, StandingQueues
    from m4ray.sim.routing import Routing
    from m4ray.sim.topology import read_topology
    from m4ray.sim.trace import run_trace

    base = folder / "m3_pl3"
    topo = read_topology(base / "topo-pl-3.txt")
    rows = []
    for shard in sorted(p for p in base.iterdir() if p.is_dir()):
        cfg, param, cc, flows, theirs, ideal, buffer, window, wire = m3_shard(shard)
        routing = Routing(topo, wire=wire)
        ns3 = network(cfg, cc, buffer_bytes=buffer, window=window, fork=True)
        want = np.quantile(theirs / ideal, [0.9, 0.99])
        cells = [f"{shard.name.split('_')[0]} ({param[4]})", f"{want[0]:.2f} / {want[1]:.2f}"]
        bursts = StandingQueues.of(ns3, routing, bursts=True)
        backends = [
            FlowSimConfig(),
            FlowSimConfig(queues=StandingQueues.of(ns3, routing)),
            FlowSimConfig(queues=bursts),
        ]
        if cc == "dcqcn":
            backends.append(FlowSimConfig(queues=bursts, rate_control=DcqcnRates.of(ns3)))
        for backend in backends:
            table = run_trace(topo, flows, backend, routing).to_pandas().set_index("flow_id")
            fct = table.fct_s.loc[[f.id for f in flows]].to_numpy()
            got = np.quantile(np.maximum(fct, ideal) / ideal, [0.9, 0.99])
            cells.append(" / ".join(f"{g / w - 1:+.1%}" for g, w in zip(got, want, strict=True)))
        rows.append(cells)
    header = ["shard (CC)", "reference", *BACKENDS, RATES]
    rows = [cells + ["-"] * (len(header) - len(cells)) for cells in rows]  # rates: DCQCN only
    notes.append("m3's 2-hop shards (300 flows each), p90 / p99 slowdown:")
    with io.StringIO() as out, contextlib.redirect_stdout(out):
        print_table(header, rows)
        notes.append(out.getvalue())


def ours(args, rows: list, notes: list, errors: dict) -> list[str]:
    from m4ray.m3.estimate import M3Config, M3Network, M3Workload, reference_run
    from m4ray.runtime.cluster import RayConfig, start_ray
    from m4ray.sim.routing import Routing, WireFormat
    from m4ray.sim.topologies import fat_tree

    ray = start_ray(RayConfig())
    topo = fat_tree(k=8, bandwidth_bps=10e9, fabric_bandwidth_bps=40e9, oversubscription=1)
    routing = Routing(topo, seed=args.seed, wire=WireFormat())
    workload = M3Workload(
        n_flows=args.flows,
        size={"kind": "empirical", "cdf": WEBSEARCH},
        size_mean_bytes=20_000,
        max_load=0.5,
    )
    flows = workload.flows(routing, args.seed)
    size = np.array([f.size_bytes for f in flows])
    buckets = []
    for cc in args.ccs:
        cfg = M3Config(workload=workload, network=M3Network(cc=cc))
        got, walls = {}, {}
        names = ("ns3", *BACKENDS, *([RATES] if cc == "dcqcn" else []))
        for name in names:
            got[name], walls[name] = reference_run(
                name, topo, flows, routing, cfg=cfg, cache=Path(args.out) / "cache", ray=ray
            )
        where = f"our ns-3 {cc}"
        buckets = rows_for(where, "ns-3", got.pop("ns3"), got, size, rows=rows, errors=errors)
        wall = ", ".join(f"{name} {walls[name]:.1f} s" for name in names)
        notes.append(f"{where}: {len(flows)} flows; wall {wall}")
    return buckets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="the ns3_cc folder (shared/data)")
    parser.add_argument("--only", choices=["field", "ours"], help="run one set only")
    parser.add_argument("--flows", type=int, default=20_000, help="flows of our workload")
    parser.add_argument("--ccs", nargs="+", default=["dctcp", "dcqcn", "hpcc", "timely"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="outputs/bench/flowsim_queues_cc")
    args = parser.parse_args()

    rows: list[list[str]] = []
    notes: list[str] = []
    errors: dict[str, dict[str, dict[str, float]]] = {}
    buckets: list[str] = []
    if args.only in (None, "field"):
        buckets = field(args.folder, rows, notes, errors)
        shards(args.folder, notes)
    if args.only in (None, "ours"):
        buckets = ours(args, rows, notes, errors)
    print("\np99 FCT slowdown: the reference's (flows), then each fluid model's error against it;")
    print("last column: per-flow median |slowdown / reference - 1|\n")
    print_table(["where", "who", *buckets, "per-flow p50"], rows)
    print()
    print("\n".join(notes))
    print(f"\nplot: {plot(errors, buckets, Path(args.out) / 'p99_errors.png')}")


def plot(errors: dict, buckets: list[str], path: Path) -> Path:
    """Each scenario's p99 error per size bucket, flowSim beside flowSim with queues (standing
    and with first windows over the level)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(errors), 1, figsize=(8, 1.6 * len(errors)), sharex=True)
    axes = np.atleast_1d(axes)
    x = np.arange(len(buckets))
    for ax, (where, by_backend) in zip(axes, errors.items(), strict=True):
        for k, (name, err) in enumerate(by_backend.items()):
            values = [100 * err.get(b, np.nan) for b in buckets]
            width = 0.8 / len(by_backend)
            ax.bar(x + (k - (len(by_backend) - 1) / 2) * width, values, width=width, label=name)
        ax.axhline(0, color="black", linewidth=0.6)
        ax.set_ylabel("%", rotation=0)
        ax.set_title(where, fontsize=9, loc="left")
    axes[0].legend(fontsize=8, loc="lower right")
    axes[-1].set_xticks(x, buckets)
    fig.suptitle("p99 FCT slowdown error against the reference, by flow size")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    main()
