"""Backends in closed loop on a dataset's collective scenarios: each scenario's DAG replayed with
flowSim, flowSim with ACK load and m4 (each flow starting when its parents end in that backend's
own run), its completion against the ns-3 run the dataset recorded.

    .venv/bin/python bench/closed_loop.py outputs/probe_4x8 [--backends flowsim flowsim_acks m4]
        [--checkpoint m4-v2] [--limit 8]

The folder is a datagen run (its ``manifest.json`` holds the config that drew the scenarios,
``dataset/`` the ns-3 records). Training and ``bench/m4_residual.py`` score a model on ns-3's own
arrivals (each flow meets what it met in ns-3); here nothing of ns-3's run is given, as in a
sweep, so small per-flow errors change when children start and what they meet (README, "The
study's gap is made in closed loop"). Per scenario: the family, degraded GPUs and R, ns-3's
completion (last flow's end) and each backend's completion / ns-3's; then each backend's mean
and worst |completion error|. Open-loop families (no DAG) are skipped: their arrivals are fixed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from m4ray.sweeps.report import format_table


def backend_configs(names: list[str], checkpoint: str, network) -> dict:
    """The named backends told the scenario's ns-3 ``network`` where they learn from it
    (``flowsim_dcqcn``: flowSim with DCQCN's rates, for DCQCN networks only)."""
    from m4ray.sim.flowsim import DcqcnRates, FlowSimConfig
    from m4ray.sim.m4 import M4Config

    made = {
        "flowsim": FlowSimConfig,
        "flowsim_acks": lambda: FlowSimConfig(ack_load=True),
        "flowsim_dcqcn": lambda: FlowSimConfig(rate_control=DcqcnRates.of(network)),
        "m4": lambda: M4Config(checkpoint=checkpoint, network=network),
    }
    unknown = sorted(set(names) - set(made))
    if unknown:
        raise SystemExit(f"unknown backend(s) {unknown}; choose from {sorted(made)}")
    return {name: made[name] for name in names}


def closed_loop(scenario, config) -> float:
    """The scenario's DAG replayed on ``config``'s backend: its completion (s)."""
    from m4ray.datagen.families import ALGORITHMS
    from m4ray.sim.replay import Replay
    from m4ray.sim.routing import Routing

    topo = scenario.build_topology()
    routing = Routing(topo, seed=scenario.seed, wire=scenario.wire)
    traffic = scenario.traffic
    workload = traffic.workload(len(topo.hosts))
    algorithm = ALGORITHMS[traffic.algorithm]().build(topo)
    backend = config.build(topo, routing)
    result = Replay(
        workload, backend, routing, algorithm, send_latency_s=traffic.send_latency_s
    ).run()
    return float(np.max(result.flows.finish_s))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="a datagen run (manifest.json, dataset/)")
    parser.add_argument("--backends", nargs="+", default=["flowsim", "flowsim_acks", "m4"])
    parser.add_argument("--checkpoint", default="m4-v2")
    parser.add_argument("--limit", type=int, default=None, help="at most this many scenarios")
    parser.add_argument("--family", default=None, help="only this family's scenarios")
    args = parser.parse_args()

    from hydra.utils import instantiate

    from m4ray.datagen.job import expand
    from m4ray.errors import InputError

    config = json.loads((args.run_dir / "manifest.json").read_text())["config"]
    datagen = instantiate(config["datagen"], _convert_="all")
    drawn = {s.scenario_id: s for s in expand(datagen, config["seed"])}
    dataset = args.run_dir / "dataset"
    rows_table = pq.read_table(dataset / "scenarios.parquet").to_pandas()
    rows_table = rows_table[rows_table.status == "ok"]
    if args.family is not None:
        rows_table = rows_table[rows_table.family == args.family]
    rows, errors = [], {name: [] for name in args.backends}
    for sid in rows_table.scenario_id[: args.limit]:
        scenario = drawn.get(sid)
        if scenario is None:
            raise SystemExit(f"{sid}: not drawn by {args.run_dir}/manifest.json's config")
        if not hasattr(scenario.traffic, "workload"):
            continue  # open loop: fixed arrivals, nothing to close
        flows = ds.dataset(dataset / "flows" / f"scenario_id={sid}").to_table().to_pandas()
        ns3 = float((flows.start_s + flows.fct_s).max())
        params = json.loads(rows_table.set_index("scenario_id").params[sid])
        row = [
            sid,
            scenario.family,
            params.get("cc", "dctcp"),
            params.get("n_degraded", ""),
            params.get("reduction", ""),
            f"{ns3 * 1e3:.3f}",
        ]
        for name, make in backend_configs(args.backends, args.checkpoint, scenario.ns3).items():
            try:
                done = closed_loop(scenario, make())
            except InputError as err:  # e.g. a CC the checkpoint never learned: said, not scored
                row.append(f"refused ({err.field})")
                continue
            errors[name].append(done / ns3 - 1)
            row.append(f"{done / ns3:.3f}")
        rows.append(row)
        print(f"  {sid} done", flush=True)
    header = ["scenario", "family", "cc", "degraded", "R", "ns-3 ms", *args.backends]
    print(f"\nclosed-loop completion / ns-3's, {len(rows)} scenarios of {args.run_dir}")
    print(format_table(header, rows))
    summary = [
        [
            name,
            f"{100 * np.mean(np.abs(e)):.1f} %",
            f"{100 * np.mean(e):+.1f} %",
            f"{100 * e[np.argmax(np.abs(e))]:+.1f} %",
        ]
        for name, e in ((n, np.asarray(v)) for n, v in errors.items())
        if len(e)
    ]
    print(format_table(["backend", "mean |err|", "mean err", "worst"], summary))


if __name__ == "__main__":
    main()
