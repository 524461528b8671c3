"""The parking-lot network of one path: the topology ns-3 runs it on, the latency terms, and
flowSim's completion times on it (``reference/flowsim_m3.md`` A.3, B.4, B.9).

Hosts ``0`` and ``L`` are the path's end hosts; switch ``j`` (node ``L + j``, ``1 <= j < L``) is the
path's ``j``-th node, and host ``j`` hangs off it on an *access* link far faster than any path link,
so background flows entering or leaving mid-path never meet anywhere but on the path (m3's ns-3 path
topologies use 100,000 Gbps links there). Every sender is paced at the NIC cap (the edge rate), as a
flow entering mid-path still comes from a host NIC: ns-3 gets ``RdmaConfig.max_rate_bps``, flowSim
``nic_cap_bps``, and the ideal FCT uses ``min(bottleneck, cap)``. The FCT convention is the
project's one (:mod:`m4ray.sim.routing`): slowdown = FCT / ideal FCT with the lot's own latencies.

Units: bytes, bits/s, seconds.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from m4ray.m3.paths import PathScenario
from m4ray.m3.pathsim import path_drain_times
from m4ray.sim.routing import Path, Routing, WireFormat
from m4ray.sim.topology import Cable, Topology

ACCESS_SPEEDUP = 100.0  # access links run this many times faster than the NIC cap


@dataclass(kw_only=True, slots=True)
class LotNetwork:
    """A path's links as a standalone network (bits/s, seconds)."""

    capacity_bps: tuple[float, ...]
    latency_s: tuple[float, ...]
    nic_cap_bps: float
    access_latency_s: float = 1e-6

    @classmethod
    def of(cls, scenario: PathScenario, *, nic_cap_bps: float | None = None) -> LotNetwork:
        """The lot of a path scenario; the NIC cap defaults to the slower end link's rate."""
        cap = scenario.capacity_bps
        return cls(
            capacity_bps=tuple(float(c) for c in cap),
            latency_s=tuple(float(t) for t in scenario.latency_s),
            nic_cap_bps=float(nic_cap_bps or min(cap[0], cap[-1])),
        )

    @property
    def n_links(self) -> int:
        return len(self.capacity_bps)

    def topology(self) -> Topology:
        """Hosts ``0..L`` (``j``: enters/leaves at path node ``j``), switches ``L+1 .. 2L-1``;
        path link ``k`` is directed link ``2k`` (cable ``k``, forward direction)."""
        n = self.n_links
        node = [0] + [n + j for j in range(1, n)] + [n]  # path node -> topology node
        cables = [
            Cable(node[k], node[k + 1], self.capacity_bps[k], self.latency_s[k]) for k in range(n)
        ]
        access = self.nic_cap_bps * ACCESS_SPEEDUP
        cables += [Cable(j, n + j, access, self.access_latency_s) for j in range(1, n)]
        return Topology(n_nodes=2 * n, switches=tuple(range(n + 1, 2 * n)), cables=tuple(cables))

    def routing(self, wire: WireFormat) -> Routing:
        return Routing(self.topology(), wire=wire)


def fg_bdp_bytes(routing: Routing, n_links: int, ack_bytes: int) -> float:
    """The foreground's bandwidth-delay product on a lot (bytes): edge rate × (one-way latency
    both ways + a data packet and an ACK stored and forwarded at every hop)."""
    path = routing.path(0, n_links)
    packet = routing.wire.mtu_bytes + routing.wire.header_bytes
    rtt = 2 * path.latency_s + (packet + ack_bytes) * 8 * path.inverse_bw_sum
    return path.bottleneck_bps * rtt / 8


def class_paths(routing: Routing, a: np.ndarray, b: np.ndarray, cap_bps: float) -> dict:
    """The lot route of each class ``(a, b)`` present, its bottleneck lowered to the NIC cap."""
    out: dict[tuple[int, int], Path] = {}
    for key in set(zip(a.tolist(), b.tolist(), strict=True)):
        path = routing.path(*key)
        out[key] = dataclasses.replace(path, bottleneck_bps=min(path.bottleneck_bps, cap_bps))
    return out


def ideal_and_delay(
    routing: Routing, scenario: PathScenario, cap_bps: float
) -> tuple[np.ndarray, np.ndarray]:
    """Per flow: the ideal FCT and the part of it that does not drain at the bottleneck (s)."""
    paths = class_paths(routing, scenario.a, scenario.b, cap_bps)
    ideal = np.empty(len(scenario.a))
    delay = np.empty(len(scenario.a))
    for i, (a, b, size) in enumerate(
        zip(scenario.a.tolist(), scenario.b.tolist(), scenario.size_bytes.tolist(), strict=True)
    ):
        path = paths[(a, b)]
        ideal[i] = routing.ideal_fct(size, path)
        delay[i] = routing.delivery_delay(size, path)
    return ideal, delay


def flowsim_fct(
    scenario: PathScenario, wire: WireFormat, lot: LotNetwork | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """flowSim on the path's lot: FCT (s) and slowdown of every (pseudo-)flow."""
    lot = lot or LotNetwork.of(scenario)
    bits = np.array([wire.wire_bytes(int(s)) * 8.0 for s in scenario.size_bytes.tolist()])
    drain = path_drain_times(
        scenario.a,
        scenario.b,
        bits,
        scenario.start_s,
        lot.capacity_bps,
        nic_cap_bps=lot.nic_cap_bps,
    )
    ideal, delay = ideal_and_delay(lot.routing(wire), scenario, lot.nic_cap_bps)
    fct = drain + delay
    return fct, fct / ideal
