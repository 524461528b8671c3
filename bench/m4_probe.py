"""What per-flow inputs could take m4's residual back (issue 32's m4 bar: ≤ ½ the anchor's error).

    .venv/bin/python bench/m4_probe.py --dataset outputs/datagen_cc/dataset

``bench/m4_residual.py`` shows that a constant per (CC, family, size bucket) — the bucket oracle —
is all m4's learned correction has learned, and that the rest is per flow. This probe asks which
per-flow inputs carry that rest: gradient-boosted trees (scikit-learn's histogram GBM, fitted on
the training periods' flows, scored on the held-out periods', split by scenario as training
splits them) predict ``log(ns-3 / anchor)`` from nested input sets:

- **bucket**: CC, family, log size (the bucket oracle's knowledge, smoothly);
- **+ fluid**: the anchor's and classic flowSim's slowdowns, the flow's hops, its ideal FCT;
- **+ network**: the scenario's network parameters as m4 reads them (``params13``: the CC's
  and the switches' settings);
- **+ arrivals**: what the flows' arrivals alone say at each flow's arrival, as a simulator knows
  it before running anything: per link of its path the backlog a FIFO queue fed by every flow
  (each at the link's rate, Lindley's recursion) would hold, as a multiple of the flow's ideal FCT
  (max and sum over its links); arrivals sharing its first and its last link in the 10 and 100 µs
  before it, and their bytes;
- **+ fluid life**: per link of its path, the flows classic flowSim has active there at its
  arrival and those arriving while it lives in flowSim (max and sum over its links);
- **+ ns-3's queues** (an oracle input, not available to a model): the bytes ns-3 had queued on
  the flow's links when it arrived (the datasets' ``queues`` table, m4's auxiliary target), in
  time at each link's rate over the flow's ideal FCT.

With ``--m4 <checkpoint>`` the trained m4 is scored too, and its answer is an input after
**+ fluid** (**+ m4**): whether its graph network knows per flow what the two fluid answers do
not.

If **+ arrivals** closes much of the gap where **+ fluid** does not, those inputs belong in m4's
flow features; if only **+ ns-3's queues** does, m4 has to learn the queues (its auxiliary loss).
Scores per flow are ``|ŝ/s − 1|`` (mean / p90), per CC and over all held-out flows.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from m4_residual import LABELS, err  # noqa: E402 (a sibling bench)

WINDOWS_US = (10.0, 100.0)


def arrival_features(flows: pd.DataFrame, bandwidth: pd.Series, queues: pd.DataFrame):
    """Per flow of one scenario (index: flow_id): the arrivals' FIFO backlog on its links and its
    neighbours in time on its first and last link; ns-3's queued time at its arrival."""
    order = flows.sort_values(["start_s", "flow_id"])
    ideal = order.ideal_fct_s.to_numpy()
    backlog: dict[int, float] = {}
    last: dict[int, float] = {}
    fifo_max = np.zeros(len(order))
    fifo_sum = np.zeros(len(order))
    for k, (t, size, path) in enumerate(
        zip(order.start_s.to_numpy(), order.size_bytes.to_numpy(), order.path, strict=True)
    ):
        for link in path:
            bw = bandwidth[link]
            b = max(0.0, backlog.get(link, 0.0) - (t - last.get(link, t)))
            fifo_max[k] = max(fifo_max[k], b)
            fifo_sum[k] += b
            backlog[link] = b + size * 8.0 / bw
            last[link] = t
    out = pd.DataFrame(
        {"fifo_max": fifo_max / ideal, "fifo_sum": fifo_sum / ideal}, index=order.flow_id
    )
    start = order.start_s.to_numpy()
    size = order.size_bytes.to_numpy()
    for end, name in ((0, "first"), (-1, "last")):
        link = np.array([p[end] for p in order.path])
        for w in WINDOWS_US:
            count = np.zeros(len(order))
            nbytes = np.zeros(len(order))
            for value in np.unique(link):
                rows = np.flatnonzero(link == value)  # by start already
                t = start[rows]
                lo = np.searchsorted(t, t - w * 1e-6, side="left")
                csum = np.concatenate([[0.0], np.cumsum(size[rows])])
                idx = np.arange(len(rows))
                count[rows] = idx - lo
                nbytes[rows] = csum[idx] - csum[lo]
            out[f"{name}_n_{w:g}us"] = count
            out[f"{name}_kb_{w:g}us"] = nbytes / 1e3
    # over the flow's fluid life (classic flowSim's), per link of its path: flows active at its
    # arrival and arriving while it lives (max and sum over its links), as a fluid replay knows
    hops = flows[["flow_id", "start_s", "flowsim_fct_s", "path"]].explode("path")
    hops["end"] = hops.start_s + hops.flowsim_fct_s
    active = np.zeros(len(hops))
    during = np.zeros(len(hops))
    for _, rows in hops.groupby("path").indices.items():
        t, e = hops.start_s.to_numpy()[rows], hops.end.to_numpy()[rows]
        starts, ends = np.sort(t), np.sort(e)
        active[rows] = np.searchsorted(starts, t, "left") - np.searchsorted(ends, t, "right")
        during[rows] = np.searchsorted(starts, e, "right") - np.searchsorted(starts, t, "right")
    hops["active"], hops["during"] = active, during
    life = hops.groupby("flow_id")[["active", "during"]].agg(["max", "sum"])
    life.columns = [f"life_{a}_{b}" for a, b in life.columns]
    out = out.join(life)
    q = queues.merge(bandwidth.rename("bw"), left_on="link", right_index=True)
    q["wait"] = q.queue_bytes * 8.0 / q.bw
    wait = q.groupby("flow_id").wait.sum()
    out["ns3_queue"] = wait.reindex(out.index).fillna(0.0).to_numpy() / ideal
    return out


def read_scenarios(dataset: Path, scenario_ids: set[str]) -> dict[str, dict[str, pd.DataFrame]]:
    """The flows, links and queues tables of each scenario, read once."""
    import pyarrow.parquet as pq

    return {
        sid: {
            t: pq.read_table(dataset / t / f"scenario_id={sid}" / "part-0.parquet").to_pandas()
            for t in ("flows", "links", "queues")
        }
        for sid in sorted(scenario_ids)
    }


def period_flow_ids(tables: dict, samples: list) -> list[tuple[str, np.ndarray]]:
    """Each sample's (scenario, flow ids) in the order its period lists its flows."""
    out = []
    for s in samples:
        f = tables[s.scenario_id]["flows"]
        out.append((s.scenario_id, np.sort(f.flow_id[f.period_id == s.period_id].to_numpy())))
    return out


def scenario_features(tables: dict) -> pd.DataFrame:
    """:func:`arrival_features` of every scenario read, keyed by (scenario_id, flow_id)."""
    parts = []
    for sid, read in tables.items():
        bw = read["links"].set_index("link").bandwidth_bps
        feats = arrival_features(read["flows"], bw, read["queues"])
        feats["scenario_id"] = sid
        parts.append(feats.reset_index())
    return pd.concat(parts, ignore_index=True)


def load(args) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, list[str]], str]:
    """The training and held-out flows with every input, the nested input sets, a header."""
    from m4_residual import anchored_splits
    from m4_residual import flows as period_flows

    table, scenario, splits, anchor = anchored_splits(args)
    trained = None
    if args.m4:
        from m4ray.models.checkpoint import load as load_checkpoint
        from m4ray.sim.m4.backend import checkpoint_dir

        trained, _ = load_checkpoint(checkpoint_dir(args.m4))
        trained.eval()
    tables = read_scenarios(
        args.dataset, {s.scenario_id for k in ("train", "test") for s in splits[k]}
    )
    frames = {}
    for k in ("train", "test"):
        f = period_flows(anchor, splits[k], scenario)
        ids = period_flow_ids(tables, splits[k])
        f["scenario_id"] = np.concatenate([np.full(len(i), s) for s, i in ids])
        f["flow_id"] = np.concatenate([i for _, i in ids])
        if trained is not None:
            f["m4"] = period_flows(trained, splits[k], scenario)["pred"]
        frames[k] = f
    feats = scenario_features(tables)
    params = pd.DataFrame(np.stack(table.params13.to_numpy()), index=table.scenario_id).add_prefix(
        "param_"
    )
    codes = {
        "cc_i": {c: i for i, c in enumerate(sorted({cc for _, cc in scenario.values()}))},
        "fam_i": {f: i for i, f in enumerate(sorted({fam for fam, _ in scenario.values()}))},
    }
    for k, raw in frames.items():
        f = raw.merge(feats, on=["scenario_id", "flow_id"], how="left")
        f = f.join(params, on="scenario_id")
        f["cc_i"] = f.cc.map(codes["cc_i"])
        f["fam_i"] = f.family.map(codes["fam_i"])
        f["log_size"] = np.log10(f["size"])
        f["log_anchor"] = np.log(f.pred)
        f["log_flowsim"] = np.log(f.flowsim)
        f["target"] = np.log(f.ns3 / f.pred)
        if trained is not None:
            f["log_m4"] = np.log(f.m4)
        frames[k] = f
    sets = {
        "bucket": ["cc_i", "fam_i", "log_size"],
        "+ fluid": ["log_anchor", "log_flowsim"],
        **({"+ m4": ["log_m4"]} if trained is not None else {}),
        "+ network": list(params.columns),
        "+ arrivals": ["fifo_max", "fifo_sum"]
        + [c for c in feats.columns if c.startswith(("first_", "last_"))],
        "+ fluid life": [c for c in feats.columns if c.startswith("life_")],
        "+ ns-3's queues": ["ns3_queue"],
    }
    train, test = frames["train"], frames["test"]
    header = (
        f"{len(splits['train'])} training / {len(splits['test'])} held-out periods of "
        f"{args.dataset} ({len(train)} / {len(test)} flows); anchor of {args.anchor}. "
        "Per-flow |ŝ/s − 1|, mean / p90\n"
    )
    return train, test, sets, header


def predictions(train, test, sets: dict[str, list[str]], seed: int) -> dict[str, pd.Series]:
    """Each estimate of the held-out flows' slowdowns: the anchor, flowSim, the bucket oracle
    and a GBM per nested input set."""
    from sklearn.ensemble import HistGradientBoostingRegressor

    who = {"anchor": test.pred, "flowSim": test.flowsim}
    if "m4" in test:
        who["m4"] = test.m4
    keys = ["cc", "family", "bucket"]
    median = train.groupby(keys, observed=True).target.median().rename("shift")
    who["bucket oracle"] = test.pred * np.exp(test.join(median, on=keys)["shift"].fillna(0.0))
    cols: list[str] = []
    for name, extra in sets.items():
        cols = cols + extra
        gbm = HistGradientBoostingRegressor(
            loss="absolute_error", max_iter=300, learning_rate=0.08, random_state=seed,
            categorical_features=[c in ("cc_i", "fam_i") for c in cols],
        )  # fmt: skip
        gbm.fit(train[cols].to_numpy(), train.target.to_numpy())
        who[name] = test.pred * np.exp(gbm.predict(test[cols].to_numpy()))
    return who


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", required=True, type=Path, help="a datagen dataset folder")
    parser.add_argument("--anchor", default="m4-v3", help="a fluid-anchored checkpoint")
    parser.add_argument("--n-train", type=int, default=2400, help="training periods (balanced)")
    parser.add_argument("--n-test", type=int, default=600, help="held-out periods (balanced)")
    parser.add_argument("--seed", type=int, default=0, help="the GBM's seed")
    parser.add_argument("--m4", help="a trained checkpoint: scored, and its answer an input")
    args = parser.parse_args()

    train, test, sets, header = load(args)
    who = predictions(train, test, sets, args.seed)
    print(header)
    print(f"{'cc':<8}{'flows':>7}" + "".join(f"{w:>17}" for w in who))
    for cc, x in [*test.groupby("cc"), ("all", test)]:
        cells = "".join(f"{err(who[w][x.index], x.ns3):>17}" for w in who)
        print(f"{cc:<8}{len(x):>7}" + cells)
    print("\nper size bucket, all CCs (mean / p90)\n")
    print(f"{'bucket':<8}{'flows':>7}" + "".join(f"{w:>17}" for w in who))
    for b in LABELS:
        x = test[test.bucket == b]
        if len(x):
            cells = "".join(f"{err(who[w][x.index], x.ns3):>17}" for w in who)
            print(f"{b:<8}{len(x):>7}" + cells)


if __name__ == "__main__":
    main()
