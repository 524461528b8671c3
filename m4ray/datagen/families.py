"""Scenario families for m4 training data, and the scenario record they sample.

A family is a config group (``conf/family/*.yaml``) holding parameter *ranges*; :meth:`sample`
turns one seed into one fully specified :class:`DatagenScenario` (every random choice made, so the
record alone reproduces the run). Two families:

* :class:`OpenLoopFamily` — the m4 training fabric with open-loop traffic (``reference/m4.md``
  §10.2–10.4): flow count, size distribution and mean, log-normal arrival σ, target max load.
* :class:`CollectiveFamily` — the rail GPU cluster with randomly chosen degraded GPUs (random
  hosts, not the evaluation sweep's server-aligned sets) and reduction factors, running phases of
  collectives of random kinds, sizes and group layouts.

Both sample the ns-3 RDMA network parameters (switch buffer, DCTCP marking threshold K, window) and
encode them as m4's ``params13`` vector.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from m4ray.datagen.sampling import (
    CcRanges,
    check_range,
    integer,
    log_uniform,
    open_loop,
    size_distribution,
    uniform,
)
from m4ray.datagen.schema import TABLES
from m4ray.datagen.traffic import IncastTraffic, OpenLoopTraffic
from m4ray.errors import InputError, choice_error
from m4ray.fingerprint import SINCE, added_field, fingerprint
from m4ray.sim.collectives import HierarchicalSpec, RingSpec
from m4ray.sim.failures import degrade, gray_failure_gpus
from m4ray.sim.nccl import SimAISpec
from m4ray.sim.ns3.backend import PARAMS13, Ns3Config, params13
from m4ray.sim.ns3.transports import RdmaConfig
from m4ray.sim.routing import Routing, WireFormat
from m4ray.sim.topologies import M4FabricSpec, RailClusterSpec
from m4ray.sim.topology import Topology
from m4ray.sim.workload import Collective, CollectiveKind, Workload

# simai: SimAI's NCCL flows (m4ray.sim.nccl), the gray-failure study's collectives
ALGORITHMS = {"ring": RingSpec, "hierarchical": HierarchicalSpec, "simai": SimAISpec}
LAYOUTS = ("all", "rails", "servers", "random", "server_pairs")
# which GPUs fail: any (random), or the gray-failure sweep's rule (GrayFailure: half of N on each
# of two servers up to a server's GPUs, then a whole server and the rest on a third) on servers
# drawn in random order (servers)
FAILURE_LAYOUTS = ("random", "servers")


RED_KB_PER_GBPS = (0.5, 2.0)  # NetworkRanges.red_kb_per_gbps's default range


@dataclass(kw_only=True, slots=True)
class NetworkRanges:
    """Ranges of the ns-3 RDMA parameters sampled per scenario (KB = 1000 bytes).

    ``buffer_kb`` is the shared buffer per switch (PFC pauses an ingress port holding an eighth
    of it, HPCC's dynamic-threshold share of an idle switch); ``ecn_k_kb`` is one marking
    threshold for every link rate; ``window_kb`` the fixed window (``null``: the topology's
    largest BDP). The values drawn are what ``params13`` records.

    ``red_share`` of the DCTCP scenarios mark as the SimAI gray-failure study's switches do
    (``conf/backend/ns3_simai.yaml``): RED per link rate, K_min = ``red_kb_per_gbps`` KB per
    Gbit/s (drawn), K_max = 4 K_min, P_max 0.2, in place of the step at ``ecn_k_kb``. At 0 (the
    default) nothing more is drawn, so earlier datasets keep their scenarios.
    """

    buffer_kb: list[float] = field(default_factory=lambda: [1000.0, 4000.0])
    ecn_k_kb: list[float] = field(default_factory=lambda: [10.0, 30.0])
    window_kb: list[float] | None = field(default_factory=lambda: [5.0, 15.0])
    dctcp_gain: list[float] = field(default_factory=lambda: [0.0625, 0.0625])
    cc: CcRanges = field(default_factory=CcRanges)  # the congestion controls drawn
    red_share: float = added_field(0.0, "the study's RED marking (issue 29)")
    red_kb_per_gbps: list[float] | None = field(  # null: [0.5, 2.0] (the study's: 1)
        default=None, metadata={SINCE: "the study's RED marking (issue 29)"}
    )

    def __post_init__(self) -> None:
        check_range(self.buffer_kb, "network.buffer_kb", lo=0, open_=True)
        if not 0 <= self.red_share <= 1:
            raise InputError(f"must be in [0, 1], got {self.red_share}", field="network.red_share")
        check_range(self._red_range(), "network.red_kb_per_gbps", lo=0, open_=True)
        check_range(self.ecn_k_kb, "network.ecn_k_kb", lo=0, open_=True)
        if self.window_kb is not None:
            check_range(self.window_kb, "network.window_kb", lo=0, open_=True)
        check_range(self.dctcp_gain, "network.dctcp_gain", lo=0, hi=1)
        if self.ecn_k_kb[1] >= self.buffer_kb[0] / 8:
            raise InputError(
                "the marking threshold must stay below the PFC threshold (buffer / 8)",
                field="network.ecn_k_kb",
            )
        if isinstance(self.cc, dict):
            self.cc = CcRanges(**self.cc)
        self.cc.check("network.cc")

    def _red_range(self) -> list[float]:
        # not filled in by __post_init__: a default left None keeps the family's ids
        return list(RED_KB_PER_GBPS if self.red_kb_per_gbps is None else self.red_kb_per_gbps)

    def sample(self, rng: np.random.Generator, wall_limit_s: float) -> Ns3Config:
        buffer = round(uniform(rng, self.buffer_kb) * 1000)
        window = None if self.window_kb is None else round(uniform(rng, self.window_kb) * 1000)
        k = float(round(uniform(rng, self.ecn_k_kb) * 1000))
        gain = uniform(rng, self.dctcp_gain)
        cc, params = self.cc.draw(rng)
        marking: dict[str, Any] = {"ecn_k_bytes": [[10e9, k]]}
        if self.red_share > 0 and cc == "dctcp" and rng.random() < self.red_share:
            per_bps = uniform(rng, self._red_range()) * 1000 / 1e9  # K_min bytes per bit/s
            # proportional to the rate up to 400 Gbit/s, held above (and lower where K_max
            # would reach the buffer: the ports must mark below it)
            top = min(400e9, 0.9 * buffer / (4 * per_bps))

            def line(factor: float) -> list[list[float]]:  # factor x K_min, linear to top
                return [[rate, round(factor * per_bps * rate)] for rate in (1e9, top)]

            marking = {"ecn_k_bytes": line(1), "ecn_k_max_bytes": line(4), "ecn_p_max": 0.2}
        return Ns3Config(
            rdma=RdmaConfig(
                buffer_bytes=buffer,
                pfc_threshold_bytes=buffer // 8,
                window_bytes=window,
                dctcp_gain=gain,
                cc=cc,
                cc_params=params,
                **marking,
            ),
            wall_limit_s=wall_limit_s,
        )


@dataclass(kw_only=True, slots=True)
class Phase:
    """Collectives issued together (one per group), after every earlier phase finished."""

    kind: CollectiveKind
    size_bytes: int
    groups: tuple[tuple[int, ...], ...]


@dataclass(kw_only=True, slots=True)
class CollectiveTraffic:
    """A sequence of collective phases on the ranks, decomposed by ``algorithm``."""

    phases: tuple[Phase, ...]
    algorithm: str = "ring"
    send_latency_s: float = 3e-6
    kind: str = field(default="collectives", init=False)

    def workload(self, n_ranks: int) -> Workload:
        nodes: list[Collective] = []
        last: dict[int, int] = {}  # rank -> its latest node
        for p, phase in enumerate(self.phases):
            for group in phase.groups:
                for rank in group:
                    node = Collective(
                        id=len(nodes),
                        rank=rank,
                        kind=phase.kind,
                        size_bytes=phase.size_bytes,
                        group=group,
                        deps=(last[rank],) if rank in last else (),
                        name=f"phase{p}",
                    )
                    nodes.append(node)
            for group in phase.groups:  # the next phase waits for all of this one on each rank
                for rank in group:
                    last[rank] = max(n.id for n in nodes if n.rank == rank)
        return Workload(n_ranks=n_ranks, nodes=nodes, name="datagen-collectives")


@dataclass(kw_only=True, slots=True)
class DatagenScenario:
    """One training-data simulation, fully specified (hosts, bytes, seconds)."""

    family: str
    index: int
    seed: int
    topology: Any
    degraded: tuple[int, ...] = ()
    reduction: int = 1
    traffic: Any = None
    ns3: Ns3Config = field(default_factory=Ns3Config)
    wire: WireFormat = field(default_factory=WireFormat)
    # busy periods couple each link with its reverse where the transport ACKs every packet
    # (RDMA): a flow's ACKs load the reverse of its path, so the flows there share with it
    ack_periods: bool = added_field(False, "busy periods over ACK-coupled links (2026-11-26)")

    TABLES: ClassVar[dict[str, pa.Schema]] = TABLES

    def record(self) -> dict[str, pa.Table]:
        """Run in ns-3 with recording on: the tables of ``schema.TABLES`` (inside a worker)."""
        from m4ray.datagen.record import record  # imports ns-3 only inside the worker

        return record(self)

    @staticmethod
    def stats(tables: dict[str, pa.Table]) -> dict[str, Any]:
        slowdown = tables["flows"].column("slowdown").to_numpy()
        return {
            "n_flows": tables["flows"].num_rows,
            "n_events": tables["events"].num_rows,
            "n_periods": tables["periods"].num_rows,
            "median_slowdown": float(np.median(slowdown)),
            # raw slowdowns below 1 (ns-3 a hair under the ideal): training clamps these targets
            "n_below_ideal": int((slowdown < 1).sum()),
        }

    @staticmethod
    def write_plots(run_dir, frame) -> list:
        from m4ray.datagen import plots

        return plots.write_all(run_dir, frame)

    @property
    def scenario_id(self) -> str:
        """Content id; the wall-clock limit is a guard, not part of what is simulated."""
        return fingerprint(with_wall_limit(self, 0.0))

    @property
    def run_id(self) -> str:
        return self.scenario_id

    def build_topology(self) -> Topology:
        base = self.topology.build()
        return degrade(base, self.degraded, self.reduction) if self.degraded else base

    def describe(self) -> dict[str, Any]:
        return {
            "scenario_id": self.scenario_id,
            "family": self.family,
            "index": self.index,
            "seed": self.seed,
        }

    def params(self) -> dict[str, Any]:
        """Every sampled parameter, flat (for the scenarios table)."""
        rdma = self.ns3.rdma
        vector = self.params13()  # routes the topology once for the default window
        out = {
            "transport": self.ns3.transport,
            "ack_bytes": rdma.ack_bytes,
            "ack_periods": self.ack_periods,
            "mtu_bytes": self.wire.mtu_bytes,
            "header_bytes": self.wire.header_bytes,
            "buffer_bytes": rdma.buffer_bytes,
            "ecn_k_bytes": min(rdma.ecn_k_bytes)[1],
            "window_bytes": round(vector[PARAMS13.index("fwin")] * 1000),
            "dctcp_gain": rdma.dctcp_gain,
            **({"cc": rdma.cc, "cc_params": rdma.cc_params} if rdma.cc != "dctcp" else {}),
            "n_degraded": len(self.degraded),
            "reduction": self.reduction,
            "traffic": self.traffic.kind,
        }
        if isinstance(self.traffic, IncastTraffic):
            t = self.traffic
            out.update(
                n_flows_target=t.rounds * t.k,
                incast_k=t.k,
                size_mean_bytes=float(t.size_bytes),
                incast_gap_s=t.gap_s,
            )
        elif isinstance(self.traffic, OpenLoopTraffic):
            t = self.traffic
            out.update(
                n_flows_target=t.n_flows,
                size_dist=t.size_name,
                size_mean_bytes=t.size_mean_bytes,
                arrival_sigma=t.sigma,
                max_load=t.max_load,
            )
        else:
            t = self.traffic
            out.update(
                algorithm=t.algorithm,
                phases=";".join(
                    f"{p.kind.value}:{p.size_bytes}:{len(p.groups)}x{len(p.groups[0])}"
                    for p in t.phases
                ),
            )
        return out

    def params13(self) -> list[float]:
        """m4's network/CC vector of this scenario (:func:`m4ray.sim.ns3.backend.params13`)."""
        return params13(self.ns3, Routing(self.build_topology(), wire=self.wire))


@dataclass(kw_only=True, slots=True)
class OpenLoopFamily:
    """The m4 training fabric with open-loop flows (ranges are inclusive ``[low, high]``)."""

    topology: Any = field(default_factory=M4FabricSpec)
    n_flows: list[int] = field(default_factory=lambda: [200, 400])
    size_mean_bytes: list[float] = field(default_factory=lambda: [1000.0, 100000.0])
    min_size_bytes: int = 50
    sizes: dict[str, Any] = field(default_factory=lambda: {"exponential": {}})
    arrival_sigma: list[float] = field(default_factory=lambda: [1.0, 2.0])
    max_load: list[float] = field(default_factory=lambda: [0.3, 0.8])
    wire: WireFormat = field(default_factory=WireFormat)
    network: NetworkRanges = field(default_factory=NetworkRanges)

    def __post_init__(self) -> None:
        self.sizes = {name: size_distribution(name, spec) for name, spec in self.sizes.items()}
        if not self.sizes:
            raise InputError("needs at least one size distribution", field="sizes")
        if isinstance(self.network, dict):
            self.network = NetworkRanges(**self.network)
        check_range(self.n_flows, "n_flows", lo=1)
        check_range(self.size_mean_bytes, "size_mean_bytes", lo=0, open_=True)
        check_range(self.arrival_sigma, "arrival_sigma", lo=0, open_=True)
        check_range(self.max_load, "max_load", lo=0, hi=1, open_=True)
        if self.min_size_bytes < 1:
            raise InputError("must be >= 1", field="min_size_bytes")

    def sample(self, name: str, index: int, seed: int, wall_limit_s: float) -> DatagenScenario:
        rng = np.random.default_rng(seed)
        traffic = OpenLoopTraffic(**open_loop(rng, self))
        return _family_scenario(
            self, name, index, seed, traffic=traffic, rng=rng, wall_limit_s=wall_limit_s
        )


@dataclass(kw_only=True, slots=True)
class IncastFamily:
    """k:1 incasts on a topology (ranges inclusive ``[low, high]``): per scenario a fan-in
    ``k``, a flow size (log-uniform), a number of rounds and the gap between rounds as a
    multiple of the time one round takes to drain at the receiver's link rate (< 1: rounds
    overlap)."""

    topology: Any = field(default_factory=M4FabricSpec)
    k: list[int] = field(default_factory=lambda: [2, 31])
    size_bytes: list[float] = field(default_factory=lambda: [10_000.0, 1_000_000.0])
    rounds: list[int] = field(default_factory=lambda: [1, 8])
    gap_drains: list[float] = field(default_factory=lambda: [0.5, 4.0])
    wire: WireFormat = field(default_factory=WireFormat)
    network: NetworkRanges = field(default_factory=NetworkRanges)

    def __post_init__(self) -> None:
        if isinstance(self.network, dict):
            self.network = NetworkRanges(**self.network)
        check_range(self.k, "k", lo=1)
        hosts = len(self.topology.build().hosts)
        if self.k[1] >= hosts:  # checked here, before any task starts
            raise InputError(
                f"a {self.k[1]}:1 incast needs {self.k[1] + 1} hosts, the topology has {hosts}",
                field="k",
            )
        check_range(self.size_bytes, "size_bytes", lo=0, open_=True)
        check_range(self.rounds, "rounds", lo=1)
        check_range(self.gap_drains, "gap_drains", lo=0, open_=True)

    def sample(self, name: str, index: int, seed: int, wall_limit_s: float) -> DatagenScenario:
        rng = np.random.default_rng(seed)
        k = integer(rng, self.k)
        size = round(log_uniform(rng, self.size_bytes))
        topo = self.topology.build()
        host_rate = min(topo.bandwidth_bps[topo.link_src == topo.hosts[0]])
        drain_s = k * self.wire.wire_bytes(size) * 8 / host_rate
        traffic = IncastTraffic(
            rounds=integer(rng, self.rounds),
            k=k,
            size_bytes=size,
            gap_s=float(f"{uniform(rng, self.gap_drains) * drain_s:.6g}"),
        )
        return _family_scenario(
            self, name, index, seed, traffic=traffic, rng=rng, wall_limit_s=wall_limit_s
        )


def _family_scenario(
    family, name, index, seed, *, traffic, rng, wall_limit_s, **extra
) -> DatagenScenario:
    """A scenario of ``traffic`` on the family's topology and wire, its network drawn from the
    family's ranges (after the traffic, as every family draws)."""
    return DatagenScenario(
        family=name,
        index=index,
        seed=seed,
        topology=family.topology,
        traffic=traffic,
        ns3=family.network.sample(rng, wall_limit_s),
        wire=family.wire,
        **extra,
    )


@dataclass(kw_only=True, slots=True)
class CollectiveFamily:
    """The rail GPU cluster with random gray failures running random collectives."""

    topology: Any = field(default_factory=RailClusterSpec)
    degraded_gpus: list[int] = field(default_factory=lambda: [0, 16])
    reduction: list[int] = field(default_factory=lambda: [2, 10])
    kinds: list[str] = field(default_factory=lambda: ["all_reduce", "all_gather", "all_to_all"])
    algorithms: list[str] = field(default_factory=lambda: ["ring", "hierarchical"])
    layouts: list[str] = field(default_factory=lambda: ["all", "rails", "random"])
    size_bytes: list[int] = field(default_factory=lambda: [262144, 2097152])
    phases: list[int] = field(default_factory=lambda: [1, 3])
    send_latency_s: float = 3e-6
    wire: WireFormat = field(default_factory=lambda: WireFormat(mtu_bytes=8948, header_bytes=54))
    network: NetworkRanges = field(
        default_factory=lambda: NetworkRanges(
            buffer_kb=[4000.0, 16000.0], ecn_k_kb=[90.0, 360.0], window_kb=None
        )
    )
    # drawn per scenario among these (FAILURE_LAYOUTS); one layout draws nothing, so datasets
    # made before the field keep their scenarios and ids
    failure_layouts: tuple[str, ...] = added_field(
        ("random",), "server-aligned failure sets (2026-11-29)"
    )

    def __post_init__(self) -> None:
        if isinstance(self.network, dict):
            self.network = NetworkRanges(**self.network)
        self.failure_layouts = tuple(self.failure_layouts)
        if not self.failure_layouts:
            raise InputError("empty list", field="failure_layouts")
        for layout in self.failure_layouts:
            if layout not in FAILURE_LAYOUTS:
                raise choice_error("failure layout", layout, list(FAILURE_LAYOUTS))
        for kind in self.kinds:
            if kind not in set(CollectiveKind):
                raise choice_error("collective kind", kind, [k.value for k in CollectiveKind])
        for algorithm in self.algorithms:
            if algorithm not in ALGORITHMS:
                raise choice_error("collective algorithm", algorithm, list(ALGORITHMS))
        for layout in self.layouts:
            if layout not in LAYOUTS:
                raise choice_error("group layout", layout, LAYOUTS)
        for name in ("kinds", "algorithms", "layouts"):
            if not getattr(self, name):
                raise InputError("empty list", field=name)
        check_range(self.degraded_gpus, "degraded_gpus", lo=0)
        check_range(self.reduction, "reduction", lo=1)
        check_range(self.size_bytes, "size_bytes", lo=1)
        check_range(self.phases, "phases", lo=1)

    def sample(self, name: str, index: int, seed: int, wall_limit_s: float) -> DatagenScenario:
        rng = np.random.default_rng(seed)
        topo = self.topology.build()
        hosts = topo.hosts
        n_degraded = min(integer(rng, self.degraded_gpus), len(hosts))
        layouts = self.failure_layouts
        layout = layouts[int(rng.integers(len(layouts)))] if len(layouts) > 1 else layouts[0]
        if layout == "servers":
            degraded = _server_aligned(rng, topo, n_degraded)
        else:
            degraded = tuple(sorted(int(h) for h in rng.choice(hosts, n_degraded, replace=False)))
        reduction = integer(rng, self.reduction) if degraded else 1
        algorithm = self.algorithms[int(rng.integers(len(self.algorithms)))]
        phases = tuple(
            Phase(
                kind=CollectiveKind(self.kinds[int(rng.integers(len(self.kinds)))]),
                size_bytes=int(log_uniform(rng, self.size_bytes)),
                groups=self._groups(rng, topo),
            )
            for _ in range(integer(rng, self.phases))
        )
        traffic = CollectiveTraffic(
            phases=phases, algorithm=algorithm, send_latency_s=self.send_latency_s
        )
        return _family_scenario(
            self, name, index, seed, traffic=traffic, rng=rng, wall_limit_s=wall_limit_s,
            degraded=degraded, reduction=reduction,
        )  # fmt: skip

    def _groups(self, rng: np.random.Generator, topo: Topology) -> tuple[tuple[int, ...], ...]:
        """Rank groups of one phase; every layout has the same member count on each server
        (hierarchical collectives need it)."""
        g = topo.gpus_per_server
        servers = len(topo.hosts) // g
        layout = self.layouts[int(rng.integers(len(self.layouts)))]
        if layout == "all":
            return (tuple(range(servers * g)),)
        if layout == "rails":  # one group per local GPU index, across servers (data parallel)
            return tuple(tuple(s * g + i for s in range(servers)) for i in range(g))
        if layout == "servers":  # one group per server (tensor parallel, NVLink only)
            return tuple(tuple(range(s * g, (s + 1) * g)) for s in range(servers))
        if layout == "server_pairs":  # each two consecutive servers one group (TP over 2 servers)
            return tuple(tuple(range(s * g, min(s + 2, servers) * g)) for s in range(0, servers, 2))
        n_servers = int(rng.integers(2, servers + 1)) if servers > 1 else 1
        chosen = sorted(rng.choice(servers, n_servers, replace=False))
        local = sorted(rng.choice(g, int(rng.integers(1, g + 1)), replace=False))
        return (tuple(int(s * g + i) for s in chosen for i in local),)


def _server_aligned(rng: np.random.Generator, topo: Topology, n_degraded: int) -> tuple[int, ...]:
    """The sweep's degraded-GPU rule (:func:`~m4ray.sim.failures.gray_failure_gpus`) for at most
    ``n_degraded`` GPUs (two servers' worth), its servers taken in a random order: a server's
    NICs failing together, or half of each of two servers, as the study's grid has them."""
    g = topo.gpus_per_server
    servers = len(topo.hosts) // g
    n = min(n_degraded, 2 * g if servers >= 3 else g)
    order = rng.permutation(servers)
    gpus = gray_failure_gpus(n, g, servers) if servers > 1 else tuple(range(n))
    return tuple(sorted(int(topo.hosts[order[i // g] * g + i % g]) for i in gpus))


def with_wall_limit(scenario: DatagenScenario, wall_limit_s: float) -> DatagenScenario:
    return dataclasses.replace(
        scenario, ns3=dataclasses.replace(scenario.ns3, wall_limit_s=wall_limit_s)
    )


__all__ = [
    "PARAMS13",
    "CollectiveFamily",
    "CollectiveTraffic",
    "DatagenScenario",
    "NetworkRanges",
    "OpenLoopFamily",
    "Phase",
]
