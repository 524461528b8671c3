"""Backends in closed loop on a dataset's collective scenarios: each scenario's DAG replayed with
flowSim, flowSim with ACK load and m4 (each flow starting when its parents end in that backend's
own run), its completion against the ns-3 run the dataset recorded.

    .venv/bin/python bench/closed_loop.py outputs/probe_4x8 [--backends flowsim flowsim_acks m4]
        [--checkpoint m4-v2] [--limit 8] [--split test]

``m4=<checkpoint>`` names another m4 beside (``--backends flowsim m4 m4=/tmp/ck``); ``--split``
keeps the scenarios a training run held out (its data split, seed 0).

The folder is a datagen run (its ``manifest.json`` holds the config that drew the scenarios,
``dataset/`` the ns-3 records). Training and ``bench/m4_residual.py`` score a model on ns-3's own
arrivals (each flow meets what it met in ns-3); here nothing of ns-3's run is given, as in a
sweep, so small per-flow errors change when children start and what they meet
(docs/gray_failure_study.md, "The study's gap is made in closed loop"). Per scenario: the
family, degraded GPUs and R, ns-3's completion (last flow's end) and each backend's completion /
ns-3's; then each backend's mean and worst |completion error|. Open-loop families (no DAG) are
skipped: their arrivals are fixed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from m4ray.sweeps.report import format_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="a datagen run (manifest.json, dataset/)")
    parser.add_argument("--backends", nargs="+", default=["flowsim", "flowsim_acks", "m4"])
    parser.add_argument("--checkpoint", help="m4's checkpoint (default: the backend's)")
    parser.add_argument("--limit", type=int, default=None, help="at most this many scenarios")
    parser.add_argument("--family", default=None, help="only this family's scenarios")
    parser.add_argument(
        "--split",
        choices=["train", "val", "test"],
        default=None,
        help="only this split's scenarios (the training data's split, seed 0)",
    )
    args = parser.parse_args()

    from m4ray.datagen.closed_loop import backends, closed_loop
    from m4ray.train.data import DataConfig, split_scenarios

    made = backends(args.backends, args.checkpoint)
    ids = None
    if args.split:
        ids = split_scenarios(args.run_dir / "dataset", DataConfig())[args.split]
    result = closed_loop(args.run_dir, made, scenario_ids=ids, family=args.family, limit=args.limit)
    header = ["scenario", "family", "cc", "degraded", "R", "ns-3 ms", *args.backends]
    rows = [
        [r["scenario"], r["family"], r["cc"], r["degraded"], r["R"], f"{r['ns3_s'] * 1e3:.3f}"]
        + [f"{r[n]:.3f}" if isinstance(r[n], float) else r[n] for n in args.backends]
        for r in result.rows
    ]
    print(f"\nclosed-loop completion / ns-3's, {len(rows)} scenarios of {args.run_dir}")
    print(format_table(header, rows))
    summary = [
        [
            name,
            f"{100 * np.mean(np.abs(e)):.1f} %",
            f"{100 * np.mean(e):+.1f} %",
            f"{100 * e[np.argmax(np.abs(e))]:+.1f} %",
        ]
        for name, e in ((n, result.errors(n)) for n in args.backends)
        if len(e)
    ]
    print(format_table(["backend", "mean |err|", "mean err", "worst"], summary))


if __name__ == "__main__":
    main()
