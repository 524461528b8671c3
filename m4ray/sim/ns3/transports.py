"""The two transports of the ns-3 backend, each a config dataclass and the fabric it builds.

* :class:`RdmaConfig` (default) — RDMA NIC queue pairs over a PFC-lossless fabric with DCTCP rate
  control (``rdma.py``), as the field's reference simulator (HPCC's ns-3) models GPU fabrics.
  Defaults are the DCTCP settings of the m4 example scenario (``CC_MODE 8``): K per link rate
  (30 KB at 10 Gbps, 120 KB at 40 Gbps, interpolated between and held beyond), g = 1/16, rate AI
  615 Mbit/s, minimum rate 1 Gbit/s, window scaled with rate (``VAR_WIN``).
* :class:`TcpConfig` — ns-3's own TCP DCTCP (BulkSend → PacketSink per flow, RED/ECN queue discs,
  ``native.py``), kept for comparison with real TCP stacks (the emulation backend).

A fabric wraps the C++ network object (``net``: the same clock, timer, guard and recording
interface for both) and knows how to start one routed flow. Units: bytes, bits/s, seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from m4ray.errors import InputError, SimulationError
from m4ray.fingerprint import SINCE, added_field
from m4ray.models.fairshare import ACK_BYTES
from m4ray.sim.flows import Flow
from m4ray.sim.ns3.cc import CCS, cc_params, check_points, interpolate
from m4ray.sim.routing import Path, Routing, route_sums
from m4ray.sim.topology import Topology

IP_TCP_HEADERS = 52  # IPv4 20 B + TCP 20 B + timestamp option 12 B
FIRST_PORT, LAST_PORT = 1000, 49151  # TCP sink ports; ns-3's ephemeral ports start at 49152
NEVER_MARK = 2**63  # an ECN threshold no queue reaches
RDMA_HEADER_BYTES = 34  # m4ray's RDMA header (32 B) + PPP (2 B): the least a wire header can be


def to_ps(seconds: float) -> int:
    """Seconds as whole picoseconds (ns-3 runs at picosecond resolution here)."""
    return round(seconds * 1e12)


@dataclass(kw_only=True, slots=True)
class RdmaConfig:
    """RDMA transport settings. ``window_bytes=None``: one window for every flow, the largest
    bandwidth-delay product of the topology's host pairs plus one packet (HPCC's ``FIXED_WIN``
    rule), so a lone flow is never window-bound; 0 disables the window. ``ecn_k_bytes``: marking
    threshold K as ``[[rate_bps, bytes], ...]``, linear in rate between points, held beyond the
    ends. ``buffer_bytes`` is shared per switch; ``pfc_threshold_bytes`` is what one ingress port
    may hold before the switch pauses its upstream."""

    window_bytes: int | None = None
    var_window: bool = True
    ecn_k_bytes: list[list[float]] = field(
        default_factory=lambda: [[10e9, 30_000.0], [40e9, 120_000.0]]
    )
    dctcp_gain: float = 0.0625
    rate_ai_bps: float = 615e6
    min_rate_bps: float = 1e9
    buffer_bytes: int = 4_000_000
    pfc: bool = True
    pfc_threshold_bytes: int = 500_000
    ack_bytes: int = ACK_BYTES
    rto_s: float = 1e-3
    # a sender never exceeds this rate even on a faster NIC (HPCC's MAX_RATE; m3's parking lots
    # pace mid-path senders on fast access links at the edge rate); None = the NIC's line rate
    max_rate_bps: float | None = added_field(None, "m3 parking lots (issue 16)")
    # the congestion control (``cc.py``): dctcp (the settings above), dcqcn, hpcc or timely, and
    # its parameters by name (None: its defaults; a name the CC does not have is an error)
    cc: str = added_field("dctcp", "congestion controls (issue 31)")
    cc_params: dict[str, Any] | None = field(
        default=None, metadata={SINCE: "congestion controls (issue 31)"}
    )
    # ACKs ride switches' high-priority queue (False: they queue, count and wait with the data)
    ack_high_priority: bool = added_field(True, "congestion controls (issue 31)")
    # where max_rate_bps caps a faster NIC: the CC's reference rates (DCQCN's target, HPCC's and
    # TIMELY's current rate) start at, and DCQCN's target may rise to, the NIC's own rate, as in
    # the m3 fork of the reference (its parking lots' 100 Tbit/s cross-traffic host)
    cc_nic_rate: bool = added_field(False, "congestion controls (issue 31)")
    # > 0: the reference's dynamic PFC threshold, (buffer − bytes in use) / 2^shift per ingress
    # port (its upstream: 3, the m3 fork: 2), in place of pfc_threshold_bytes
    pfc_dynamic_shift: int = added_field(0, "congestion controls (issue 31)")
    # SimAI's ns-3 (the study's ground truth), where it differs from the reference's timing:
    # each packet's time on a wire and each pacing gap rounded to the whole ns (its
    # nanosecond clock: a 1,040 B packet takes 21 ns at 400 Gbit/s, 3 ns at 2,400)
    round_ns: bool = added_field(False, "SimAI's ns-3 timing (issue 29)")
    # DCTCP's α as the reference's HandleAckDctcp counts it (a batch's marks over the packets
    # in flight when it began, plus one; strict batch ends); False: over the ACKs received
    dctcp_reference_alpha: bool = added_field(False, "SimAI's ns-3 timing (issue 29)")
    # DCTCP's α of a new flow (the reference's and SimAI's: 1, so a flow's first marks halve
    # its rate); a probe of how much of a collective's ramp-up that start costs
    dctcp_alpha_init: float = added_field(1.0, "DCTCP's starting alpha (2026-11-30)")
    # "simai": the window SimAI gives every flow, its largest host-pair BDP counted as it does
    # (twice the propagation plus one payload's serialisation per hop, in whole ns, × the
    # bottleneck); "m4ray": a data packet out and an ACK back, plus one packet (window_bytes
    # null only)
    window_rule: str = added_field("m4ray", "SimAI's ns-3 timing (issue 29)")
    # a flow is done when its sender has the last ACK, as simulated (queued behind data where
    # switches queue ACKs with it), as SimAI's QpComplete; False: when its last byte arrives
    # (a replay that counts flows done at their last ACK then adds an idle path's ACK trip)
    done_at_ack: bool = added_field(False, "SimAI's ns-3 timing (issue 29)")
    # a port picks its next packet (switches: mark ECN on the queue it leaves; hosts: the next
    # queue pair) when its wire goes idle, as SimAI's device does; False: as the wire starts the
    # previous one, keeping one packet ready (no gap either way)
    feed_when_idle: bool = added_field(False, "SimAI's ns-3 timing (issue 29)")
    # a host NIC with no queue pair ready retries at the earliest next-send time over its queue
    # pairs with bytes left, window-bound ones included, only when that is still ahead and no
    # retry is pending, as SimAI's DequeueAndTransmit does; otherwise the next ACK in or transmit
    # done wakes it (a window-bound pair whose time has passed holds paced ones back). False:
    # a retry at the earliest time a ready pair may send
    nic_wake_simai: bool = added_field(False, "SimAI's ns-3 NIC (issue 29)")
    # RED marking under DCTCP, as the reference's switches judge every CC (KMIN_MAP, KMAX_MAP,
    # PMAX_MAP): none while what stays queued is at most K_min (ecn_k_bytes), every packet above
    # K_max (these points, linear in rate), probability rising to ecn_p_max between; null: the
    # step at K on the queue the packet leaves (K_min = K_max in the reference)
    ecn_k_max_bytes: list[list[float]] | None = field(
        default=None, metadata={SINCE: "SimAI's study RED (issue 29)"}
    )
    ecn_p_max: float = added_field(1.0, "SimAI's study RED (issue 29)")

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Reject impossible settings, naming the field (``ns3.rdma.<field>``)."""
        checks = [
            (self.window_bytes is None or self.window_bytes >= 0, "window_bytes", ">= 0 or null"),
            (0 < self.dctcp_gain <= 1, "dctcp_gain", "in (0, 1]"),
            (0 <= self.dctcp_alpha_init <= 1, "dctcp_alpha_init", "in [0, 1]"),
            (self.rate_ai_bps >= 0, "rate_ai_bps", ">= 0"),
            (self.min_rate_bps > 0, "min_rate_bps", "> 0"),
            (self.buffer_bytes > 0, "buffer_bytes", "> 0"),
            (self.ack_bytes >= RDMA_HEADER_BYTES, "ack_bytes", f">= {RDMA_HEADER_BYTES}"),
            (self.rto_s > 0, "rto_s", "> 0"),
            (self.max_rate_bps is None or self.max_rate_bps > 0, "max_rate_bps", "> 0 or null"),
            (0 <= self.pfc_dynamic_shift <= 16, "pfc_dynamic_shift", "in [0, 16]"),
            (self.window_rule in ("m4ray", "simai"), "window_rule", "'m4ray' or 'simai'"),
            (0 < self.ecn_p_max <= 1, "ecn_p_max", "in (0, 1]"),
            (
                0 < self.pfc_threshold_bytes < self.buffer_bytes,
                "pfc_threshold_bytes",
                f"in (0, buffer_bytes = {self.buffer_bytes})",
            ),
        ]
        for ok, name, rule in checks:
            if not ok:
                raise InputError(f"must be {rule}", field=f"ns3.rdma.{name}")
        self.cc_config()  # an unknown CC or parameter fails here
        if self.cc == "hpcc" and self.window_bytes == 0:
            raise InputError("HPCC needs a window (window_bytes null or > 0)", field="ns3.rdma.cc")
        points = self.ecn_k_bytes
        check_points(points, "ns3.rdma.ecn_k_bytes")
        if self.ecn_k_max_bytes is not None:
            if self.cc != "dctcp":
                raise InputError(
                    f"RED points are DCTCP's ({self.cc} has its own marking)",
                    field="ns3.rdma.ecn_k_max_bytes",
                )
            check_points(self.ecn_k_max_bytes, "ns3.rdma.ecn_k_max_bytes")
            points = [*points, *self.ecn_k_max_bytes]
        if max(p[1] for p in points) >= self.buffer_bytes:
            raise InputError(
                f"K {max(p[1] for p in points):g} B is not below the buffer "
                f"({self.buffer_bytes} B): nothing would ever be marked",
                field="ns3.rdma.ecn_k_bytes",
            )

    def cc_config(self):
        """The congestion control's parameters (:mod:`~m4ray.sim.ns3.cc`; None for DCTCP)."""
        return cc_params(self.cc, self.cc_params)

    def ecn_k(self, rate_bps: float) -> int:
        """Marking threshold (bytes) of a port sending at ``rate_bps``."""
        return round(interpolate(self.ecn_k_bytes, rate_bps))

    def red_marking(self, rate_bps: float) -> tuple[int, int, float, str] | None:
        """RED at a port sending at ``rate_bps``: (K_min, K_max bytes, P_max, the field that
        sets K_max) — DCQCN's, or DCTCP's with ``ecn_k_max_bytes`` — or None (DCTCP's step)."""
        if self.cc == "dcqcn":
            params = self.cc_config()
            return (*params.red(rate_bps), params.p_max, "cc_params.k_max_bytes")
        if self.ecn_k_max_bytes is None:
            return None
        kmin = self.ecn_k(rate_bps)
        kmax = max(kmin + 1, round(interpolate(self.ecn_k_max_bytes, rate_bps)))
        return kmin, kmax, self.ecn_p_max, "ecn_k_max_bytes"

    def window(self, routing: Routing) -> int:
        """The window every flow gets (bytes; 0 = none)."""
        if self.window_bytes is not None:
            return self.window_bytes
        if self.window_rule == "simai":
            return simai_window_bytes(routing)
        return bdp_window_bytes(routing, self.ack_bytes)

    def params13(self, routing: Routing) -> list[float]:
        """m4's vector (reference/m4.md §3.1): buffer in 10 KB, window in KB, the CC one-hot
        and its parameters — DCTCP's K and DCQCN's K_min, K_max in KB at the lowest rate,
        HPCC's η in % and AI in 10 Mbit/s, TIMELY's thresholds in µs."""
        vec = [0.0] * len(PARAMS13)
        vec[0] = self.buffer_bytes / 1000 / 10
        vec[1] = self.window(routing) / 1000
        vec[2 + CCS[self.cc][0]] = 1.0
        params = self.cc_config()
        if self.cc == "dctcp":
            vec[6] = min(self.ecn_k_bytes)[1] / 1000
        elif self.cc == "dcqcn":
            vec[7] = min(params.k_min_bytes)[1] / 1000
            vec[8] = min(params.k_max_bytes)[1] / 1000
        elif self.cc == "hpcc":
            vec[9] = params.target_utilization / 0.01
            vec[10] = params.rate_ai_bps / 1e6 / 10
        else:
            vec[11] = params.t_low_s * 1e6
            vec[12] = params.t_high_s * 1e6
        return vec

    def fabric(self, ns, topology: Topology, routing: Routing) -> RdmaFabric:
        return RdmaFabric(ns, topology, routing, self)


def bdp_window_bytes(routing: Routing, ack_bytes: int) -> int:
    """RDMA's default window (the reference's): the largest bandwidth-delay product over host
    pairs (:func:`max_bdp_bytes`) plus one packet."""
    wire = routing.wire
    return math.ceil(max_bdp_bytes(routing, ack_bytes)) + wire.mtu_bytes + wire.header_bytes


def max_bdp_bytes(routing: Routing, ack_bytes: int) -> float:
    """Largest bottleneck bandwidth × round trip (first data packet out, an ACK back) over host
    pairs, in bytes. Paths from up to 16 evenly spaced source hosts to every host: all pairs on
    small topologies, the symmetric classes of large regular ones. Routed at once
    (:meth:`~m4ray.sim.routing.Routing.links_many`, the paths :meth:`Routing.path` takes) and
    kept on ``routing`` (the m4 backend asks twice per scenario: its params13 and its window)."""
    return _host_pair_extremes(routing, ack_bytes)[0]


def max_base_rtt_s(routing: Routing, ack_bytes: int) -> float:
    """HPCC's T with one T for all pairs (the reference's ``GLOBAL_T``): the largest base RTT
    over the pairs of :func:`max_bdp_bytes`, as the reference counts it (twice the one-way
    propagation plus one payload's serialisation on each forward link)."""
    return _host_pair_extremes(routing, ack_bytes)[1]


def simai_window_bytes(routing: Routing) -> int:
    """SimAI's window for every flow (its ns-3 front end, ``common.h``): the largest over host
    pairs of the base RTT — twice the propagation plus one payload's serialisation on each hop,
    in whole nanoseconds — times the path's bottleneck, in bytes. The study's 32-GPU cluster:
    4,080 ns × 400 Gbit/s = 204,000 B."""
    memo = routing.memo.get("simai_window_bytes")
    if memo is not None:
        return memo
    table, on, link = _pair_links(routing)
    topo = routing.topo
    latency_ns = np.where(on, np.rint(topo.latency_s[link] * 1e9), 0.0).sum(axis=1)
    serial_ns = np.where(
        on, np.floor(routing.wire.mtu_bytes * 8e9 / topo.bandwidth_bps[link]), 0.0
    ).sum(axis=1)
    bottleneck = np.where(on, topo.bandwidth_bps[link], np.inf).min(axis=1)
    best = int(((2 * latency_ns + serial_ns) * bottleneck / 8e9).max()) if len(table) else 0
    routing.memo["simai_window_bytes"] = best
    return best


def _pair_links(routing: Routing) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The link table of :func:`max_bdp_bytes`'s host pairs (-1 padded), where it is a link,
    and the links with padding as link 0."""
    hosts = routing.topo.hosts
    step = max(1, len(hosts) // 16)
    pairs = [(src, dst) for src in hosts[::step] for dst in hosts if dst != src]
    if not pairs:
        empty = np.zeros((0, 0), dtype=np.int64)
        return empty, empty.astype(bool), empty
    src, dst = np.array(pairs, dtype=np.int64).T
    table = routing.links_many(src, dst, np.zeros(len(pairs), dtype=np.int64))
    on = table >= 0
    return table, on, np.where(on, table, 0)


def _host_pair_extremes(routing: Routing, ack_bytes: int) -> tuple[float, float]:
    memo = routing.memo.get(("max_bdp_bytes", ack_bytes))
    if memo is not None:
        return memo
    table, on, link = _pair_links(routing)
    if not len(table):
        return 0.0, 0.0
    topo = routing.topo
    latency, inverse = route_sums(table, topo.latency_s, topo.bandwidth_bps)
    bottleneck = np.where(on, topo.bandwidth_bps[link], np.inf).min(axis=1)
    packet = routing.wire.mtu_bytes + routing.wire.header_bytes
    rtt = 2 * latency + (packet + ack_bytes) * 8 * inverse
    base_rtt = 2 * latency + routing.wire.mtu_bytes * 8 * inverse
    best = float((bottleneck * rtt / 8).max()), float(base_rtt.max())
    routing.memo[("max_bdp_bytes", ack_bytes)] = best
    return best


def _set_cc(p, cfg: RdmaConfig, routing: Routing) -> None:
    """The congestion control's settings on the C++ ``RdmaParams`` ``p``."""
    params = cfg.cc_config()
    p.cc = CCS[cfg.cc][0]
    if cfg.cc == "dcqcn":
        p.cc_ai, p.cc_hai, p.dcqcn_gain = params.rate_ai_bps, params.rate_hai_bps, params.gain
        p.alpha_ps, p.decrease_ps = (
            to_ps(params.alpha_interval_s),
            to_ps(params.decrease_interval_s),
        )
        p.increase_ps, p.fast_recovery = (
            to_ps(params.increase_interval_s),
            params.fast_recovery_steps,
        )
        p.clamp, p.first_cnp = params.clamp_target_rate, params.rate_on_first_cnp
    elif cfg.cc == "hpcc":
        p.cc_ai, p.eta, p.max_stage = (
            params.rate_ai_bps,
            params.target_utilization,
            params.max_stage,
        )
        p.fast_react, p.int_bytes = params.fast_react, params.int_bytes
        p.ack_int_bytes = params.ack_int_bytes
        rtt = params.base_rtt_s or max_base_rtt_s(routing, cfg.ack_bytes)
        p.base_rtt_ps = max(1, to_ps(rtt))
    elif cfg.cc == "timely":
        p.cc_ai, p.cc_hai, p.beta, p.ewma = (
            params.rate_ai_bps,
            params.rate_hai_bps,
            params.beta,
            params.ewma,
        )
        p.t_low_ps, p.t_high_ps = params.t_low_s * 1e12, params.t_high_s * 1e12
        p.min_rtt_ps, p.int_bytes = params.min_rtt_s * 1e12, params.int_bytes


class RdmaFabric:
    """The RDMA C++ network for one topology; flows start with the configured window."""

    def __init__(self, ns, topology: Topology, routing: Routing, cfg: RdmaConfig) -> None:
        from m4ray.sim.ns3.rdma import compiled

        native = compiled()
        wire = routing.wire
        if wire.header_bytes < RDMA_HEADER_BYTES:
            raise InputError(
                f"the RDMA transport needs >= {RDMA_HEADER_BYTES} header bytes per packet",
                field="wire.header_bytes",
            )
        p = native.RdmaParams()
        p.mtu, p.header, p.ack_bytes = wire.mtu_bytes, wire.header_bytes, cfg.ack_bytes
        p.gain, p.alpha_init = cfg.dctcp_gain, cfg.dctcp_alpha_init
        p.rate_ai, p.min_rate = cfg.rate_ai_bps, cfg.min_rate_bps
        p.var_window, p.buffer, p.pfc = cfg.var_window, cfg.buffer_bytes, cfg.pfc
        p.pfc_threshold, p.rto_ps = cfg.pfc_threshold_bytes, to_ps(cfg.rto_s)
        p.max_rate = cfg.max_rate_bps or 0.0
        _set_cc(p, cfg, routing)
        p.ack_high, p.cc_nic_rate = cfg.ack_high_priority, cfg.cc_nic_rate
        p.pfc_shift = cfg.pfc_dynamic_shift
        p.round_ns, p.dctcp_reference = cfg.round_ns, cfg.dctcp_reference_alpha
        p.done_at_ack, p.feed_idle = cfg.done_at_ack, cfg.feed_when_idle
        p.nic_wake_simai = cfg.nic_wake_simai
        is_switch = np.ones(topology.n_nodes, dtype=np.uint8)
        is_switch[list(topology.hosts)] = 0
        is_switch[list(topology.nvswitches)] = 2  # no ECN, PFC or drops (SimAI's NVSwitch)
        nvswitch = set(topology.nvswitches)
        self.net = native.RdmaNetwork(
            topology.n_nodes, ns.cppyy.gbl.std.vector["unsigned char"](is_switch.tolist()), p
        )
        for cable in topology.cables:
            # K is per link; a link out of an NVSwitch never marks (one K serves both ends, so
            # both directions of a GPU-NVSwitch cable go unmarked: hosts never mark anyway)
            on_nvswitch = cable.a in nvswitch or cable.b in nvswitch
            self.net.AddLink(
                cable.a,
                cable.b,
                cable.bandwidth_bps,
                to_ps(cable.latency_s),
                NEVER_MARK if on_nvswitch else cfg.ecn_k(cable.bandwidth_bps),
                cable.error_rate,
            )
            red = None if on_nvswitch else cfg.red_marking(cable.bandwidth_bps)
            if red is not None:  # RED in place of the step (both ways)
                kmin, kmax, p_max, source = red
                if kmax >= cfg.buffer_bytes:
                    raise InputError(
                        f"K_max {kmax} B at {cable.bandwidth_bps:g} bit/s is not below the "
                        f"buffer ({cfg.buffer_bytes} B): RED would never mark",
                        field=f"ns3.rdma.{source}",
                    )
                link = self.net.n_links() - 2
                self.net.SetRed(link, kmin, kmax, p_max)
                self.net.SetRed(link + 1, kmin, kmax, p_max)
        self._window = cfg.window(routing)
        self._vector = ns.cppyy.gbl.std.vector["unsigned int"]

    def start(self, flow: Flow, path: Path, back: Path) -> None:
        self.net.StartFlow(
            flow.id,
            flow.size_bytes,
            self._vector(path.links),
            self._vector(back.links),
            self._window,
        )

    def sent_bytes(self) -> np.ndarray:
        """Bytes each directed link has put on its wire so far (data, ACKs and control frames,
        PPP header included; the topology's link ids)."""
        return np.array([self.net.SentBytes(link) for link in range(self.net.n_links())])

    def marked_packets(self) -> np.ndarray:
        """Data packets each directed link has marked CE so far (the topology's link ids)."""
        return np.array([self.net.Marked(link) for link in range(self.net.n_links())])

    def counters(self) -> dict[str, int]:
        """Drops, retransmission timeouts, PFC pauses, ECN marks, retransmitted packets, NACKs
        the longest data queue of any fabric switch port and the mean queue a data packet found
        at one on arrival (bytes)."""
        net = self.net
        return {
            "drops": int(net.drops),
            "timeouts": int(net.timeouts),
            "pauses": int(net.pauses),
            "marks": int(net.marks),
            "retransmits": int(net.retransmits),
            "nacks": int(net.nacks),
            "max_queue_bytes": int(net.max_queue),
            "mean_queue_bytes": round(net.queue_sum / max(1, int(net.queue_samples))),
        }


@dataclass(kw_only=True, slots=True)
class TcpConfig:
    """ns-3 TCP DCTCP settings (seconds, bytes, packets); segment = the wire's ``mtu_bytes``."""

    ecn_k_packets: int = 20  # RED MinTh = MaxTh: DCTCP step-marking threshold
    buffer_packets: int = 400  # RED queue limit per port
    dctcp_gain: float = 0.0625
    initial_cwnd: int = 10
    min_rto_s: float = 1e-3
    initial_rtt_s: float = 100e-6
    clock_granularity_s: float = 1e-6
    delack_timeout_s: float = 50e-6
    conn_timeout_s: float = 10e-3
    socket_buffer_bytes: int = 16 << 20

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if self.ecn_k_packets < 1 or self.buffer_packets <= self.ecn_k_packets:
            raise InputError(
                "need 1 <= ecn_k_packets < buffer_packets", field="ns3.tcp.ecn_k_packets"
            )

    def params13(self, routing: Routing) -> list[float]:
        """m4's vector: DCTCP one-hot, buffer in 10 KB, initial window in KB, K in KB."""
        packet = routing.wire.mtu_bytes + IP_TCP_HEADERS
        vec = [0.0] * len(PARAMS13)
        vec[0] = self.buffer_packets * packet / 1000 / 10
        vec[1] = self.initial_cwnd * routing.wire.mtu_bytes / 1000
        vec[2] = 1.0
        vec[6] = self.ecn_k_packets * packet / 1000
        return vec

    def fabric(self, ns, topology: Topology, routing: Routing) -> TcpFabric:
        return TcpFabric(ns, topology, routing, self)


class TcpFabric:
    """The TCP C++ network: one sink port per flow at its receiver."""

    def __init__(self, ns, topology: Topology, routing: Routing, cfg: TcpConfig) -> None:
        from m4ray.sim.ns3.native import compiled

        native = compiled()
        self.segment = routing.wire.mtu_bytes
        _set_tcp_defaults(ns, cfg, self.segment)
        self.net = native.Network(topology.n_nodes)
        for cable in topology.cables:
            self.net.AddLink(
                cable.a,
                cable.b,
                cable.bandwidth_bps,
                to_ps(cable.latency_s),
                self.segment + IP_TCP_HEADERS,
                cfg.ecn_k_packets,
                cfg.buffer_packets,
                cable.error_rate,
            )
        self._vector = ns.cppyy.gbl.std.vector["unsigned int"]
        self._next_port: dict[int, int] = {}

    def start(self, flow: Flow, path: Path, back: Path) -> None:
        port = self._port(flow.dst)
        links = self._vector(path.links)
        self.net.Route(port, links, self._vector(back.links))
        self.net.StartFlow(flow.id, port, flow.size_bytes, links, 8 * self.segment)

    def counters(self) -> dict[str, int]:
        return {}

    def sent_bytes(self) -> np.ndarray:
        raise InputError("per-link bytes are counted by the RDMA transport only", field="transport")

    def marked_packets(self) -> np.ndarray:
        raise InputError("per-link marks are counted by the RDMA transport only", field="transport")

    def _port(self, host: int) -> int:
        port = self._next_port.get(host, FIRST_PORT)
        if port > LAST_PORT:
            raise SimulationError(f"more than {LAST_PORT - FIRST_PORT + 1} flows to host {host}")
        self._next_port[host] = port + 1
        return port


def _set_tcp_defaults(ns, cfg: TcpConfig, segment: int) -> None:
    """Config defaults must be set before any node, socket or queue disc exists."""
    string, uint, double = ns.StringValue, ns.UintegerValue, ns.DoubleValue
    boolean = ns.BooleanValue

    def time(seconds: float):
        return ns.TimeValue(ns.PicoSeconds(to_ps(seconds)))

    settings = {
        "ns3::TcpL4Protocol::SocketType": string("ns3::TcpDctcp"),
        "ns3::TcpSocket::SegmentSize": uint(segment),
        "ns3::TcpSocket::InitialCwnd": uint(cfg.initial_cwnd),
        "ns3::TcpSocket::SndBufSize": uint(cfg.socket_buffer_bytes),
        "ns3::TcpSocket::RcvBufSize": uint(cfg.socket_buffer_bytes),
        "ns3::TcpSocket::ConnTimeout": time(cfg.conn_timeout_s),
        "ns3::TcpSocket::DelAckTimeout": time(cfg.delack_timeout_s),
        "ns3::TcpSocket::DelAckCount": uint(2),
        "ns3::TcpSocketBase::MinRto": time(cfg.min_rto_s),
        "ns3::TcpSocketBase::ClockGranularity": time(cfg.clock_granularity_s),
        "ns3::RttEstimator::InitialEstimation": time(cfg.initial_rtt_s),
        "ns3::TcpDctcp::DctcpShiftG": double(cfg.dctcp_gain),
        "ns3::RedQueueDisc::UseEcn": boolean(True),
        "ns3::RedQueueDisc::UseHardDrop": boolean(False),
        "ns3::RedQueueDisc::QW": double(1.0),
        "ns3::RedQueueDisc::Gentle": boolean(False),
    }
    for name, value in settings.items():
        ns.Config.SetDefault(name, value)


PARAMS13 = (  # the names of m4's network/CC vector, in order (reference/m4.md §3.1)
    "bfsz",
    "fwin",
    "dctcp",
    "dcqcn",
    "hpcc",
    "timely",
    "dctcp_k",
    "dcqcn_k_min",
    "dcqcn_k_max",
    "hpcc_u_tgt",
    "hpcc_ai",
    "timely_t_low",
    "timely_t_high",
)
