"""m4 against our ns-3 per congestion control, on a dataset's held-out scenarios.

    .venv/bin/python bench/m4_cc.py outputs/train_m4_cc/export --dataset outputs/datagen_cc/dataset
    .venv/bin/python bench/m4_cc.py m4-v2 --dataset outputs/datagen_cc/dataset   # DCTCP-only m4

The test split is the training job's own (scenarios split by the data config's seed, 15 % held
out; ``--n-test`` periods balanced-sampled as ``train_m4_v2``'s 600): no scenario of it was
trained on. Per CC of the scenarios (``params.cc``; DCTCP where none is recorded): per-flow
slowdown error ``|ŝ/s − 1|`` of m4, of its fluid anchor alone (the correction zeroed) and of
classic flowSim, mean and p90, and m4's ratio to each (issue 32's bar: ≤ 0.5 × the anchor's,
≤ 0.55 × flowSim's, on mean and p90). Replays the recorded periods as training does (not the
online engine), so a checkpoint is scored on exactly the updates it learned from.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="a checkpoint name or directory")
    parser.add_argument("--dataset", required=True, type=Path, help="a datagen dataset folder")
    parser.add_argument("--n-test", type=int, default=600, help="held-out periods (balanced)")
    args = parser.parse_args()

    import pyarrow.parquet as pq

    from m4ray.models.checkpoint import load
    from m4ray.sim.m4.backend import checkpoint_dir
    from m4ray.train.data import DataConfig, load_splits
    from m4ray.train.loop import flow_errors

    model, _ = load(checkpoint_dir(args.checkpoint))
    model = model.eval()
    cfg = DataConfig(dataset=str(args.dataset), n_samples=[0, 0, args.n_test])
    test = load_splits(cfg)["test"]
    table = pq.read_table(args.dataset / "scenarios.parquet", columns=["scenario_id", "params"])
    ids, params = (table.column(c).to_pylist() for c in ("scenario_id", "params"))
    cc_of = {sid: json.loads(p).get("cc", "dctcp") for sid, p in zip(ids, params, strict=True)}
    print(f"{args.checkpoint} on {len(test)} held-out periods of {args.dataset}\n")
    head = f"{'cc':<8}{'flows':>7}  " + "".join(
        f"{w + ' mean/p90':>18}" for w in ("m4", "anchor", "flowSim")
    )
    print(head + f"{'m4/anchor':>14}{'m4/flowSim':>14}")
    for cc in sorted({cc_of[s.scenario_id] for s in test}):
        mine = [s for s in test if cc_of[s.scenario_id] == cc]
        errors = flow_errors(model, mine)
        cells, stats = [], {}
        for who in ("m4", "anchor", "flowsim"):
            err = errors.get(who, np.zeros(0))
            stats[who] = (err.mean(), np.quantile(err, 0.9)) if len(err) else (np.nan, np.nan)
            cells.append(f"{stats[who][0]:8.3f} / {stats[who][1]:.3f}")
        ratio = [
            f"{stats['m4'][0] / stats[o][0]:6.2f}/{stats['m4'][1] / stats[o][1]:.2f}"
            for o in ("anchor", "flowsim")
        ]
        n = len(errors["m4"])
        print(
            f"{cc:<8}{n:>7}  "
            + "".join(f"{c:>18}" for c in cells)
            + "".join(f"{r:>14}" for r in ratio)
        )


if __name__ == "__main__":
    main()
