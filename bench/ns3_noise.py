"""How far ns-3's own per-flow answers move when every flow starts 10 ns later: the error floor
no flow-level model can go under, beside the anchor's error it is asked to halve (issue 32).

    .venv/bin/python bench/ns3_noise.py                        # data cc's families, 48 scenarios
    .venv/bin/python bench/ns3_noise.py --experiment datagen_v3 --n 24 --delays 1e-9 1e-8
    .venv/bin/python bench/ns3_noise.py --n 40 --delays 1e-8 --overrides datagen.weights.rail=0 \
        datagen.weights.incast=0 datagen.weights.fat_tree=0 datagen.weights.fat_tree_4to1=0

Draws ``--n`` scenarios of a datagen experiment (the same scenarios its dataset holds: same
root seed, same families, so those ids are in ``outputs/<experiment>/dataset``), evenly over its
families, and runs each in ns-3 as datagen does, then again with each flow started later by its
own uniform draw below ``delay`` (open loop: each arrival; collectives: each send's latency).
(A shift of every flow by the same amount changes nothing: ns-3 is translation-invariant.)
Nanoseconds change nothing a model is given (sizes, paths, rates, arrival order beyond ties),
so the per-flow slowdown change ``|s'/s − 1|`` is what ns-3 answers beyond what any model can
know: a model scored per flow against one ns-3 run cannot, on average, go much under it.
Beside it, classic flowSim's error against the unjittered run on the same flows, and a rerun
with no jitter (which must be 0: ns-3 is deterministic). Prints mean / p90 per congestion
control and family.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def scenarios(experiment: str, n: int, overrides: list[str] | None = None) -> list:
    """``n`` of the experiment's datagen scenarios, evenly over its families (in order)."""
    from hydra import compose, initialize_config_dir

    from m4ray.config import CONF_DIR
    from m4ray.datagen.job import expand
    from m4ray.sweeps.__main__ import resolve

    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
        cfg = compose("sweep", overrides=[f"+experiment={experiment}", *(overrides or [])])
    sweep = resolve(cfg)
    every = expand(sweep.datagen, sweep.seed)
    families = sorted({s.family for s in every})
    per = max(1, n // len(families))
    return [s for fam in families for s in [x for x in every if x.family == fam][:per]]


def one(job: tuple) -> pd.DataFrame:
    """Per-flow slowdowns of one scenario: unshifted, each delay, flowSim (in a worker)."""
    scenario, delays = job
    from m4ray.datagen.record import deliver
    from m4ray.sim.flowsim import FlowSimConfig
    from m4ray.sim.trace import run_trace

    topo, routing, _, base = deliver(scenario)
    base = _keyed(base)
    flows = [f for f, _ in base]
    fct = np.array([t - f.start_s for f, t in base])
    ideal = np.array(
        [routing.ideal_fct(f.size_bytes, routing.path(f.src, f.dst, f.id)) for f in flows]
    )
    out = pd.DataFrame(
        {
            "family": scenario.family,
            "scenario": scenario.index,
            "cc": scenario.ns3.rdma.cc if scenario.ns3.rdma is not None else "tcp",
            "size": [f.size_bytes for f in flows],
            "slowdown": fct / ideal,
        }
    )
    fs = run_trace(topo, flows, FlowSimConfig(), routing).column("fct_s").to_numpy()
    out["flowsim"] = fs / ideal  # run_trace keeps the order of the flows it is given
    for delay in delays:
        _, _, _, moved = deliver(scenario, jitter_s=delay)
        moved = _keyed(moved)
        if [(f.src, f.dst, f.size_bytes) for f, _ in moved] != [
            (f.src, f.dst, f.size_bytes) for f in flows
        ]:  # a DAG replay sends the same flows whatever the timing
            raise RuntimeError(f"{scenario.family} #{scenario.index}: the flows changed")
        out[f"shift_{delay:g}"] = np.array([t - f.start_s for f, t in moved]) / ideal
    return out


def _keyed(delivered: list) -> list:
    """Flows in a timing-free order: by (src, dst, size), then start within that key (a DAG
    replay numbers flows as they start, so ids move when timing does)."""
    return sorted(delivered, key=lambda x: (x[0].src, x[0].dst, x[0].size_bytes, x[0].start_s))


def table(frame: pd.DataFrame, delays: list[float], by: str) -> str:
    cols = [f"shift_{d:g}" for d in delays]
    lines = [
        f"{by:<12}{'flows':>7}"
        + "".join(f"{'ns-3 +' + c[6:] + ' s':>20}" for c in cols)
        + f"{'flowSim':>18}{'floor/flowSim':>16}"
    ]
    groups = [*sorted(frame[by].unique()), "all"]
    for g in groups:
        sub = frame if g == "all" else frame[frame[by] == g]
        cells = []
        for c in [*cols, "flowsim"]:
            err = (sub[c] / sub["slowdown"] - 1).abs().to_numpy()
            cells.append((err.mean(), np.quantile(err, 0.9)))
        floor, fs = cells[-2], cells[-1]  # the last delay's floor beside flowSim
        lines.append(
            f"{g:<12}{len(sub):>7}"
            + "".join(f"{m:>11.3f} / {p:.3f}" for m, p in cells[:-1])
            + f"{fs[0]:>9.3f} / {fs[1]:.3f}"
            + f"{floor[0] / fs[0]:>9.2f} / {floor[1] / fs[1]:.2f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experiment", default="datagen_cc", help="a datagen experiment")
    parser.add_argument("--n", type=int, default=48, help="scenarios, evenly over families")
    parser.add_argument("--delays", type=float, nargs="+", default=[0.0, 1e-9, 1e-8])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, help="write the per-flow table here (parquet)")
    parser.add_argument(
        "--overrides", nargs="*", default=[], help="Hydra overrides of the experiment, e.g. "
        "datagen.weights.rail=0 (a family's weight 0 leaves it out)",
    )  # fmt: skip
    args = parser.parse_args()

    chosen = scenarios(args.experiment, args.n, args.overrides)
    started = time.perf_counter()
    with ProcessPoolExecutor(args.workers) as pool:
        parts = list(pool.map(one, [(s, args.delays) for s in chosen]))
    frame = pd.concat(parts, ignore_index=True)
    if args.out:
        frame.to_parquet(args.out)
    print(
        f"{len(chosen)} scenarios of {args.experiment}, {len(frame)} flows, "
        f"{time.perf_counter() - started:.0f} s; per-flow |slowdown / ns-3's unshifted − 1|, "
        "mean / p90\n"
    )
    print(table(frame, args.delays, "cc"))
    print()
    print(table(frame, args.delays, "family"))


if __name__ == "__main__":
    main()
