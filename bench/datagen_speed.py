"""Training-data generation cost: ns-3 scenarios per hour per core, and the Ray fan-out overhead.

    .venv/bin/python bench/datagen_speed.py                 # 8 + 8 scenarios, default families
    .venv/bin/python bench/datagen_speed.py --scenarios 8 --fabric-flows 2000   # m4's full size

Runs the real experiment (``python -m m4ray.sweeps +experiment=datagen``) in a fresh output
directory on an embedded local Ray with all cores, then prints per family the median and mean task
wall time and the scenarios per hour per core, and the orchestration overhead: the sum of task
times against wall time × cores (Ray start, worker start with the ns-3 import and C++ compile,
scheduling, the final dataset pass). The last line extrapolates to 1,000 scenarios on 64 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", type=int, default=16, help="total, split over families")
    parser.add_argument("--fabric-flows", type=int, default=0, help="fix n_flows of m4_fabric")
    parser.add_argument("--cores", type=int, default=os.cpu_count())
    args = parser.parse_args()
    overrides = [
        "+experiment=datagen",
        f"datagen.scenarios={args.scenarios}",
        f"ray.num_cpus={args.cores}",
        "progress=false",
    ]
    if args.fabric_flows:
        n = args.fabric_flows
        overrides.append(f"datagen.families.m4_fabric.n_flows=[{n},{n}]")
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "m4ray.sweeps", *overrides, f"paths.output_dir={tmp}"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=False,
        )
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            sys.exit(proc.stderr[-3000:])
        run_dir = Path(tmp) / "datagen"
        frame = pd.read_parquet(run_dir / "dataset" / "scenarios.parquet")
        version = json.loads((run_dir / "manifest.json").read_text())["dataset_version"]
    ok = frame[frame.status == "ok"]
    print(f"datagen: {len(ok)}/{len(frame)} scenarios ok on {args.cores} cores, dataset {version}")
    print(
        f"{'family':<12}{'scen':>6}{'flows/scen':>12}{'median s':>10}{'mean s':>9}"
        f"{'scen/h/core':>13}"
    )
    for family, group in ok.groupby("family"):
        mean = group.wall_s.mean()
        print(
            f"{family:<12}{len(group):>6}{group.n_flows.mean():>12.0f}"
            f"{group.wall_s.median():>10.2f}{mean:>9.2f}{3600 / mean:>13.0f}"
        )
    busy = ok.wall_s.sum()
    efficiency = busy / (wall * args.cores)
    print(
        f"\nwall {wall:.1f} s x {args.cores} cores = {wall * args.cores:.1f} core-s; "
        f"sum of task times {busy:.1f} s; efficiency {efficiency:.0%} "
        f"(overhead {wall * args.cores - busy:.1f} core-s)"
    )
    per_scenario = busy / len(ok)
    hours = 1000 * per_scenario / 64 / 3600
    print(
        f"1,000 scenarios of this mix on 64 cores: ~{hours * 60:.1f} min of task time "
        f"(+ ~{wall * args.cores - busy:.0f} core-s of start-up, paid per node, not per scenario)"
    )


if __name__ == "__main__":
    main()
