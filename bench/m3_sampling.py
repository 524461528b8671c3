"""How much of m3's error is the draw of paths, and how much is the model: its estimate over
many draws of the sampled paths, on the m3 experiment, against network-wide ns-3.

    .venv/bin/python bench/m3_sampling.py                               # m3's default experiment
    .venv/bin/python bench/m3_sampling.py --paths 500 2000 --draws 8
    .venv/bin/python bench/m3_sampling.py m3.network.cc=hpcc m3.checkpoint=checkpoints/m3-v3

Arguments other than the options are overrides of ``+experiment=m3`` (its topology, workload,
network and checkpoint). Network-wide ns-3, flowSim and flowSim with standing queues run once
(cached by content where the experiment caches them, ``<run_dir>/cache``: a run of
``+experiment=m3 'm3.compare=[ns3]'`` with the same overrides is reused). Then for each
``--paths`` count, ``--draws`` independent draws of that many paths (seeds derived from the
root seed), and for each draw three estimates through the same mixture
(:func:`m4ray.m3.aggregate.aggregate`):

* **ns-3 on the paths**: each sampled path's own flows' slowdowns in the network-wide ns-3 run.
  The best any per-path model can do with these paths: its error is the sampling alone;
* **path flowSim** (uncorrected) and **m3** (the checkpoint's correction), as the experiment
  computes them; with ``--also``, other checkpoints' corrections on the same draws (one fit's
  answer moves with its training split by up to ~40 points in a bucket: compare several).

Per size bucket: the mean error over the draws (what stays when draws average out: the model's
bias), its rms (what one run shows), and, for ns-3 on the paths, how often the bootstrap's 90 %
range (``p99_lo``-``p99_hi`` of the experiment's table) held ns-3's p99. Network-wide flowSim
(classic, with standing queues and with first windows over them) samples nothing: one error each.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

COLUMNS = ("overall", "<1KB", "1-10KB", "10-50KB", ">=50KB")


def p99s(est) -> np.ndarray:
    return np.array(
        [float((est.overall if c == "overall" else est.buckets[c]).quantile(0.99)) for c in COLUMNS]
    )


def main() -> None:  # noqa: PLR0915 (one bench, read top to bottom)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="+experiment=m3 overrides")
    parser.add_argument("--paths", type=int, nargs="+", default=[500, 2000])
    parser.add_argument("--draws", type=int, default=8)
    parser.add_argument("--replicates", type=int, default=200, help="bootstrap replicates")
    parser.add_argument(
        "--also", nargs="+", default=[], metavar="CKPT",
        help="more m3 checkpoints, scored on the same draws (a row each: fits side by side)",
    )  # fmt: skip
    args = parser.parse_args()

    from hydra import compose, initialize_config_dir

    from m4ray.config import CONF_DIR
    from m4ray.m3.aggregate import aggregate, bootstrap, bucket_counts, empirical
    from m4ray.m3.estimate import checkpoint_queues, estimate, load_model, reference_run
    from m4ray.m3.paths import RoutedFlows
    from m4ray.models.m3_features import targets
    from m4ray.runtime.cluster import start_ray
    from m4ray.sim.routing import Routing
    from m4ray.sweeps.__main__ import resolve
    from m4ray.sweeps.report import format_table

    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
        sweep = resolve(compose("sweep", overrides=["+experiment=m3", *args.overrides]))
    cfg = sweep.m3
    model, info = load_model(cfg.checkpoint, cfg.network.cc)
    topo = sweep.topology.build()
    routing = Routing(topo, seed=sweep.seed, wire=sweep.wire)
    flows = cfg.workload.flows(routing, sweep.seed)
    routed = RoutedFlows(flows, routing)
    size = routed.size_bytes
    share = bucket_counts(size)
    ray = start_ray(sweep.ray)
    cache = Path(sweep.paths.run_dir).resolve() / "cache"
    truth, fixed = None, {}
    for name in ("ns3", "flowsim", "flowsim_queues", "flowsim_bursts"):
        print(f"network-wide {name} ({len(flows):,} flows; cached in {cache})", flush=True)
        slowdown, _ = reference_run(name, topo, flows, routing, cfg=cfg, cache=cache, ray=ray)
        if name == "ns3":
            ns3, truth = slowdown, p99s(empirical(slowdown, size))
        else:
            fixed[name] = p99s(empirical(slowdown, size)) / truth - 1
    queues = checkpoint_queues(cfg, topo, info)
    others = {}  # --also: label -> (model, its path flowSim's queues)
    for ckpt in args.also:
        other, other_info = load_model(ckpt, cfg.network.cc)
        others[f"m3 {Path(ckpt).name}"] = (other, checkpoint_queues(cfg, topo, other_info))
    rows = []
    for n_paths in args.paths:
        errors: dict[str, list[np.ndarray]] = {
            "ns-3 on the paths": [],
            "path flowSim": [],
            "m3": [],
            **{label: [] for label in others},
        }
        covered, walls = [], []
        for k in range(args.draws):
            seed = int(np.random.SeedSequence([sweep.seed, 3, k]).generate_state(1)[0])
            began = time.perf_counter()

            def run(model, queues, n_paths=n_paths, seed=seed):
                return estimate(
                    routed,
                    dataclasses.replace(cfg, n_paths=n_paths),
                    seed=seed,
                    ray=ray,
                    model=model,
                    wire=sweep.wire,
                    queues=queues,
                )

            est = run(model, queues)
            walls.append(time.perf_counter() - began)
            errors["m3"].append(p99s(est["m3"]) / truth - 1)
            errors["path flowSim"].append(p99s(est["path_flowsim"]) / truth - 1)
            for label, (other, other_queues) in others.items():
                errors[label].append(p99s(run(other, other_queues)["m3"]) / truth - 1)
            pct, counts, draws = [], [], []
            for path, n in routed.sample(n_paths, seed):  # the same draw as the estimate's
                fg = routed.members(path)
                pct.append(targets(ns3[fg], size[fg])[0])
                counts.append(bucket_counts(size[fg]))
                draws.append(n)
            sample = (np.stack(pct), np.stack(counts), np.array(draws), share)
            errors["ns-3 on the paths"].append(p99s(aggregate(*sample)) / truth - 1)
            boot = bootstrap(*sample, levels=(0.99,), n=args.replicates, seed=seed)
            lo_hi = np.array([np.nanquantile(boot[c][:, 0], [0.05, 0.95]) for c in COLUMNS])
            covered.append((lo_hi[:, 0] <= truth) & (truth <= lo_hi[:, 1]))
            print(f"  {n_paths} paths, draw {k + 1}/{args.draws}: {walls[-1]:.1f} s", flush=True)
        for method, listed in errors.items():
            errs = np.array(listed)
            mean, rms = errs.mean(axis=0), np.sqrt((errs**2).mean(axis=0))
            cells = [f"{m:+.1%} / {r:.1%}" for m, r in zip(mean, rms, strict=True)]
            note = ""
            if method == "ns-3 on the paths":
                note = "bootstrap 90 % held ns-3: " + " ".join(
                    f"{c:.0%}" for c in np.mean(covered, axis=0)
                )
            rows.append([n_paths, method, *cells, f"{np.median(walls):.2f}", note])
    for name, err in fixed.items():
        rows.append(["all", name, *(f"{e:+.1%}" for e in err), "", "one run, no sampling"])
    print(
        f"\np99 error against network-wide ns-3 ({len(flows):,} flows, {len(topo.hosts)} hosts, "
        f"{cfg.network.cc}, {cfg.checkpoint}), over {args.draws} draws of the sampled paths: "
        "mean / rms"
    )
    head = ["paths", "estimate", *COLUMNS, "m3 s", ""]
    print(format_table(head, rows))


if __name__ == "__main__":
    main()
