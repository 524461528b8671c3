"""How much of a fast backend's error on a gray-failure sweep is the draw of its own seed (the
fluid's stagger), and how much ns-3 itself moves: the sweep's scenarios run once per seed, each
scored against the ns-3 a sweep already ran.

    .venv/bin/python bench/fluid_seeds.py outputs/full21 --seeds 0 1 2 3 4 5 -- \\
        +experiment=gray_failure workload.scale=1 wire=default \\
        'grid.n=[2,4,6,8,9,12,13,16]' 'grid.r=[4,7,10]'
    .venv/bin/python bench/fluid_seeds.py outputs/full21 --ns3-again outputs/full21_j2 \\
        --seeds 0 1 2 -- <the same overrides>

The overrides after ``--`` are the sweep's own (its grid, scale and wire); ``run_dir`` holds the
ns-3 answers (its ``results.parquet``). Per seed (``backend_options.<backend>.seed``): the
completion's mean |err|, mean err and worst against ns-3, and rank 0's mean |err|; then the mean
over seeds (its worst unsigned), and the error of the seeds' mean completion (what averaging
the draws gives).
``--ns3-again`` scores a second ns-3 run of the same points against the first (e.g. the sweep
with ``send_latency_s=3.002e-6``: every flow sent 2 ns later; without it, the sweep's own
``ns3_again`` where it ran, the same thing), in the same columns: how far one
ns-3 run is from another that no model input can tell apart, the floor under any backend's error
against a single run. ``--out`` keeps every (seed, point) row as parquet.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

from composed import resolved

POINT = ["n_degraded", "reduction"]


@functools.cache
def results(run_dir: Path) -> pd.DataFrame:
    """A sweep's ``results.parquet`` (read once)."""
    path = run_dir / "results.parquet"
    if not path.exists():
        sys.exit(f"{path}: no results (run the sweep with ns3 first)")
    return pd.read_parquet(path)


def ns3_results(run_dir: Path, backend: str = "ns3") -> pd.DataFrame:
    """A sweep's ns-3 completions by (N, R): completion and rank 0's time (s)."""
    table = results(run_dir)
    table = table[(table.backend == backend) & (table.status == "ok")]
    if table.duplicated(POINT).any():
        sys.exit(f"{run_dir}: more than one {backend} run per (N, R); keep one seed of the grid")
    return table.set_index(POINT)[["completion_time_s", "rank0_time_s"]]


def backend_runs(overrides: list[str], backend: str, seeds: list[int]) -> pd.DataFrame:
    """Every scenario of the sweep ``overrides`` describe, run with ``backend`` once per seed."""
    from tqdm import tqdm

    from m4ray.sim.scenario import simulate
    from m4ray.sweeps.gray_failure import scenarios_of

    rows = []
    per_seed = [
        scenarios_of(
            resolved(*overrides, f"backends=[{backend}]", f"backend_options.{backend}.seed={s}")
        )
        for s in seeds
    ]
    with tqdm(total=sum(map(len, per_seed)), desc=f"{backend} x {len(seeds)} seeds") as bar:
        for seed, scenarios in zip(seeds, per_seed, strict=True):
            for scenario in scenarios:
                result, _ = simulate(scenario)
                rows.append(
                    {
                        "seed": seed,
                        "n_degraded": result["n_degraded"],
                        "reduction": result["reduction"],
                        "completion_time_s": result["completion_time_s"],
                        "rank0_time_s": result["rank0_time_s"],
                    }
                )
                bar.update()
    return pd.DataFrame(rows)


def scores(runs: pd.DataFrame, ref: pd.DataFrame) -> list[float]:
    """Completion mean |err|, mean err, worst (signed) and rank 0's mean |err|, in %."""
    at = ref.loc[list(zip(runs.n_degraded, runs.reduction, strict=True))]
    err = (runs.completion_time_s.to_numpy() / at.completion_time_s.to_numpy() - 1) * 100
    err0 = (runs.rank0_time_s.to_numpy() / at.rank0_time_s.to_numpy() - 1) * 100
    return [np.abs(err).mean(), err.mean(), err[np.abs(err).argmax()], np.abs(err0).mean()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="a gray-failure sweep's run with ns3")
    parser.add_argument("--backend", default="fluid_dctcp")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--ns3-again", type=Path, help="a second ns-3 run of the same points")
    parser.add_argument("--out", type=Path, help="every (seed, point) row as parquet")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args, overrides = parser.parse_args(argv[:cut]), argv[cut + 1 :]  # after --: the sweep's
    ref = ns3_results(args.run_dir)
    runs = backend_runs(overrides, args.backend, args.seeds)
    missing = set(zip(runs.n_degraded, runs.reduction, strict=True)) - set(ref.index)
    if missing:
        sys.exit(f"{args.run_dir}: no ns-3 answer at (N, R) {sorted(missing)}")
    if args.out:
        runs.to_parquet(args.out)

    from m4ray.sweeps.report import format_table

    header = ["run", "points", "mean |err|", "mean err", "worst", "rank 0 mean |err|"]
    rows, per_seed = [], []  # (label, points, scores, worst signed)
    for seed, group in runs.groupby("seed"):
        per_seed.append(scores(group, ref))
        rows.append((f"{args.backend} seed {seed}", len(group), per_seed[-1], True))
    mean = np.mean(per_seed, axis=0)
    mean[2] = np.abs(per_seed)[:, 2].mean()  # the worst: its size, unsigned
    rows.append((f"{args.backend}, mean over seeds", "", mean, False))
    ensemble = runs.groupby(POINT, as_index=False)[["completion_time_s", "rank0_time_s"]].mean()
    label = f"{args.backend}, the seeds' mean completion"
    rows.append((label, len(ensemble), scores(ensemble, ref), True))
    again_dir = args.ns3_again or args.run_dir  # else the sweep's own ns3_again, if it ran
    if args.ns3_again or "ns3_again" in set(results(args.run_dir).backend):
        again = ns3_results(again_dir, "ns3" if args.ns3_again else "ns3_again").reset_index()
        ran = runs.set_index(POINT).index.unique()  # the points the overrides describe
        again = again[again.set_index(POINT).index.isin(ran)]
        if len(again) < len(ran):
            sys.exit(f"{args.ns3_again}: ns-3 ran {len(again)} of the {len(ran)} points")
        label = f"ns-3 again ({args.ns3_again.name})" if args.ns3_again else "ns3_again"
        rows.append((label, len(again), scores(again, ref), True))
    cells = []
    for name, points, values, worst_signed in rows:
        signed = (1, 2) if worst_signed else (1,)
        shown = [f"{v:+.2f} %" if i in signed else f"{v:.2f} %" for i, v in enumerate(values)]
        cells.append([name, points, *shown])
    print(f"\ncompletion against ns-3 in {args.run_dir} (last rank; rank 0 beside)")
    print(format_table(header, cells))


if __name__ == "__main__":
    main()
