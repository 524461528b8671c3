"""m3's training networks, one by one: how far path flowSim and each checkpoint are from the
same paths' ns-3, per size bucket, grouped by what the networks are.

    .venv/bin/python bench/m3_networks.py outputs/datagen_m3_v6/dataset \\
        checkpoints/m3-v5 [more checkpoints] [--by family cc oversubscription load]

For each network of a datagen_m3 dataset (network-path samples), the p99 slowdown of each size
bucket is mixed over its sampled paths as the estimate mixes them (each path's 100 percentiles
weighed by draws x its foreground flows in the bucket / its foreground flows:
:func:`m4ray.m3.train.bucket_weights`, :class:`m4ray.m3.aggregate.Mixture`) for the paths'
network-wide ns-3 (the fit's target), path flowSim (the model's baseline) and each checkpoint's
correction. Printed: the mean relative p99 error per bucket over the networks of each group.

What it is for: a model fitted on these networks corrects path flowSim where path flowSim is
wrong *on them*. Where the baseline errs one way on the training networks and the other way on
an experiment (m3's default experiment: path flowSim −16 % under 1 KB), the fit pulls the wrong
way there. Most networks are in some soup member's training split: this scores what the fit
saw, not how it generalises (that is ``bench/m3_sampling.py`` and ``bench/m3_eval.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

LOAD_BINS = [0.0, 0.35, 0.5, 1.0]


def bucket_p99(values: np.ndarray, weight: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """``(4,)`` p99 of each bucket's mixture of ``values`` ``(P, 4, 100)`` (NaN where no path
    has a flow there)."""
    from m4ray.m3.aggregate import Mixture

    out = np.full(values.shape[1], np.nan)
    for b in range(values.shape[1]):
        used = mask[:, b] & (weight[:, b] > 0)
        if used.any():
            w = np.repeat(weight[used, b] / values.shape[2], values.shape[2])
            out[b] = Mixture(values=values[used, b].reshape(-1), weights=w / w.sum()).quantile(0.99)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset")
    parser.add_argument("checkpoints", nargs="*", help="m3 checkpoint directories")
    parser.add_argument(
        "--by", nargs="+", default=["family", "cc", "oversubscription", "load"],
        help="one table per key: family, cc, oversubscription, k, load, pfc, size (its kind: "
        "the measured mixes are all empirical)",
    )  # fmt: skip
    args = parser.parse_args()

    from m4ray.m3.aggregate import BUCKET_NAMES
    from m4ray.m3.train import load_lots, predict
    from m4ray.models.checkpoint import M3, load

    lots = load_lots(args.dataset, weights=True)
    runs = pd.read_parquet(Path(args.dataset) / "scenarios.parquet").set_index("scenario_id")
    estimates = {"path flowSim": lots.flowsim}
    for directory in args.checkpoints:
        model, _ = load(directory, kind=M3)
        estimates[directory] = predict(model.eval(), lots)
        print(f"  predicted {len(lots)} paths with {directory}", flush=True)

    ids = lots.scenario_id
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    rows = []
    for lo, hi in zip(starts, np.r_[starts[1:], len(ids)], strict=True):
        sid = str(ids[lo])
        params = json.loads(runs.loc[sid, "params"])
        weight, mask = lots.weight[lo:hi], lots.mask[lo:hi]
        truth = bucket_p99(lots.target[lo:hi], weight, mask)
        row = {
            "family": runs.loc[sid, "family"],
            "cc": params.get("cc", "dctcp"),
            "oversubscription": params.get("oversubscription"),
            "k": params.get("k"),
            "pfc": params.get("pfc"),
            "size": params.get("size_dist"),
            "load": pd.cut([params["max_load"]], LOAD_BINS)[0],
        }
        for name, values in estimates.items():
            err = bucket_p99(values[lo:hi], weight, mask) / truth - 1
            row.update({(name, b): e for b, e in zip(BUCKET_NAMES, err, strict=True)})
        rows.append(row)
    table = pd.DataFrame(rows)
    metrics = [c for c in table.columns if isinstance(c, tuple)]
    print(
        f"\nmean p99 error per bucket (%) against the same paths' ns-3, {len(table)} networks of "
        f"{args.dataset}, paths mixed as the estimate mixes them"
    )
    pd.set_option("display.width", 250)
    pd.set_option("display.max_columns", 50)
    for key in args.by:
        grouped = table.groupby(key, observed=True)
        means = (grouped[metrics].mean() * 100).round(1)
        means.columns = [f"{name} {b}" for name, b in means.columns]
        means.insert(0, "networks", grouped.size())
        print(f"\nby {key}\n{means.T.to_string()}")


if __name__ == "__main__":
    main()
