"""m4's forward pass, numpy against compiled (``m4ray/models/_step.c``), by graph size.

    .venv/bin/python bench/m4_step_native.py                  # the shipped m4-v2, ~1 min
    .venv/bin/python bench/m4_step_native.py --checkpoint m4-v3 --repeat 500

For each size (flows, links; one graph of random states and wiring, every row moving), the
microseconds of one ``NumpyModel.step`` through numpy's pass and through the compiled one,
their ratio, and the largest relative difference of their states and slowdowns. The step
sends passes of at most ``NATIVE_MAX_ROWS`` rows (flows + links) to the compiled pass: this
table is where that threshold comes from (its crossing), on the machine it runs on. Both run in
one process with one BLAS thread, as a sweep's m4 workers do.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from m4ray.models import numpy_step  # noqa: E402
from m4ray.models.graph import StepGraph  # noqa: E402
from m4ray.sim.m4.backend import checkpoint_dir  # noqa: E402
from m4ray.sweeps.report import format_table  # noqa: E402

SIZES = [(1, 1), (3, 4), (6, 5), (10, 6), (16, 8), (25, 7), (40, 16), (60, 25), (120, 40)]
SIZES += [(250, 80), (500, 150), (1000, 300), (2000, 600)]


def graph(cfg, rng, n_flow: int, n_link: int) -> StepGraph:
    per = int(rng.integers(1, min(n_link, 4) + 1))
    incidence = np.stack(
        [
            np.repeat(np.arange(n_flow), per),
            np.concatenate([rng.choice(n_link, per, replace=False) for _ in range(n_flow)]),
        ]
    )
    return StepGraph(
        h_flow=rng.normal(size=(n_flow, cfg.hidden)),
        h_link=rng.normal(size=(n_link, cfg.hidden)),
        dt_flow_us=rng.uniform(0.1, 5, n_flow),
        dt_link_us=rng.uniform(0.1, 5, n_link),
        incidence=incidence,
        params=rng.random((n_flow, cfg.n_inputs)),
        n_links=np.full(n_flow, float(per)),
        base=rng.uniform(1, 3, n_flow) if cfg.fluid else None,
        fluid=rng.normal(size=(n_flow, cfg.n_fluid)) if cfg.fluid else None,
    )


def per_step(model, graphs, max_rows: int, repeat: int) -> tuple[float, list]:
    numpy_step.NATIVE_MAX_ROWS = max_rows
    out = model.step(graphs)
    start = time.perf_counter()
    for _ in range(repeat):
        model.step(graphs)
    return (time.perf_counter() - start) / repeat, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", default="m4-v2")
    parser.add_argument("--repeat", type=int, default=100)
    args = parser.parse_args()
    numpy_step.limit_blas_threads(1)
    if numpy_step.native_step_library() is None:
        sys.exit("the compiled pass is unavailable here (no C compiler, or M4RAY_NATIVE=0)")
    model = numpy_step.load_numpy_model(str(checkpoint_dir(args.checkpoint)))
    threshold = numpy_step.NATIVE_MAX_ROWS
    rows = []
    for n_flow, n_link in SIZES:
        graphs = [graph(model.cfg, np.random.default_rng(n_flow), n_flow, n_link)]
        t_np, ref = per_step(model, graphs, 0, args.repeat)
        t_c, got = per_step(model, graphs, 10**9, args.repeat)
        diff = max(
            float(np.max(np.abs(getattr(b, k) - getattr(a, k)) / (np.abs(getattr(a, k)) + 1e-12)))
            for a, b in zip(ref, got, strict=True)
            for k in ("h_flow", "h_link", "slowdown")
        )
        rows.append(
            [
                f"{n_flow} + {n_link}",
                f"{t_np * 1e6:.0f}",
                f"{t_c * 1e6:.0f}",
                f"{t_np / t_c:.2f}x",
                f"{diff:.1e}",
                "C" if n_flow + n_link <= threshold else "numpy",
            ]
        )
    numpy_step.NATIVE_MAX_ROWS = threshold
    print(f"m4 step ({args.checkpoint}), one graph per step, µs per step, {args.repeat} repeats")
    print(
        format_table(
            ["flows + links", "numpy", "compiled", "speed-up", "max rel diff", "the step uses"],
            rows,
        )
    )


if __name__ == "__main__":
    main()
