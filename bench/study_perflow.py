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


def given_arrivals(run_dir: Path, runs: pd.DataFrame, n: int, configs: dict) -> tuple[dict, dict]:
    """Per backend in ``configs``, per class of flow at one point: the backend run on ns-3's
    flows at ns-3's start times, each flow's FCT / ns-3's (p50, p10, p1) and the sums' ratio;
    and per ring step (a flow's rank by start among its sender's flows to the same receiver of
    its size) of the largest cross-server flows, the sums' ratio per sender and receiver."""
    from m4ray.sim.flows import Flow
    from m4ray.sim.routing import Routing
    from m4ray.sim.trace import run_trace

    by = dict(zip(runs.backend, runs.run_id, strict=True))
    ns3 = pd.read_parquet(run_dir / "flows" / f"{by['ns3']}.parquet")
    topo, degraded = point(run_dir, runs, n)
    trace = [
        Flow(i, int(f.src), int(f.dst), int(f.size_bytes), float(f.start_s))
        for i, f in enumerate(ns3.itertuples())
    ]
    base = class_columns(ns3, topo.gpus_per_server, degraded).assign(
        ns3=ns3.fct_s.to_numpy(),
        step=ns3.groupby(["src", "dst", "size_bytes"]).start_s.rank(method="first").to_numpy(),
    )
    out, steps = {}, {}
    for name, (config, wire) in configs.items():
        fct = run_trace(topo, trace, config, Routing(topo, wire=wire)).column("fct_s").to_numpy()
        frame = base.assign(backend=fct, ratio=fct / base.ns3.to_numpy())
        grouped = frame.groupby(CLASS)
        out[name] = pd.concat(
            [
                grouped.ratio.median().rename("p50"),
                grouped.ratio.quantile(0.1).rename("p10"),
                grouped.ratio.quantile(0.01).rename("p1"),
                (grouped.backend.sum() / grouped.ns3.sum()).rename("sum"),
                grouped.size().rename("flows"),
            ],
            axis=1,
        )
        cross = frame[(frame.path == "cross") & (frame["size"] == frame["size"].max())]
        sums = cross.groupby(["step", "sender", "receiver"])[["backend", "ns3"]].sum()
        steps[name] = (sums.backend / sums.ns3).unstack(["sender", "receiver"])
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
        "--by-step", action="store_true", help="with --given-arrivals: the ratio per ring step"
    )
    args = parser.parse_args()
    configs = arrivals_configs(args.given_arrivals, args.wire) if args.given_arrivals else {}
    given: dict[str, list[pd.DataFrame]] = {}
    by_step: dict[str, list[pd.DataFrame]] = {}
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
    for backend, parts in given.items():
        frame = pd.concat(parts).reset_index()
        rows = [
            [f"{key[0] / 1024:.0f} KiB", *key[1:]]
            + [f"{part[c].median():.2f}" for c in ("p50", "p10", "p1", "sum")]
            + [f"{part.flows.median():.0f}", str(len(part))]
            for key, part in frame.groupby(CLASS)
        ]
        print(
            f"\n{backend} on ns-3's own arrivals: its FCT / ns-3's per flow "
            f"(medians over {len(parts)} points)"
        )
        header = ["size", "path", "sender", "receiver", "p50", "p10", "p1", "sum", "flows",
                  "points"]  # fmt: skip
        print(format_table(header, rows))
    for backend, parts in by_step.items() if args.by_step else ():
        table = pd.concat(parts).groupby(level=0).median()
        print(
            f"\n{backend} on ns-3's own arrivals, the largest cross-server flows by ring step: "
            f"summed FCT / ns-3's (medians over {len(parts)} points)"
        )
        header = ["step", *(f"{a} -> {b}" for a, b in table.columns)]
        rows = [[f"{step:.0f}", *(f"{v:.2f}" for v in row)] for step, row in table.iterrows()]
        print(format_table(header, rows))
    print("\niteration (rank 0) / ns-3's")
    print(format_table(["N, R", "ns-3 ms", *classes], iterations))


if __name__ == "__main__":
    main()
