"""Our ns-3 RDMA transport under each congestion control against the reference simulator (HPCC's
ns-3), flow by flow, on the shared per-flow results (``ns3_cc/``; its README says what each is).

    .venv/bin/python bench/ns3_cc.py ../shared/data/ns3_cc                  # both sets
    .venv/bin/python bench/ns3_cc.py ../shared/data/ns3_cc --only m3         # m3's 2-hop shards
    .venv/bin/python bench/ns3_cc.py ../shared/data/ns3_cc --fat-flows 3000  # a longer prefix

* ``m3_pl3/``: eight 300-flow scenarios on one 2-hop path (two per CC: DCQCN, HPCC, TIMELY, DCTCP),
  each with its own sampled CC parameters, buffer, window and PFC setting, mapped onto ours
  (:func:`m3_network`). Their FCT ends when the receiver has every byte (one way, as ours) and is
  clipped below at their ideal; ours is clipped the same way. Each is also run with DCTCP in place
  of its own CC (K at its K_max, or 30 KB; DCTCP_RATE_AI), to show where the CC matters.
* ``hpcc_fat_websearch/``: HPCC and three TIMELY window modes on the HPCC paper's 320-host fat
  tree with WebSearch flows at 30 % load. A prefix of the 70,001 flows in start order
  (``--fat-flows``, default 2,000: ~2.8 ms of arrivals, what 2 cores replay in ~2 min a run),
  scored on the flows the reference finished before the prefix's last start: every flow that
  could share a link with them is in the prefix (the others meet flows it leaves out; their
  median ratio is printed apart). Their FCT ends at the sender's last ACK: ours (one way) gets
  the ACK's way back added (its path's propagation plus one ACK's serialisation per hop).

Prints, per scenario and CC, the median and p90 of |FCT ratio − 1| to the reference overall and
per size bucket (<10 KB, 10 KB–1 MB, ≥1 MB), flowSim's beside it (on m3's shards also flowSim
with each CC's standing queues, ``FlowSimConfig.queues``), and wall times. Paths are our own
ECMP (same lengths as the reference's, not the same hash). ACKs queue with the data at switches
where the reference's do (upstream always; the m3 fork with ACK_HIGH_PRIO 0). Differences we know
of and keep: NACKs are not throttled by time; PFC's threshold is static (a quarter of the buffer
for the m3 fork's runs, an eighth for upstream's). Theirs is that share of the free buffer less
reservations; ``--dynamic-pfc`` takes the share of the free buffer (``pfc_dynamic_shift``): no
change on the fat-tree prefixes (no pause there in either), worse on two m3 shards. The m3
fork's CC reference rates start at the NIC's rate even where MAX_RATE caps the sender (its
100 Tbit/s cross-traffic host): ``cc_nic_rate`` does the same for its shards.
"""

from __future__ import annotations

import argparse
import gzip
import time
from pathlib import Path

import numpy as np
from m4_example import print_table, rate, read_config  # bench/ beside us: the reference's format

BUCKETS = (("all", 0, None), ("<10KB", 0, 10_000), ("10KB-1MB", 10_000, 1_000_000))
BUCKETS += ((">=1MB", 1_000_000, None),)
M3_CC = {"dctcp": "dctcp", "dcqcn_paper_vwin": "dcqcn", "hp": "hpcc", "timely_vwin": "timely"}


def rate_map(cfg: dict[str, list[str]], key: str, scale: float = 1000.0) -> list[list[float]]:
    """``KMIN_MAP n rate1 v1 ...`` as ``[[rate, v·scale], ...]`` (KB → bytes by default)."""
    m = cfg[key]
    return [[float(m[1 + 2 * i]), float(m[2 + 2 * i]) * scale] for i in range(int(m[0]))]


def cc_settings(cfg: dict[str, list[str]], cc: str) -> dict:
    """Our ``rdma`` fields for the reference config's CC (``cc.py`` names the keys)."""
    from m4ray.sim.ns3.cc import interpolate

    if cc == "dctcp":
        return {
            "ecn_k_bytes": rate_map(cfg, "KMAX_MAP"),
            "dctcp_gain": float(cfg["EWMA_GAIN"][0]),
            "rate_ai_bps": rate(cfg["DCTCP_RATE_AI"][0]),
        }
    params: dict = {}
    if cc == "dcqcn":
        pmax = rate_map(cfg, "PMAX_MAP", 1.0)
        params = {
            "k_min_bytes": rate_map(cfg, "KMIN_MAP"),
            "k_max_bytes": rate_map(cfg, "KMAX_MAP"),
            "p_max": interpolate(pmax, pmax[0][0]),
            "gain": float(cfg["EWMA_GAIN"][0]),
            "alpha_interval_s": float(cfg["ALPHA_RESUME_INTERVAL"][0]) * 1e-6,
            "decrease_interval_s": float(cfg["RATE_DECREASE_INTERVAL"][0]) * 1e-6,
            "increase_interval_s": float(cfg["RP_TIMER"][0]) * 1e-6,
            "fast_recovery_steps": int(cfg["FAST_RECOVERY_TIMES"][0]),
            "rate_ai_bps": rate(cfg["RATE_AI"][0]),
            "rate_hai_bps": rate(cfg["RATE_HAI"][0]),
            "clamp_target_rate": cfg["CLAMP_TARGET_RATE"][0] == "1",
        }
    elif cc == "hpcc":
        params = {
            "target_utilization": float(cfg["U_TARGET"][0]),
            "rate_ai_bps": rate(cfg["RATE_AI"][0]),
            "max_stage": int(cfg["MI_THRESH"][0]),
            "fast_react": cfg["FAST_REACT"][0] == "1",
        }
        if "BASE_RTT" in cfg:  # the m3 fork's T; upstream's is the largest base RTT
            params["base_rtt_s"] = float(cfg["BASE_RTT"][0]) * 1e-9
    elif cc == "timely":
        params = {"rate_ai_bps": rate(cfg["RATE_AI"][0]), "rate_hai_bps": rate(cfg["RATE_HAI"][0])}
        if "TIMELY_T_LOW" in cfg:  # the m3 fork's; upstream's are built in (our defaults)
            params["t_low_s"] = float(cfg["TIMELY_T_LOW"][0]) * 1e-9
            params["t_high_s"] = float(cfg["TIMELY_T_HIGH"][0]) * 1e-9
            params["beta"] = float(cfg["TIMELY_BETA"][0])
    return {"cc": cc, "cc_params": params}


def network(
    cfg: dict[str, list[str]],
    cc: str,
    *,
    buffer_bytes: int,
    window: int | None,
    fork: bool,
    dynamic_pfc: bool = False,
):
    """Our ns-3 settings for a reference config; ``fork``: the m3 fork's (its ACK priority and
    PFC threshold rules), else upstream's (ACKs always queue with the data at switches)."""
    from m4ray.sim.ns3.backend import Ns3Config
    from m4ray.sim.ns3.transports import RdmaConfig

    settings = cc_settings(cfg, cc)
    if cc != "dctcp":  # DCTCP's K must sit below the buffer even when another CC runs
        settings["ecn_k_bytes"] = [[10e9, min(30_000.0, buffer_bytes / 4)]]
    return Ns3Config(
        rdma=RdmaConfig(
            window_bytes=window if cfg["HAS_WIN"][0] == "1" else 0,
            var_window=cfg["VAR_WIN"][0] == "1",
            min_rate_bps=rate(cfg["MIN_RATE"][0]),
            max_rate_bps=rate(cfg["MAX_RATE"][0]) if "MAX_RATE" in cfg else None,
            buffer_bytes=buffer_bytes,
            pfc=cfg.get("ENABLE_PFC", ["1"])[0] == "1",
            pfc_threshold_bytes=buffer_bytes // (4 if fork else 8),
            pfc_dynamic_shift=(2 if fork else 3) if dynamic_pfc else 0,  # (bench: --dynamic-pfc)
            ack_high_priority=fork and cfg["ACK_HIGH_PRIO"][0] == "1",
            cc_nic_rate=fork,
            **settings,
        )
    )


def errors(ratio: np.ndarray, size: np.ndarray) -> list[str]:
    cells = []
    for _, lo, hi in BUCKETS:
        sel = (size >= lo) & (size < hi if hi else True)
        err = np.abs(ratio[sel] - 1)
        cells.append(f"{np.median(err):6.1%} / {np.quantile(err, 0.9):6.1%}" if sel.any() else "-")
    return cells


def run(topo, flows, backend_cfg, routing) -> tuple[dict[int, float], float]:
    from m4ray.sim.trace import run_trace

    t0 = time.perf_counter()
    table = run_trace(topo, flows, backend_cfg, routing)
    ids, fcts = table.column("flow_id").to_pylist(), table.column("fct_s").to_pylist()
    return dict(zip(ids, fcts, strict=True)), time.perf_counter() - t0


def m3_shard(shard: Path):
    """One of m3's shards: its config, its param line's fields, our name of its CC, its flows
    (times from the first start), the reference's FCT and ideal FCT (s, by flow id), its buffer
    (KB in the m3 fork) and window (bytes) and its wire."""
    from m4ray.sim.flows import Flow
    from m4ray.sim.routing import WireFormat

    cfg = read_config(next(shard.glob("config_*.txt")))
    param = (next(shard.glob("param_*.txt")).read_text().splitlines()[1]).split()
    cc = next(ours for prefix, ours in M3_CC.items() if param[4].startswith(prefix))
    size = np.load(shard / "fsize.npy")
    start = np.load(shard / "fat.npy") * 1e-9
    pairs = np.load(shard / "fsd.npy")
    flows = [
        Flow(i, int(pairs[i, 0]), int(pairs[i, 1]), int(size[i]), float(start[i] - start[0]))
        for i in range(len(size))
    ]
    fid = np.load(next(shard.glob("fid_*.npy")))
    theirs = np.empty(len(size))
    theirs[fid] = np.load(next(shard.glob("fct_topo*.npy"))) * 1e-9
    their_ideal = np.empty(len(size))
    their_ideal[fid] = np.load(next(shard.glob("fct_i_*.npy"))) * 1e-9
    buffer = int(cfg["BUFFER_SIZE"][0]) * 1024  # KB in the m3 fork
    window = int(cfg["FIXED_WIN"][0])
    wire = WireFormat(mtu_bytes=int(cfg["PACKET_PAYLOAD_SIZE"][0]), header_bytes=48)
    return cfg, param, cc, flows, theirs, their_ideal, buffer, window, wire


def m3_shards(folder: Path, rows: list, notes: list, dynamic_pfc: bool = False) -> None:
    from m4ray.sim.flowsim import FlowSimConfig, StandingQueues
    from m4ray.sim.fluidcc import FluidDctcpConfig
    from m4ray.sim.routing import Routing
    from m4ray.sim.topology import read_topology

    base = folder / "m3_pl3"
    topo = read_topology(base / "topo-pl-3.txt")
    for shard in sorted(p for p in base.iterdir() if p.is_dir()):
        cfg, param, cc, flows, theirs, their_ideal, buffer, window, wire = m3_shard(shard)
        size = np.array([f.size_bytes for f in flows])
        routing = Routing(topo, wire=wire)
        name = shard.name.split("_")[0]
        backends = {
            cc: network(
                cfg, cc, buffer_bytes=buffer, window=window, fork=True, dynamic_pfc=dynamic_pfc
            ),
            "flowSim": FlowSimConfig(),
        }
        queues = StandingQueues.of(backends[cc], routing)  # its CC's level (standing_levels)
        backends["flowSim+queues"] = FlowSimConfig(queues=queues)
        backends[f"fluid {cc.upper()}"] = FluidDctcpConfig(network=backends[cc])  # same network
        if cc != "dctcp":
            dctcp = dict(cfg)
            dctcp["EWMA_GAIN"] = ["0.0625"]
            backends["dctcp instead"] = network(
                dctcp,
                "dctcp",
                buffer_bytes=buffer,
                window=window,
                fork=True,
                dynamic_pfc=dynamic_pfc,
            )
        for who, backend in backends.items():
            fct, wall = run(topo, flows, backend, routing)
            ours = np.maximum(np.array([fct[i] for i in range(len(size))]), their_ideal)
            rows.append([f"m3 {name} ({param[4]})", who, *errors(ours / theirs, size)])
            notes.append(f"m3 {name} {who}: wall {wall:.1f} s, {len(size)} flows")


def fat_flows(base: Path, n_flows: int):
    """The first ``n_flows`` flows in start order (times from the first) and the reference's
    key of each, (src, dst, sport) -> flow index: the k-th flow of a pair has sport 10000 + k."""
    from m4ray.sim.flows import Flow

    with gzip.open(base / "tmp_traffic.txt.gz", "rt") as fh:
        lines = fh.read().splitlines()[1:]
    records, seen = [], {}
    for line in lines:
        f = line.split()
        if len(f) < 6:
            continue
        src, dst = int(f[0]), int(f[1])
        k = seen.get((src, dst), 0)
        seen[(src, dst)] = k + 1
        records.append((src, dst, 10000 + k, int(f[4]), float(f[5])))
    records.sort(key=lambda r: r[4])
    records = records[:n_flows]
    t0 = records[0][4]
    flows = [Flow(i, r[0], r[1], r[3], r[4] - t0) for i, r in enumerate(records)]
    key = {(r[0], r[1], r[2]): i for i, r in enumerate(records)}
    return flows, key


FAT_RUNS = {  # label: (config, per-flow result) in hpcc_fat_websearch/
    "hpcc": ("config_topology_flow_hp95ai50.txt", "fct_topology_flow_hp95ai50.txt.gz"),
    "timely": ("config_fat_flow_timely.txt", "fct_fat_flow_timely.txt.gz"),
    "timely fixwin": ("config_fat_flow_timely_fixwin.txt", "fct_fat_flow_timely_fixwin.txt.gz"),
    "timely nowin": ("config_fat_flow_timely_nowin.txt", "fct_fat_flow_timely_nowin.txt.gz"),
}


def fat_results(path: Path, key: dict, n_flows: int) -> tuple[np.ndarray, np.ndarray]:
    """The reference's FCT and standalone FCT (s) of each flow of :func:`fat_flows`' key (NaN
    where it has none: outside the prefix, or unfinished)."""
    fct, ideal = np.full(n_flows, np.nan), np.full(n_flows, np.nan)
    with gzip.open(path, "rt") as fh:
        for line in fh:
            f = line.split()
            sip, dip = (int(f[0], 16) >> 8) & 0xFFFF, (int(f[1], 16) >> 8) & 0xFFFF
            i = key.get((sip, dip, int(f[2])))
            if i is not None:
                fct[i], ideal[i] = int(f[6]) * 1e-9, int(f[7]) * 1e-9
    return fct, ideal


def fat_tree(
    folder: Path, n_flows: int, rows: list, notes: list, *, only=None, dynamic_pfc: bool = False
) -> None:
    from m4ray.sim.flowsim import FlowSimConfig
    from m4ray.sim.fluidcc import FluidDctcpConfig
    from m4ray.sim.routing import Routing, WireFormat
    from m4ray.sim.topology import read_topology

    base = folder / "hpcc_fat_websearch"
    topo = read_topology(base / "fat.txt")
    flows, key = fat_flows(base, n_flows)
    size = np.array([f.size_bytes for f in flows])
    wire = WireFormat(mtu_bytes=1000, header_bytes=48)
    routing = Routing(topo, wire=wire)
    flowsim_fct = None
    for label, (config, result) in FAT_RUNS.items():
        if only and label not in only:
            continue
        cfg = read_config(base / config)
        theirs, _ = fat_results(base / result, key, len(flows))
        cc = label.split()[0]
        buffer = int(cfg["BUFFER_SIZE"][0]) * 1024 * 1024  # MB upstream
        backend = network(
            cfg, cc, buffer_bytes=buffer, window=None, fork=False, dynamic_pfc=dynamic_pfc
        )
        fct, wall = run(topo, flows, backend, routing)
        back = np.array([ack_way_back(routing, f, backend.rdma.ack_bytes) for f in flows])
        ours = np.array([fct[f.id] for f in flows]) + back
        # scored: the flows the reference finished before the prefix's last start, whose every
        # competitor is in the prefix (a longer flow meets later flows the prefix leaves out)
        start = np.array([f.start_s for f in flows])
        inside = start + theirs <= start.max()
        where = f"fat-tree {len(flows)} flows ({inside.sum()} scored)"
        rows.append([where, label, *errors(ours[inside] / theirs[inside], size[inside])])
        later = ours[~inside] / theirs[~inside]
        notes.append(
            f"fat-tree {label}: wall {wall:.1f} s; the {len(later)} flows the reference ended "
            f"after the prefix's last start: median FCT ratio {np.median(later):.3f}"
        )
        fluid, wall = run(topo, flows, FluidDctcpConfig(network=backend), routing)  # the same
        notes.append(f"fat-tree fluid {label}: wall {wall:.1f} s")
        fl = np.array([fluid[f.id] for f in flows]) + back
        rows.append(
            [where, f"fluid vs {label}", *errors(fl[inside] / theirs[inside], size[inside])]
        )
        if flowsim_fct is None:
            flowsim_fct, wall = run(topo, flows, FlowSimConfig(), routing)
            notes.append(f"fat-tree flowSim: wall {wall:.1f} s")
        fs = np.array([flowsim_fct[f.id] for f in flows]) + back
        rows.append(
            [where, f"flowSim vs {label}", *errors(fs[inside] / theirs[inside], size[inside])]
        )


def ack_way_back(routing, flow, ack_bytes: int) -> float:
    """An ACK's way from the receiver to the sender: propagation plus one serialisation a hop."""
    path = routing.path(flow.dst, flow.src, flow.id)
    topo = routing.topo
    return float(
        sum(topo.latency_s[link] + ack_bytes * 8 / topo.bandwidth_bps[link] for link in path.links)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="the ns3_cc folder (shared/data)")
    parser.add_argument("--only", choices=["m3", "fat"], help="run one set only")
    parser.add_argument("--fat-flows", type=int, default=2000, help="fat-tree prefix (flows)")
    parser.add_argument("--dynamic-pfc", action="store_true", help="PFC on free buffer")
    parser.add_argument(
        "--fat-runs", nargs="+", metavar="RUN", help="fat-tree runs: hpcc, timely, 'timely nowin' …"
    )
    args = parser.parse_args()
    rows: list[list[str]] = []
    notes: list[str] = []
    if args.only in (None, "m3"):
        m3_shards(args.folder, rows, notes, args.dynamic_pfc)
    if args.only in (None, "fat"):
        fat_tree(
            args.folder,
            args.fat_flows,
            rows,
            notes,
            only=args.fat_runs,
            dynamic_pfc=args.dynamic_pfc,
        )
    head = ["scenario", "ours", *(f"{b[0]} p50 / p90" for b in BUCKETS)]
    print("\n|FCT ratio - 1| to the reference ns-3 (median / p90), by flow size:\n")
    print_table(head, rows)
    print()
    print("\n".join(notes))


if __name__ == "__main__":
    main()
