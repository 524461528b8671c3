"""Where the fluid and learned backends go wrong per flow on a gray-failure sweep: each flow's FCT
against ns-3's (flows matched by DAG node, endpoints, size and occurrence), by class of flow —
its size, whether it crosses servers, whether its sender or receiver is a degraded GPU — beside
each point's iteration (rank 0's finish) against ns-3's.

    .venv/bin/python bench/study_perflow.py outputs/fullsize_f32            # every (N, R)
    .venv/bin/python bench/study_perflow.py outputs/fullsize_f32 --points 8:4 16:4

The folder is a sweep's run directory (``results.parquet`` and ``flows/``) with ns-3 among its
backends and GPU-targeted failures (the server-aligned sets of ``m4ray.sim.failures``). A ratio
above 1 is a backend slower than ns-3. Per class the table gives ns-3's and the backend's FCT
median and p90 (each the median over the points chosen), the ratio of the medians, the median
of each matched flow's FCT / ns-3's, and the flows per point; then the iteration ratio per
point. A flow's FCT here is its own (start to last ACK). Flows start when their parents finish,
so the same flow starts at another time in each simulation and meets other flows there: the
distributions say whether a backend is biased on a kind of flow, the matched ratio mixes that
with how differently the two runs unfolded. Choose points that behave alike (``--points``):
the study's N <= 8 and N >= 9 (a whole server degraded) do not.

``--given-arrivals flowsim m4 ...`` separates the two: each backend (as the default sweep
composes it, ``--wire`` for the packets) is run in trace mode on ns-3's own flows with ns-3's
start times, so every flow meets the flows ns-3 had beside it; per class, the backend's FCT /
ns-3's per flow at the median, p10 and p1 (the flows it makes too fast), and its summed FCT /
ns-3's. Close to 1 there while the iteration is far off says the gap is made in closed loop:
small per-flow errors change when children start, and so what each flow meets.

    .venv/bin/python bench/study_perflow.py outputs/<run> --points 16:4 --given-arrivals flowsim

``--ns3-on-own-flows fluid_dctcp ...`` is the other view: ns-3 (as the sweep composes it) run
open loop on each backend's own closed-loop flows at that backend's start times, the backend's
FCT / ns-3's there. A backend right flow by flow on ns-3's arrivals can still run its own loop
into situations ns-3's never meets; this finds them (``--by-step``: per ring step of the largest
cross-server flows; at scale 0.25, N16R4 it showed the fluid's degraded senders 2–2.5x too fast
in the first five steps, docs/gray_failure_study.md). ns-3 runs once per backend and point.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from m4ray.sim.failures import gray_failure_gpus
from m4ray.sim.topology import read_topology
from m4ray.sweeps.report import format_table

MATCH = ["node_id", "src", "dst", "size_bytes"]


def flows(run_dir: Path, run_id: str) -> pd.DataFrame:
    """A run's per-flow table indexed by (node, src, dst, size, occurrence)."""
    table = pd.read_parquet(run_dir / "flows" / f"{run_id}.parquet")
    table["k"] = table.groupby(MATCH).cumcount()
    return table.set_index([*MATCH, "k"])[["fct_s"]]


CLASS = ["size", "path", "sender", "receiver"]


def point(run_dir: Path, runs: pd.DataFrame, n: int):
    """A point's topology (from the run's own file) and its degraded GPUs."""
    r = int(runs.reduction.iloc[0])
    topo = read_topology(run_dir / "topologies" / f"gray_topo_N{n}_R{r}.txt")
    per_server = topo.gpus_per_server
    return topo, list(gray_failure_gpus(n, per_server, len(topo.hosts) // per_server))


def class_columns(table: pd.DataFrame, per_server: int, degraded: list[int]) -> pd.DataFrame:
    """Each flow's class (:data:`CLASS`): size, intra- or cross-server, degraded ends."""
    src, dst = table.src.to_numpy(), table.dst.to_numpy()
    return pd.DataFrame({
        "size": table.size_bytes.to_numpy(),
        "path": np.where(src // per_server != dst // per_server, "cross", "intra"),
        "sender": np.where(np.isin(src, degraded), "degraded", "healthy"),
        "receiver": np.where(np.isin(dst, degraded), "degraded", "healthy"),
    })  # fmt: skip


def point_classes(run_dir: Path, runs: pd.DataFrame, n: int) -> dict[str, pd.DataFrame]:
    """Per backend (not ns-3), per class of flow at one point: ns-3's and the backend's FCT
    median and p90 (µs) and the median of each matched flow's FCT / ns-3's."""
    by = dict(zip(runs.backend, runs.run_id, strict=True))
    reference = flows(run_dir, by["ns3"])
    topo, degraded = point(run_dir, runs, n)
    out = {}
    for backend, run_id in by.items():
        if backend == "ns3":
            continue
        both = reference.join(flows(run_dir, run_id).add_suffix("_b"), how="inner").reset_index()
        frame = class_columns(both, topo.gpus_per_server, degraded).assign(
            ns3=both.fct_s.to_numpy() * 1e6,
            backend=both.fct_s_b.to_numpy() * 1e6,
            log_ratio=np.log(both.fct_s_b.to_numpy() / both.fct_s.to_numpy()),
        )
        grouped = frame.groupby(CLASS)
        out[backend] = pd.concat(
            [
                grouped.ns3.median().rename("ns3_p50"),
                grouped.ns3.quantile(0.9).rename("ns3_p90"),
                grouped.backend.median().rename("p50"),
                grouped.backend.quantile(0.9).rename("p90"),
                np.exp(grouped.log_ratio.median()).rename("matched"),
                grouped.size().rename("flows"),
            ],
            axis=1,
        )
    return out


def ratio_tables(
    flows: pd.DataFrame, topo, degraded: list[int], reference: np.ndarray, candidate: np.ndarray
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per class of flow: ``candidate`` FCT / ``reference``'s per flow (p50, p10, p1) and the
    sums' ratio; and per ring step (a flow's rank by start among its sender's flows to the same
    receiver of its size) of the largest cross-server flows, the sums' ratio per sender and
    receiver. ``flows`` is the trace both ran (its ``src``, ``dst``, ``size_bytes``,
    ``start_s``)."""
    base = class_columns(flows, topo.gpus_per_server, degraded).assign(
        ref=reference,
        backend=candidate,
        ratio=candidate / reference,
        step=flows.groupby(["src", "dst", "size_bytes"]).start_s.rank(method="first").to_numpy(),
    )
    grouped = base.groupby(CLASS)
    table = pd.concat(
        [
            grouped.ratio.median().rename("p50"),
            grouped.ratio.quantile(0.1).rename("p10"),
            grouped.ratio.quantile(0.01).rename("p1"),
            (grouped.backend.sum() / grouped.ref.sum()).rename("sum"),
            grouped.size().rename("flows"),
        ],
        axis=1,
    )
    cross = base[(base.path == "cross") & (base["size"] == base["size"].max())]
    sums = cross.groupby(["step", "sender", "receiver"])[["backend", "ref"]].sum()
    return table, (sums.backend / sums.ref).unstack(["sender", "receiver"])


def _trace(table: pd.DataFrame) -> list:
    from m4ray.sim.flows import Flow

    return [
        Flow(i, int(f.src), int(f.dst), int(f.size_bytes), float(f.start_s))
        for i, f in enumerate(table.itertuples())
    ]


def given_arrivals(run_dir: Path, runs: pd.DataFrame, n: int, configs: dict) -> tuple[dict, dict]:
    """Per backend in ``configs`` at one point, run on ns-3's flows at ns-3's start times: its
    FCT / ns-3's per class and per ring step (:func:`ratio_tables`)."""
    from m4ray.sim.routing import Routing
    from m4ray.sim.trace import run_trace

    by = dict(zip(runs.backend, runs.run_id, strict=True))
    ns3 = pd.read_parquet(run_dir / "flows" / f"{by['ns3']}.parquet")
    topo, degraded = point(run_dir, runs, n)
    trace = _trace(ns3)
    out, steps = {}, {}
    for name, (config, wire) in configs.items():
        fct = run_trace(topo, trace, config, Routing(topo, wire=wire)).column("fct_s").to_numpy()
        out[name], steps[name] = ratio_tables(ns3, topo, degraded, ns3.fct_s.to_numpy(), fct)
    return out, steps


def ns3_on_own_flows(run_dir: Path, runs: pd.DataFrame, n: int, backends: list[str], ns3):
    """The other view: ns-3 (``ns3``: its config and wire) run open loop on each backend's own
    closed-loop flows at that backend's start times, the backend's FCT / ns-3's there per class
    and per ring step (:func:`ratio_tables`). Given ns-3's arrivals a backend can be right flow
    by flow and still run its own closed loop into situations ns-3's never meets; this says
    where its own trajectory is wrong."""
    from m4ray.sim.routing import Routing
    from m4ray.sim.trace import run_trace

    by = dict(zip(runs.backend, runs.run_id, strict=True))
    topo, degraded = point(run_dir, runs, n)
    config, wire = ns3
    out, steps = {}, {}
    for name in backends:
        own = pd.read_parquet(run_dir / "flows" / f"{by[name]}.parquet")
        fct = run_trace(topo, _trace(own), config, Routing(topo, wire=wire))
        reference = fct.column("fct_s").to_numpy()
        out[name], steps[name] = ratio_tables(own, topo, degraded, reference, own.fct_s.to_numpy())
    return out, steps


def arrivals_configs(names: list[str], wire: str) -> dict:
    """The named backends as the default sweep composes them, with ``wire``'s packets."""
    from composed import resolved

    cfg = resolved("+experiment=gray_failure", f"wire={wire}")
    return {name: (cfg.backend_options[name], cfg.wire) for name in names}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--points", nargs="*", default=None, help="N:R points (default: all)")
    parser.add_argument(
        "--given-arrivals", nargs="*", default=[], help="backends run on ns-3's own arrivals"
    )
    parser.add_argument("--wire", default="default", help="packets for --given-arrivals")
    parser.add_argument(
        "--ns3-on-own-flows",
        nargs="*",
        default=[],
        help="backends whose own closed-loop flows ns-3 runs open loop (at --wire)",
    )
    parser.add_argument(
        "--by-step", action="store_true", help="both views' ratios per ring step too"
    )
    args = parser.parse_args()
    configs = arrivals_configs(args.given_arrivals, args.wire) if args.given_arrivals else {}
    ns3 = arrivals_configs(["ns3"], args.wire)["ns3"] if args.ns3_on_own_flows else None
    given: dict[str, list[pd.DataFrame]] = {}
    by_step: dict[str, list[pd.DataFrame]] = {}
    own: dict[str, list[pd.DataFrame]] = {}
    own_steps: dict[str, list[pd.DataFrame]] = {}
    results = pd.read_parquet(args.run_dir / "results.parquet")
    results = results[results.status == "ok"]
    if "ns3" not in set(results.backend):
        raise SystemExit(f"{args.run_dir}: no ns-3 runs to compare with")
    wanted = {tuple(int(v) for v in p.split(":")) for p in args.points} if args.points else None
    classes: dict[str, list[pd.DataFrame]] = {}
    iterations = []
    for (n, r), runs in results.groupby(["n_degraded", "reduction"]):
        if wanted is not None and (n, r) not in wanted:
            continue
        time = runs.set_index("backend")["rank0_time_s"]
        row = [f"{n}, {r}", f"{time['ns3'] * 1e3:.2f}"]
        for backend, table in point_classes(args.run_dir, runs, n).items():
            classes.setdefault(backend, []).append(table)
            row.append(f"{time[backend] / time['ns3']:.3f}")
        iterations.append(row)
        if configs:
            tables, steps = given_arrivals(args.run_dir, runs, n, configs)
            for backend, table in tables.items():
                given.setdefault(backend, []).append(table)
                by_step.setdefault(backend, []).append(steps[backend])
        if ns3 is not None:
            tables, steps = ns3_on_own_flows(args.run_dir, runs, n, args.ns3_on_own_flows, ns3)
            for backend, table in tables.items():
                own.setdefault(backend, []).append(table)
                own_steps.setdefault(backend, []).append(steps[backend])
    for backend, parts in classes.items():
        frame = pd.concat(parts).reset_index()
        rows = []
        for key, part in frame.groupby(CLASS):
            m = part.median(numeric_only=True)
            rows.append([
                f"{key[0] / 1024:.0f} KiB", *key[1:], f"{m.ns3_p50:.0f} / {m.ns3_p90:.0f}",
                f"{m.p50:.0f} / {m.p90:.0f}", f"{m.p50 / m.ns3_p50:.2f}",
                f"{m.matched:.2f}", f"{m.flows:.0f}", str(len(part)),
            ])  # fmt: skip
        print(f"\n{backend} against ns-3 per class of flow (medians over {len(parts)} points)")
        header = ["size", "path", "sender", "receiver", "ns-3 p50 / p90 us",
                  f"{backend} p50 / p90 us", "p50 ratio", "matched", "flows", "points"]  # fmt: skip
        print(format_table(header, rows))
    views = [
        (given, by_step, "on ns-3's own arrivals"),
        (own, own_steps, "on its own flows, ns-3 run open loop on them"),
    ]
    for tables, steps, where in views:
        print_ratios(tables, steps if args.by_step else {}, where)
    print("\niteration (rank 0) / ns-3's")
    print(format_table(["N, R", "ns-3 ms", *classes], iterations))


def print_ratios(given: dict, by_step: dict, where: str) -> None:
    """The per-class ratio tables of :func:`ratio_tables` (medians over points), then the
    per-step ones."""
    for backend, parts in given.items():
        frame = pd.concat(parts).reset_index()
        rows = [
            [f"{key[0] / 1024:.0f} KiB", *key[1:]]
            + [f"{part[c].median():.2f}" for c in ("p50", "p10", "p1", "sum")]
            + [f"{part.flows.median():.0f}", str(len(part))]
            for key, part in frame.groupby(CLASS)
        ]
        print(f"\n{backend} {where}: its FCT / ns-3's per flow (medians over {len(parts)} points)")
        header = ["size", "path", "sender", "receiver", "p50", "p10", "p1", "sum", "flows",
                  "points"]  # fmt: skip
        print(format_table(header, rows))
    for backend, parts in by_step.items():
        table = pd.concat(parts).groupby(level=0).median()
        print(
            f"\n{backend} {where}, the largest cross-server flows by ring step: "
            f"summed FCT / ns-3's (medians over {len(parts)} points)"
        )
        header = ["step", *(f"{a} -> {b}" for a, b in table.columns)]
        rows = [[f"{step:.0f}", *(f"{v:.2f}" for v in row)] for step, row in table.iterrows()]
        print(format_table(header, rows))


if __name__ == "__main__":
    main()
