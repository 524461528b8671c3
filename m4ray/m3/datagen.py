"""m3 training data: parking-lot path scenarios run in ns-3 (``reference/flowsim_m3.md`` B.9).

:class:`LotFamily` (config group ``family``, ``conf/family/parking_lot.yaml``) samples one
:class:`LotScenario` per seed, every random choice made: the path length (2/4/6 links, m3's
3/5/7 hosts), capacities (edge rate at both ends, core rate between), the host pairs (foreground
``(0, L)`` always, ``ntc - 1`` background pairs, m3's pair weights), the flows (size distribution
and mean, log-normal arrivals at a target max link load) and the ns-3 RDMA settings (buffer,
window, PFC, DCTCP K scaled with link rate). :meth:`LotScenario.record` runs ns-3 on the lot
(senders paced at the edge rate), flowSim on the same flows, and returns the per-flow table and
one sample row: the feature tokens (flowSim) and the targets (ns-3) that m3 trains on.
The datagen job (:mod:`m4ray.datagen.job`) fans these out exactly as it does m4's scenarios.

Units: bytes, bits/s, seconds.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from m4ray.datagen.sampling import CcRanges, check_range, open_loop, size_distribution, uniform
from m4ray.datagen.traffic import SizeDistribution
from m4ray.errors import InputError
from m4ray.fingerprint import added_field, fingerprint
from m4ray.m3.lot import LotNetwork, fg_bdp_bytes, flowsim_fct, ideal_and_delay, lot_queues
from m4ray.m3.paths import PathScenario
from m4ray.models.m3_features import HOPS, NetConfig, targets, tokens
from m4ray.sim.flows import Flow
from m4ray.sim.ns3.backend import Ns3Config
from m4ray.sim.ns3.transports import RdmaConfig
from m4ray.sim.routing import WireFormat

M3_TABLES: dict[str, pa.Schema] = {
    "lot_flows": pa.schema(
        [
            pa.field("flow_id", pa.int64(), metadata={"doc": "flow id in the lot (0-based)"}),
            pa.field("a", pa.int32(), metadata={"doc": "first path link the flow uses"}),
            pa.field("b", pa.int32(), metadata={"doc": "last path link it uses + 1"}),
            pa.field("foreground", pa.bool_(), metadata={"doc": "a == 0 and b == L"}),
            pa.field("size_bytes", pa.int64(), metadata={"doc": "payload bytes"}),
            pa.field("start_s", pa.float64(), metadata={"doc": "arrival (s)"}),
            pa.field("fct_s", pa.float64(), metadata={"doc": "ns-3 FCT (s)"}),
            pa.field("ideal_fct_s", pa.float64(), metadata={"doc": "ideal FCT on the lot (s)"}),
            pa.field("slowdown", pa.float64(), metadata={"doc": "ns-3 fct / ideal, raw"}),
            pa.field("flowsim_slowdown", pa.float64(), metadata={"doc": "path flowSim slowdown"}),
        ],
        metadata={"doc": "One row per flow of the parking lot."},
    ),
    "lot_samples": pa.schema(
        [
            pa.field("n_links", pa.int32(), metadata={"doc": "path links L"}),
            pa.field("n_foreground", pa.int64(), metadata={"doc": "foreground flows"}),
            pa.field(
                "draws",
                pa.int64(),
                metadata={"doc": "times the path was drawn (network paths; a lot: 1)"},
            ),
            pa.field("tokens", pa.list_(pa.float32()), metadata={"doc": "(L+1) x TOKEN_DIM"}),
            pa.field("empty", pa.list_(pa.bool_()), metadata={"doc": "(L+1) x 10 empty buckets"}),
            pa.field("target", pa.list_(pa.float32()), metadata={"doc": "4 x 100 ns-3 pcts"}),
            pa.field("mask", pa.list_(pa.bool_()), metadata={"doc": "4 output buckets with flows"}),
            pa.field(
                "flowsim_target",
                pa.list_(pa.float32()),
                metadata={"doc": "4 x 100 flowSim pcts of the foreground (the baseline)"},
            ),
        ],
        metadata={"doc": "One row per lot: m3's model input (flowSim) and target (ns-3)."},
    ),
}


@dataclass(kw_only=True, slots=True)
class LotTraffic:
    """One lot's flows, as parameters (bytes, seconds): host pairs ``(a, b)`` (first =
    foreground) with their weights, and the open-loop arrival process."""

    pairs: tuple[tuple[int, int], ...]
    weights: tuple[float, ...]
    n_flows: int
    size_name: str
    size: SizeDistribution
    size_mean_bytes: float
    min_size_bytes: int = 50
    sigma: float = 1.0
    max_load: float = 0.5
    kind: str = field(default="parking_lot", init=False)

    def draw(self, capacity_bps: np.ndarray, wire: WireFormat, seed: int):
        """``(a, b, size_bytes, start_s)`` arrays, flow order = arrival order."""
        rng = np.random.default_rng(seed)
        weights = np.asarray(self.weights)
        pair = rng.choice(len(self.pairs), self.n_flows, p=weights / weights.sum())
        pair[0] = 0  # every lot has foreground traffic
        a = np.array([self.pairs[p][0] for p in pair], dtype=np.int64)
        b = np.array([self.pairs[p][1] for p in pair], dtype=np.int64)
        size = self.size.sample(rng, self.size_mean_bytes, self.n_flows, self.min_size_bytes)
        bits = np.array([wire.wire_bytes(int(s)) * 8.0 for s in size])
        per_link = np.array([bits[(a <= k) & (k < b)].sum() for k in range(len(capacity_bps))])
        share = per_link / bits.sum()
        busy = share > 0
        total_rate = self.max_load * np.min(capacity_bps[busy] / share[busy])
        mu = math.log(bits.mean() / total_rate) - self.sigma**2 / 2
        gaps = rng.lognormal(mu, self.sigma, self.n_flows)
        start = np.concatenate([[0.0], np.cumsum(gaps[:-1])])
        return a, b, size, start


@dataclass(kw_only=True, slots=True)
class LotScenario:
    """One parking-lot training simulation, fully specified."""

    TABLES: ClassVar[dict[str, pa.Schema]] = M3_TABLES

    family: str
    index: int
    seed: int
    capacity_bps: tuple[float, ...]
    latency_s: tuple[float, ...]
    traffic: LotTraffic
    ns3: Ns3Config
    wire: WireFormat = field(default_factory=WireFormat)
    # path flowSim's tokens and baseline with standing queues (m4ray.m3.lot.lot_queues)
    queues: bool = added_field(False, "path flowSim's standing queues (issue 32)")

    @property
    def scenario_id(self) -> str:
        return fingerprint(dataclasses.replace(self, ns3=_no_limit(self.ns3)))

    @property
    def run_id(self) -> str:
        return self.scenario_id

    @property
    def n_links(self) -> int:
        return len(self.capacity_bps)

    def describe(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("family", "index", "seed")} | {
            "scenario_id": self.scenario_id
        }

    def lot(self) -> LotNetwork:
        return LotNetwork(
            capacity_bps=self.capacity_bps,
            latency_s=self.latency_s,
            nic_cap_bps=min(self.capacity_bps[0], self.capacity_bps[-1]),
        )

    def net_config(self) -> NetConfig:
        rdma = self.ns3.rdma
        return NetConfig(
            buffer_bytes=rdma.buffer_bytes,
            window_bytes=rdma.window_bytes or 0,
            ecn_k_bytes=min(rdma.ecn_k_bytes)[1],
            pfc=rdma.pfc,
            cc=rdma.cc,
        )

    def config_vector(self) -> np.ndarray:
        bdp = fg_bdp_bytes(self.lot(), self.wire, self.ns3.rdma.ack_bytes)
        return self.net_config().vector(self.n_links, np.asarray(self.capacity_bps), bdp)

    def params13(self) -> list[float]:
        """The scenario table's network vector: here m3's config (features.CONFIG_FIELDS)."""
        return self.config_vector().tolist()

    def params(self) -> dict[str, Any]:
        t, rdma = self.traffic, self.ns3.rdma
        return (
            {
                "n_links": self.n_links,
                "core_bps": max(self.capacity_bps),
                "pairs": ";".join(f"{a}-{b}" for a, b in t.pairs),
                "n_flows_target": t.n_flows,
                "size_dist": t.size_name,
                "size_mean_bytes": t.size_mean_bytes,
                "arrival_sigma": t.sigma,
                "max_load": t.max_load,
                "buffer_bytes": rdma.buffer_bytes,
                "window_bytes": rdma.window_bytes,
                "ecn_k_bytes": min(rdma.ecn_k_bytes)[1],
                "pfc": rdma.pfc,
                "traffic": t.kind,
            }
            | ({"path_queues": True} if self.queues else {})
            | cc_param(rdma.cc)
        )

    def path_scenario(self) -> PathScenario:
        a, b, size, start = self.traffic.draw(np.asarray(self.capacity_bps), self.wire, self.seed)
        return PathScenario(
            links=tuple(range(self.n_links)),
            capacity_bps=np.asarray(self.capacity_bps),
            latency_s=np.asarray(self.latency_s),
            a=a,
            b=b,
            size_bytes=size,
            start_s=start,
            origin=np.arange(len(a)),
            foreground=(a == 0) & (b == self.n_links),
        )

    def record(self) -> dict[str, pa.Table]:
        """ns-3 and flowSim on the lot: the per-flow table and the training sample."""
        from m4ray.sim.trace import run_trace  # ns-3 loads inside the worker only

        scn, lot = self.path_scenario(), self.lot()
        routing = lot.routing(self.wire)
        ns3 = dataclasses.replace(
            self.ns3, rdma=dataclasses.replace(self.ns3.rdma, max_rate_bps=lot.nic_cap_bps)
        )
        flows = [
            Flow(i, int(a), int(b), int(s), float(t))
            for i, (a, b, s, t) in enumerate(
                zip(scn.a, scn.b, scn.size_bytes, scn.start_s, strict=True)
            )
        ]
        fct = run_trace(lot.topology(), flows, ns3, routing).column("fct_s").to_numpy()
        ideal, _ = ideal_and_delay(lot, self.wire, scn)
        queues = lot_queues(lot, self.wire, scn, self.ns3.rdma) if self.queues else None
        _, flowsim = flowsim_fct(scn, self.wire, lot, queues)
        slowdown = fct / ideal
        fg = scn.foreground
        tok, empty = tokens(flowsim, scn.size_bytes, scn.a, scn.b, fg, self.config_vector())
        target, mask = targets(slowdown[fg], scn.size_bytes[fg])
        baseline, _ = targets(flowsim[fg], scn.size_bytes[fg])
        flows_table = {
            "flow_id": np.arange(len(flows)),
            "a": scn.a,
            "b": scn.b,
            "foreground": fg,
            "size_bytes": scn.size_bytes,
            "start_s": scn.start_s,
            "fct_s": fct,
            "ideal_fct_s": ideal,
            "slowdown": slowdown,
            "flowsim_slowdown": flowsim,
        }
        sample = {
            "n_links": [self.n_links],
            "n_foreground": [int(fg.sum())],
            "draws": [1],
            "tokens": [tok.reshape(-1)],
            "empty": [empty.reshape(-1)],
            "target": [target.reshape(-1)],
            "mask": [mask],
            "flowsim_target": [baseline.reshape(-1)],
        }
        return {
            "lot_flows": pa.table(flows_table, schema=M3_TABLES["lot_flows"]),
            "lot_samples": pa.table(sample, schema=M3_TABLES["lot_samples"]),
        }

    @staticmethod
    def stats(tables: dict[str, pa.Table]) -> dict[str, Any]:
        slowdown = tables["lot_flows"].column("slowdown").to_numpy()
        return {
            "n_flows": len(slowdown),
            "n_events": 2 * len(slowdown),
            "n_periods": 0,
            "median_slowdown": float(np.median(slowdown)),
            "n_below_ideal": int((slowdown < 1).sum()),
        }

    @staticmethod
    def write_plots(run_dir: Path, frame) -> list[Path]:
        from m4ray.m3.plots import dataset_plots

        return dataset_plots(run_dir, frame)


def cc_param(cc: str) -> dict[str, str]:
    """A scenario's congestion control in its ``params`` (DCTCP's records carry none, as before
    other CCs were drawn: ``dataset_ccs`` reads a missing one as DCTCP)."""
    return {} if cc == "dctcp" else {"cc": cc}


def _no_limit(ns3: Ns3Config) -> Ns3Config:
    return dataclasses.replace(ns3, wall_limit_s=0.0)


@dataclass(kw_only=True, slots=True)
class LotFamily:
    """Ranges of m3's parking-lot scenarios (inclusive ``[low, high]``; KB = 1000 B)."""

    hops: list[int] = field(default_factory=lambda: list(HOPS))
    edge_bps: float = 10e9
    core_bps: list[float] = field(default_factory=lambda: [40e9])
    latency_s: float = 1e-6
    n_flows: list[int] = field(default_factory=lambda: [300, 1000])
    size_mean_bytes: list[float] = field(default_factory=lambda: [1000.0, 100000.0])
    min_size_bytes: int = 50
    sizes: dict[str, Any] = field(default_factory=lambda: {"exponential": {}})
    arrival_sigma: list[float] = field(default_factory=lambda: [1.0, 2.0])
    max_load: list[float] = field(default_factory=lambda: [0.2, 0.8])
    pair_candidates: list[float] = field(default_factory=lambda: [0.0, 10.0, 20.0, 50.0])
    buffer_kb: list[float] = field(default_factory=lambda: [200.0, 500.0])
    window_kb: list[float] = field(default_factory=lambda: [5.0, 30.0])
    ecn_k_kb: list[float] = field(default_factory=lambda: [5.0, 20.0])
    pfc_probability: float = 0.5
    wire: WireFormat = field(default_factory=WireFormat)
    cc: CcRanges = field(default_factory=CcRanges)  # the congestion controls drawn
    queues: bool = False  # path flowSim with standing queues (tokens and baseline; DCTCP)

    def __post_init__(self) -> None:
        self.sizes = {name: size_distribution(name, spec) for name, spec in self.sizes.items()}
        if not self.sizes:
            raise InputError("needs at least one size distribution", field="sizes")
        if not self.hops or set(self.hops) - set(HOPS):
            raise InputError(f"path lengths must be among {list(HOPS)}", field="hops")
        for name in ("n_flows", "size_mean_bytes", "arrival_sigma", "buffer_kb", "window_kb"):
            check_range(getattr(self, name), name, lo=0, open_=True)
        check_range(self.max_load, "max_load", lo=0, hi=1, open_=True)
        check_range(self.ecn_k_kb, "ecn_k_kb", lo=0, open_=True)
        if self.ecn_k_kb[1] * max(self.core_bps) / self.edge_bps >= self.buffer_kb[0]:
            raise InputError("K at the core rate must stay below the buffer", field="ecn_k_kb")
        if not 0 <= self.pfc_probability <= 1:
            raise InputError("must be in [0, 1]", field="pfc_probability")
        if isinstance(self.cc, dict):
            self.cc = CcRanges(**self.cc)
        self.cc.check("cc")

    def sample(self, name: str, index: int, seed: int, wall_limit_s: float) -> LotScenario:
        rng = np.random.default_rng(seed)
        n = int(self.hops[int(rng.integers(len(self.hops)))])
        core = float(self.core_bps[int(rng.integers(len(self.core_bps)))])
        capacity = (self.edge_bps, *([core] * (n - 2)), self.edge_bps)
        pairs, weights = self._pairs(rng, n)
        traffic = LotTraffic(pairs=pairs, weights=weights, **open_loop(rng, self))
        buffer = round(uniform(rng, self.buffer_kb) * 1000)
        k = round(uniform(rng, self.ecn_k_kb) * 1000)
        rdma = RdmaConfig(
            buffer_bytes=buffer,
            pfc=bool(rng.random() < self.pfc_probability),
            pfc_threshold_bytes=buffer // 4,
            ecn_k_bytes=[[self.edge_bps, float(k)], [core, float(k * core / self.edge_bps)]],
            window_bytes=round(uniform(rng, self.window_kb) * 1000),
            **dict(zip(("cc", "cc_params"), self.cc.draw(rng), strict=True)),
        )
        return LotScenario(
            family=name,
            index=index,
            seed=seed,
            capacity_bps=capacity,
            latency_s=(self.latency_s,) * n,
            traffic=traffic,
            ns3=Ns3Config(rdma=rdma, wall_limit_s=wall_limit_s),
            wire=self.wire,
            queues=self.queues,
        )

    def _pairs(self, rng: np.random.Generator, n: int):
        """m3's pair choice: the foreground and ``ntc - 1`` other pairs, weights
        ``U[0,1) · c / ntc`` (``c`` drawn from the candidates, 0 meaning ``ntc``), foreground 1."""
        others = [(a, b) for a in range(n) for b in range(a + 1, n + 1) if (a, b) != (0, n)]
        ntc = int(rng.integers(2, len(others) + 2))
        chosen = sorted(rng.choice(len(others), ntc - 1, replace=False).tolist())
        candidate = float(self.pair_candidates[int(rng.integers(len(self.pair_candidates)))])
        raw = rng.random(ntc) * (candidate or ntc) / ntc
        raw[0] = 1.0
        weights = raw / raw.sum()
        pairs = ((0, n), *(others[i] for i in chosen))
        return pairs, tuple(round(float(w), 6) for w in weights)
