"""Where m4's fluid anchor is wrong, and how much of it a model that knows only the congestion
control, the family and the flow size could take back (issue 32's m4 bar: ≤ ½ the anchor's error).

    .venv/bin/python bench/m4_residual.py --dataset outputs/datagen_cc/dataset
    .venv/bin/python bench/m4_residual.py --dataset outputs/datagen_cc/dataset --m4 <checkpoint>
    .venv/bin/python bench/m4_residual.py --dataset outputs/datagen_v4/dataset --components \
        --m4 v4=outputs/train_m4_v4/export v5=outputs/train_m4_v5/export
    .venv/bin/python bench/m4_residual.py --dataset outputs/datagen_v5/dataset --components \
        --by-path

On a dataset's periods, split by scenario as training splits them (``train.data.seed`` 0), the
anchor of a fluid-anchored checkpoint (``--anchor``, default m4-v3: its correction zeroed, so
flowSim with the RDMA window and ACK load, re-projected at the recorded updates) and classic
flowSim are scored per flow against ns-3, ``|ŝ/s − 1|``, per family and congestion control.
Beside them, the **bucket oracle**: the anchor times the median of ``s / anchor`` over the
training periods' flows of the same (CC, family, size bucket). It is the best a constant per
bucket can do: where it gains little, the residual is per flow (which flow met a queue or a cut),
and no feature the bucket names can halve it. With ``--m4`` trained checkpoints are scored too
(``name=path`` or a path). ``--components`` scores the engine's components of periods up to
``--max-period-flows`` flows (``train.data.components``; components of up to ``--max-flows``
flows with fewer than ``--max-active`` active, train_m4_v5's 600 and 300 by default), so the
held-out flows include the large busy periods that training without it drops; a model's
answers on a component are its answers on the whole period.
The signed table prints the median ``log(s / anchor)`` per size bucket: > 0 where ns-3 is slower.
``--by-path`` splits it by the slowest link on each flow's path too (a degraded GPU's NIC or
NVLink against the 400 G NICs): where a failure's regime shows, if the data has it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

BUCKETS = [0, 1e3, 1e4, 5e4, 2e5, 1e6, np.inf]
LABELS = ["<1K", "1-10K", "10-50K", "50-200K", "0.2-1M", ">=1M"]
# the slowest link on a flow's path, Gbit/s (a degraded NIC or NVLink falls below the 400 G NICs)
BOTTLENECKS = [0, 100, 200, 399.5, 400.5, np.inf]
BOTTLENECK_LABELS = ["<100G", "100-199G", "200-399G", "400G", ">400G"]


def flows(model, samples: list, scenario: dict) -> pd.DataFrame:
    """One row per flow of ``samples``: family, CC, size, ns-3's slowdown and the model's and
    flowSim's (every model's prediction clamped at 1, as ``flow_errors`` does)."""
    import torch

    from m4ray.train.loop import batches
    from m4ray.train.periods import period_losses

    rows = []
    with torch.no_grad():
        for batch in batches(samples, 8):
            pred = period_losses(model, [s.period for s in batch])["pred"].clamp(min=1.0)
            at = 0
            for s in batch:
                n = s.n_flows
                fam, cc = scenario[s.scenario_id]
                inc = s.period.incidence.numpy()
                slowest = np.full(n, np.inf)
                np.minimum.at(slowest, inc[0], s.period.link_bandwidth.numpy()[inc[1]])
                rows.append(
                    pd.DataFrame(
                        {
                            "family": fam,
                            "cc": cc,
                            "size": s.period.size_bytes.numpy(),
                            "ns3": s.period.slowdown.numpy(),
                            "pred": pred[at : at + n].numpy(),
                            "flowsim": s.flowsim_slowdown.numpy(),
                            "bottleneck": slowest / 1e9,
                        }
                    )
                )
                at += n
    frame = pd.concat(rows, ignore_index=True)
    frame["bucket"] = pd.cut(frame["size"], BUCKETS, labels=LABELS, right=False)
    frame["path"] = pd.cut(frame["bottleneck"], BOTTLENECKS, labels=BOTTLENECK_LABELS, right=False)
    return frame


def anchored_splits(args) -> tuple:
    """The dataset's scenarios table, each scenario's (family, CC), the training and held-out
    periods (``args.n_train`` / ``args.n_test``, split as training splits them) and the fluid
    anchor of ``args.anchor`` (its correction zeroed)."""
    import pyarrow.parquet as pq

    from m4ray.models.checkpoint import load
    from m4ray.sim.m4.backend import checkpoint_dir
    from m4ray.train.data import DataConfig, load_splits
    from m4ray.train.loop import fluid_anchor

    table = pq.read_table(args.dataset / "scenarios.parquet").to_pandas()
    scenario = {
        sid: (fam, json.loads(p).get("cc", "dctcp"))
        for sid, fam, p in zip(table.scenario_id, table.family, table.params, strict=True)
    }
    model, _ = load(checkpoint_dir(args.anchor))
    data = DataConfig(dataset=str(args.dataset), n_samples=[args.n_train, 0, args.n_test])
    if args.components:
        data = dataclasses.replace(
            data,
            components=True,
            max_period_flows=args.max_period_flows,
            max_flows=args.max_flows,
            max_active=args.max_active,
        )
    splits = load_splits(data, model.cfg.anchor)
    return table, scenario, splits, fluid_anchor(model.eval())


def err(pred: pd.Series, true: pd.Series) -> str:
    e = (pred / true - 1).abs()
    return f"{e.mean():.3f} / {e.quantile(0.9):.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", required=True, type=Path, help="a datagen dataset folder")
    parser.add_argument("--anchor", default="m4-v3", help="a fluid-anchored checkpoint")
    parser.add_argument("--m4", nargs="*", default=[], help="also score these (name=path)")
    parser.add_argument("--components", action="store_true", help="score periods' components")
    parser.add_argument("--max-period-flows", type=int, default=4000)
    parser.add_argument("--max-flows", type=int, default=600, help="per component")
    parser.add_argument("--max-active", type=int, default=300, help="per component")
    parser.add_argument("--n-train", type=int, default=2400, help="training periods (balanced)")
    parser.add_argument("--n-test", type=int, default=600, help="held-out periods (balanced)")
    parser.add_argument(
        "--by-path", action="store_true", help="also split by the path's slowest link"
    )
    args = parser.parse_args()

    from m4ray.models.checkpoint import load
    from m4ray.sim.m4.backend import checkpoint_dir

    _, scenario, splits, anchor = anchored_splits(args)
    train, test = (flows(anchor, splits[k], scenario) for k in ("train", "test"))
    models = dict(m.split("=", 1) if "=" in m else (Path(m).name, m) for m in args.m4)
    if taken := set(models) & {*test.columns, "oracle", "anchor", "bucket oracle", "flowSim"}:
        parser.error(f"--m4: {', '.join(sorted(taken))} is a column already; name it otherwise")
    for name, path in models.items():
        trained, _ = load(checkpoint_dir(path))
        test[name] = flows(trained.eval(), splits["test"], scenario)["pred"]
    keys = ["cc", "family", "bucket"]
    train["log"] = np.log(train.ns3 / train.pred)
    median = train.groupby(keys, observed=True)["log"].median().rename("shift")
    test = test.join(median, on=keys)
    test["oracle"] = test.pred * np.exp(test["shift"].fillna(0.0))

    print(
        f"{len(splits['train'])} training / {len(splits['test'])} held-out periods of "
        f"{args.dataset}; anchor of {args.anchor}. Per-flow |ŝ/s − 1|, mean / p90\n"
    )
    who = ["anchor", "bucket oracle", "flowSim", *models]
    cols = {"anchor": "pred", "bucket oracle": "oracle", "flowSim": "flowsim"} | {
        name: name for name in models
    }
    print(f"{'family':<14}{'cc':<8}{'flows':>7}" + "".join(f"{w:>18}" for w in who))
    groups = [*test.groupby(["family", "cc"]), (("all", ""), test)]
    for (fam, cc), x in groups:
        cells = "".join(f"{err(x[cols[w]], x.ns3):>18}" for w in who)
        print(f"{fam:<14}{cc:<8}{len(x):>7}" + cells)

    print("\nmedian log(ns-3 / anchor) per size bucket, held-out flows (> 0: ns-3 slower)\n")
    signed = np.log(test.ns3 / test.pred).groupby(
        [test.family, test.cc, test.bucket], observed=True
    )
    print(signed.median().unstack("bucket").round(3).to_string(na_rep="—"))
    if args.by_path:
        print(
            "\nby the path's slowest link (Gbit/s) and size, held-out flows: median log(ns-3 / "
            "anchor), and the anchor's and flowSim's mean |ŝ/s − 1|\n"
        )
        log = np.log(test.ns3 / test.pred)
        keys = [test.family, test.path, test.bucket]
        table = pd.DataFrame(
            {
                "flows": log.groupby(keys, observed=True).size(),
                "median log": log.groupby(keys, observed=True).median().round(3),
                "anchor": (test.pred / test.ns3 - 1).abs().groupby(keys, observed=True).mean(),
                "flowSim": (test.flowsim / test.ns3 - 1).abs().groupby(keys, observed=True).mean(),
            }
        )
        print(table.round(3).to_string())


if __name__ == "__main__":
    main()
