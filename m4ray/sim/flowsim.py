"""flowSim: the max-min fair fluid backend.

Every active flow drains at its max-min fair rate, found by progressive filling over the directed
links it crosses and recomputed at every arrival and completion (``reference/flowsim_m3.md`` A.1,
A.2). A flow of ``S`` bytes carries ``wire_bytes(S) * 8`` bits; when its last bit has drained it is
delivered :meth:`~m4ray.sim.routing.Routing.delivery_delay` later (one-way propagation plus the
first packet's store-and-forward beyond the bottleneck), so a flow that never shares a link has
FCT = ideal FCT (slowdown 1) under the one FCT convention of ``m4ray.sim.routing``, as in m3's
``sldn_flowsim = (fct + base_delay) / ideal``. Simultaneous events are processed
together before one rate computation; completion wins ties with arrivals.

With ``ack_load`` (:class:`FlowSimConfig`) the receivers' ACKs take their share of the links too
(:func:`ack_capacity`): RDMA ACKs every data packet, and where a cable carries data both ways
(every ring step of a collective) the ACKs of one direction's data ride with the other's,
which then gets ``1 / (1 + ack / packet)`` of the link — what ns-3 RDMA gives (0.7 % with jumbo
frames, 6 % with 1,000-byte packets), and why classic flowSim is 0.2–0.7 % fast on the
gray-failure grid.

Units: seconds, bits, bits/s.
"""

from __future__ import annotations

import ctypes
import functools
import math
from dataclasses import dataclass
from pathlib import Path as FilePath

import numpy as np

from m4ray import native
from m4ray.errors import InputError, SimulationError
from m4ray.sim.backend import DoneCallback, EventQueue, QueueClock
from m4ray.sim.flows import Flow
from m4ray.sim.routing import Path, Routing, WireFormat
from m4ray.sim.topology import Topology

_REL_TIE = 1e-9  # completions within this relative distance of the earliest finish together
ACK_PASSES = 3  # max-min passes of a share with ACK load (the m4 anchor's too: fluid.py, _core.c)


def max_min_rates(
    flow_links: list[np.ndarray],
    capacity_bps: np.ndarray,
    rate_cap_bps: float | np.ndarray | None = None,
) -> np.ndarray:
    """Max-min fair rates (bits/s) of flows crossing the given links, by progressive filling.

    ``flow_links[i]`` holds the link ids of flow ``i``; ``capacity_bps`` is indexed by link id.
    ``rate_cap_bps`` caps every flow (m3's NIC cap) or, as an array, each flow (a window's
    rate, :class:`Window`): a capped flow is a flow crossing one more link of its own. None
    means links alone limit flows.
    """
    n = len(flow_links)
    if n == 0:
        return np.zeros(0)
    caps = None
    if rate_cap_bps is not None:
        caps = np.broadcast_to(np.asarray(rate_cap_bps, dtype=np.float64), (n,))
    lengths = np.fromiter((len(p) for p in flow_links), dtype=np.int64, count=n)
    flow_of = np.repeat(np.arange(n), lengths)
    used_links, link_of = np.unique(np.concatenate(flow_links), return_inverse=True)
    n_used = len(used_links)
    remaining = capacity_bps[used_links].astype(
        np.float64
    )  # capacity not yet given to frozen flows
    load = np.bincount(link_of, minlength=n_used).astype(np.float64)  # unfrozen flows per link
    open_edge = np.ones(len(flow_of), dtype=bool)
    open_flow = np.ones(n, dtype=bool)
    rate = np.zeros(n)
    while True:
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(load > 0, remaining / load, np.inf)
        level = share.min()
        hit = np.zeros(n, dtype=bool)
        if caps is not None and (capped := caps[open_flow].min()) < level:
            # the lowest caps bind before any link does: those flows freeze at their cap
            hit[open_flow & (caps <= capped * (1 + _REL_TIE))] = True
            rate[hit] = caps[hit]
            frozen_edge = open_edge & hit[flow_of]
            used = np.bincount(
                link_of[frozen_edge], weights=rate[flow_of[frozen_edge]], minlength=n_used
            )
        else:
            # every unfrozen flow crossing a bottleneck link freezes at its fair share
            hit[flow_of[open_edge & (share[link_of] <= level * (1 + _REL_TIE))]] = True
            rate[hit] = max(level, 0.0)
            frozen_edge = open_edge & hit[flow_of]
            used = None
        open_edge &= ~frozen_edge
        counts = np.bincount(link_of[frozen_edge], minlength=n_used)
        load -= counts
        remaining -= counts * max(level, 0.0) if used is None else used
        if not open_edge.any():
            return rate
        if caps is not None:
            open_flow &= ~hit


@functools.cache
def _compiled() -> ctypes.CDLL | None:
    """``_maxmin.c`` built and loaded (once per process), or ``None`` without a compiler."""
    lib = native.load(FilePath(__file__).with_name("_maxmin.c"), "compiled flowSim max-min")
    if lib is not None:
        ptr = np.ctypeslib.ndpointer
        lib.m4ray_max_min.restype = ctypes.c_int
        lib.m4ray_max_min.argtypes = [
            ctypes.c_int64,
            ptr(np.int64, flags="C"),
            ptr(np.int64, flags="C"),
            ctypes.c_int64,
            ptr(np.float64, flags="C"),
            ctypes.c_void_p,
            ptr(np.float64, flags="C"),
        ]
    return lib


def flow_csr(flow_links: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Flows' links as offsets and one index array (flow ``i``: ``idx[off[i]:off[i + 1]]``)."""
    n = len(flow_links)
    off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, flow_links), np.int64, n), out=off[1:])
    idx = np.ascontiguousarray(np.concatenate(flow_links), dtype=np.int64)
    return off, idx


def compiled_max_min_rates(
    flow_links: list[np.ndarray],
    capacity_bps: np.ndarray,
    rate_cap_bps: np.ndarray | None = None,
    csr: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """:func:`max_min_rates` in C (``_maxmin.c``; per-flow caps or none), falling back to it
    where nothing compiles. The two agree to rounding (``tests/sim/test_flowsim.py``). ``csr``:
    the flows' :func:`flow_csr`, when the caller already has it."""
    lib = _compiled()
    n = len(flow_links)
    if lib is None or n == 0:
        return max_min_rates(flow_links, capacity_bps, rate_cap_bps)
    off, idx = csr if csr is not None else flow_csr(flow_links)
    capacity = np.ascontiguousarray(capacity_bps, dtype=np.float64)
    caps = None
    if rate_cap_bps is not None:
        caps = np.ascontiguousarray(np.broadcast_to(rate_cap_bps, (n,)), dtype=np.float64)
    rate = np.empty(n)
    status = lib.m4ray_max_min(
        n, off, idx, len(capacity), capacity, None if caps is None else caps.ctypes.data, rate
    )
    if status:
        raise MemoryError("compiled max-min: out of memory")
    return rate


def ack_capacity(
    capacity_bps: np.ndarray, reverse: np.ndarray, fraction: float, data_bps: np.ndarray
) -> np.ndarray:
    """Link capacities left to data once ACKs take theirs: link ``l`` carries the ACKs of the
    data on ``reverse[l]`` (the same cable's other direction; -1: none), ``fraction`` ACK
    bits per data bit (an ACK's wire bytes per data packet's); ``data_bps`` per link. At least
    1 % of a link stays for data. The m4 anchor's compiled core computes the same per link."""
    out = np.asarray(capacity_bps, dtype=np.float64).copy()
    has = np.flatnonzero(reverse >= 0)
    load = fraction * np.maximum(data_bps[reverse[has]], 0.0)
    out[has] = np.maximum(out[has] - load, 0.01 * out[has])
    return out


def reverse_links(n_links: int) -> np.ndarray:
    """Each directed link's reverse (the other direction of its cable: links ``2k``, ``2k+1``)."""
    return np.arange(n_links, dtype=np.int64) ^ 1


def ack_fraction(ack_bytes: float, wire: WireFormat) -> float:
    """ACK wire bits per data wire bit: one ACK of ``ack_bytes`` per full data packet."""
    return ack_bytes / (wire.mtu_bytes + wire.header_bytes)


def network_ack_fraction(network, wire: WireFormat) -> float:
    """:func:`ack_fraction` of an ns-3 network config (``Ns3Config``): RDMA ACKs every packet;
    0 for TCP (delayed, cumulative ACKs: not modelled)."""
    if network.transport != "rdma":
        return 0.0
    return ack_fraction(network.rdma.ack_bytes, wire)


@dataclass(frozen=True, slots=True)
class Window:
    """A sender's window of ``bytes`` payload (RDMA's fixed window; 0 = none): it may have ``k =
    ceil(bytes / mtu)`` packets in flight, so packet ``i + k`` leaves when packet ``i``'s ACK is
    back, one round trip (a full packet's delivery plus an ACK's return over the same links)
    after ``i`` left. Alone, a flow of ``n`` packets is then ``floor((n - 1) / k)`` rounds of
    ``rtt - k * tx`` late. Fluid form: the flow's rate is capped at ``k`` packets per round trip
    and its work set so that, alone, it drains in exactly the packet model's time; shared, it
    drains at the lesser of its fair share and the cap. A window of at least one bandwidth-delay
    product (ns-3's default) never binds."""

    bytes: int
    ack_bytes: int = 64

    def limit(self, wire: WireFormat, path: Path, bits: float) -> tuple[float, float]:
        """(rate cap in bits/s, bits to drain at the capped rate) of a flow of ``bits`` on the
        wire over ``path``; (inf, bits) where the window does not bind."""
        return self.limit_on(wire, path.latency_s, path.inverse_bw_sum, path.bottleneck_bps, bits)

    def limit_links(
        self, wire: WireFormat, latency_s: np.ndarray, bandwidth_bps: np.ndarray, bits: float
    ) -> tuple[float, float]:
        """:meth:`limit` for a path given as its links' latencies and rates (the engine's and the
        training data's link arrays, where no :class:`Path` is at hand)."""
        rates = np.asarray(bandwidth_bps, dtype=np.float64)
        return self.limit_on(
            wire, float(np.sum(latency_s)), float((1 / rates).sum()), float(rates.min()), bits
        )

    def limit_on(
        self,
        wire: WireFormat,
        latency_s: float,
        inverse_bw_sum: float,
        bottleneck_bps: float,
        bits: float,
    ) -> tuple[float, float]:
        """:meth:`limit` from a path's one-way latency, Σ 1/bandwidth and bottleneck."""
        if self.bytes <= 0:
            return np.inf, bits
        packet = (wire.mtu_bytes + wire.header_bytes) * 8.0
        rtt = 2 * latency_s + (packet + self.ack_bytes * 8.0) * inverse_bw_sum
        k = math.ceil(self.bytes / wire.mtu_bytes)
        tx = packet / bottleneck_bps
        if rtt <= k * tx:
            return np.inf, bits
        packets = math.ceil(bits / packet - 1e-9)
        late = (packets - 1) // k * (rtt - k * tx)
        cap = k * packet / rtt
        return cap, (bits / bottleneck_bps + late) * cap

    @classmethod
    def of(cls, network, routing: Routing) -> Window | None:
        """The window of an ns-3 network config (``Ns3Config``): RDMA's, else None (TCP's
        congestion window is no fixed window)."""
        if network.transport != "rdma":
            return None
        return cls(network.rdma.window(routing), network.rdma.ack_bytes)


@dataclass(kw_only=True, slots=True)
class FlowSimConfig:
    """flowSim settings. ``rate_cap_bps``: optional per-flow cap (NIC rate), None = links only;
    ``window_bytes``: a sender's fixed window (:class:`Window`, RDMA's), None = classic flowSim
    (no window; m3's and m4's baseline); ``ack_bytes`` the ACK's wire size for its round trip;
    ``ack_load``: ACKs (one per data packet) take their share of the reverse links
    (:func:`ack_capacity`; off: classic flowSim)."""

    rate_cap_bps: float | None = None
    window_bytes: int | None = None
    ack_bytes: int = 64
    ack_load: bool = False

    def __post_init__(self) -> None:
        if self.rate_cap_bps is not None and self.rate_cap_bps <= 0:
            raise InputError(f"must be > 0 or null, got {self.rate_cap_bps}", field="rate_cap_bps")
        if self.window_bytes is not None and self.window_bytes < 0:
            raise InputError(f"must be >= 0 or null, got {self.window_bytes}", field="window_bytes")
        if self.ack_bytes <= 0:
            raise InputError(f"must be > 0, got {self.ack_bytes}", field="ack_bytes")

    @classmethod
    def windowed(cls, network, routing: Routing, *, acks: bool = False) -> FlowSimConfig:
        """flowSim with the sender window of an ns-3 network config (``Ns3Config``; TCP: none),
        and with ``acks`` its ACKs' load (RDMA): the m4 anchor of a model with
        ``fluid_window`` (and ``fluid_acks``) alone."""
        window = Window.of(network, routing)
        if window is None:
            return cls()
        return cls(window_bytes=window.bytes, ack_bytes=window.ack_bytes, ack_load=acks)

    def build(self, topology: Topology, routing: Routing) -> FlowSim:
        return FlowSim(
            topology,
            routing,
            rate_cap_bps=self.rate_cap_bps,
            window=None if self.window_bytes is None else Window(self.window_bytes, self.ack_bytes),
            ack_fraction=ack_fraction(self.ack_bytes, routing.wire) if self.ack_load else 0.0,
        )


class FlowSim(QueueClock):
    """Event-driven max-min fluid simulation implementing ``NetworkBackend``."""

    def __init__(
        self,
        topology: Topology,
        routing: Routing,
        *,
        rate_cap_bps: float | None = None,
        window: Window | None = None,
        ack_fraction: float = 0.0,
    ):
        self.topology = topology
        self.routing = routing
        self.rate_cap_bps = rate_cap_bps
        self.window = window
        self.ack_fraction = ack_fraction
        self._reverse = reverse_links(topology.n_links)
        self._caps: list[float] = []
        self.events = EventQueue()
        self._now = 0.0
        self._capacity = topology.bandwidth_bps.copy()
        # active flows, parallel lists
        self._ids: list[int] = []
        self._links: list[np.ndarray] = []
        self._delay: list[float] = []
        self._done_cb: list[DoneCallback] = []
        self._remaining = np.zeros(0)  # bits
        self._rates = np.zeros(0)  # bits/s, valid while not self._dirty
        self._dirty = False
        self.n_events = 0  # arrivals + completions processed (for benchmarks)

    # ------------------------------------------------------------ protocol
    def send(self, flow: Flow, on_done: DoneCallback) -> None:
        path = self.routing.path(flow.src, flow.dst, flow.id)
        self._ids.append(flow.id)
        self._links.append(np.asarray(path.links, dtype=np.int64))
        self._delay.append(self.routing.delivery_delay(flow.size_bytes, path))
        self._done_cb.append(on_done)
        bits = self.routing.wire.wire_bytes(flow.size_bytes) * 8.0
        cap = np.inf if self.rate_cap_bps is None else self.rate_cap_bps
        if self.window is not None:
            window_cap, bits = self.window.limit(self.routing.wire, path, bits)
            cap = min(cap, window_cap)
        self._caps.append(cap)
        self._remaining = np.append(self._remaining, bits)
        self._dirty = True
        self.n_events += 1

    def run(self, until: float | None = None) -> None:
        horizon = float("inf") if until is None else until
        while True:
            t_event = self.events.peek_time()
            t_done, finishing = self._next_completion()
            t_next = min(t_event, t_done)
            if t_next == float("inf"):
                break
            if t_next > horizon:
                self._advance(horizon - self._now)
                self._now = horizon
                break
            if t_done <= t_event:
                self._advance(t_done - self._now)
                self._now = t_done
                self._complete(finishing)
            else:
                self._advance(t_event - self._now)
                self._now = t_event
                while self.events.peek_time() <= self._now:
                    _, fn = self.events.pop()
                    fn()

    def set_bandwidth(self, link: int, bandwidth_bps: float) -> None:
        """Change a directed link's rate now (a gray failure's onset); rates are recomputed."""
        self._capacity[link] = bandwidth_bps
        self._dirty = True

    # ------------------------------------------------------------ fluid state
    def _next_completion(self) -> tuple[float, np.ndarray]:
        if not self._ids:
            return float("inf"), np.zeros(0, dtype=np.int64)
        if self._dirty:
            capped = self.window is not None or self.rate_cap_bps is not None
            caps = np.array(self._caps) if capped else None
            self._rates = self._share(caps)
            self._dirty = False
        with np.errstate(divide="ignore"):
            left = np.where(self._rates > 0, self._remaining / self._rates, np.inf)
        # rounding in _advance can leave a drained flow a hair below zero bits: it finishes now
        # (a negative dt would make the tie test below select nothing and the loop spin forever)
        dt = max(float(left.min()), 0.0)
        if dt == np.inf:
            raise SimulationError("active flows with zero rate: a link has no capacity left")
        finishing = np.flatnonzero(left <= dt * (1 + _REL_TIE))
        return self._now + dt, finishing

    def _share(self, caps: np.ndarray | None) -> np.ndarray:
        """Max-min rates; with ACK load, again over the capacities the previous pass's ACKs
        leave, ``ACK_PASSES`` in all (the ACKs' share ``a`` is a fraction of a percent to a
        few, and the third pass leaves an error of ``a³``)."""
        csr = flow_csr(self._links)  # once for every pass
        rates = compiled_max_min_rates(self._links, self._capacity, caps, csr)
        if not self.ack_fraction:
            return rates
        off, every = csr
        lengths = np.diff(off)
        for _ in range(ACK_PASSES - 1):
            data = np.bincount(
                every, weights=np.repeat(rates, lengths), minlength=len(self._capacity)
            )
            capacity = ack_capacity(self._capacity, self._reverse, self.ack_fraction, data)
            rates = compiled_max_min_rates(self._links, capacity, caps, csr)
        return rates

    def _advance(self, dt: float) -> None:
        if dt > 0 and self._ids:
            self._remaining = self._remaining - self._rates * dt

    def _complete(self, finishing: np.ndarray) -> None:
        done = set(finishing.tolist())
        callbacks = [(self._ids[i], self._delay[i], self._done_cb[i]) for i in finishing.tolist()]
        keep = [i for i in range(len(self._ids)) if i not in done]
        self._ids = [self._ids[i] for i in keep]
        self._links = [self._links[i] for i in keep]
        self._delay = [self._delay[i] for i in keep]
        self._caps = [self._caps[i] for i in keep]
        self._done_cb = [self._done_cb[i] for i in keep]
        self._remaining = self._remaining[keep]
        self._dirty = True
        self.n_events += len(callbacks)
        for flow_id, delay, on_done in callbacks:
            t = self._now + delay
            self.events.push(t, lambda f=flow_id, t=t, cb=on_done: cb(f, t))
