"""The fluid models' fair share, which flowSim (:mod:`m4ray.sim.flowsim`) and m4's anchor
(:mod:`m4ray.models.fluid`) both drain flows by: max-min fair rates by progressive filling (in
numpy, the reference, and in C, ``_maxmin.c``), RDMA's ACK load on the reverse links and a
sender's fixed window as a rate cap. It sits in the models layer, below the simulators, so the
training data, the m4 engine and flowSim share one definition.

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
from m4ray.models.wire import WireFormat

_REL_TIE = 1e-9  # completions within this relative distance of the earliest finish together
ACK_BYTES = 64  # an RDMA ACK's wire bytes (the ns-3 NIC's default, RdmaConfig.ack_bytes)
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
    flow_links: list[np.ndarray] | None,
    capacity_bps: np.ndarray,
    rate_cap_bps: np.ndarray | None = None,
    csr: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """:func:`max_min_rates` in C (``_maxmin.c``; per-flow caps or none), falling back to it
    where nothing compiles. The two agree to rounding (``tests/sim/test_flowsim.py``). ``csr``:
    the flows' :func:`flow_csr`, when the caller already has it (then ``flow_links`` may be
    None)."""
    lib = _compiled()
    off, idx = csr if csr is not None else flow_csr(flow_links)
    n = len(off) - 1
    if lib is None or n == 0:
        if flow_links is None:
            flow_links = np.split(idx, off[1:-1]) if n else []
        return max_min_rates(flow_links, capacity_bps, rate_cap_bps)
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


def fifo_rates(
    csr: tuple[np.ndarray, np.ndarray],
    capacity_bps: np.ndarray,
    caps: np.ndarray | None,
    start: np.ndarray,
    in_order: np.ndarray,
) -> np.ndarray:
    """Rates under FIFO service (``m4ray.sim.flowsim``'s module docstring): the flows
    ``in_order`` by ``start`` (stably), each instant's sharing max-min
    (:func:`compiled_max_min_rates`, under ``caps``; None: none) what the earlier instants left
    on each link, floored at 0; then the others sharing what is left. Flows as CSR
    ``(offsets, link ids)``. flowSim's numpy loop (flows kept in arrival order:
    ``fs_fifo_share`` in ``_maxmin.c`` is its twin, sum for sum) and m4's FIFO anchor
    (:class:`~m4ray.models.fluid.Fluid`) share it."""
    off, idx = csr
    residual = np.array(capacity_bps, dtype=np.float64)
    rates = np.zeros(len(off) - 1)
    lens = np.diff(off)
    first = np.flatnonzero(in_order)
    first = first[np.argsort(start[first], kind="stable")]
    groups = np.split(first, np.flatnonzero(np.diff(start[first]) != 0) + 1)
    for members in [*groups, np.flatnonzero(~in_order)]:
        if not len(members):
            continue
        sub_idx = np.concatenate([idx[off[m] : off[m + 1]] for m in members])
        sub_off = np.zeros(len(members) + 1, dtype=np.int64)
        np.cumsum(lens[members], out=sub_off[1:])
        got = compiled_max_min_rates(
            None, residual, None if caps is None else caps[members], (sub_off, sub_idx)
        )
        rates[members] = got
        used = np.bincount(sub_idx, np.repeat(got, lens[members]), len(residual))
        residual = np.maximum(residual - used, 0.0)
    return rates


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


def round_trip_s(
    wire: WireFormat, latency_s: float, inverse_bw_sum: float, ack_bytes: int = ACK_BYTES
) -> float:
    """A packet's round trip over a path of one-way ``latency_s`` and Σ 1/bandwidth: a full
    packet's delivery and an ACK's return over the same links (:class:`Window`'s, and the
    standing queues' excess in flight, ``m4ray.sim.flowsim.StandingQueues``)."""
    packet = (wire.mtu_bytes + wire.header_bytes) * 8.0
    return 2 * latency_s + (packet + ack_bytes * 8.0) * inverse_bw_sum


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
    ack_bytes: int = ACK_BYTES

    def limit(self, wire: WireFormat, path, bits: float) -> tuple[float, float]:
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
        rtt = round_trip_s(wire, latency_s, inverse_bw_sum, self.ack_bytes)
        k = math.ceil(self.bytes / wire.mtu_bytes)
        tx = packet / bottleneck_bps
        if rtt <= k * tx:
            return np.inf, bits
        packets = math.ceil(bits / packet - 1e-9)
        late = (packets - 1) // k * (rtt - k * tx)
        cap = k * packet / rtt
        return cap, (bits / bottleneck_bps + late) * cap

    @classmethod
    def of(cls, network, routing) -> Window | None:
        """The window of an ns-3 network config (``Ns3Config``): RDMA's, else None (TCP's
        congestion window is no fixed window)."""
        if network.transport != "rdma":
            return None
        return cls(network.rdma.window(routing), network.rdma.ack_bytes)
