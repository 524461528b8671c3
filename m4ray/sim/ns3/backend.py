"""``backend=ns3``: the packet-level ground truth behind the ``NetworkBackend`` protocol.

Hosts and switches are ns-3 nodes; every cable is a point-to-point link with its rate and delay, a
1-packet NIC queue and a RED queue disc marking ECN at a step threshold (``Gentle=false``, ``QW=1``:
deterministic DCTCP marking); hosts run DCTCP with datacenter timers (``reference/ns3.md`` §4).
A flow is a BulkSend → PacketSink pair created when it starts, routed over exactly the path that
m4ray's :class:`~m4ray.sim.routing.Routing` gives it; it completes when its last byte reaches the
sink. The TCP segment size is the wire format's ``mtu_bytes`` (device MTU = segment + 52 B of
IP/TCP headers), so ideal FCTs and flowSim use the same packetisation as ns-3.

One simulation per process at a time (ns-3 keeps global state); an ns-3 assertion kills the
process, so sweeps run it inside Ray worker processes. A wall-clock guard stops a run that takes too
long and raises :class:`SimulationError`, keeping what completed.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from m4ray.errors import InputError, SimulationError
from m4ray.sim.backend import DoneCallback
from m4ray.sim.flows import Flow
from m4ray.sim.ns3.loader import load
from m4ray.sim.ns3.native import compiled
from m4ray.sim.routing import Routing, WireFormat
from m4ray.sim.topology import Topology

IP_TCP_HEADERS = 52  # IPv4 20 B + TCP 20 B + timestamp option 12 B
FIRST_PORT, LAST_PORT = 1000, 49151  # sink ports; ns-3's ephemeral ports start at 49152


@dataclass(kw_only=True, slots=True)
class Ns3Config:
    """ns-3 settings (seconds, bytes, packets). Packetisation comes from the wire format."""

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
    wall_limit_s: float = 3600.0  # graceful stop after this much wall-clock time
    guard_interval_s: float = 20e-6  # simulated time between wall-clock checks

    def build(self, topology: Topology, routing: Routing) -> Ns3Backend:
        return Ns3Backend(topology, routing, self)


PARAMS13 = (  # the names of m4's network/CC vector, in order
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


def params13(ns3: Ns3Config, wire: WireFormat) -> list[float]:
    """m4's 13-float network/CC vector for ns-3 settings (``reference/m4.md`` §3.1): DCTCP
    one-hot, buffer in units of 10 KB, initial window in KB for ``fwin``, marking threshold K in
    KB (raw)."""
    packet = wire.mtu_bytes + IP_TCP_HEADERS
    vec = [0.0] * len(PARAMS13)
    vec[0] = ns3.buffer_packets * packet / 1000 / 10
    vec[1] = ns3.initial_cwnd * wire.mtu_bytes / 1000
    vec[2] = 1.0
    vec[6] = ns3.ecn_k_packets * packet / 1000
    return vec


def _ps(seconds: float) -> int:
    return round(seconds * 1e12)


class Ns3Backend:
    """One ns-3 simulation implementing ``NetworkBackend``."""

    def __init__(self, topology: Topology, routing: Routing, cfg: Ns3Config) -> None:
        if cfg.ecn_k_packets < 1 or cfg.buffer_packets <= cfg.ecn_k_packets:
            raise InputError("need 1 <= ecn_k_packets < buffer_packets", field="ecn_k_packets")
        self.ns = ns = load()
        native = compiled()
        ns.Simulator.Destroy()  # drop any previous simulation of this process
        self.cfg, self.routing = cfg, routing
        self.segment = routing.wire.mtu_bytes
        _set_defaults(ns, cfg, self.segment)
        self.net = native.Network(topology.n_nodes)
        for cable in topology.cables:
            self.net.AddLink(
                cable.a,
                cable.b,
                cable.bandwidth_bps,
                _ps(cable.latency_s),
                self.segment + IP_TCP_HEADERS,
                cfg.ecn_k_packets,
                cfg.buffer_packets,
                cable.error_rate,
            )
        self._vector = ns.cppyy.gbl.std.vector["unsigned int"]
        self._timers: dict[int, Callable[[], None]] = {}
        self._done: dict[int, DoneCallback] = {}
        self._tokens = itertools.count()
        self._next_port: dict[int, int] = {}
        self._error: BaseException | None = None
        self._guarded = False
        self.net.on_flow_done = self._flow_done
        self.net.on_timer = self._timer

    # ------------------------------------------------------------ protocol
    def now(self) -> float:
        return self.ns.Simulator.Now().GetSeconds()

    def schedule(self, delay_s: float, fn: Callable[[], None]) -> None:
        if delay_s < 0:
            raise SimulationError(f"cannot schedule {delay_s} s in the past")
        token = next(self._tokens)
        self._timers[token] = fn
        self.net.Schedule(_ps(delay_s), token)

    def send(self, flow: Flow, on_done: DoneCallback) -> None:
        path = self.routing.path(flow.src, flow.dst, flow.id)
        back = self.routing.path(flow.dst, flow.src, flow.id)
        port = self._port(flow.dst)
        links = self._vector(path.links)
        self.net.Route(port, links, self._vector(back.links))
        self._done[flow.id] = on_done
        self.net.StartFlow(flow.id, port, flow.size_bytes, links, 8 * self.segment)

    def run(self, until: float | None = None) -> None:
        if not self._timers and not self._done:
            return
        if until is not None:
            self.ns.Simulator.Stop(self.ns.PicoSeconds(_ps(max(0.0, until - self.now()))))
        if not self._guarded:
            self.net.Guard(self.cfg.wall_limit_s, _ps(self.cfg.guard_interval_s))
            self._guarded = True
        self.ns.Simulator.Run()
        if self._error is not None:
            raise self._error
        if self.net.Expired():
            raise SimulationError(
                f"ns-3 wall-clock limit of {self.cfg.wall_limit_s:g} s reached at simulated "
                f"t = {self.now() * 1e6:.1f} us with {len(self._done)} flows in flight"
            )

    def record(self) -> None:
        """Keep dense supervision (events, bytes received, per-hop backlog) for :meth:`recording`;
        call before the first flow starts."""
        self.net.Record(True)

    def recording(self) -> Recording:
        """What the C++ layer recorded so far, as numpy arrays."""
        net = self.net
        return Recording(
            event_time_s=_array(net.ev_time, np.float64),
            event_flow=_array(net.ev_flow, np.int64),
            event_kind=_array(net.ev_kind, np.int8),
            rx_event=_array(net.rx_event, np.int64),
            rx_flow=_array(net.rx_flow, np.int64),
            rx_bytes=_array(net.rx_bytes, np.int64),
            queue_flow=_array(net.q_flow, np.int64),
            queue_hop=_array(net.q_hop, np.int32),
            queue_link=_array(net.q_link, np.int32),
            queue_bytes=_array(net.q_bytes, np.int64),
        )

    def set_bandwidth(self, link: int, bandwidth_bps: float) -> None:
        """Change a directed link's rate now; the device reads it for every packet."""
        self.net.SetRate(link, bandwidth_bps)

    # ------------------------------------------------------------ callbacks from C++
    def _timer(self, token: int) -> None:
        self._call(self._timers.pop(token))

    def _flow_done(self, flow_id: int, t: float) -> None:
        on_done = self._done.pop(flow_id)
        self._call(lambda: on_done(flow_id, t))

    def _call(self, fn: Callable[[], None]) -> None:
        """Run a Python callback; keep its exception for ``run`` (it cannot cross C++ frames)."""
        try:
            fn()
        except BaseException as err:  # re-raised by run()
            self._error = err
            self.ns.Simulator.Stop()
            return
        if not self._timers and not self._done:
            self.ns.Simulator.Stop()  # nothing left but idle TCP timers

    def _port(self, host: int) -> int:
        port = self._next_port.get(host, FIRST_PORT)
        if port > LAST_PORT:
            raise SimulationError(f"more than {LAST_PORT - FIRST_PORT + 1} flows to host {host}")
        self._next_port[host] = port + 1
        return port


@dataclass(frozen=True, slots=True)
class Recording:
    """Dense supervision from one ns-3 run (seconds, bytes). Events are arrivals (kind 0) and
    completions (kind 1) in simulated order; ``rx_*`` has one row per (event, flow active at it)
    with the bytes that flow had received; ``queue_*`` one row per hop of each arriving flow with
    the backlog (queue disc + NIC queue) of that hop's output port at the arrival."""

    event_time_s: np.ndarray
    event_flow: np.ndarray
    event_kind: np.ndarray
    rx_event: np.ndarray
    rx_flow: np.ndarray
    rx_bytes: np.ndarray
    queue_flow: np.ndarray
    queue_hop: np.ndarray
    queue_link: np.ndarray
    queue_bytes: np.ndarray


def _array(vector, dtype) -> np.ndarray:
    """A numpy copy of a C++ std::vector (numpy reads its buffer, not element by element)."""
    return np.array(vector, dtype=dtype) if vector.size() else np.zeros(0, dtype)


def _set_defaults(ns, cfg: Ns3Config, segment: int) -> None:
    """Config defaults must be set before any node, socket or queue disc exists."""
    string, uint, double = ns.StringValue, ns.UintegerValue, ns.DoubleValue
    time, boolean = ns.TimeValue, ns.BooleanValue
    settings = {
        "ns3::TcpL4Protocol::SocketType": string("ns3::TcpDctcp"),
        "ns3::TcpSocket::SegmentSize": uint(segment),
        "ns3::TcpSocket::InitialCwnd": uint(cfg.initial_cwnd),
        "ns3::TcpSocket::SndBufSize": uint(cfg.socket_buffer_bytes),
        "ns3::TcpSocket::RcvBufSize": uint(cfg.socket_buffer_bytes),
        "ns3::TcpSocket::ConnTimeout": time(ns.PicoSeconds(_ps(cfg.conn_timeout_s))),
        "ns3::TcpSocket::DelAckTimeout": time(ns.PicoSeconds(_ps(cfg.delack_timeout_s))),
        "ns3::TcpSocket::DelAckCount": uint(2),
        "ns3::TcpSocketBase::MinRto": time(ns.PicoSeconds(_ps(cfg.min_rto_s))),
        "ns3::TcpSocketBase::ClockGranularity": time(ns.PicoSeconds(_ps(cfg.clock_granularity_s))),
        "ns3::RttEstimator::InitialEstimation": time(ns.PicoSeconds(_ps(cfg.initial_rtt_s))),
        "ns3::TcpDctcp::DctcpShiftG": double(cfg.dctcp_gain),
        "ns3::RedQueueDisc::UseEcn": boolean(True),
        "ns3::RedQueueDisc::UseHardDrop": boolean(False),
        "ns3::RedQueueDisc::QW": double(1.0),
        "ns3::RedQueueDisc::Gentle": boolean(False),
    }
    for name, value in settings.items():
        ns.Config.SetDefault(name, value)
