"""In-process m4 backend speed: the full-size microAllReduce (N=8, R=4, scale 1) on CPU.

    .venv/bin/python bench/m4_speed.py [--repeat 2] [--scale 1.0] [--m4 m4-small m4-v2]

One table, one row per update policy (``window_us``: per event, per instant, 10 µs windows) of
the first checkpoint, the default policy of the others (each told the ns-3 transport it learned;
a fluid-anchored one pays for its max-min shares in ``prepare``) and flowSim for reference:
flows, events (arrivals + completions), model updates, wall time, events/s, and where the time
goes per update: state gather (``prepare``), the neural step, write-back (``finish``) and
everything else (event loop, replay, routing). Goal: <= 2 s.
"""

from __future__ import annotations

import argparse
import time

import torch

from m4ray.sim.collectives import HierarchicalSpec
from m4ray.sim.failures import GrayFailure
from m4ray.sim.flowsim import FlowSimConfig
from m4ray.sim.m4 import M4Config
from m4ray.sim.m4.backend import learned_transport
from m4ray.sim.m4.engine import M4Engine
from m4ray.sim.ns3.backend import Ns3Config
from m4ray.sim.replay import Replay
from m4ray.sim.routing import Routing, WireFormat
from m4ray.sim.topologies import rail_cluster
from m4ray.sweeps.report import format_table
from m4ray.workload.simai import SimAIWorkloadSpec


class Timed:
    """Accumulates wall time of the engine's phases (wraps bound methods)."""

    def __init__(self, engine: M4Engine) -> None:
        self.t = {"prepare": 0.0, "step": 0.0, "finish": 0.0}
        self.n = {"prepare": 0, "step": 0, "finish": 0}
        for name in ("prepare", "finish"):
            setattr(engine, name, self._wrap(name, getattr(engine, name)))
        engine.stepper = self._wrap("step", engine.stepper)

    def _wrap(self, name, fn):
        def timed(*args):
            start = time.perf_counter()
            try:
                return fn(*args)
            finally:
                self.t[name] += time.perf_counter() - start
                self.n[name] += 1

        return timed


def case(config, scale: float):
    topo = GrayFailure(n_degraded=8, reduction=4).apply(rail_cluster())
    routing = Routing(topo, wire=WireFormat(mtu_bytes=8948, header_bytes=54))
    workload = SimAIWorkloadSpec(path="microAllReduce", scale=scale).build()
    backend = config.build(topo, routing)
    timer = Timed(backend.engine) if hasattr(backend, "engine") else None
    start = time.perf_counter()
    result = Replay(workload, backend, routing, HierarchicalSpec().build(topo)).run()
    wall = time.perf_counter() - start
    return wall, result, backend, timer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--m4", nargs="+", default=["m4-small"], help="checkpoints")
    args = parser.parse_args()
    torch.set_num_threads(1)

    def m4(checkpoint, window_us):
        network = Ns3Config(transport=learned_transport(checkpoint))
        return M4Config(checkpoint=checkpoint, window_us=window_us, network=network)

    first, *others = args.m4
    cases = [
        (f"{first}, per event", m4(first, None)),
        (f"{first}, per instant (default)", m4(first, 0.0)),
        (f"{first}, 10 us windows", m4(first, 10.0)),
        *((f"{name}, per instant (default)", m4(name, 0.0)) for name in others),
        ("flowSim", FlowSimConfig()),
    ]
    rows = []
    for label, config in cases:
        case(config, 0.01)  # warm: model load, first-call overheads
        best = None
        for _ in range(args.repeat):
            out = case(config, args.scale)
            if best is None or out[0] < best[0]:
                best = out
        wall, result, backend, timer = best
        events = backend.n_events
        row = {
            "case": label,
            "flows": len(result.flows.flow_id),
            "events": events,
            "completion ms": round(result.completion_time_s * 1e3, 3),
            "wall s": round(wall, 3),
            "events/s": round(events / wall),
        }
        if timer is not None:
            n = timer.n["step"]
            graphs = backend.engine.n_updates
            row.update(
                {
                    "updates": n,
                    "graphs": graphs,
                    "flows/graph": round(backend.engine.n_stepped_flows / max(graphs, 1), 1),
                    "us/event": round(wall / events * 1e6, 1),
                    "prepare us/upd": round(timer.t["prepare"] / max(n, 1) * 1e6, 1),
                    "step us/upd": round(timer.t["step"] / max(n, 1) * 1e6, 1),
                    "finish us/upd": round(timer.t["finish"] / max(n, 1) * 1e6, 1),
                    "other s": round(wall - sum(timer.t.values()), 3),
                }
            )
        rows.append(row)
    print(f"microAllReduce, N=8 R=4, scale {args.scale}, 1 torch thread, best of {args.repeat}")
    header = list(max(rows, key=len))
    print(format_table(header, [[r.get(k, "") for k in header] for r in rows]))


if __name__ == "__main__":
    main()
