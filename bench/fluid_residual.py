"""How much of the fluid's per-flow error a learned correction could take back (issue 32's m4
bar: half its anchor's error, with the fluid as the anchor; docs/m4.md).

    .venv/bin/python bench/fluid_residual.py outputs/cc_open outputs/cc_open_dcqcn \\
        outputs/cc_open_hpcc outputs/cc_open_timely

Each folder is a datagen run of open-loop scenarios (flows given up front, so every backend
meets ns-3's arrivals; e.g. data cc's open-loop families under one CC:
``+experiment=datagen_cc datagen.scenarios=48 datagen.weights.rail=0`` with each family's
``network.cc.ccs=[<cc>]``). Every flow is replayed on the fluid (``fluid_dctcp``, the network's
CC) and classic flowSim; a quarter of the scenarios (by a hash of their id) are held out. On the
held-out flows, mean / p90 of |FCT / ns-3's − 1| for:

- **flowSim** and **the fluid** as they are;
- **bucket oracle**: the fluid times the median ns-3 / fluid of the training flows of the same
  CC, family and size bucket (what a model that knows only those can do);
- **trees**: gradient-boosted trees (scikit-learn's histogram GBM, fitted on the training
  flows) predicting ``log(ns-3 / fluid)`` from the CC, family, log size, log ideal FCT, hops,
  the fluid's and flowSim's slowdowns: what a learned correction on those inputs reaches.

If the trees come near half the fluid's error, an m4 anchored on the fluid has that much to
learn from inputs it would have; if they stay near the bucket oracle, the rest is per flow and
needs more than the fluid's own answers.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from m4ray.sweeps.report import format_table

BUCKETS = [0, 1_000, 10_000, 50_000, 1_000_000, np.inf]  # bytes


def flows_of(run_dir: Path) -> pd.DataFrame:
    """Every open-loop flow of the run on the fluid and classic flowSim (``fluid_s``,
    ``flowsim_s``) beside ns-3's (:func:`fluid_perflow.open_loop_flows`)."""
    from fluid_perflow import open_loop_flows

    flows = open_loop_flows(run_dir, ["fluid_dctcp", "flowsim"])[0]
    return flows.rename(columns={"fluid_dctcp_s": "fluid_s"})


def held_out(scenario_id: str, seed: int) -> bool:
    return hashlib.sha256(f"{seed}:{scenario_id}".encode()).digest()[0] % 4 == 0


def scores(err: np.ndarray) -> str:
    return f"{err.mean():.3f} / {np.quantile(err, 0.9):.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="datagen runs (open loop)")
    parser.add_argument("--seed", type=int, default=0, help="the split's and the trees' seed")
    args = parser.parse_args()
    from sklearn.ensemble import HistGradientBoostingRegressor

    flows = pd.concat([flows_of(run) for run in args.runs], ignore_index=True)
    flows = flows[(flows.fct_s > 0) & (flows.fluid_s > 0) & (flows.flowsim_s > 0)]
    flows["bucket"] = pd.cut(flows.size_bytes, BUCKETS, right=False, labels=False)
    flows["y"] = np.log(flows.fct_s / flows.fluid_s)
    test = flows.scenario.map(lambda s: held_out(s, args.seed)).to_numpy()
    train, held = flows[~test], flows[test]
    features = pd.DataFrame(
        {
            "cc": flows.cc.astype("category").cat.codes,
            "family": flows.family.astype("category").cat.codes,
            "log_size": np.log(flows.size_bytes),
            "log_ideal": np.log(flows.ideal_fct_s),
            "hops": flows.n_links,
            "fluid": flows.fluid_s / flows.ideal_fct_s,
            "flowsim": flows.flowsim_s / flows.ideal_fct_s,
        }
    )
    trees = HistGradientBoostingRegressor(
        max_iter=300, learning_rate=0.05, random_state=args.seed, categorical_features=[0, 1]
    )
    trees.fit(features[~test], train.y)
    held = held.assign(trees_s=held.fluid_s * np.exp(trees.predict(features[test])))
    keys = ["cc", "family", "bucket"]
    oracle = train.groupby(keys).y.median().rename("shift")
    held = held.join(oracle, on=keys)
    held["oracle_s"] = held.fluid_s * np.exp(held["shift"].fillna(0.0))
    rows = []
    for cc in [*sorted(held.cc.unique()), "all"]:
        part = held if cc == "all" else held[held.cc == cc]
        row = [cc, f"{len(part):,}"]
        for column in ("flowsim_s", "fluid_s", "oracle_s", "trees_s"):
            row.append(scores(np.abs(part[column] / part.fct_s - 1).to_numpy()))
        fluid = np.abs(part.fluid_s / part.fct_s - 1).mean()
        row.append(f"{np.abs(part.trees_s / part.fct_s - 1).mean() / fluid:.2f}x")
        rows.append(row)
    header = ["CC", "held-out flows", "flowSim", "fluid", "bucket oracle", "trees"]
    header.append("trees / fluid (mean)")
    print(
        f"per flow against ns-3, mean / p90 |FCT / ns-3's − 1|: {len(train):,} training flows, "
        f"{len(held):,} held out ({held.scenario.nunique()} scenarios)"
    )
    print(format_table(header, rows))


if __name__ == "__main__":
    main()
