"""Fluid backends per flow against the ns-3 runs a dataset recorded, on its open-loop scenarios
(flows given up front: every backend meets the same arrivals, so each flow's FCT compares one
to one): per family, the mean and p90 of |FCT / ns-3's − 1| and the p99 slowdown's error.

    .venv/bin/python bench/fluid_perflow.py outputs/cc_open [--backends flowsim fluid_dctcp]
        [--limit 20]

The folder is a datagen run (``manifest.json``, ``dataset/``), e.g. data cc's open-loop families
under DCTCP alone::

    python -m m4ray.sweeps +experiment=datagen_cc datagen.scenarios=48 datagen.weights.rail=0 \\
        'datagen.families.m4_fabric.network.cc.ccs=[dctcp]' ... name=cc_open

A backend that refuses a scenario's network (``fluid_dctcp`` under another CC) skips it, said.
Collective (closed-loop) scenarios are left to ``bench/closed_loop.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from m4ray.sweeps.report import format_table


def open_loop_flows(run_dir: Path, names: list[str], limit: int | None = None):
    """Every flow of the run's open-loop scenarios (the first ``limit`` of them): its scenario,
    family, CC, size, hops, ideal FCT, ns-3's FCT and slowdown, and each backend's FCT
    (``<name>_s``; NaN where it refused the scenario's network); how many scenarios each
    backend refused, by backend and CC; how many ran."""
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    from m4ray.datagen.closed_loop import backends, drawn_scenarios
    from m4ray.datagen.record import deliver
    from m4ray.errors import InputError

    made = backends(names)
    drawn = drawn_scenarios(run_dir)
    dataset = run_dir / "dataset"
    table = pq.read_table(dataset / "scenarios.parquet").to_pandas()
    table = table[table.status == "ok"]
    parts, refused, done = [], defaultdict(int), 0
    for sid, params in zip(table.scenario_id, table.params, strict=True):
        scenario = drawn[sid]
        if hasattr(scenario.traffic, "workload"):
            continue  # closed loop: bench/closed_loop.py
        if limit is not None and done >= limit:
            break
        done += 1
        cc = json.loads(params).get("cc", "dctcp")
        ref = ds.dataset(dataset / "flows" / f"scenario_id={sid}").to_table().to_pandas()
        frame = ref.set_index("flow_id")[
            ["size_bytes", "n_links", "ideal_fct_s", "fct_s", "slowdown"]
        ].assign(scenario=sid, family=scenario.family, cc=cc)
        for name, make in made.items():
            try:
                out = deliver(scenario, config=make(scenario.ns3))[3]
            except InputError:
                refused[f"{name} ({cc})"] += 1
                frame[f"{name}_s"] = np.nan
                continue
            fct = pd.Series({f.id: end - f.start_s for f, end in out})
            frame[f"{name}_s"] = fct.reindex(frame.index).to_numpy()
        parts.append(frame)
    return pd.concat(parts, ignore_index=True), refused, done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="a datagen run (manifest.json, dataset/)")
    parser.add_argument("--backends", nargs="+", default=["flowsim", "fluid_dctcp"])
    parser.add_argument("--limit", type=int, default=None, help="at most this many scenarios")
    args = parser.parse_args()
    flows, refused, done = open_loop_flows(args.run_dir, args.backends, args.limit)
    families = sorted(flows.family.unique())
    rows = []
    for family in [*families, "all"]:
        part = flows if family == "all" else flows[flows.family == family]
        p99 = np.quantile(part.slowdown, 0.99)
        for name in args.backends:
            ran = part[part[f"{name}_s"].notna()]
            if ran.empty:
                continue
            err = np.abs(ran[f"{name}_s"] / ran.fct_s - 1).to_numpy()
            mine = np.quantile(ran[f"{name}_s"] / ran.ideal_fct_s, 0.99)
            rows.append(
                [
                    family,
                    name,
                    f"{len(err):,}",
                    f"{err.mean():.3f}",
                    f"{np.quantile(err, 0.9):.3f}",
                    f"{p99:.2f}",
                    f"{mine:.2f} ({mine / p99 - 1:+.1%})",
                ]
            )
    header = ["family", "backend", "flows", "mean |r-1|", "p90 |r-1|", "ns-3 p99 sldn", "p99 sldn"]
    print(f"per flow against ns-3, {done} open-loop scenarios of {args.run_dir}")
    print(format_table(header, rows))
    for what, n in sorted(refused.items()):
        print(f"{what}: refused {n} scenario(s)")


if __name__ == "__main__":
    main()
