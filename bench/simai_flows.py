"""Flow for flow against SimAI: the shared SimAI run replayed with ``collective=simai`` on m4ray's
backends and compared with SimAI's own per-flow logs.

    .venv/bin/python bench/simai_flows.py ../shared/data                    # flowSim + ns-3
    .venv/bin/python bench/simai_flows.py ../shared/data --backends flowsim ns3 m4

Inputs (``<data>/simai/fct_example_commit_5206325/``): the run's topology ``topo_N0_M1.txt``, its
workload ``microAllReduce.txt`` (TP 16, all-reduces of 16 MiB and 256 MiB), SimAI's per-flow logs
``{ns3,flowsim,m4}_fct.txt.gz`` (``sip dip sport dport size start_ns fct_ns standalone_ns
flow_id``; IP ``0b00XX01`` = node XX; FCT to the sender's last ACK) and ``*_EndToEnd.csv``.
ns-3 runs with SimAI's ns-3 timing over the study preset
(``conf/backend/ns3_simai_timing.yaml``; ``--ns3-preset ns3_simai``: the gray-failure default)
and the DCTCP settings of the run's own ``SimAI.conf`` (K 80 KB at 400 Gbit/s, g = 1/256, ...;
``--study-conf``: the study's), on SimAI's 1,040 B packets; m4 is told that network.

For every backend it prints: the flow count and whether the multiset of (src, dst, size) equals
SimAI's; each flow's start minus its parent's end (SimAI: the flow its sender received last step
in that channel, decoded from its flow id; ours: the replay's ``parent_id``); and per-flow FCT
(start to last ACK) against SimAI's ns-3 and against SimAI's same backend, as |ratio - 1| median
and p90, per flow size. Flows are matched by (collective, src, dst, ring step), then by start
order within that key (the channels that share an edge). Totals are compared with SimAI's
``EndToEnd.csv``: rank 0's own finish, as rank 0 writes that file (SimAI's ns-3 log ends group 0
at its total, 11,684 µs, and group 1 at 12,252 µs: the groups are alike, their packets not).
"""

from __future__ import annotations

import argparse
import gzip
from collections import defaultdict
from pathlib import Path

import numpy as np

RUN = "simai/fct_example_commit_5206325"
CHANNELS, RANKS = 8, 16  # SimAI's flow ids: block * 3840 + channel * 480 + step * 16 + sender


def read_simai_flows(path: Path, endpoints: dict | None = None) -> dict[str, np.ndarray]:
    """SimAI's per-flow log as columns (seconds), with each flow's step, collective and parent.
    Its flowSim and m4 logs leave the IPs zero: ``endpoints`` (flow id -> (src, dst), from the
    ns-3 log of the same run) fills them in."""
    with gzip.open(path, "rt") as lines:
        rows = [line.split() for line in lines if line.strip()]
    ids = [int(r[8]) for r in rows]
    if endpoints is None:
        src = [(int(r[0], 16) >> 8) & 0xFFFF for r in rows]
        dst = [(int(r[1], 16) >> 8) & 0xFFFF for r in rows]
    else:
        src, dst = zip(*(endpoints[i] for i in ids), strict=True)
    cols = {
        "src": np.array(src),
        "dst": np.array(dst),
        "size": np.array([int(r[4]) for r in rows]),
        "start": np.array([int(r[5]) for r in rows]) * 1e-9,
        "fct": np.array([int(r[6]) for r in rows]) * 1e-9,
        "id": np.array(ids),
    }
    per_block = CHANNELS * RANKS * 2 * (RANKS - 1)
    block, rest = np.divmod(cols["id"], per_block)
    channel, rest = np.divmod(rest, RANKS * 2 * (RANKS - 1))
    cols["step"] = rest // RANKS
    # a block is one group's all-reduce; the first collective is the 16 MiB one
    cols["coll"] = (cols["size"] != cols["size"].min()).astype(int)
    received = {
        (b, c, s, d): i
        for i, (b, c, s, d) in enumerate(
            zip(block, channel, cols["step"], cols["dst"], strict=True)
        )
    }
    cols["parent"] = np.array(
        [
            received.get((b, c, s - 1, src), -1)
            for b, c, s, src in zip(block, channel, cols["step"], cols["src"], strict=True)
        ]
    )
    return cols


def ours(table) -> dict[str, np.ndarray]:
    """m4ray's per-flow table as the same columns (FCT to the last ACK, ``done_s``)."""
    flow_id = table.column("flow_id").to_numpy()
    row_of = {f: i for i, f in enumerate(flow_id.tolist())}
    parent = np.array([row_of.get(p, -1) for p in table.column("parent_id").to_pylist()])
    start = table.column("start_s").to_numpy()
    cols = {
        "src": table.column("src").to_numpy(),
        "dst": table.column("dst").to_numpy(),
        "size": table.column("size_bytes").to_numpy(),
        "start": start,
        "fct": table.column("done_s").to_numpy() - start,
        "parent": parent,
    }
    step = np.zeros(len(start), dtype=int)
    for i in np.argsort(start, kind="stable"):  # a parent starts before its child
        step[i] = step[parent[i]] + 1 if parent[i] >= 0 else 0
    cols["step"] = step
    cols["coll"] = (cols["size"] != cols["size"].min()).astype(int)
    return cols


def match(a: dict, b: dict) -> tuple[np.ndarray, np.ndarray]:
    """Row pairs of flows with the same (collective, src, dst, step), in start order."""

    def groups(cols):
        out = defaultdict(list)
        keys = zip(cols["coll"], cols["src"], cols["dst"], cols["step"], strict=True)
        for i, key in enumerate(keys):
            out[key].append(i)
        return {k: sorted(v, key=lambda i: cols["start"][i]) for k, v in out.items()}

    ga, gb = groups(a), groups(b)
    ia, ib = [], []
    for key, rows in ga.items():
        other = gb.get(key, [])
        ia += rows[: len(other)]
        ib += other[: len(rows)]
    return np.array(ia, dtype=int), np.array(ib, dtype=int)


def gaps(cols: dict) -> np.ndarray:
    """Start minus parent end (seconds) of every flow that has a parent."""
    has = cols["parent"] >= 0
    parent = cols["parent"][has]
    return cols["start"][has] - (cols["start"][parent] + cols["fct"][parent])


def ratio_stats(mine: dict, ref: dict) -> str:
    ia, ib = match(mine, ref)
    err = np.abs(mine["fct"][ia] / ref["fct"][ib] - 1)
    parts = [f"{np.median(err):.1%} / {np.quantile(err, 0.9):.1%} ({len(ia)})"]
    for size in np.unique(ref["size"][ib]):
        sel = ref["size"][ib] == size
        parts.append(f"{size // 1024} KiB {np.median(err[sel]):.1%}")
    return "; ".join(parts)


def end_to_end_us(path: Path) -> float:
    """The total of a SimAI ``EndToEnd.csv`` (µs)."""
    for line in path.read_text().splitlines():
        if line.startswith("total exposed comm"):
            return float(line.split(",")[-1])
    raise ValueError(f"{path}: no 'total time' line")


def study_ns3(conf: Path | None = None, preset: str = "ns3_simai"):
    """ns-3 as the gray-failure experiment composes it with ``backend@backend_options.ns3=
    <preset>`` (``ns3_simai``: its default; ``ns3_simai_timing``: SimAI's ns-3 timing); with
    ``conf`` (a SimAI.conf), its DCTCP settings in place of the study's
    (:func:`simai_conf_rdma`)."""
    import dataclasses

    from composed import resolved

    overrides = ["+experiment=gray_failure", f"backend@backend_options.ns3={preset}"]
    ns3 = resolved(*overrides).backend_options["ns3"]
    if conf is None:
        return ns3
    return dataclasses.replace(ns3, rdma=dataclasses.replace(ns3.rdma, **simai_conf_rdma(conf)))


def simai_conf_rdma(path: Path) -> dict:
    """The DCTCP settings of a SimAI.conf (CC_MODE 8) as ``ns3.rdma`` fields: its marking per
    port rate (KMIN_MAP, KMAX_MAP in KB, PMAX_MAP: the step at K where KMIN = KMAX everywhere,
    else RED), EWMA_GAIN, DCTCP_RATE_AI and MIN_RATE. Its BUFFER_SIZE is left alone: SimAI's
    PFC threshold underflows at small buffers, so no buffer binds."""
    values = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        parts = line.split()
        if len(parts) >= 2:
            values[parts[0]] = (n, parts[1:])

    def field(key: str) -> list[str]:
        if key not in values:
            raise ValueError(f"{path}: no {key} line")
        return values[key][1]

    def rate(text: str, key: str) -> float:
        units = {"Gb/s": 1e9, "Mb/s": 1e6, "Kb/s": 1e3, "b/s": 1.0}
        for unit, scale in units.items():
            if text.endswith(unit):
                return float(text[: -len(unit)]) * scale
        raise ValueError(f"{path}, line {values[key][0]}: {key} {text!r} has no rate unit")

    if field("CC_MODE")[0] != "8":
        raise ValueError(f"{path}, line {values['CC_MODE'][0]}: CC_MODE is not 8 (DCTCP)")

    def points(key: str, scale: float) -> list[list[float]]:
        row = field(key)
        return [[float(row[1 + 2 * i]), float(row[2 + 2 * i]) * scale] for i in range(int(row[0]))]

    kmin, kmax, pmax = points("KMIN_MAP", 1000), points("KMAX_MAP", 1000), points("PMAX_MAP", 1)
    step = sorted(kmin) == sorted(kmax)  # PMAX then never matters
    if not step and len({p for _, p in pmax}) != 1:
        raise ValueError(f"{path}, line {values['PMAX_MAP'][0]}: RED's PMAX differs by rate")
    return {
        "ecn_k_bytes": kmax if step else kmin,
        "ecn_k_max_bytes": None if step else kmax,
        "ecn_p_max": 1.0 if step else pmax[0][1],
        "dctcp_gain": float(field("EWMA_GAIN")[0]),
        "rate_ai_bps": rate(field("DCTCP_RATE_AI")[0], "DCTCP_RATE_AI"),
        "min_rate_bps": rate(field("MIN_RATE")[0], "MIN_RATE"),
    }


def backend_configs(
    names: list[str], checkpoint: str | None, conf: Path | None = None, preset: str = "ns3_simai"
):
    """The named backends on the study's ns-3 network (m4: ``checkpoint``, or the backend's
    default)."""
    from m4ray.sim.flowsim import FlowSimConfig
    from m4ray.sim.fluidcc import FluidDctcpConfig
    from m4ray.sim.m4.backend import M4Config

    ns3 = study_ns3(conf, preset)
    checkpoint = checkpoint or M4Config().checkpoint
    every = {
        "flowsim": ("flowsim", FlowSimConfig()),
        "flowsim_fifo": ("flowsim", FlowSimConfig(service="fifo", fifo_bytes="window")),
        "ns3": ("ns3", ns3),
        "m4": ("m4", M4Config(checkpoint=checkpoint, network=ns3)),
        "m4_fifo": ("m4", M4Config(checkpoint=checkpoint, network=ns3, anchor="fifo")),
        "fluid_dctcp": ("fluid_dctcp", FluidDctcpConfig(network=ns3)),
    }
    return {name: every[name] for name in names}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data", type=Path, help="the shared data folder (holding simai/)")
    parser.add_argument("--backends", nargs="+", default=["flowsim", "ns3"])
    parser.add_argument("--checkpoint", help="m4's checkpoint (default: the backend's)")
    parser.add_argument("--save", type=Path, help="write each backend's flows here (Parquet)")
    parser.add_argument(
        "--send-latency-us",
        type=float,
        default=3.0,
        help="each flow's wait after its parent (SimAI's AS_SEND_LAT; its logs show 3.01)",
    )
    parser.add_argument(
        "--ns3-preset",
        default="ns3_simai_timing",
        help="conf/backend preset for ns-3 (ns3_simai: the gray-failure default)",
    )
    parser.add_argument(
        "--study-conf",
        action="store_true",
        help="ns-3 with the study's DCTCP settings, not those of the run's own SimAI.conf",
    )
    args = parser.parse_args()

    from composed import wire as composed_wire

    from m4ray.sim.nccl import SimAISpec
    from m4ray.sim.scenario import Scenario, simulate
    from m4ray.sim.topologies import TopologyFileSpec
    from m4ray.sweeps.report import format_table
    from m4ray.workload.simai import SimAIWorkloadSpec

    run = args.data / RUN
    simai = {"ns3": read_simai_flows(run / "ns3_fct.txt.gz")}
    ref = simai["ns3"]
    ends = dict(zip(ref["id"].tolist(), zip(ref["src"], ref["dst"], strict=True), strict=True))
    for name in ("flowsim", "m4"):
        simai[name] = read_simai_flows(run / f"{name}_fct.txt.gz", ends)
    totals = {name: end_to_end_us(run / f"{name}_EndToEnd.csv") for name in simai}
    key = sorted(zip(simai["ns3"]["src"], simai["ns3"]["dst"], simai["ns3"]["size"], strict=True))
    g = gaps(simai["ns3"]) * 1e6
    rows = [
        [
            "SimAI ns-3 (reference)",
            f"{len(key):,}",
            "—",
            f"{np.median(g):.2f} / {np.quantile(g, 0.99):.2f}",
            f"{totals['ns3']:,.1f}",
            "—",
            "—",
            "—",
        ]
    ]
    conf = None if args.study_conf else run / "SimAI.conf"
    wire = composed_wire("simai")  # SimAI's packets
    for name, (backend, config) in backend_configs(
        args.backends, args.checkpoint, conf, args.ns3_preset
    ).items():
        scenario = Scenario(
            wire=wire,
            topology=TopologyFileSpec(path=str(run / "topo_N0_M1.txt")),
            workload=SimAIWorkloadSpec(path=str(run / "microAllReduce.txt")),
            collective=SimAISpec(),
            backend=backend,
            backend_config=config,
            send_latency_s=args.send_latency_us * 1e-6,
        )
        row, table = simulate(scenario)
        wall = row["wall_s"]
        if row["status"] != "ok":
            rows.append([name, "failed", row["error"].strip().splitlines()[-1][:80]] + [""] * 5)
            continue
        if args.save:
            import pyarrow.parquet as pq

            args.save.mkdir(parents=True, exist_ok=True)
            pq.write_table(table, args.save / f"{name}.parquet")
        mine = ours(table)
        same = sorted(zip(mine["src"], mine["dst"], mine["size"], strict=True)) == key
        g = gaps(mine) * 1e6
        us = row["rank0_time_s"] * 1e6
        # SimAI's backend of the same kind (flowsim_fifo: flowsim; the fluid DCTCP: flowsim)
        kind = "flowsim" if name == "fluid_dctcp" else name.split("_")[0]
        rows.append(
            [
                name,
                f"{len(mine['src']):,}",
                "yes" if same else "NO",
                f"{np.median(g):.2f} / {np.quantile(g, 0.99):.2f}",
                f"{us:,.1f} ({us / totals['ns3'] - 1:+.1%}; SimAI's {kind} "
                f"{us / totals[kind] - 1:+.1%})",
                ratio_stats(mine, simai["ns3"]),
                ratio_stats(mine, simai[kind]),
                f"{wall:.1f}",
            ]
        )
        print(f"  {name}: {us:,.1f} us in {wall:.1f} s", flush=True)
    for name in ("flowsim", "m4"):  # SimAI's own fluid and learned backends, for scale
        err = ratio_stats(simai[name], simai["ns3"])
        rows.append([f"SimAI {name}", "", "", "", f"{totals[name]:,.1f}", err, "—", ""])
    print()
    print(
        format_table(
            [
                "backend",
                "flows",
                "(src,dst,size) = SimAI",
                "start − parent end µs (median / p99)",
                "total µs (vs SimAI ns-3)",
                "FCT |ratio−1| vs SimAI ns-3: median / p90 (n); per size",
                "… vs SimAI's same backend",
                "wall s",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
