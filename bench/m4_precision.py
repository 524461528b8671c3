"""m4 in float32 against float64 on the full-size gray-failure study, beside what a nudge of
float64's weights does: how far the precision moves m4's answers, and how far they are defined
in the first place.

    .venv/bin/python bench/m4_precision.py                      # 5 points, ~1 min
    .venv/bin/python bench/m4_precision.py --points 2:4 8:4 16:10 --nudge 1e-7 1e-15

For each (N, R) point of ``+experiment=gray_failure`` at full size (SimAI's collectives, 1,000 B
packets, the study's network as m4 reads it), m4-v2 runs in float64 (the reference), in float32
(the default), and in float64 with every weight multiplied by 1 ± ``nudge`` (a random sign per
weight, seed 0). Per variant: its wall time, its iteration's change from float64's, and the
median and p90 of |FCT / FCT_float64 − 1| over the flows, matched by (DAG node, source,
destination, size, occurrence).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from m4_sweep_speed import grid
from simai_flows import study_ns3

from m4ray.models import numpy_step
from m4ray.sim.m4 import M4Config
from m4ray.sim.scenario import simulate
from m4ray.sweeps.report import format_table


def run(point: tuple[int, int], precision: str) -> tuple[float, float, dict]:
    """One full-size scenario on m4: wall seconds, iteration, FCT per matched flow key."""
    config = M4Config(network=study_ns3(), precision=precision)
    scenarios = grid(1, 105, config, "m4", "simai", "default")
    [scenario] = [
        s for s in scenarios if (s.failure.n_degraded, s.failure.reduction) == point
    ]  # fmt: skip
    start = time.perf_counter()
    row, flows = simulate(scenario)
    wall = time.perf_counter() - start
    table = flows.to_pydict()
    seen: dict[tuple, int] = defaultdict(int)
    fct = {}
    columns = ("node_id", "src", "dst", "size_bytes", "start_s", "finish_s")
    for node, src, dst, size, t0, t1 in zip(*(table[c] for c in columns), strict=True):
        key = (node, src, dst, size)
        fct[(*key, seen[key])] = t1 - t0
        seen[key] += 1
    return wall, row["completion_time_s"], fct


def nudged(scale: float):
    """NumpyModel.__init__ with every weight times 1 ± ``scale`` (seeded signs)."""
    plain = numpy_step.NumpyModel.__init__

    def init(self, cfg, weights, precision="float64"):
        rng = np.random.default_rng(0)
        weights = {
            k: np.asarray(v, dtype=np.float64) * (1 + scale * rng.choice([-1, 1], np.shape(v)))
            for k, v in weights.items()
        }
        plain(self, cfg, weights, precision)

    return plain, init


def clear_model_caches() -> None:
    """Models are loaded once per process (load_numpy_model): forget them, so the next run
    loads afresh."""
    numpy_step.load_numpy_model.cache_clear()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--points", nargs="+", default=["2:4", "6:10", "8:4", "12:10", "16:10"], metavar="N:R"
    )
    parser.add_argument("--nudge", nargs="*", type=float, default=[1e-7])
    args = parser.parse_args()
    rows = []
    for text in args.points:
        point = tuple(int(x) for x in text.split(":"))
        variants = {}
        clear_model_caches()
        variants["float64"] = run(point, "float64")
        variants["float32"] = run(point, "float32")
        for scale in args.nudge:
            plain, init = nudged(scale)
            numpy_step.NumpyModel.__init__ = init
            clear_model_caches()
            try:
                variants[f"float64, weights x(1 ± {scale:g})"] = run(point, "float64")
            finally:
                numpy_step.NumpyModel.__init__ = plain
                clear_model_caches()
        _, ref_iter, ref_fct = variants["float64"]
        for name, (wall, iteration, fct) in variants.items():
            ratio = np.array([abs(fct[k] / ref_fct[k] - 1) for k in ref_fct if k in fct])
            rows.append([
                f"N={point[0]}, R={point[1]}",
                name,
                f"{wall:.2f}",
                f"{(iteration / ref_iter - 1) * 100:+.3f} %",
                f"{np.median(ratio) * 100:.3f} %",
                f"{np.quantile(ratio, 0.9) * 100:.1f} %",
            ])  # fmt: skip
    header = ["point", "m4", "wall s", "iteration vs float64", "FCT |r-1| median", "p90"]
    print(format_table(header, rows))


if __name__ == "__main__":
    main()
