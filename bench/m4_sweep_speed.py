"""m4 against flowSim (and ns-3) on the gray-failure grid: whole commands and per scenario.

    .venv/bin/python bench/m4_sweep_speed.py                 # both tables (~6 min on 2 cores)
    .venv/bin/python bench/m4_sweep_speed.py --repeat 1 --no-ns3
    .venv/bin/python bench/m4_sweep_speed.py --no-commands --group 8 --scales 1 --wire default \
        --transports rdma     # the full-size study's packets (ns-3 ~3-5 min)

Table 1, the user's view: ``python -m m4ray.sweeps +experiment=gray_failure backends=[B]`` (the
default 105-scenario grid, workload.scale 0.08), run as whole commands for B = flowsim, m4
(each scenario alone, in the compiled loop: the default), m4 with ``share_steps=64`` (groups
sharing forward passes through Python's scheduler), and flowsim and m4 with
``workload.lockstep=true``, alternating, ``--repeat`` times; min and median wall time and the
ratio to flowSim (full replay).

Table 2, in one process (no Ray): seconds per scenario for the first ``--group`` scenarios of that
grid, at scale 0.08 and at full scale: flowSim; m4 alone (the compiled loop); m4 as one group (wall
÷ group size); flowSim and m4 in lockstep (``workload.lockstep``: each distinct collective step run
once, no per-flow table; ``m4ray.sim.lockstep``), with their largest iteration difference from the
full replay; and ns-3 on the N=8, R=4 scenario at full scale, RDMA (the default ground truth; each
backend's speed-up is over it, and its iteration error on that scenario) and TCP DCTCP (the default
before 2026-11, which the issue's 1,000x bar was written against). Also checks that grouped m4
equals m4 alone, flow by flow.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from composed import resolved  # noqa: E402

from m4ray.sim.collectives import HierarchicalSpec  # noqa: E402
from m4ray.sim.failures import GrayFailure  # noqa: E402
from m4ray.sim.flowsim import FlowSimConfig  # noqa: E402
from m4ray.sim.m4 import M4Config  # noqa: E402
from m4ray.sim.nccl import SimAISpec  # noqa: E402
from m4ray.sim.ns3.backend import Ns3Config  # noqa: E402
from m4ray.sim.scenario import Scenario, simulate  # noqa: E402
from m4ray.sweeps.report import format_table  # noqa: E402
from m4ray.workload.simai import SimAIWorkloadSpec  # noqa: E402

# the hierarchical collective throughout: lockstep refuses collective=simai (no step barrier)
COMMANDS = {
    "flowsim": ["backends=[flowsim]", "collective=hierarchical"],
    "m4 (alone, the default)": ["backends=[m4]", "collective=hierarchical"],
    "m4 (groups of 64)": [
        "backends=[m4]",
        "backend_options.m4.share_steps=64",
        "collective=hierarchical",
    ],
    "flowsim (lockstep)": [
        "backends=[flowsim]",
        "workload.lockstep=true",
        "collective=hierarchical",
    ],
    "m4 (lockstep)": ["backends=[m4]", "workload.lockstep=true", "collective=hierarchical"],
}


def whole_commands(repeat: int) -> list[list]:
    walls: dict[str, list[float]] = {name: [] for name in COMMANDS}
    with tempfile.TemporaryDirectory() as out:
        for i in range(repeat):
            for name, args in COMMANDS.items():
                start = time.perf_counter()
                subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "m4ray.sweeps",
                        "+experiment=gray_failure",
                        *args,
                        f"name=run{i}-{list(COMMANDS).index(name)}",
                        f"paths.output_dir={out}",
                        "progress=false",
                    ],
                    cwd=REPO,
                    check=True,
                    capture_output=True,
                )
                walls[name].append(time.perf_counter() - start)
                print(f"  {name} #{i + 1}: {walls[name][-1]:.1f} s", flush=True)
    base = min(walls["flowsim"])
    return [
        [
            name,
            len(w),
            f"{min(w):.1f}",
            f"{statistics.median(w):.1f}",
            f"{min(w) / base:.2f}x",
            f"{statistics.median(w) / statistics.median(walls['flowsim']):.2f}x",
        ]
        for name, w in walls.items()
    ]


# table 2's collective: SimAI's (the study's default since issue 29: its workload, each flow
# waiting for its parent; no lockstep) or the rail-aligned one the bars were set on
COLLECTIVES = {
    "simai": (SimAISpec, "microAllReduce_tp16"),
    "hierarchical": (HierarchicalSpec, "microAllReduce"),
}


def grid_points(n: int) -> list[tuple[int, int]]:
    """The first ``n`` (N, R) points of the grid, the last one swapped for N=8, R=4 (where
    ns-3 is timed) when it is not among them."""
    points = [(n_, r) for n_ in range(2, 17) for r in range(4, 11)][:n]
    if (8, 4) not in points:
        points[-1] = (8, 4)
    return points


def grid(  # noqa: PLR0917 (the grid's axes)
    scale: float,
    n_scenarios: int,
    config,
    backend: str,
    collective: str = "hierarchical",
    wire: str = "jumbo",
) -> list[Scenario]:
    """The first grid points as scenarios; ``wire``: the packets (the experiment's jumbo frames,
    or ``default``: the full-size study's 1,000 B)."""
    wire = resolved("+experiment=gray_failure", f"wire={wire}").wire
    points = grid_points(n_scenarios)
    spec, workload = COLLECTIVES[collective]
    return [
        Scenario(
            failure=GrayFailure(n_degraded=n, reduction=r),
            workload=SimAIWorkloadSpec(path=workload, scale=scale),
            collective=spec(),
            backend=backend,
            backend_config=config,
            wire=wire,
        )
        for n, r in points
    ]


def timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def in_process(  # noqa: PLR0917 (table 2's settings)
    scales: list[float],
    group: int,
    ns3: bool,
    collective: str,
    transports=("rdma", "tcp"),
    wire: str = "jumbo",
    checkpoints: tuple[str, ...] = (),
) -> list[list]:
    from simai_flows import study_ns3  # bench/: the study's ns-3 preset, as the sweep runs it

    from m4ray.sim.m4.shared import simulate_together

    # m4 is told the network ns-3 runs (the experiment's backend_options.m4.network)
    m4 = M4Config(network=study_ns3()) if collective == "simai" else M4Config()
    models = {name: dataclasses.replace(m4, checkpoint=name) for name in checkpoints}
    models = models or {"": m4}
    for model in models.values():
        simulate(grid(0.01, 1, model, "m4")[0])  # load the model, warm the caches
    n8r4 = grid_points(group).index((8, 4))
    rows = []
    for scale in scales:
        flowsim = grid(scale, group, FlowSimConfig(), "flowsim", collective, wire)
        t_fs, fs_out = timed(lambda s=flowsim: [simulate(x) for x in s])
        per = {"flowSim": (t_fs / group, fs_out, "")}
        for name, model in models.items():
            m4s = grid(scale, group, model, "m4", collective, wire)
            t_alone, alone = timed(lambda s=m4s: [simulate(x) for x in s])
            t_group, grouped = timed(
                lambda s=m4s, m=model: simulate_together(s, m.shared_stepper(), simulate)
            )
            same = all(
                a[1].column("finish_s").equals(g[1].column("finish_s"))
                for a, g in zip(alone, grouped, strict=True)
            )
            tag = f" ({name})" if name else ""
            per[f"m4{tag} alone"] = (t_alone / group, alone, "")
            per[f"m4{tag} in a group of {group}"] = (
                t_group / group,
                grouped,
                "yes" if same else "NO",
            )
        if collective != "simai":  # lockstep needs a step barrier (SimAI's flows have none)
            lock_fs, lock_m4 = (lockstep(s) for s in (flowsim, m4s))
            t_lfs, lfs_out = timed(lambda s=lock_fs: [simulate(x) for x in s])
            t_lm4, lm4_out = timed(lambda s=lock_m4: [simulate(x) for x in s])
            per["flowSim, lockstep"] = (t_lfs / group, lfs_out, max_diff(lfs_out, fs_out))
            per[f"m4{tag} alone, lockstep"] = (t_lm4 / group, lm4_out, max_diff(lm4_out, alone))
        refs: dict[str, tuple[float, float]] = {}
        if ns3 and scale == 1.0:
            for transport in transports:
                config = study_ns3() if transport == "rdma" else Ns3Config(transport=transport)
                scenario = dataclasses.replace(m4s[n8r4], backend="ns3", backend_config=config)
                seconds, (row, _) = timed(lambda s=scenario: simulate(s))
                assert row["status"] == "ok", row["error"]
                refs[transport] = (seconds, row["completion_time_s"])
                per[f"ns-3 {transport} (N=8 R=4, one run)"] = (seconds, [(row, None)] * group, "")
        for name, (seconds, out, note) in per.items():
            error = ""
            if "rdma" in refs and out[n8r4][0]["status"] == "ok":
                error = f"{out[n8r4][0]['completion_time_s'] / refs['rdma'][1] - 1:+.3%}"
            rows.append(
                [
                    scale,
                    name,
                    f"{seconds * 1e3:.1f}",
                    *(f"{refs[t][0] / seconds:.0f}x" if t in refs else "" for t in ("rdma", "tcp")),
                    error,
                    note,
                ]
            )
    return rows


def lockstep(scenarios: list[Scenario]) -> list[Scenario]:
    """The same scenarios replayed in lockstep (``workload.lockstep``)."""
    return [
        dataclasses.replace(s, workload=dataclasses.replace(s.workload, lockstep=True))
        for s in scenarios
    ]


def max_diff(out: list, reference: list) -> str:
    """Largest relative difference of the iteration time from the full replay's."""
    worst = max(
        abs(a[0]["completion_time_s"] / b[0]["completion_time_s"] - 1)
        for a, b in zip(out, reference, strict=True)
    )
    return f"iteration within {worst:.2%} of the full replay"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--group", type=int, default=53, help="scenarios in table 2's group")
    parser.add_argument("--no-commands", action="store_true", help="skip table 1")
    parser.add_argument("--no-ns3", action="store_true", help="skip the full-scale ns-3 run")
    parser.add_argument(
        "--collective",
        choices=sorted(COLLECTIVES),
        default="simai",
        help="table 2's collective (simai: the study's default; no lockstep rows)",
    )
    parser.add_argument(
        "--wire",
        default="jumbo",
        choices=["jumbo", "default", "simai"],
        help="table 2's packets: the grid's jumbo frames, or the full-size study's 1,000 B",
    )
    parser.add_argument("--scales", type=float, nargs="+", default=[0.08, 1.0])
    parser.add_argument(
        "--transports", nargs="+", default=["rdma", "tcp"], choices=["rdma", "tcp"],
        help="ns-3 transports timed at full scale (TCP at 1,000 B takes about an hour)",
    )  # fmt: skip
    parser.add_argument(
        "--m4", nargs="+", default=[], metavar="CHECKPOINT",
        help="table 2's m4 checkpoints, side by side in the one run (default: the backend's)",
    )  # fmt: skip
    args = parser.parse_args()
    if not args.no_commands:
        rows = whole_commands(args.repeat)
        print("\nThe default gray-failure grid (105 scenarios, scale 0.08), whole command:")
        head = ["backends", "runs", "min s", "median s", "min / flowSim", "median / flowSim"]
        print(format_table(head, rows))
    rows = in_process(
        args.scales,
        args.group,
        not args.no_ns3,
        args.collective,
        args.transports,
        args.wire,
        tuple(args.m4),
    )
    _, workload = COLLECTIVES[args.collective]
    print(
        f"\nPer scenario in one process ({args.group} grid points with N=8 R=4, {workload}, "
        f"collective={args.collective}, wire={args.wire}):"
    )
    head = [
        "scale",
        "backend",
        "ms / scenario",
        "vs ns-3 rdma",
        "vs ns-3 tcp",
        "N=8 R=4 iteration vs ns-3 rdma",
        "same answers",
    ]
    print(format_table(head, rows))


if __name__ == "__main__":
    main()
