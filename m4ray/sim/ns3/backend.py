"""``backend=ns3``: the packet-level ground truth behind the ``NetworkBackend`` protocol.

Hosts and switches are ns-3 nodes; every cable is a pair of ns-3 point-to-point devices with its
rate and delay. The transport is a config choice (``transports.py``): by default RDMA NIC queue
pairs with DCTCP rate control over a PFC-lossless fabric (``rdma.py``), as GPU fabrics and the
field's reference simulator run; ``transport=tcp`` gives ns-3's TCP DCTCP with RED/ECN
(``native.py``). Either way a flow takes exactly the path m4ray's
:class:`~m4ray.sim.routing.Routing` gives it (ACKs the reverse path) and completes when its last
byte is delivered at the receiver (the FCT convention of ``m4ray.sim.routing``).

One simulation per process at a time (ns-3 keeps global state); an ns-3 assertion kills the
process, so sweeps run it inside Ray worker processes. A wall-clock guard stops a run that takes too
long and raises :class:`SimulationError`, keeping what completed.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from m4ray.errors import InputError, SimulationError, choice_error
from m4ray.fingerprint import added_field
from m4ray.sim.backend import DoneCallback
from m4ray.sim.flows import Flow
from m4ray.sim.ns3.loader import load
from m4ray.sim.ns3.transports import PARAMS13, RdmaConfig, TcpConfig, to_ps
from m4ray.sim.routing import Routing
from m4ray.sim.topology import Topology

__all__ = ["IMITATED", "PARAMS13", "Ns3Backend", "Ns3Config", "Recording", "params13"]


@dataclass(kw_only=True, slots=True)
class Ns3Config:
    """ns-3 settings: the transport (``rdma`` or ``tcp``) and its settings, and the run guard
    (seconds). Packetisation comes from the wire format."""

    replay: ClassVar[str] = "dag"  # m4ray.sim.replays

    transport: str = "rdma"
    rdma: RdmaConfig = field(default_factory=RdmaConfig)
    tcp: TcpConfig = field(default_factory=TcpConfig)
    wall_limit_s: float = 3600.0  # graceful stop after this much wall-clock time
    guard_interval_s: float = 20e-6  # simulated time between wall-clock checks
    # every flow leaves its sender this much later than the replay sends it (its FCT counts
    # it): backend ``ns3_again`` runs the same scenario 2 ns later, a second ns-3 answer that no
    # model input can tell from the first, so its error against ``ns3`` is ns-3's own spread
    send_delay_s: float = added_field(0.0, "ns-3's own spread (issue 29)")

    def __post_init__(self) -> None:
        if isinstance(self.rdma, dict):  # nested YAML and JSON arrive as mappings
            self.rdma = RdmaConfig(**self.rdma)
        if isinstance(self.tcp, dict):
            self.tcp = TcpConfig(**self.tcp)
        if self.transport not in TRANSPORTS:
            raise choice_error("ns-3 transport", self.transport, TRANSPORTS)
        if not self.send_delay_s >= 0:
            raise InputError(f"must be >= 0 s, got {self.send_delay_s}", field="ns3.send_delay_s")

    @property
    def settings(self) -> RdmaConfig | TcpConfig:
        """The selected transport's settings."""
        return getattr(self, self.transport)

    def build(self, topology: Topology, routing: Routing) -> Ns3Backend:
        return Ns3Backend(topology, routing, self)


TRANSPORTS = ("rdma", "tcp")
# the transport m4 checkpoints that do not record theirs learned (m4-small: ns-3 TCP DCTCP runs);
# m4-v2 and later record it in model.json ("transport"), the default m4 backends describe rdma
IMITATED = "tcp"


def params13(ns3: Ns3Config, routing: Routing) -> list[float]:
    """m4's 13-float network/CC vector for these ns-3 settings (``reference/m4.md`` §3.1)."""
    return ns3.settings.params13(routing)


class Ns3Backend:
    """One ns-3 simulation implementing ``NetworkBackend``."""

    def __init__(self, topology: Topology, routing: Routing, cfg: Ns3Config) -> None:
        cfg.settings.validate()
        self.ns = ns = load()
        ns.Simulator.Destroy()  # drop any previous simulation of this process
        self.cfg, self.routing = cfg, routing
        self.fabric = cfg.settings.fabric(ns, topology, routing)
        self.net = self.fabric.net
        self._timers: dict[int, Callable[[], None]] = {}
        self._done: dict[int, DoneCallback] = {}
        self._tokens = itertools.count()
        self._error: BaseException | None = None
        self._guarded = False
        self.net.on_flow_done = self._flow_done
        self.net.on_timer = self._timer
        # flows are reported done at their sender's last ACK (the replay adds no ACK trip)
        self.done_at_ack = cfg.transport == "rdma" and cfg.rdma.done_at_ack

    # ------------------------------------------------------------ protocol
    def now(self) -> float:
        return self.ns.Simulator.Now().GetSeconds()

    def schedule(self, delay_s: float, fn: Callable[[], None]) -> None:
        if delay_s < 0:
            raise SimulationError(f"cannot schedule {delay_s} s in the past")
        token = next(self._tokens)
        self._timers[token] = fn
        self.net.Schedule(to_ps(delay_s), token)

    def send(self, flow: Flow, on_done: DoneCallback) -> None:
        path = self.routing.path(flow.src, flow.dst, flow.id)
        back = self.routing.path(flow.dst, flow.src, flow.id)
        self._done[flow.id] = on_done
        if self.cfg.send_delay_s:
            self.schedule(self.cfg.send_delay_s, lambda: self.fabric.start(flow, path, back))
        else:
            self.fabric.start(flow, path, back)

    def run(self, until: float | None = None) -> None:
        if not self._timers and not self._done:
            return
        if until is not None:
            self.ns.Simulator.Stop(self.ns.PicoSeconds(to_ps(max(0.0, until - self.now()))))
        if not self._guarded:
            self.net.Guard(self.cfg.wall_limit_s, to_ps(self.cfg.guard_interval_s))
            self._guarded = True
        self.ns.Simulator.Run()
        if self._error is not None:
            raise self._error
        if self.net.Expired():
            stalled = getattr(self.net, "Stalled", None)
            detail = f" (still:{stalled()})" if stalled is not None else ""
            raise SimulationError(
                f"ns-3 wall-clock limit of {self.cfg.wall_limit_s:g} s reached at simulated "
                f"t = {self.now() * 1e6:.1f} us with {len(self._done)} flows in flight{detail}"
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

    def counters(self) -> dict[str, int]:
        """Transport counters of the run so far (RDMA: drops, timeouts, pauses, marks,
        retransmits; TCP: none)."""
        return self.fabric.counters()

    def sent_bytes(self) -> np.ndarray:
        """Bytes each directed link has sent so far (RDMA; a link's busy share of a run is
        ``8 * bytes / (bandwidth * time)``: ``bench/ns3_utilisation.py``)."""
        return self.fabric.sent_bytes()

    def marked_packets(self) -> np.ndarray:
        """Data packets each directed link has marked CE so far (RDMA)."""
        return self.fabric.marked_packets()


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
