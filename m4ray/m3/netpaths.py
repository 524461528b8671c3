"""m3 training samples from whole networks: paths sampled as the estimate samples them, with
targets from network-wide ns-3 (``datagen.families.net``; a departure from m3, below).

m3 trains on parking lots: one path, its own flows and every flow crossing it, simulated alone
in ns-3. On m3's default experiment the estimate's paths look nothing like those lots (links
carrying thousands of flows, little fluid contention, yet queues; docs/m3.md, issue 32), and a
correction learned on lots moved the network-wide answer away from ns-3. A
:class:`NetworkPathsScenario` instead runs a whole network in ns-3 (a fat-tree and an open-loop
workload drawn from :class:`NetworkFamily`'s ranges), samples paths ∝ their foreground as
:func:`m4ray.m3.estimate.estimate` does, and records for each sampled path what the estimate
would compute (path flowSim's tokens and foreground percentiles on the path's lot) beside what
the network's ns-3 gave that path's foreground flows: the model learns the network's answer from
exactly the inputs it will see. Rows are ``lot_samples`` rows (one per sampled path, all under
the network's scenario id), so ``train_m3`` takes such a dataset unchanged; ``lot_flows`` holds
the sampled paths' foreground flows (``a = 0``, ``b = L``; ``flow_id``: the network's flow).

Units: bytes, bits/s, seconds.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from m4ray.datagen.sampling import CcRanges, check_range, integer, size_distribution, uniform
from m4ray.errors import InputError
from m4ray.fingerprint import added_field, fingerprint
from m4ray.m3.datagen import M3_TABLES, LotScenario, cc_param
from m4ray.m3.estimate import M3Network, M3Workload, path_sample
from m4ray.m3.lot import LotNetwork, PathQueues, fg_bdp_bytes
from m4ray.models.m3_features import targets
from m4ray.sim.routing import Routing, WireFormat
from m4ray.sim.topologies import FatTreeSpec


@dataclass(kw_only=True, slots=True)
class NetworkPathsScenario:
    """One network simulated in ns-3 and ``n_paths`` path draws from it, fully specified."""

    TABLES: ClassVar[dict[str, pa.Schema]] = M3_TABLES

    family: str
    index: int
    seed: int
    topology: FatTreeSpec
    workload: M3Workload
    network: M3Network
    n_paths: int = 500
    queues: bool = True  # path flowSim with standing queues (as the estimate then runs it)
    wire: WireFormat = field(default_factory=WireFormat)
    wall_limit_s: float = 0.0  # the ns-3 run's guard; not part of the scenario's identity
    # with queues: HPCC's first windows queue in path flowSim (m4ray.m3.lot.PathQueues); set
    # only where the network's CC queues nothing else (NetworkFamily.sample)
    first_windows: bool = added_field(False, "path flowSim's first windows (issue 32)")
    # with queues: first windows over the level in path flowSim (PathQueues.bursts)
    bursts: bool = added_field(False, "path flowSim's first windows over the level (issue 32)")
    # with bursts: each flow's round trip over its network route in path flowSim
    route_rtt: bool = added_field(False, "path flowSim's route round trips (issue 32)")
    # with queues, under DCQCN: each flow keeps DCQCN's rate in path flowSim (PathQueues.rates)
    rates: bool = added_field(False, "path flowSim with DCQCN's rates (issue 32)")
    # datasets whose record of this network under another path flowSim mode record() reuses
    # (ns-3's answers do not depend on it); not part of the scenario's identity
    reuse: tuple[str, ...] = added_field((), "where ns-3's answers may come from (issue 32)")

    @property
    def scenario_id(self) -> str:
        return fingerprint(dataclasses.replace(self, wall_limit_s=0.0, reuse=()))

    def _rates(self) -> tuple[float, float]:
        t = self.topology
        return float(t.bandwidth_bps), float(t.fabric_bandwidth_bps or t.bandwidth_bps)

    def params13(self) -> list[float]:
        """The scenarios table's network vector: m3's config vector of a 6-hop path here."""
        edge, core = self._rates()
        capacity = np.array([edge] + [core] * 4 + [edge])
        lot = LotNetwork(capacity_bps=tuple(capacity), latency_s=(1e-6,) * 6, nic_cap_bps=edge)
        bdp = fg_bdp_bytes(lot, self.wire, 64)
        return self.network.net_config().vector(6, capacity, bdp).tolist()

    def params(self) -> dict[str, Any]:
        w, n, t = self.workload, self.network, self.topology
        return (
            {
                "traffic": "network",
                "k": t.k,
                "oversubscription": t.oversubscription,
                "n_flows_target": w.n_flows,
                "size_dist": w.size["kind"],
                "size_mean_bytes": w.size_mean_bytes,
                "arrival_sigma": w.arrival_sigma,
                "max_load": w.max_load,
                "buffer_bytes": n.buffer_bytes,
                "window_bytes": n.window_bytes,
                "ecn_k_bytes": n.ecn_k_bytes,
                "pfc": n.pfc,
                "n_paths": self.n_paths,
            }
            | ({"path_queues": True} if self.queues else {})
            | ({"path_first_windows": True} if self.queues and self.first_windows else {})
            | ({"path_bursts": True} if self.queues and self.bursts else {})
            | ({"path_route_rtt": True} if self.queues and self.bursts and self.route_rtt else {})
            | ({"path_rates": True} if self.queues and self.rates else {})
            | cc_param(n.cc)
        )

    def truth_twins(self) -> list[str]:
        """The ids of this network with path flowSim run otherwise (queues on; first windows,
        bursts, route round trips and DCQCN's rates either way): the same ns-3 run, the same
        paths, so the same targets."""
        twins = {
            dataclasses.replace(
                self, queues=True, first_windows=fw, bursts=bursts, route_rtt=route, rates=rates
            ).scenario_id
            for fw in (False, True)
            for bursts in (False, True)
            for route in ((False, True) if bursts else (False,))
            for rates in (False, True)
        }
        return sorted(twins - {self.scenario_id})

    def record(self) -> dict[str, pa.Table]:
        """ns-3 on the whole network, then each sampled path's estimate inputs
        (:func:`~m4ray.m3.estimate.path_sample`, as the estimate makes them) and targets.
        ``reuse``: datasets whose record of a twin of this network (:meth:`truth_twins`) gives
        the sampled flows' ns-3 answers instead of running ns-3 again (path flowSim's mode
        changed, not the network); checked path for path."""
        from m4ray.m3.paths import RoutedFlows
        from m4ray.sim.trace import run_trace  # ns-3 loads inside the worker only

        topo = self.topology.build()
        routing = Routing(topo, seed=self.seed, wire=self.wire)
        flows = self.workload.flows(routing, self.seed)
        ns3 = dataclasses.replace(self.network.ns3(*self._rates()), wall_limit_s=self.wall_limit_s)
        reused = self._reused_truth(len(flows))
        if reused is None:
            table = run_trace(topo, flows, ns3, routing)
            slowdown = table.column("slowdown").to_numpy()
            ideal_all = table.column("ideal_fct_s").to_numpy()
            fct_all = table.column("fct_s").to_numpy()
        else:
            record, (slowdown, ideal_all, fct_all) = reused
        routed = RoutedFlows(flows, routing)
        queues = (
            PathQueues(
                ns3.rdma,
                self.first_windows,
                bursts=self.bursts,
                route_rtt=self.route_rtt,
                rates=self.rates,
            )
            if self.queues
            else None
        )
        network = self.network.net_config()
        samples: dict[str, list] = {name: [] for name in M3_TABLES["lot_samples"].names}
        fg_rows: dict[str, list] = {name: [] for name in M3_TABLES["lot_flows"].names}
        for path, draws in routed.sample(self.n_paths, self.seed):
            sample = path_sample(routed, path, 1, self.wire, network, queues)
            scn, fg = sample.scenario, sample.scenario.foreground
            origin = scn.origin[fg]
            target, mask = targets(slowdown[origin], scn.size_bytes[fg])
            for name, value in (
                ("n_links", scn.n_links),
                ("n_foreground", int(fg.sum())),
                ("draws", draws),
                ("tokens", sample.tokens.reshape(-1)),
                ("empty", sample.empty.reshape(-1)),
                ("target", target.reshape(-1)),
                ("mask", mask),
                ("flowsim_target", sample.baseline.reshape(-1)),
            ):
                samples[name].append(value)
            n_fg = len(origin)
            for name, value in (
                ("flow_id", origin),
                ("a", np.zeros(n_fg, dtype=np.int32)),
                ("b", np.full(n_fg, scn.n_links, dtype=np.int32)),
                ("foreground", np.ones(n_fg, dtype=bool)),
                ("size_bytes", scn.size_bytes[fg]),
                ("start_s", scn.start_s[fg]),
                ("fct_s", fct_all[origin]),
                ("ideal_fct_s", ideal_all[origin]),
                ("slowdown", slowdown[origin]),
                ("flowsim_slowdown", sample.slowdown[fg]),
            ):
                fg_rows[name].append(value)
        flows_table = {name: np.concatenate(parts) for name, parts in fg_rows.items()}
        if reused is not None:
            record.check(fg_rows["flow_id"], fg_rows["size_bytes"])
        return {
            "lot_flows": pa.table(flows_table, schema=M3_TABLES["lot_flows"]),
            "lot_samples": pa.table(samples, schema=M3_TABLES["lot_samples"]),
        }

    def _reused_truth(self, n_flows: int):
        """(the twin's record, (slowdown, ideal FCT, FCT) per flow: NaN but the twin's sampled
        flows) from the first of :attr:`reuse` that holds a twin of this network, else None."""
        twins = self.truth_twins()
        for source in self.reuse:
            for twin in twins:
                path = Path(source) / "lot_flows" / f"scenario_id={twin}" / "part-0.parquet"
                if path.exists():
                    record = _TwinRecord.read(path, twin, n_flows)
                    return record, record.truth(n_flows)
        return None

    # the datagen job's scenario protocol, as the parking lots have it
    run_id = LotScenario.run_id
    describe = LotScenario.describe
    stats = staticmethod(LotScenario.stats)
    write_plots = staticmethod(LotScenario.write_plots)


@dataclass(kw_only=True, slots=True)
class NetworkFamily:
    """Ranges of the networks :class:`NetworkPathsScenario` draws (inclusive ``[low, high]``;
    KB = 1000 B): fat-trees of ``k`` and oversubscription drawn from the lists, open-loop
    workloads as the lots draw theirs, DCTCP settings as the lots', and the congestion control
    from ``cc`` (one listed: no draw, so DCTCP-only families draw as before; DCQCN's RED from
    its ranges, the others' parameters likewise: :class:`~m4ray.datagen.sampling.CcRanges`)."""

    k: list[int] = field(default_factory=lambda: [4])
    oversubscription: list[int] = field(default_factory=lambda: [1, 2])
    bandwidth_bps: float = 10e9
    fabric_bandwidth_bps: float = 40e9
    n_flows: list[int] = field(default_factory=lambda: [10_000, 30_000])
    sizes: dict[str, Any] = field(default_factory=lambda: {"exponential": {}})
    size_mean_bytes: list[float] = field(default_factory=lambda: [2000.0, 100000.0])
    min_size_bytes: int = 50
    arrival_sigma: list[float] = field(default_factory=lambda: [1.0, 2.0])
    max_load: list[float] = field(default_factory=lambda: [0.2, 0.7])
    buffer_kb: list[float] = field(default_factory=lambda: [200.0, 500.0])
    window_kb: list[float] = field(default_factory=lambda: [10.0, 30.0])
    ecn_k_kb: list[float] = field(default_factory=lambda: [5.0, 20.0])
    pfc_probability: float = 0.5
    n_paths: int = 500
    queues: bool = True
    first_windows: bool = False  # HPCC's first windows queue in path flowSim (PathQueues)
    bursts: bool = False  # first windows over the level in path flowSim (PathQueues)
    route_rtt: bool = False  # with bursts: each flow's route round trip (PathQueues)
    rates: bool = False  # under DCQCN: each flow keeps DCQCN's rate (PathQueues.rates)
    wire: WireFormat = field(default_factory=WireFormat)
    cc: CcRanges = field(default_factory=CcRanges)

    def __post_init__(self) -> None:
        if isinstance(self.cc, dict):
            self.cc = CcRanges(**self.cc)
        self.cc.check("cc")
        self.sizes = {name: size_distribution(name, spec) for name, spec in self.sizes.items()}
        if not self.sizes:
            raise InputError("needs at least one size distribution", field="sizes")
        for name in ("n_flows", "size_mean_bytes", "arrival_sigma", "buffer_kb", "window_kb"):
            check_range(getattr(self, name), name, lo=0, open_=True)
        check_range(self.max_load, "max_load", lo=0, hi=1, open_=True)
        check_range(self.ecn_k_kb, "ecn_k_kb", lo=0, open_=True)
        if not self.k or any(k < 2 or k % 2 for k in self.k):
            raise InputError("fat-tree k must be even and >= 2", field="k")
        if self.n_paths < 1:
            raise InputError(f"must be >= 1, got {self.n_paths}", field="n_paths")

    def sample(self, name: str, index: int, seed: int, wall_limit_s: float):
        rng = np.random.default_rng(seed)
        topology = FatTreeSpec(
            k=int(self.k[int(rng.integers(len(self.k)))]),
            bandwidth_bps=self.bandwidth_bps,
            fabric_bandwidth_bps=self.fabric_bandwidth_bps,
            oversubscription=int(
                self.oversubscription[int(rng.integers(len(self.oversubscription)))]
            ),
        )
        size_name = sorted(self.sizes)[int(rng.integers(len(self.sizes)))]
        size = self.sizes[size_name]
        workload = M3Workload(
            n_flows=integer(rng, self.n_flows),
            size={f.name: getattr(size, f.name) for f in dataclasses.fields(size)},
            size_mean_bytes=round(uniform(rng, self.size_mean_bytes), 1),
            min_size_bytes=self.min_size_bytes,
            arrival_sigma=round(uniform(rng, self.arrival_sigma), 4),
            max_load=round(uniform(rng, self.max_load), 4),
        )
        network = M3Network(
            buffer_bytes=round(uniform(rng, self.buffer_kb) * 1000),
            window_bytes=round(uniform(rng, self.window_kb) * 1000),
            ecn_k_bytes=round(uniform(rng, self.ecn_k_kb) * 1000),
            pfc=bool(rng.random() < self.pfc_probability),
            **dict(zip(("cc", "cc_params"), self.cc.draw(rng), strict=True)),
        )
        return NetworkPathsScenario(
            family=name,
            index=index,
            seed=seed,
            topology=topology,
            workload=workload,
            network=network,
            n_paths=self.n_paths,
            queues=self.queues,
            wire=self.wire,
            wall_limit_s=wall_limit_s,
            # only where it changes path flowSim (a CC that queues only its first windows):
            # the other networks keep their ids, and a dataset its runs
            first_windows=self.first_windows and self.queues and _first_rtt_only(network),
            bursts=self.bursts and self.queues,
            route_rtt=self.route_rtt and self.bursts and self.queues,
            rates=self.rates and self.queues and network.cc == "dcqcn",
        )


def recovered_draws(params: dict[str, Any], seed: int, flow_ids: list[np.ndarray]) -> np.ndarray:
    """Each sampled path's draw count for a network written before ``lot_samples`` had them:
    the estimate's draws repeated (:func:`~m4ray.m3.paths.draw_flows` over the network's
    ``n_flows_target`` flows) and counted on each path's recorded foreground (``flow_ids``, one
    array per sample, in sample order). Raises if the draws do not all land on the recorded
    paths (then they are not this network's)."""
    from m4ray.m3.paths import draw_flows

    owner = np.full(max((int(f.max()) for f in flow_ids if len(f)), default=-1) + 1, -1)
    for k, ids in enumerate(flow_ids):
        owner[ids] = k
    picks = draw_flows(int(params["n_flows_target"]), int(params["n_paths"]), seed)
    hit = owner[picks[picks < len(owner)]]
    draws = np.bincount(hit[hit >= 0], minlength=len(flow_ids))
    if len(hit) != len(picks) or (hit < 0).any() or (draws < 1).any():
        raise InputError(
            "the network's draws do not land on its recorded paths", field="lot_samples.draws"
        )
    return draws


@dataclass(frozen=True, slots=True)
class _TwinRecord:
    """A twin network's recorded flows (:meth:`NetworkPathsScenario.truth_twins`), read once."""

    path: Path
    twin: str
    columns: dict[str, np.ndarray]

    @classmethod
    def read(cls, path: Path, twin: str, n_flows: int) -> _TwinRecord:
        import pyarrow.parquet as pq

        names = ["flow_id", "size_bytes", "slowdown", "ideal_fct_s", "fct_s"]
        table = pq.read_table(path, columns=names)
        columns = {name: table.column(name).to_numpy() for name in names}
        ids = columns["flow_id"]
        if len(ids) and (ids.min() < 0 or ids.max() >= n_flows):
            raise InputError(
                f"flow ids outside this network's {n_flows} flows", file=str(path), field="flow_id"
            )
        return cls(path=path, twin=twin, columns=columns)

    def truth(self, n_flows: int) -> tuple[np.ndarray, ...]:
        """Slowdown, ideal FCT and FCT per network flow: NaN but the recorded flows."""
        out = []
        for name in ("slowdown", "ideal_fct_s", "fct_s"):
            full = np.full(n_flows, np.nan)
            full[self.columns["flow_id"]] = self.columns[name]
            out.append(full)
        return tuple(out)

    def check(self, flow_ids: list, sizes: list) -> None:
        """The record must hold exactly the flows this network's sampled paths carry, in order
        (the same network, seed and draws); anything else is refused by name."""
        if not (
            np.array_equal(self.columns["flow_id"], np.concatenate(flow_ids))
            and np.array_equal(self.columns["size_bytes"], np.concatenate(sizes))
        ):
            raise InputError(
                f"the record of network {self.twin} holds other flows than this network's "
                "sampled paths: not the same network",
                file=str(self.path),
                field="flow_id",
            )


def _first_rtt_only(network: M3Network) -> bool:
    """Whether the network's CC queues only its flows' first windows (standing_levels; the flag
    is the CC's, so any link rate asks it)."""
    from m4ray.sim.flowsim import standing_levels

    rdma = network.ns3(1e9, 1e9).rdma
    return standing_levels(rdma, [1e9], lambda: 0.0)[1]


__all__ = ["NetworkFamily", "NetworkPathsScenario", "recovered_draws"]
