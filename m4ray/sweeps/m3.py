"""The m3 experiment: a network-wide FCT slowdown distribution from sampled paths, beside the
references."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from m4ray.fingerprint import fingerprint
from m4ray.m3.aggregate import empirical
from m4ray.m3.estimate import (
    M3Config,
    checkpoint_queues,
    estimate,
    load_model,
    reference_run,
    summary,
    warm_up,
)
from m4ray.m3.paths import RoutedFlows
from m4ray.runtime.rundir import write_manifest
from m4ray.sim.routing import Routing, WireFormat

SECTIONS = {"m3": M3Config}  # checked before run


def run(sweep, raw_config: dict[str, Any]) -> Path:
    from m4ray.m3.plots import estimate_cdf
    from m4ray.runtime.cluster import start_ray

    cfg: M3Config = sweep.m3
    model, info = load_model(cfg.checkpoint, cfg.network.cc)
    run_dir = Path(sweep.paths.run_dir).resolve()
    wire: WireFormat = sweep.wire
    topo = sweep.topology.build()
    routing = Routing(topo, seed=sweep.seed, wire=wire)
    flows = cfg.workload.flows(routing, sweep.seed)
    ray = start_ray(sweep.ray)
    warm_up(ray, cfg.tasks)  # workers up and path flowSim loaded: the clock times the estimate
    began = time.perf_counter()
    routed = RoutedFlows(flows, routing)
    queues = checkpoint_queues(cfg, topo, info)  # path flowSim as the checkpoint was trained
    estimates = estimate(
        routed, cfg, seed=sweep.seed, ray=ray, model=model, wire=wire, queues=queues
    )
    walls = {"m3": time.perf_counter() - began}
    walls["path_flowsim"] = walls["m3"]
    size = routed.size_bytes
    for name in cfg.compare:
        print(f"m3: running network-wide {name} on {len(flows)} flows for comparison")
        slowdown, walls[name] = reference_run(
            name, topo, flows, routing, cfg=cfg, cache=run_dir / "cache", ray=ray
        )
        estimates[name] = empirical(slowdown, size)
    frame = summary(estimates, walls, seed=sweep.seed)
    tag = fingerprint([raw_config.get("topology"), raw_config.get("m3"), sweep.seed], 10)
    out = run_dir / f"estimate-{tag}.parquet"
    out.parent.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(out)
    curves = {name: (est.overall.values, est.overall.weights) for name, est in estimates.items()}
    plot = estimate_cdf(
        curves,
        f"{len(topo.hosts)} hosts, {len(flows)} flows",
        run_dir / "plots" / f"slowdown_cdf-{tag}.png",
    )
    extra = {
        "estimate": out.name,
        "checkpoint": cfg.checkpoint,
        "checkpoint_dataset": info.get("dataset_version"),
        "hosts": len(topo.hosts),
        "flows": len(flows),
        "paths_sampled": cfg.n_paths,
        "unique_paths": len(routed.sample(cfg.n_paths, sweep.seed)),
    }
    write_manifest(run_dir, raw_config, [out, plot], extra=extra, name=f"manifest-{tag}.json")
    print()
    print(frame.to_string(index=False, float_format=lambda v: f"{v:.3f}", na_rep=""))
    print(
        f"p99_lo / p99_hi (err_lo / err_hi): p99's 90 % range over bootstrap replicates of the "
        f"{cfg.n_paths} sampled paths, how far another draw would move it (not the model's "
        "error; m3.n_paths narrows it)"
    )
    if "ns3" in walls:
        print(
            f"\nm3 {walls['m3']:.2f} s (its Ray workers started first, as ns-3's clock starts "
            f"once ns-3 is loaded) vs ns-3 "
            f"{walls['ns3']:.1f} s: {walls['ns3'] / walls['m3']:.0f}x faster"
        )
    print(f"outputs: {out}, {plot}")
    return run_dir


__all__ = ["SECTIONS", "run"]
