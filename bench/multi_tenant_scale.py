"""Many jobs on a large cluster: wall time and peak memory of one multi-job replay (issue 33's
scale point: >= 1,024 GPUs, >= 8 jobs, flowSim on one machine).

    .venv/bin/python bench/multi_tenant_scale.py [--gpus 1024] [--backends flowsim m4]
        [--policies packed spread]

A Spectrum-X cluster of ``--gpus`` GPUs (64 spines) shared by eight jobs of an eighth of it each:
four GPT-13B-shaped (TP 8, 2 of its layers), two Mixtral-like MoE (TP 4, EP 8, 1 layer), two
data-parallel GPTs, through SimAI's collectives (``--collective hierarchical``: rail-aligned);
one table row per policy × backend: flows, wall
seconds, peak resident memory (MiB), and the slowest and fastest job's iteration (ms).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from m4ray.runtime.memory import PeakRss  # noqa: E402
from m4ray.sim.collectives import HierarchicalSpec  # noqa: E402
from m4ray.sim.flowsim import FlowSimConfig  # noqa: E402
from m4ray.sim.nccl import SimAISpec  # noqa: E402
from m4ray.sim.routing import WireFormat  # noqa: E402
from m4ray.sim.scenario import Scenario, simulate  # noqa: E402
from m4ray.sim.templates import ClusterTemplateSpec  # noqa: E402
from m4ray.sweeps.multi_tenant import with_policy  # noqa: E402
from m4ray.sweeps.report import format_table  # noqa: E402
from m4ray.workload.multi import JobEntry, MultiJobSpec  # noqa: E402
from m4ray.workload.synth import SyntheticWorkloadSpec  # noqa: E402


def jobs(gpus_each: int) -> list[JobEntry]:
    gpt = {"name": "gpt13b", "num_layers": 2, "hidden_size": 5120, "num_heads": 40}
    gpt |= {"sequence_len": 2048, "vocab_size": 50257, "num_microbatches": 1}
    moe = {"name": "moe", "num_layers": 1, "hidden_size": 4096, "num_heads": 32}
    moe |= {"sequence_len": 2048, "vocab_size": 32000, "num_microbatches": 1}
    moe |= {"num_experts": 8, "top_k": 2}
    dense = {"name": "gpt", "num_layers": 2, "hidden_size": 2048, "num_heads": 16}
    dense |= {"sequence_len": 1024, "vocab_size": 32000, "num_microbatches": 1}
    out = []
    for i in range(8):
        if i < 4:
            model, parallel = gpt, {"tp": 8, "dp": gpus_each // 8}
        elif i < 6:
            model, parallel = moe, {"tp": 4, "ep": 8, "dp": gpus_each // 4}
        else:
            model, parallel = dense, {"dp": gpus_each}
        model = {**model, "batch_size": parallel["dp"]}
        spec = SyntheticWorkloadSpec(model=model, parallel=parallel)
        out.append(JobEntry(name=f"{model['name']}-{i}", workload=spec, gpus=gpus_each))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=1024)
    parser.add_argument("--backends", nargs="+", default=["flowsim"])
    parser.add_argument("--policies", nargs="+", default=["packed", "spread"])
    parser.add_argument(
        "--collective", choices=["simai", "hierarchical"], default="simai", help="the layer"
    )
    args = parser.parse_args()
    topo = ClusterTemplateSpec(template="spectrum_x", gpus=args.gpus, spines=64)
    spec = MultiJobSpec(jobs=jobs(args.gpus // 8), gpus_per_server=8)
    configs = {"flowsim": FlowSimConfig()}
    if "m4" in args.backends:
        from m4ray.sim.m4 import M4Config

        configs["m4"] = M4Config()
    collective = SimAISpec() if args.collective == "simai" else HierarchicalSpec()
    rows = []
    for policy in args.policies:
        placed = with_policy(spec, policy)
        for backend in args.backends:
            scenario = Scenario(
                topology=topo,
                workload=placed,
                collective=collective,
                wire=WireFormat(mtu_bytes=8948, header_bytes=54),
                backend=backend,
                backend_config=configs[backend],
            )
            start = time.perf_counter()
            with PeakRss() as memory:
                row, _ = simulate(scenario)
            wall = time.perf_counter() - start
            if row["status"] != "ok":
                print(f"{policy} {backend}: {row['error']}")
                continue
            times = json.loads(row["job_iteration_s"])
            rows.append(
                [
                    policy,
                    backend,
                    row["n_flows"],
                    f"{wall:.1f}",
                    f"{memory.peak:.0f}",
                    f"{max(times.values()) * 1e3:.2f}",
                    f"{min(times.values()) * 1e3:.2f}",
                ]
            )
            print(f"  {policy} {backend}: {wall:.1f} s", flush=True)
    print(f"\n{len(spec.jobs)} jobs on Spectrum-X {args.gpus} GPUs, {args.collective}, full replay")
    header = ["policy", "backend", "flows", "wall s", "peak MiB", "slowest ms", "fastest ms"]
    print(format_table(header, rows))


if __name__ == "__main__":
    main()
