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
import functools
from dataclasses import dataclass

import numpy as np

from m4ray.errors import InputError
from m4ray.m3.paths import PathScenario
from m4ray.m3.pathsim import path_drain_times
from m4ray.models.fairshare import round_trip_s
from m4ray.models.wire import wire_window
from m4ray.sim.flowsim import queue_caps, round_trip, standing_levels
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

    def path(self, a: int, b: int) -> Path:
        """The route of class ``(a, b)`` on :meth:`topology`, as ``routing(...).path(a, b)`` gives
        it (same sums in the same order), without building a router: the access link from host
        ``a`` unless ``a == 0``, path links ``a .. b-1``, the access link to host ``b`` unless
        ``b == L``. Cached by value: the lots of one fabric share their few distinct routes."""
        return _lot_path(
            self.capacity_bps, self.latency_s, self.nic_cap_bps, self.access_latency_s, a, b
        )


@functools.lru_cache(maxsize=4096)
def _lot_path(  # noqa: PLR0917 (a cache key)
    capacity_bps: tuple[float, ...],
    latency_s: tuple[float, ...],
    nic_cap_bps: float,
    access_latency_s: float,
    a: int,
    b: int,
) -> Path:
    access = nic_cap_bps * ACCESS_SPEEDUP
    hops = [(latency_s[k], capacity_bps[k]) for k in range(a, b)]
    if a > 0:
        hops.insert(0, (access_latency_s, access))
    if b < len(capacity_bps):
        hops.append((access_latency_s, access))
    return Path(
        links=(),  # not needed by the latency terms
        latency_s=sum(lat for lat, _ in hops),
        inverse_bw_sum=sum(1.0 / bw for _, bw in hops),
        bottleneck_bps=min(bw for _, bw in hops),
    )


def fg_bdp_bytes(lot: LotNetwork, wire: WireFormat, ack_bytes: int) -> float:
    """The foreground's bandwidth-delay product on a lot (bytes): edge rate × (one-way latency
    both ways + a data packet and an ACK stored and forwarded at every hop)."""
    path = lot.path(0, lot.n_links)
    packet = wire.mtu_bytes + wire.header_bytes
    rtt = 2 * path.latency_s + (packet + ack_bytes) * 8 * path.inverse_bw_sum
    return path.bottleneck_bps * rtt / 8


def class_paths(lot: LotNetwork, a: np.ndarray, b: np.ndarray) -> tuple[list[Path], np.ndarray]:
    """The lot route of each class ``(a, b)`` present (bottleneck lowered to the NIC cap), and
    each flow's index into them."""
    width = lot.n_links + 1
    # np.unique's sorted keys and inverse, by counting (the keys are < width², a few dozen)
    code = np.asarray(a, dtype=np.int64) * width + np.asarray(b, dtype=np.int64)
    present = np.bincount(code, minlength=width * width) > 0
    keys, inverse = np.flatnonzero(present), (np.cumsum(present) - 1)[code]
    paths = []
    for key in keys.tolist():
        paths.append(_capped(lot.path(*divmod(key, width)), lot.nic_cap_bps))
    return paths, inverse.reshape(-1)


@functools.lru_cache(maxsize=4096)
def _capped(path: Path, cap_bps: float) -> Path:
    return dataclasses.replace(path, bottleneck_bps=min(path.bottleneck_bps, cap_bps))


def ideal_and_delay(
    lot: LotNetwork, wire: WireFormat, scenario: PathScenario
) -> tuple[np.ndarray, np.ndarray]:
    """Per flow: the ideal FCT and the part of it that does not drain at the bottleneck (s):
    :meth:`Routing.ideal_fct` and :meth:`Routing.delivery_delay`, vectorised over classes."""
    paths, cls = class_paths(lot, scenario.a, scenario.b)
    latency = np.array([p.latency_s for p in paths])[cls]
    # the same operations as Routing, in the same order (bit-identical)
    store = np.array([p.inverse_bw_sum - 1 / p.bottleneck_bps for p in paths])[cls]
    bottleneck = np.array([p.bottleneck_bps for p in paths])[cls]
    size = np.asarray(scenario.size_bytes, dtype=np.int64)
    first = wire.wire_bytes(np.minimum(size, wire.mtu_bytes))
    delay = latency + first * 8 * store
    return delay + wire.wire_bytes(size) * 8 / bottleneck, delay


# each mode of PathQueues and the model.json key a checkpoint records it under (beside
# ``path_flowsim_queues``: whether path flowSim queues at all)
PATH_MODES = {
    "first_windows": "path_flowsim_first_windows",
    "bursts": "path_flowsim_bursts",
    "route_rtt": "path_flowsim_route_rtt",
    "rates": "path_flowsim_rates",
}


@dataclass(frozen=True, slots=True)
class PathQueues:
    """How path flowSim queues on a lot: the network's ``RdmaConfig`` (its CC's standing
    levels, window and ACKs) and whether a CC whose queue is only its first windows (HPCC)
    queues them (:func:`lot_queues`). A checkpoint records the mode it was trained with
    (``model.json`` ``path_flowsim_queues`` / ``path_flowsim_first_windows``)."""

    rdma: object
    first_windows: bool = False
    bursts: bool = False  # first windows over the level, up to the buffer (lot_queues)
    route_rtt: bool = False  # with bursts: each flow's round trip over its network route
    rates: bool = False  # under DCQCN: each flow keeps DCQCN's rate (rate_control)

    def __post_init__(self) -> None:
        if self.route_rtt and not self.bursts:
            raise InputError(
                "route round trips weigh first windows over the level: set bursts too",
                field="route_rtt",
            )

    def rate_control(self):
        """DCQCN's rates on this network's lots (:class:`~m4ray.sim.flowsim.DcqcnRates`, as
        network-wide flowSim's ``rate_control``), or None: not asked for, or another CC."""
        if not self.rates or self.rdma.cc != "dcqcn":
            return None
        from m4ray.sim.flowsim import DcqcnRates

        return DcqcnRates(cc_params=self.rdma.cc_params, min_rate_bps=self.rdma.min_rate_bps)

    def of(self, lot: LotNetwork, wire: WireFormat, scenario: PathScenario) -> tuple:
        return lot_queues(
            lot,
            wire,
            scenario,
            self.rdma,
            first_windows=self.first_windows,
            bursts=self.bursts,
            route_rtt=self.route_rtt,
        )


def lot_queues(
    lot: LotNetwork,
    wire: WireFormat,
    scenario: PathScenario,
    rdma,
    *,
    first_windows: bool = False,
    bursts: bool = False,
    route_rtt: bool = False,
) -> tuple[np.ndarray, float, list[float], bool, float]:
    """Path flowSim's standing queues on a lot (:class:`~m4ray.sim.flowsim.StandingQueues`'
    model) for an RDMA network (``RdmaConfig``): each flow's round trip over its lot route, the
    senders' window on the wire (no window: unbounded, a full link then holds its level), each
    path link's cap, the level its CC holds at its rate
    (:func:`~m4ray.sim.flowsim.standing_levels`, TIMELY's from the lot's largest round trip;
    link 0 leaves the source host: none), and whether only flows in their first round trip
    queue. A CC whose queue is only its first windows (HPCC) queues them with
    ``first_windows``, as network-wide flowSim does; without it, nothing (caps 0: as m3-v3 was
    trained: its checkpoint says which, ``model.json`` ``path_flowsim_first_windows``). With
    ``bursts`` the switch buffer last (0 without, and under a CC whose queue is only its first
    windows): flows in their first round trip queue their excess on top of the level, up to
    it (:attr:`~m4ray.sim.flowsim.StandingQueues.buffer_bytes`; ``model.json``
    ``path_flowsim_bursts``).

    With ``route_rtt`` (and ``bursts``; ``model.json`` ``path_flowsim_route_rtt``) a flow's
    round trip is its network route's (:attr:`~m4ray.m3.paths.PathScenario.route_latency_s`),
    as network-wide flowSim has it, not its lot segment's: a background flow's segment is
    shorter than its route, so its round trip, and the bandwidth-delay product it keeps its
    window beyond, came out short and its excess large (docs/m3.md, issue 32); TIMELY's level then
    takes the largest route round trip. A lot without routes (drawn as a lot, not cut from a
    network) is its flows' whole network: their segments are their routes."""
    paths, cls = class_paths(lot, scenario.a, scenario.b)
    class_rtt = np.array([round_trip(p, wire, rdma.ack_bytes) for p in paths])
    rtt = route = class_rtt[cls]
    if route_rtt and bursts and scenario.route_latency_s is not None:
        route = round_trip_s(
            wire, scenario.route_latency_s, scenario.route_inverse_bw, rdma.ack_bytes
        )
    levels, first_rtt = standing_levels(
        rdma, sorted(set(lot.capacity_bps)), lambda: float(route.max())
    )
    if first_rtt and not first_windows:  # nothing queues: no young flows to count either
        caps, first_rtt = np.zeros(len(lot.capacity_bps)), False
    else:
        caps = queue_caps(levels, lot.capacity_bps)
    caps[0] = 0.0
    # HPCC's queue is its first windows already: kept as they are (StandingQueues.of)
    buffer = float(rdma.buffer_bytes) if bursts and caps.any() and not first_rtt else 0.0
    if buffer:  # only the bursts' sums take each flow's own round trip
        rtt = route
    return rtt, wire_window(rdma.window_bytes or 0, wire), caps.tolist(), bool(first_rtt), buffer


def flowsim_fct(
    scenario: PathScenario,
    wire: WireFormat,
    lot: LotNetwork | None = None,
    queues: tuple[np.ndarray, float, list[float], bool] | None = None,
    rates=None,
) -> tuple[np.ndarray, np.ndarray]:
    """flowSim on the path's lot: FCT (s) and slowdown of every (pseudo-)flow; ``queues``
    (:func:`lot_queues`): each flow also waits for the standing queues it meets; ``rates``
    (:meth:`PathQueues.rate_control`): each flow keeps DCQCN's rate."""
    lot = lot or LotNetwork.of(scenario)
    bits = wire.wire_bytes(np.asarray(scenario.size_bytes, dtype=np.int64)) * 8.0
    drain = path_drain_times(
        scenario.a,
        scenario.b,
        bits,
        scenario.start_s,
        lot.capacity_bps,
        nic_cap_bps=lot.nic_cap_bps,
        queues=queues,
        rates=rates,
    )
    ideal, delay = ideal_and_delay(lot, wire, scenario)
    fct = drain + delay
    return fct, fct / ideal
