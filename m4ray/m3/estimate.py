"""``python -m m4ray.sweeps +experiment=m3``: network-wide FCT-slowdown estimates by m3.

A topology (the sweep's ``topology`` group: fat-tree builder, SimAI / ns-3 text file) and a
workload (open-loop traffic drawn like the datagen families, or an m4 ``flows.txt``) are routed;
``n_paths`` paths are sampled ∝ foreground flows; the sampled paths' parking lots run through path
flowSim into feature tokens in Ray tasks; the checkpoint corrects every path's foreground
percentiles in one batch; the mixture gives overall and per-size-bucket p50/p90/p99
(``reference/flowsim_m3.md`` B.2-B.8). ``compare=[ns3, flowsim]`` runs the same flows through
network-wide ns-3 and flowSim for reference (``flowsim_queues``: flowSim with the network's
standing queues, :class:`~m4ray.sim.flowsim.StandingQueues`; ``flowsim_bursts``: with first windows
over the level too; ``flowsim_rates``: that with DCQCN's rates,
:class:`~m4ray.sim.flowsim.DcqcnRates`, DCQCN networks only), each cached by content under
``<run_dir>/cache``, so a re-run does not redo them. Writes ``estimate.parquet``,
``plots/slowdown_cdf.png`` and ``manifest.json``, and prints the table.

Units: bytes, bits/s, seconds.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from m4ray.datagen.traffic import OpenLoopTraffic, SizeDistribution
from m4ray.errors import InputError, choice_error
from m4ray.fingerprint import added_field, fingerprint
from m4ray.m3.aggregate import BUCKET_NAMES, Estimate, aggregate, bootstrap, bucket_counts
from m4ray.m3.lot import PATH_MODES, LotNetwork, PathQueues, fg_bdp_bytes, flowsim_fct
from m4ray.m3.paths import PathScenario, RoutedFlows
from m4ray.models.m3_features import HOPS, NetConfig, targets, tokens
from m4ray.sim.flows import Flow, read_flows
from m4ray.sim.routing import Routing, WireFormat

COMPARE = ("ns3", "flowsim", "flowsim_queues", "flowsim_bursts", "flowsim_rates", "fluid_dctcp")
QUANTILES = (0.5, 0.9, 0.99)


@dataclass(kw_only=True, slots=True)
class M3Workload:
    """Open-loop traffic (as the datagen families) or, when ``flows_file`` is set, its flows."""

    flows_file: str | None = None
    n_flows: int = 20_000
    size: dict[str, Any] = field(default_factory=lambda: {"kind": "exponential"})
    size_mean_bytes: float = 20_000.0
    min_size_bytes: int = 50
    arrival_sigma: float = 1.5
    max_load: float = 0.5

    def flows(self, routing: Routing, seed: int) -> list[Flow]:
        if self.flows_file:
            return read_flows(self.flows_file)  # unknown hosts are caught by RoutedFlows
        size = SizeDistribution(**self.size)
        traffic = OpenLoopTraffic(
            n_flows=self.n_flows,
            size_name=size.kind,
            size=size,
            size_mean_bytes=self.size_mean_bytes,
            min_size_bytes=self.min_size_bytes,
            sigma=self.arrival_sigma,
            max_load=self.max_load,
        )
        return traffic.flows(routing, seed)


@dataclass(kw_only=True, slots=True)
class M3Network:
    """The network's CC settings (bytes): what ns-3 runs and what the model is told. ``cc``
    any of ns-3's (``m4ray.sim.ns3.cc``) with its ``cc_params`` (None: its defaults, and for
    DCQCN RED from K_min = ``ecn_k_bytes`` to K_max = 4 K_min, both scaled with link rate);
    of the shipped m3 models, m3-v10, m3-v5, m3-v4 and m3-v3 know all four, m3-v2 and m3-small
    DCTCP only."""

    buffer_bytes: int = 400_000
    window_bytes: int = 18_000
    ecn_k_bytes: int = 12_000  # at the host link rate; scaled with link rate
    pfc: bool = True
    cc: str = "dctcp"
    cc_params: dict[str, Any] | None = added_field(None, "ns-3 under every CC (issue 32)")  # noqa: RUF009

    def net_config(self) -> NetConfig:
        return NetConfig(
            buffer_bytes=self.buffer_bytes,
            window_bytes=self.window_bytes,
            ecn_k_bytes=self.ecn_k_bytes,
            pfc=self.pfc,
            cc=self.cc,
        )

    def ns3(self, edge_bps: float, core_bps: float):
        from m4ray.sim.ns3.backend import Ns3Config
        from m4ray.sim.ns3.transports import RdmaConfig

        k = float(self.ecn_k_bytes)
        points = [[edge_bps, k]] + (
            [[core_bps, k * core_bps / edge_bps]] if core_bps > edge_bps else []
        )
        params = dict(self.cc_params or {})
        if self.cc == "dcqcn":
            params.setdefault("k_min_bytes", points)
            params.setdefault("k_max_bytes", [[rate, 4 * v] for rate, v in points])
        return Ns3Config(
            rdma=RdmaConfig(
                buffer_bytes=self.buffer_bytes,
                pfc=self.pfc,
                pfc_threshold_bytes=self.buffer_bytes // 4,
                ecn_k_bytes=points,
                window_bytes=self.window_bytes,
                cc=self.cc,
                cc_params=params or None,
            )
        )


@dataclass(kw_only=True, slots=True)
class M3Config:
    """The m3 experiment's ``m3`` section."""

    workload: M3Workload = field(default_factory=M3Workload)
    network: M3Network = field(default_factory=M3Network)
    n_paths: int = 500
    checkpoint: str = "checkpoints/m3-v2"
    compare: list[str] = field(default_factory=list)
    tasks: int = 8  # Ray tasks the sampled paths are spread over
    ns3_wall_limit_s: float = 3600.0
    # path flowSim under DCQCN's rates (PathQueues.rates): None as the checkpoint was trained;
    # true/false override it (the model then reads inputs it was not trained on: its column says
    # what the correction does to them, the path_flowsim column what path flowSim alone gives)
    path_rates: bool | None = None

    def __post_init__(self) -> None:
        if isinstance(self.workload, dict):
            self.workload = M3Workload(**self.workload)
        if isinstance(self.network, dict):
            self.network = M3Network(**self.network)
        for name in self.compare:
            if name not in COMPARE:
                raise choice_error("comparison backend", name, COMPARE)
        if self.n_paths < 1:
            raise InputError(f"must be >= 1, got {self.n_paths}", field="m3.n_paths")
        self.network.net_config()  # an unknown CC fails here
        if self.path_rates and self.network.cc != "dcqcn":
            raise InputError(
                f"path flowSim's rates are DCQCN's; this network runs {self.network.cc}",
                field="m3.path_rates",
            )


def load_model(directory: str, cc: str):
    """The m3 checkpoint, refusing a CC it was not trained on."""
    from m4ray.models import checkpoint
    from m4ray.models.checkpoint import M3

    model, info = checkpoint.load(directory, kind=M3)
    supported = info.get("supported_cc", [])
    if cc not in supported:
        others = [str(d) for d in m3_checkpoints_knowing(cc, Path(directory).parent)]
        hint = f"; m3.checkpoint={others[0]} knows it" if others else ""
        raise InputError(
            f"the checkpoint {directory} was trained on {supported}, not {cc!r}{hint}",
            field="m3.network.cc",
        )
    return model, info


def m3_checkpoints_knowing(cc: str, folder: Path) -> list[Path]:
    """The m3 checkpoints beside each other in ``folder`` (``checkpoints/``) trained on
    ``cc``, the latest name first, numbers by value (m3-v10 after m3-v9: a hint for a refused
    CC)."""
    import json
    import re

    def version(meta: Path) -> list:
        return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", meta.parent.name)]

    found = []
    for meta in sorted(folder.glob("*/model.json"), key=version, reverse=True):
        try:
            info = json.loads(meta.read_text())
        except (OSError, ValueError):
            continue
        if str(info.get("format", "")).startswith("m4ray-m3") and cc in info.get(
            "supported_cc", []
        ):
            found.append(meta.parent)
    return found


@dataclass(frozen=True, slots=True)
class PathSample:
    """What the estimate computes for one sampled path: its lot, path flowSim's slowdown of
    every lot flow, the model's tokens and empty flags, path flowSim's foreground percentiles
    (the baseline m3 corrects) and the foreground flows per output bucket."""

    scenario: PathScenario
    slowdown: np.ndarray
    tokens: np.ndarray
    empty: np.ndarray
    baseline: np.ndarray
    counts: np.ndarray


def path_sample(  # noqa: PLR0917 (the path and what it is simulated with)
    routed: RoutedFlows,
    path,
    draws: int,
    wire: WireFormat,
    network: NetConfig,
    queues: PathQueues | None = None,
) -> PathSample:
    """One sampled path as the estimate sees it (``queues``: path flowSim with standing queues,
    as the checkpoint was trained: :func:`checkpoint_queues`); training samples from whole
    networks are made by this too (:mod:`m4ray.m3.netpaths`)."""
    scn = routed.scenario(path, draws)
    if scn.n_links not in HOPS:
        raise InputError(
            f"a path of {scn.n_links} links (links {list(path)}); m3 knows {HOPS}",
            field="topology",
        )
    lot = LotNetwork.of(scn)
    if queues is None:
        _, slowdown = flowsim_fct(scn, wire, lot)
    else:
        q = queues.of(lot, wire, scn)
        _, slowdown = flowsim_fct(scn, wire, lot, q, rates=queues.rate_control())
    bdp = fg_bdp_bytes(lot, wire, 64)
    config = network.vector(scn.n_links, scn.capacity_bps, bdp)
    fg = scn.foreground
    tok, empty = tokens(slowdown, scn.size_bytes, scn.a, scn.b, fg, config)
    pct, _ = targets(slowdown[fg], scn.size_bytes[fg])
    counts = bucket_counts(scn.size_bytes[fg])
    return PathSample(
        scenario=scn, slowdown=slowdown, tokens=tok, empty=empty, baseline=pct, counts=counts
    )


def path_features(
    routed: RoutedFlows, sampled, wire: WireFormat, network: NetConfig, queues=None
) -> list:
    """Per sampled path (:func:`path_sample`): tokens, empty flags, foreground counts per output
    bucket, path flowSim's foreground percentiles, and the draw count (a Ray task runs one
    chunk)."""
    out = []
    for path, draws in sampled:
        s = path_sample(routed, path, draws, wire, network, queues)
        out.append((s.tokens, s.empty, s.counts, s.baseline, draws))
    return out


def warm_up(ray, tasks: int) -> None:
    """Start the Ray workers the estimate's tasks run on (as many as the cluster has CPUs, at
    most ``tasks``) and load path flowSim in each, so that the estimate's clock times the
    estimate, as the references' clocks time their simulation (:func:`_reference_task`), not
    process start-up."""
    n = max(1, min(tasks, int(ray.cluster_resources().get("CPU", 1))))
    task = ray.remote(num_cpus=1)(_warm)
    ray.get([task.remote() for _ in range(n)])  # each holds a CPU a moment: one per worker


def _warm() -> None:
    """A worker's start-up (this module imported to run it) and path flowSim loaded."""
    from m4ray.m3.pathsim import native_library

    native_library()
    time.sleep(0.2)


def estimate(
    routed: RoutedFlows, cfg: M3Config, *, seed: int, ray, model, wire, queues=None
) -> dict[str, Estimate]:
    """m3's estimate and path flowSim's (the same sampled paths, uncorrected); ``queues``: path
    flowSim with the network's standing queues (:func:`checkpoint_queues`)."""
    import torch

    sampled = routed.sample(cfg.n_paths, seed)
    network = cfg.network.net_config()
    task = ray.remote(path_features)
    ref = ray.put(routed)
    chunks = [sampled[k :: cfg.tasks] for k in range(min(cfg.tasks, len(sampled)))]
    rows = [
        r
        for part in ray.get([task.remote(ref, c, wire, network, queues) for c in chunks])
        for r in part
    ]
    lmax = max(len(r[0]) for r in rows)
    tok = np.zeros((len(rows), lmax, rows[0][0].shape[1]), dtype=np.float32)
    empty = np.ones((len(rows), lmax, rows[0][1].shape[1]), dtype=bool)
    for i, r in enumerate(rows):
        tok[i, : len(r[0])], empty[i, : len(r[1])] = r[0], r[1]
    lengths = torch.tensor([len(r[0]) - 1 for r in rows])
    t, e = torch.from_numpy(tok), torch.from_numpy(empty)
    baseline = np.stack([r[3] for r in rows])
    with torch.no_grad():
        pred = model(t[:, 0], e[:, 0], t[:, 1:], e[:, 1:], lengths, torch.from_numpy(baseline))
    counts = np.stack([r[2] for r in rows])
    draws = np.array([r[4] for r in rows])
    share = bucket_counts(routed.size_bytes)  # every flow is routed: the shares are known
    return {
        "m3": aggregate(pred.numpy(), counts, draws, share),
        "path_flowsim": aggregate(baseline, counts, draws, share),
    }


def network_ns3(cfg: M3Config, topo):
    """The network's ns-3 config (``M3Network.ns3``) at the topology's host and core rates."""
    host = topo.bandwidth_bps[np.isin(topo.link_src, topo.hosts)]
    return cfg.network.ns3(float(host.min()), float(topo.bandwidth_bps.max()))


def checkpoint_queues(cfg: M3Config, topo, info: dict) -> PathQueues | None:
    """Path flowSim's standing queues on the network as the checkpoint was trained with them
    (``model.json`` ``path_flowsim_queues``, and ``path_flowsim_first_windows``: HPCC's first
    windows queue; ``path_flowsim_bursts``: first windows over the level;
    ``path_flowsim_route_rtt``: at each flow's route round trip; :func:`path_sample`
    then runs it so), else None."""
    if not info.get("path_flowsim_queues"):
        if cfg.path_rates:
            raise InputError(
                "path flowSim's rates run with its standing queues, and this checkpoint was "
                "trained without them",
                field="m3.path_rates",
            )
        return None
    queues = trained_queues(network_ns3(cfg, topo).rdma, info)
    if cfg.path_rates is not None:
        queues = dataclasses.replace(queues, rates=cfg.path_rates)
    return queues


def trained_queues(rdma, info: dict) -> PathQueues | None:
    """Path flowSim's queues on a network (``RdmaConfig``) as a checkpoint (``model.json``:
    ``info``) was trained with them, else None."""
    if not info.get("path_flowsim_queues"):
        return None
    return PathQueues(rdma, **{mode: bool(info.get(key)) for mode, key in PATH_MODES.items()})


def reference_run(name: str, topo, flows, routing, *, cfg: M3Config, cache: Path, ray) -> tuple:
    """Network-wide ``ns3``, ``flowsim``, ``flowsim_queues``, ``flowsim_bursts`` (standing
    queues with first windows over the level), ``flowsim_rates`` (those with DCQCN's rates) or
    ``fluid_dctcp`` (the fluid of the same network and its CC) slowdowns and wall time,
    cached by content."""
    from m4ray.sim.flowsim import DcqcnRates, FlowSimConfig, StandingQueues
    from m4ray.sim.fluidcc import FluidDctcpConfig

    network = network_ns3(cfg, topo)
    if name == "ns3":
        backend = dataclasses.replace(network, wall_limit_s=cfg.ns3_wall_limit_s)
    elif name == "flowsim":
        backend = FlowSimConfig()
    elif name == "fluid_dctcp":
        backend = FluidDctcpConfig(network=network)
    else:
        bursts = name != "flowsim_queues"
        queues = StandingQueues.of(network, routing, bursts=bursts)
        rates = DcqcnRates.of(network) if name == "flowsim_rates" else None
        backend = FlowSimConfig(queues=queues, rate_control=rates)
    key = fingerprint([name, topo, flows, routing.seed, routing.wire, backend], 16)
    path = cache / f"{name}-{key}.parquet"
    if path.exists():
        frame = pd.read_parquet(path)
        return frame.slowdown.to_numpy(), float(frame.attrs_wall_s.iloc[0])

    # the flows go by the object store (a closure over 200,000 of them is a 10 MiB function)
    task = ray.remote(max_calls=1)(_reference_task)
    slowdown, wall = ray.get(task.remote(name, topo, ray.put(flows), backend, routing))
    cache.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame({"slowdown": slowdown, "attrs_wall_s": wall})
    tmp = path.with_name(f".{path.name}.tmp")
    frame.to_parquet(tmp)
    tmp.replace(path)
    return slowdown, wall


def _reference_task(name: str, topo, flows, backend, routing) -> tuple[np.ndarray, float]:
    """:func:`reference_run`'s simulation (a Ray task): slowdowns and seconds simulating."""
    from m4ray.sim.trace import run_trace

    if name == "ns3":  # load ns-3 and compile its transport first: the clock times simulation
        from m4ray.sim.ns3 import rdma

        rdma.compiled()
    began = time.perf_counter()
    table = run_trace(topo, flows, backend, routing)
    return table.column("slowdown").to_numpy(), time.perf_counter() - began


def summary(
    estimates: dict[str, Estimate], walls: dict[str, float], *, replicates: int = 200, seed: int = 0
) -> pd.DataFrame:
    """One row per method and bucket: p50/p90/p99 and, for sampled estimates (m3, path
    flowSim), ``p99_lo``/``p99_hi``, the 5th and 95th percentiles of p99 over ``replicates``
    bootstrap replicates of the sampled paths (:func:`~m4ray.m3.aggregate.bootstrap`; 0: none):
    how far the answer would move with another draw of as many paths. With ns-3 among the
    estimates, every p99 (and that range) as an error against ns-3's."""
    rows = []
    for method, est in estimates.items():
        noise = None
        if est.sample is not None and replicates > 0:
            noise = bootstrap(*est.sample, levels=(0.99,), n=replicates, seed=seed)
        for bucket, mix in [("overall", est.overall), *est.buckets.items()]:
            row = {"method": method, "bucket": bucket, "wall_s": walls.get(method, np.nan)}
            for q in QUANTILES:
                row[f"p{round(q * 100)}"] = float(mix.quantile(q))
            if noise is not None:
                row["p99_lo"], row["p99_hi"] = np.nanquantile(noise[bucket][:, 0], [0.05, 0.95])
            rows.append(row)
    frame = pd.DataFrame(rows)
    if "ns3" in estimates:
        ref = frame.bucket.map(frame[frame.method == "ns3"].set_index("bucket").p99)
        frame["p99_err_vs_ns3"] = frame.p99 / ref - 1
        for end in ("lo", "hi"):
            if f"p99_{end}" in frame:
                frame[f"err_{end}"] = frame[f"p99_{end}"] / ref - 1
    return frame


__all__ = ["BUCKET_NAMES", "M3Config", "M3Network", "M3Workload", "estimate", "summary"]
