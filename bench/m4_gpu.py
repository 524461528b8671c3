"""m4's neural step on CPU and on a GPU, side by side: steps/s by component size, and full
replays (per-flow output) of the scale ladder's MoE job, whose large components are m4's weak
rung (issue 34).

    .venv/bin/python bench/m4_gpu.py [--checkpoint m4-v2] [--flows 64 512 4096 16384]
        [--gpus 128 512] [--devices cpu cuda]

Table 1, one row per component size (synthetic graphs of the checkpoint's shapes: each flow on
4 of F/2 links): ms per step and flows/s of the numpy step (what the in-process backend runs on a
CPU), the torch step on the CPU (1 thread), and the torch step on the GPU in float64 (the
backend's ``device=cuda``) and float32 (``precision=float32``); the largest relative difference
of each's slowdowns from numpy float64.

Table 2, one row per rung and device: the ladder's MoE job (Spectrum-X, TP 4, EP 8, 2 layers)
replayed in full on m4 with ``device`` cpu and cuda, and on flowSim: wall seconds, flows,
updates, its completion time and its largest per-flow relative difference from the CPU run.
Runs without Ray (a GPU machine may not have it); greenlet must import.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from m4ray.models.graph import StepGraph  # noqa: E402
from m4ray.sweeps.report import format_table  # noqa: E402


def graphs_of(cfg, flows: int, rng: np.random.Generator) -> list[StepGraph]:
    """One component of ``flows`` flows on ``flows // 2`` links (4 links per flow)."""
    links = max(flows // 2, 4)
    per = 4
    rows = np.repeat(np.arange(flows), per)
    cols = np.concatenate([rng.choice(links, per, replace=False) for _ in range(flows)])
    h = cfg.hidden
    graph = StepGraph(
        h_flow=rng.standard_normal((flows, h)) * 0.3,
        h_link=rng.standard_normal((links, h)) * 0.3,
        dt_flow_us=rng.uniform(0.1, 20.0, flows),
        dt_link_us=rng.uniform(0.1, 20.0, links),
        incidence=np.stack([rows, cols]).astype(np.int64),
        params=rng.uniform(0.0, 1.0, (flows, cfg.n_params)),
        n_links=np.full(flows, per, dtype=np.int64),
    )
    if cfg.fluid:
        graph.base = rng.uniform(1.0, 3.0, flows)
        graph.fluid = rng.uniform(0.0, 2.0, (flows, 3))
    return [graph]


def timed(fn, graphs, seconds: float, sync) -> tuple[float, np.ndarray]:
    """Mean seconds per call over up to ``seconds`` (after a warm-up) and the first answer."""
    out = np.asarray(fn(graphs)[0].slowdown, dtype=np.float64)
    sync()
    n, start = 0, time.perf_counter()
    while n < 3 or (time.perf_counter() - start < seconds and n < 2000):
        fn(graphs)
        n += 1
    sync()
    return (time.perf_counter() - start) / n, out


def step_table(args, devices: list[str]) -> None:
    from m4ray.models.numpy_step import NumpyStepper, load_numpy_model
    from m4ray.models.step import LocalStepper
    from m4ray.sim.m4.backend import checkpoint_dir, load_model

    directory = str(checkpoint_dir(args.checkpoint))
    steppers = {"numpy": NumpyStepper(load_numpy_model(directory), max_flows=1 << 30)}
    steppers["torch cpu"] = LocalStepper(load_model(args.checkpoint), max_flows=1 << 30)
    if "cuda" in devices:
        for precision in ("float64", "float32"):
            model = load_model(args.checkpoint, "cuda", precision)
            steppers[f"cuda {precision[-2:]}"] = LocalStepper(model, max_flows=1 << 30)
    cfg = load_model(args.checkpoint).cfg
    rng = np.random.default_rng(0)
    header = ["flows"] + [f"{k} ms" for k in steppers] + [f"{k} Mflow/s" for k in steppers]
    header += [f"{k} max rel" for k in steppers if k != "numpy"]
    rows = []
    for flows in args.flows:
        graphs = graphs_of(cfg, flows, rng)
        ms, rate, rel, ref = [], [], [], None
        for name, stepper in steppers.items():
            sync = torch.cuda.synchronize if name.startswith("cuda") else (lambda: None)
            sec, out = timed(stepper, graphs, args.seconds, sync)
            ms.append(f"{sec * 1e3:.3f}")
            rate.append(f"{flows / sec / 1e6:.3f}")
            if ref is None:
                ref = out
            else:
                rel.append(f"{np.max(np.abs(out - ref) / np.abs(ref)):.1e}")
        rows.append([flows, *ms, *rate, *rel])
        print(f"  {flows} flows done", flush=True)
    print(f"\nm4 step, checkpoint {args.checkpoint} (hidden {cfg.hidden}), one component")
    print(format_table(header, rows))


def replay_table(args, devices: list[str]) -> None:
    from composed import ladder_workload, wire

    from m4ray.sim.collectives import HierarchicalSpec
    from m4ray.sim.flowsim import FlowSimConfig
    from m4ray.sim.m4 import M4Config
    from m4ray.sim.m4.backend import learned_transport
    from m4ray.sim.ns3.backend import Ns3Config
    from m4ray.sim.replay import Replay
    from m4ray.sim.routing import Routing
    from m4ray.sim.templates import ClusterTemplateSpec
    from m4ray.sweeps.scale import synthetic_workload

    moe, jumbo = ladder_workload("moe"), wire("jumbo")
    network = Ns3Config(transport=learned_transport(args.checkpoint))
    configs = {"flowsim": FlowSimConfig()}
    for device in devices:
        configs[f"m4 {device}"] = M4Config(
            checkpoint=args.checkpoint, network=network, device=device
        )
    rows = []
    for gpus in args.gpus:
        spec = ClusterTemplateSpec(template="spectrum_x", gpus=gpus)
        topo = spec.build()
        routing = Routing(topo, wire=jumbo)
        workload = synthetic_workload("moe", moe, gpus, 1.0).build(n_hosts=len(topo.hosts))
        algorithm = HierarchicalSpec().build(topo)
        ref = None
        for name, config in configs.items():
            backend = config.build(topo, routing)
            start = time.perf_counter()
            result = Replay(workload, backend, routing, algorithm).run()
            wall = time.perf_counter() - start
            finish = np.asarray(result.flows.finish_s, dtype=np.float64)
            diff = ""
            if name.startswith("m4"):
                if ref is None:
                    ref = finish
                else:
                    diff = f"{np.max(np.abs(finish - ref) / np.maximum(np.abs(ref), 1e-12)):.1e}"
            updates = getattr(getattr(backend, "engine", None), "n_updates", "")
            rows.append(
                [
                    gpus,
                    name,
                    len(finish),
                    updates,
                    f"{wall:.2f}",
                    f"{result.completion_time_s * 1e3:.4f}",
                    diff,
                ]
            )
            print(f"  {gpus} GPUs {name}: {wall:.1f} s", flush=True)
    print("\nMoE job (scale ladder), Spectrum-X, full replay with per-flow output")
    header = ["GPUs", "backend", "flows", "graphs", "wall s", "completion ms", "max rel vs cpu"]
    print(format_table(header, rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default="m4-v2")
    parser.add_argument("--flows", type=int, nargs="+", default=[64, 512, 4096, 16384])
    parser.add_argument("--gpus", type=int, nargs="*", default=[128, 512])
    parser.add_argument("--devices", nargs="+", default=["cpu", "cuda"])
    parser.add_argument("--seconds", type=float, default=2.0, help="timing per step cell")
    args = parser.parse_args()
    torch.set_num_threads(1)
    devices = [d for d in args.devices if d == "cpu" or torch.cuda.is_available()]
    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    print(f"torch {torch.__version__}; GPU: {name}; devices {devices}", flush=True)
    step_table(args, devices)
    if args.gpus:
        replay_table(args, devices)


if __name__ == "__main__":
    main()
