"""Backends of gray-failure sweeps side by side against one reference backend (ns-3 by default):
mean and max |error| of the completion time per (N, R) point, and time per scenario.

    .venv/bin/python bench/sweep_errors.py outputs/study_full/results.parquet \\
        --add m4-v3=outputs/study_full_v3/results.parquet:m4

The first file holds the reference; ``--add LABEL=PATH[:BACKEND]`` adds a backend of another sweep
of the same grid (e.g. a new checkpoint run with ``backends=[m4]``), joined on (N, R, seed, loss,
onset). A point the reference or a backend failed on is left out of that backend's errors, and
counted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

KEY = ["n_degraded", "reduction", "seed", "loss_rate", "onset_s"]


def load(path: Path, backend: str | None = None, label: str | None = None) -> pd.DataFrame:
    frame = pd.read_parquet(path)
    if backend is not None:
        frame = frame[frame.backend == backend].assign(backend=label or backend)
    return frame[[*KEY, "backend", "status", "completion_time_s", "wall_s"]]


def table(frame: pd.DataFrame, reference: str) -> list[list[str]]:
    ref = frame[(frame.backend == reference) & (frame.status == "ok")].set_index(KEY)
    rows = []
    for name, part in frame.groupby("backend", sort=False):
        ok = part[part.status == "ok"].set_index(KEY)
        both = ok.join(ref.add_suffix("_ref"), how="inner")
        err = (both.completion_time_s / both.completion_time_s_ref - 1).abs()
        wall = ok.wall_s.mean()
        rows.append(
            [
                str(name),
                f"{len(both)}/{len(part)}",
                "—" if name == reference else f"{err.mean():.1%}",
                "—" if name == reference else f"{err.max():.1%}",
                f"{wall:.2f}",
                "—" if name == reference else f"{ref.wall_s.mean() / wall:.0f}x",
            ]
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, help="a sweep's results.parquet (the reference's)")
    parser.add_argument("--add", nargs="*", default=[], help="LABEL=PATH[:BACKEND]")
    parser.add_argument("--reference", default="ns3")
    args = parser.parse_args()
    from m4ray.sweeps.report import format_table

    frames = [load(args.results)]
    for item in args.add:
        label, _, rest = item.partition("=")
        path, _, backend = rest.partition(":")
        frames.append(load(Path(path), backend or None, label))
    frame = pd.concat(frames, ignore_index=True)
    header = ["backend", "points", "mean |err|", "max |err|", "s/scenario", "speed-up"]
    print(f"vs {args.reference}, {args.results}")
    print(format_table(header, table(frame, args.reference)))


if __name__ == "__main__":
    main()
