"""Topology builders and the specs that name them in configs and scenarios.

* :func:`rail_cluster` — the SimAI gray-failure cluster: servers of GPUs on one NVSwitch each, one
  rail switch per GPU index, one spine. Default 4 × 8 = 32 GPUs, node ids as in
  ``reference/gray_failure.md``: GPUs 0–31, NVSwitches 32–35, rails 36–43, spine 44, 72 cables.
* :func:`fat_tree` — a k-ary fat-tree (k pods, k/2 edge and k/2 aggregation switches per pod,
  (k/2)² cores, k³/4 hosts), hosts first, then edge, aggregation and core switches.
* :func:`m4_fabric` — the 32-host, 10 Gbps fabric m4 trains on (ToR → aggregation → core).

Specs are small dataclasses with a ``build() -> Topology`` method; Hydra instantiates them from
``conf/topology/*.yaml`` and they travel inside a Scenario.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from m4ray.errors import InputError
from m4ray.fingerprint import added_field
from m4ray.sim.topology import Cable, Topology, read_topology


def rail_cluster(
    *,
    servers: int = 4,
    gpus_per_server: int = 8,
    nvlink_bps: float = 2400e9,
    nvlink_latency_s: float = 25e-9,
    nic_bps: float = 400e9,
    nic_latency_s: float = 500e-9,
    spine_bps: float = 400e9,
    spine_latency_s: float = 500e-9,
    gpu_type: str = "A100",
) -> Topology:
    """Rail-optimised GPU cluster; GPU ``g`` attaches to NVSwitch ``G + g // gpus_per_server``
    and to rail ``G + servers + g % gpus_per_server`` (``G`` GPUs); rails meet at one spine.
    """
    if servers < 1 or gpus_per_server < 1:
        raise InputError("servers and gpus_per_server must be >= 1", field="topology")
    n_gpus = servers * gpus_per_server
    first_nvswitch, first_rail = n_gpus, n_gpus + servers
    spine = first_rail + gpus_per_server
    cables = []
    for gpu in range(n_gpus):
        nvswitch = first_nvswitch + gpu // gpus_per_server
        rail = first_rail + gpu % gpus_per_server
        cables.append(Cable(gpu, nvswitch, nvlink_bps, nvlink_latency_s))
        cables.append(Cable(gpu, rail, nic_bps, nic_latency_s))
    cables += [
        Cable(first_rail + r, spine, spine_bps, spine_latency_s) for r in range(gpus_per_server)
    ]
    return Topology(
        n_nodes=spine + 1,
        switches=tuple(range(first_nvswitch, spine + 1)),
        nvswitches=tuple(range(first_nvswitch, first_rail)),
        cables=tuple(cables),
        gpus_per_server=gpus_per_server,
        gpu_type=gpu_type,
    )


def fat_tree(
    *,
    k: int = 4,
    bandwidth_bps: float = 100e9,
    latency_s: float = 1e-6,
    fabric_bandwidth_bps: float | None = None,
    oversubscription: int = 1,
) -> Topology:
    """k-ary fat-tree; k must be even and >= 2. Host links run at ``bandwidth_bps``, switch-switch
    links at ``fabric_bandwidth_bps`` (default: the same); each edge switch has
    ``k/2 × oversubscription`` hosts for its ``k/2`` uplinks (an ``oversubscription``:1 fabric)."""
    if k < 2 or k % 2:
        raise InputError(f"fat-tree arity must be an even number >= 2, got {k}", field="k")
    if oversubscription < 1:
        raise InputError(f"must be >= 1, got {oversubscription}", field="oversubscription")
    fabric = bandwidth_bps if fabric_bandwidth_bps is None else fabric_bandwidth_bps
    half = k // 2
    per_edge = half * oversubscription
    n_hosts = k * half * per_edge
    first_edge = n_hosts
    first_agg = first_edge + k * half
    first_core = first_agg + k * half
    n_nodes = first_core + half * half
    cables = []
    for pod in range(k):
        for e in range(half):
            edge = first_edge + pod * half + e
            for h in range(per_edge):
                host = (pod * half + e) * per_edge + h
                cables.append(Cable(host, edge, bandwidth_bps, latency_s))
            for a in range(half):
                cables.append(Cable(edge, first_agg + pod * half + a, fabric, latency_s))
        for a in range(half):
            agg = first_agg + pod * half + a
            for c in range(half):
                cables.append(Cable(agg, first_core + a * half + c, fabric, latency_s))
    return Topology(
        n_nodes=n_nodes, switches=tuple(range(first_edge, n_nodes)), cables=tuple(cables)
    )


def m4_fabric(
    *,
    racks: int = 8,
    hosts_per_rack: int = 4,
    racks_per_pod: int = 4,
    cores: int = 4,
    bandwidth_bps: float = 10e9,
    latency_s: float = 1e-6,
) -> Topology:
    """The m4 training fabric (``reference/m4.md`` §10.2): by default 32 hosts (0–31), 8 ToRs
    (32–39) with 4 hosts and one uplink each (4:1 oversubscribed), 2 aggregation switches (40–41,
    one per pod of 4 ToRs), 4 cores (42–45) meshed with every aggregation switch: 48 cables, all
    10 Gbps. Paths are 2 (same rack), 4 (same pod) or 6 (across pods) links long.
    """
    if racks < 1 or hosts_per_rack < 1 or racks_per_pod < 1 or cores < 1:
        raise InputError("racks, hosts_per_rack, racks_per_pod and cores must be >= 1")
    if racks % racks_per_pod:
        raise InputError(f"{racks} racks do not split into pods of {racks_per_pod}", field="racks")
    n_hosts = racks * hosts_per_rack
    pods = racks // racks_per_pod
    first_tor, first_agg = n_hosts, n_hosts + racks
    first_core = first_agg + pods
    cables = [
        Cable(h, first_tor + h // hosts_per_rack, bandwidth_bps, latency_s) for h in range(n_hosts)
    ]
    cables += [
        Cable(first_tor + t, first_agg + t // racks_per_pod, bandwidth_bps, latency_s)
        for t in range(racks)
    ]
    cables += [
        Cable(first_agg + a, first_core + c, bandwidth_bps, latency_s)
        for a in range(pods)
        for c in range(cores)
    ]
    return Topology(
        n_nodes=first_core + cores,
        switches=tuple(range(first_tor, first_core + cores)),
        cables=tuple(cables),
    )


@dataclass(kw_only=True, slots=True)
class M4FabricSpec:
    """Config/Scenario form of :func:`m4_fabric`."""

    racks: int = 8
    hosts_per_rack: int = 4
    racks_per_pod: int = 4
    cores: int = 4
    bandwidth_bps: float = 10e9
    latency_s: float = 1e-6

    def build(self) -> Topology:
        return m4_fabric(**{f: getattr(self, f) for f in self.__slots__})


@dataclass(kw_only=True, slots=True)
class RailClusterSpec:
    """Config/Scenario form of :func:`rail_cluster` (bits/s, seconds)."""

    servers: int = 4
    gpus_per_server: int = 8
    nvlink_bps: float = 2400e9
    nvlink_latency_s: float = 25e-9
    nic_bps: float = 400e9
    nic_latency_s: float = 500e-9
    spine_bps: float = 400e9
    spine_latency_s: float = 500e-9
    gpu_type: str = "A100"

    def build(self) -> Topology:
        return rail_cluster(**{f: getattr(self, f) for f in self.__slots__})


@dataclass(kw_only=True, slots=True)
class FatTreeSpec:
    """Config/Scenario form of :func:`fat_tree`."""

    k: int = 4
    bandwidth_bps: float = 100e9
    latency_s: float = 1e-6
    fabric_bandwidth_bps: float | None = added_field(None, "m3 / m4 v2 fat-trees")
    oversubscription: int = added_field(1, "m3 / m4 v2 fat-trees")

    def build(self) -> Topology:
        return fat_tree(
            k=self.k,
            bandwidth_bps=self.bandwidth_bps,
            latency_s=self.latency_s,
            fabric_bandwidth_bps=self.fabric_bandwidth_bps,
            oversubscription=self.oversubscription,
        )


@dataclass(kw_only=True, slots=True)
class TopologyFileSpec:
    """A topology read from a SimAI or ns-3 text file (absolute path)."""

    path: str

    def build(self) -> Topology:
        return read_topology(Path(self.path))
