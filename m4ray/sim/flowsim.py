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

With ``queues`` (:class:`StandingQueues`) a flow also waits, at its start, for the queues it
meets: a fluid model shares rates but holds no packets, so on its own a one-packet flow crossing
a congested network takes its ideal time, where ns-3's waits behind what larger flows keep
queued. A window-based sender keeps up to ``window - rate x rtt`` bytes in flight beyond its own
bandwidth-delay product (its first window leaves at line rate); they wait in the switch queues
of the full links it crosses. So a full link (its data fill its capacity) out of a switch holds
the sum of its flows' excess, at most the level its congestion control keeps
(:func:`standing_levels`: DCTCP's K, DCQCN's K_min, TIMELY's T_low less the base round trip;
under HPCC, which holds none, only flows in their first round trip queue their excess,
``StandingQueues.first_rtt``); a host's own uplink holds none (its NIC paces its flows, a switch
queues nothing there). A flow arriving waits for the queues of the full links on its path to drain
(``Σ q_l / C_l``), added to its delivery. It lets the fluid model see small flows' tails:
against the HPCC simulator's own DCTCP run (``bench/m4_example.py``) and our ns-3 on m3's
default workload (``+experiment=m3 'm3.compare=[ns3,flowsim,flowsim_queues]'``); counting
each flow's excess only at its bottleneck, or leaving the hosts' uplinks in, missed one of the
two by 23-89 % (docs/flowsim.md). With ``StandingQueues.buffer_bytes`` the first windows of flows in
their first round trip queue on top of that level, up to the switch buffer (a new flow's
window leaves at line rate before any mark or INT returns), each flow keeping in flight at
most what it has left.

With ``rate_control`` (:class:`DcqcnRates`) flows keep DCQCN's rates, not their max-min shares:
a fluid model lets a flow take any share freed, where DCQCN's sender, once cut, climbs back only
at its increase timer (900 µs by default, longer than most flows live). Every flow starts at
line rate. Where the max-min shares under the flows' rates as caps fill a switch's link, hold a
flow on it below its rate and its NIC's (a queue builds) and what its flows keep in flight
beyond their bandwidth-delay products passes K_min (RED marks; each flow's at most its window
and what it has left, as ``queues`` counts it), each flow crossing it that was not cut in the
last decrease interval is cut to its share there: RED marks a few packets at a time, so the cuts
stop once the link's flows together fit it, which in the fluid limit is their shares (one
flow's α/2 step is not the aggregate's). The target takes the rate before the cut (at a flow's
first cut, or its first since an increase, as ns-3's ``DcqcnDecrease`` without clamping); each
increase timer since the cut moves the rate ``(rate + target) / 2``, the target rising by the AI
at the first step after the fast-recovery steps and by the hyper AI after it (at most to the
line rate). The queues a flow meets at its arrival
(``queues``) are those of the links the shares without the cuts would fill: the contention DCQCN
answers with cuts and queues at K_min..K_max. Every parameter is the CC's own (timers, fast
recovery, AI and hyper AI, K_min, minimum rate); nothing is fitted. The compiled fluid state
(``_maxmin.c``) runs it too, to the bit.

``rate_control`` may also be :class:`DctcpRates`, RDMA DCTCP's (the reference's ``CC_MODE 8``):
the same cuts, at most once a round trip (its CWR), and the rate back up by the AI once a round
trip since, for every flow on one grid of round trips. It runs in the numpy loop only. On the
gray-failure study it answers as classic flowSim does (docs/flowsim.md, "DCTCP's rates in flowSim"):
each chunk is a new queue pair starting at line rate, so a cut is forgotten when its flow ends.

With ``service="fifo"`` a link serves its flows in order of arrival instead of max-min: the
flows that arrived at one instant share max-min what the earlier ones left on each link, in
arrival order (the later ones may get nothing until the earlier drain), and with ``fifo_bytes``
only flows of at most that many bytes are served so, the larger sharing max-min what they
leave. An RDMA sender whose flow fits its window puts the whole flow on the wire at line rate
before any feedback returns, so a congested switch port holds it in its queue and drains the
flows first-come first-served, where processor sharing (max-min) would finish them all late
together; a flow longer than its window keeps only a window queued and interleaves. On the
gray-failure grid, whose chunks all fit the window (README), FIFO takes flowSim's error
against ns-3 from 8.2 % to 2.1 %. The compiled fluid state runs it too, to the bit.

Units: seconds, bits, bits/s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from m4ray.errors import InputError, SimulationError
from m4ray.fingerprint import added_field
from m4ray.models.fairshare import (
    _REL_TIE,
    ACK_PASSES,
    Window,
    ack_capacity,
    ack_fraction,
    compiled_max_min_rates,
    fifo_rates,
    reverse_links,
    round_trip_s,
)
from m4ray.models.wire import wire_window
from m4ray.sim.backend import DoneCallback, EventQueue, QueueClock
from m4ray.sim.dagloop import NativeLoop, library
from m4ray.sim.flows import Flow
from m4ray.sim.routing import Path, Routing, WireFormat
from m4ray.sim.topology import Topology

QUEUE_FULL = 1e-6  # a link whose data are within this share of its capacity is full (_maxmin.c)


@dataclass(kw_only=True, slots=True)
class StandingQueues:
    """flowSim's queues (module docstring): every sender's ``window_bytes`` of payload (on the
    wire: whole packets with their headers; 0: no window, so a full link's queue stands at its
    level) and the most a switch port queues, ``k_bytes`` as ``[[rate_bps, bytes], ...]``
    (linear in rate between points, held beyond the ends): the level its congestion control
    holds a full link's queue at (:func:`standing_levels`). Hosts' uplinks queue nothing.
    ``first_rtt``: only a flow in its first round trip keeps its excess queued (HPCC: its
    first window leaves at line rate before any feedback; after a round trip its INT feedback
    holds links below η, where nothing stands). ``buffer_bytes`` > 0 (0: off): first windows
    over the level. A flow's first window leaves at line rate before any feedback returns, so
    a full link briefly holds more than its CC's level: the excess of the flows in their first
    round trip queues on top of the others' (which stand at most at the level; none with
    ``first_rtt``), up to this switch buffer, and every flow keeps in flight at most the bytes
    it has left (a 500-byte flow adds 500 bytes, not a window); without a window a young flow
    has out at most one round trip at its line rate, all it sends before its first feedback."""

    window_bytes: int
    k_bytes: list[list[float]]
    first_rtt: bool = added_field(False, "HPCC's first windows (issue 32)")
    buffer_bytes: int = added_field(0, "first windows over the level (issue 32)")

    def __post_init__(self) -> None:
        if self.window_bytes < 0:
            raise InputError(
                f"must be >= 0 (0: no window), got {self.window_bytes}", field="queues.window_bytes"
            )
        if not self.k_bytes or any(len(p) != 2 or p[0] <= 0 or p[1] < 0 for p in self.k_bytes):
            raise InputError(
                "expected [[rate_bps, bytes], ...] with rates > 0 and bytes >= 0",
                field="queues.k_bytes",
            )
        if self.buffer_bytes < 0:
            raise InputError(
                f"must be >= 0 (0: off), got {self.buffer_bytes}", field="queues.buffer_bytes"
            )

    @classmethod
    def of(cls, network, routing: Routing, *, bursts: bool = False) -> StandingQueues:
        """The queues of an ns-3 network config (``Ns3Config``): its RDMA window and the level
        its congestion control holds a full switch port at (:func:`standing_levels`); with
        ``bursts`` first windows over the level, up to its switch buffer, where the CC holds a
        level (HPCC, whose queue is its first windows, keeps them as they are: capping them at
        what each flow has left lost 24-31 points under 1 KB against the HPCC simulator's HPCC
        run and ours, docs/flowsim.md)."""
        from m4ray.sim.ns3.transports import max_base_rtt_s

        if network.transport != "rdma":
            raise InputError(
                f"standing queues know RDMA's congestion controls, not {network.transport}",
                field="queues",
            )
        rdma = network.rdma
        rates = sorted({float(b) for b in routing.topo.bandwidth_bps})
        levels, first_rtt = standing_levels(
            rdma, rates, lambda: max_base_rtt_s(routing, rdma.ack_bytes)
        )
        return cls(
            window_bytes=rdma.window(routing),
            k_bytes=levels,
            first_rtt=first_rtt,
            buffer_bytes=rdma.buffer_bytes if bursts and not first_rtt else 0,
        )

    def caps(self, capacity_bps: np.ndarray) -> np.ndarray:
        """Each link's most queued bytes, by its rate (a switch's port)."""
        return queue_caps(self.k_bytes, capacity_bps)

    def window_wire(self, wire: WireFormat) -> float:
        """The window on the wire (bytes): its packets with their headers."""
        return wire_window(self.window_bytes, wire)


def standing_levels(rdma, rates_bps, base_rtt_s) -> tuple[list[list[float]], bool]:
    """``[[rate_bps, bytes], ...]``: the most a full switch port queues, at each of
    ``rates_bps``, under the congestion control of ``rdma`` (``RdmaConfig``), and whether only
    flows in their first round trip queue (:attr:`StandingQueues.first_rtt`), from what each CC
    controls to:

    * DCTCP: its marking threshold K (under RED, K_min: it holds the queue where marking
      starts);
    * DCQCN: K_min (RED's probability is small at its fixed point, so the queue sits just
      above where marking starts);
    * TIMELY: the queue delay that brings the round trip to T_low (below T_low it only
      increases): ``rate x (T_low - base RTT)``, with the network's largest base round trip
      (``base_rtt_s``: a function, called for TIMELY only);
    * HPCC: no standing queue (it holds its links at η < 1 of their rate), but a flow's first
      window leaves at line rate before any INT feedback: first round trips only, up to the
      switch buffer.
    """
    if rdma.cc == "dctcp":
        return [list(p) for p in rdma.ecn_k_bytes], False
    params = rdma.cc_config()
    if rdma.cc == "dcqcn":
        return [list(p) for p in params.k_min_bytes], False
    if rdma.cc == "hpcc":
        return [[float(rate), float(rdma.buffer_bytes)] for rate in rates_bps], True
    if rdma.cc == "timely":
        delay = max(params.t_low_s - base_rtt_s(), 0.0)
        return [[float(rate), rate * delay / 8.0] for rate in rates_bps], False
    raise InputError(f"standing queues do not know {rdma.cc!r}", field="queues")


def queue_caps(k_bytes: list[list[float]], capacity_bps) -> np.ndarray:
    """The most each link queues, ``k_bytes`` (``[[rate_bps, bytes], ...]``) at its rate."""
    points = sorted(k_bytes)
    rates, values = [p[0] for p in points], [p[1] for p in points]
    return np.interp(np.asarray(capacity_bps, dtype=np.float64), rates, values)


def round_trip(path: Path, wire: WireFormat, ack_bytes: int) -> float:
    """A packet's round trip over ``path`` (:func:`round_trip_s`)."""
    return round_trip_s(wire, path.latency_s, path.inverse_bw_sum, ack_bytes)


@dataclass(kw_only=True, slots=True)
class DcqcnRates:
    """DCQCN's rate control in flowSim (module docstring): its parameters by name as ns-3 takes
    them (``RdmaConfig.cc_params`` under DCQCN, :class:`~m4ray.sim.ns3.cc.DcqcnParams`: K_min,
    the decrease and increase timers, fast recovery, AI and hyper AI; None: DCQCN's defaults)
    and the sender's minimum rate."""

    cc_params: dict[str, Any] | None = None
    min_rate_bps: float = 1e9

    def __post_init__(self) -> None:
        self.params()  # every name and value by the CC's own rules
        if not self.min_rate_bps > 0:
            raise InputError(
                f"must be > 0, got {self.min_rate_bps}", field="rate_control.min_rate_bps"
            )

    def params(self):
        """The :class:`~m4ray.sim.ns3.cc.DcqcnParams` these name."""
        from m4ray.sim.ns3.cc import cc_params

        return cc_params("dcqcn", self.cc_params, at="rate_control")

    def k_min_bytes(self, capacity_bps) -> np.ndarray:
        """K_min (bytes), where RED starts marking, of a port at each of these rates."""
        red = self.params().red
        return np.array([red(float(rate))[0] for rate in capacity_bps], dtype=np.float64)

    @classmethod
    def of(cls, network) -> DcqcnRates:
        """The rate control of an ns-3 network config (``Ns3Config``) running DCQCN."""
        rdma = network.rdma if network.transport == "rdma" else None
        if rdma is None or rdma.cc != "dcqcn":
            cc = "tcp" if rdma is None else rdma.cc
            raise InputError(
                f"flowSim's rate control models DCQCN only, not {cc}", field="rate_control"
            )
        return cls(cc_params=rdma.cc_params, min_rate_bps=rdma.min_rate_bps)


class _DcqcnState:
    """Each active flow's DCQCN state, parallel to :class:`FlowSim`'s active arrays: its rate
    (a cap on its share), target and line rate, its last cut, its next increase and how many
    increases since that cut."""

    def __init__(self, rc: DcqcnRates) -> None:
        self.rc, self.min_rate = rc.params(), rc.min_rate_bps
        self.rate = np.zeros(0)
        self.target = np.zeros(0)
        self.line = np.zeros(0)
        self.t_cut = np.zeros(0)
        self.t_increase = np.zeros(0)
        self.stage = np.zeros(0, dtype=np.int64)

    def add(self, line: np.ndarray) -> None:
        """Flows starting now at their line rates ``line`` (their NICs')."""
        n = len(line)
        grow = {"rate": np.inf, "target": np.inf, "t_cut": -np.inf, "t_increase": np.inf}
        for name, value in grow.items():
            setattr(self, name, np.concatenate([getattr(self, name), np.full(n, value)]))
        self.line = np.concatenate([self.line, line])
        self.stage = np.concatenate([self.stage, np.zeros(n, dtype=np.int64)])

    def keep(self, keep: np.ndarray) -> None:
        for name in ("rate", "target", "line", "t_cut", "t_increase", "stage"):
            setattr(self, name, getattr(self, name)[keep])

    def next_increase(self) -> float:
        return float(self.t_increase.min()) if len(self.t_increase) else math.inf

    def increase(self, now: float) -> bool:
        """Every increase timer due by ``now``; whether any rate moved."""
        due = np.flatnonzero(self.t_increase <= now)
        if not len(due):
            return False
        rc = self.rc
        stage = self.stage[due]  # ns-3's DcqcnIncrease: AI at the first step past fast recovery
        step = np.where(stage == rc.fast_recovery_steps, rc.rate_ai_bps, rc.rate_hai_bps)
        raised = self.target[due] + np.where(stage >= rc.fast_recovery_steps, step, 0.0)
        self.target[due] = np.minimum(raised, self.line[due])
        self.rate[due] = (self.rate[due] + self.target[due]) / 2
        self.stage[due] += 1
        self.t_increase[due] += rc.increase_interval_s
        return True

    def cut(self, hit: np.ndarray, rates: np.ndarray, now: float) -> None:
        """The flows ``hit`` (indices) cut to their current shares ``rates``, as CNPs cut them
        (module docstring); the target takes the rate before the cut at a flow's first cut, or
        its first since an increase ran (ns-3's ``DcqcnDecrease`` without clamping)."""
        rc = self.rc
        fresh = ~np.isfinite(self.t_cut[hit]) | (self.stage[hit] != 0) | rc.clamp_target_rate
        before = np.minimum(self.rate[hit], self.line[hit])
        self.target[hit] = np.where(fresh, before, self.target[hit])
        self.rate[hit] = np.maximum(self.min_rate, rates)
        self.t_cut[hit] = now
        self.t_increase[hit] = now + rc.increase_interval_s
        self.stage[hit] = 0


@dataclass(kw_only=True, slots=True)
class DctcpRates:
    """DCTCP's rate control as an RDMA NIC runs it (the reference's ``CC_MODE 8``, its
    ``HandleAckDctcp``; module docstring): a flow marked on a switch's link is cut, at most
    once a round trip (its CWR), and climbs back by ``rate_ai_bps`` once a round trip since.
    ``k_bytes``: where marking starts, ``[[rate_bps, bytes], ...]`` by the port's rate (DCTCP's
    K, RED's K_min); ``round_trip_s``: the round trip that paces both (the network's largest
    base round trip, :meth:`of`); the sender's minimum rate."""

    k_bytes: list[list[float]]
    round_trip_s: float
    rate_ai_bps: float = 2e9
    min_rate_bps: float = 1e9

    def __post_init__(self) -> None:
        if not self.k_bytes or any(len(p) != 2 or p[0] <= 0 or p[1] < 0 for p in self.k_bytes):
            raise InputError(
                "expected [[rate_bps, bytes], ...] with rates > 0 and bytes >= 0",
                field="rate_control.k_bytes",
            )
        for name in ("round_trip_s", "rate_ai_bps", "min_rate_bps"):
            if not getattr(self, name) > 0:
                raise InputError(
                    f"must be > 0, got {getattr(self, name)}", field=f"rate_control.{name}"
                )

    @property
    def decrease_interval_s(self) -> float:
        return self.round_trip_s

    def k_min_bytes(self, capacity_bps) -> np.ndarray:
        """Where marking starts (bytes) on a port at each of these rates."""
        return queue_caps(self.k_bytes, capacity_bps)

    @classmethod
    def of(cls, network, routing: Routing) -> DctcpRates:
        """The rate control of an ns-3 network config (``Ns3Config``) running RDMA DCTCP."""
        from m4ray.sim.ns3.transports import max_base_rtt_s

        rdma = network.rdma if network.transport == "rdma" else None
        if rdma is None or rdma.cc != "dctcp":
            cc = "tcp" if rdma is None else rdma.cc
            raise InputError(f"DCTCP's rates model RDMA DCTCP, not {cc}", field="rate_control")
        return cls(
            k_bytes=[list(p) for p in rdma.ecn_k_bytes],
            round_trip_s=max_base_rtt_s(routing, rdma.ack_bytes),
            rate_ai_bps=rdma.rate_ai_bps,
            min_rate_bps=rdma.min_rate_bps,
        )


class _DctcpState:
    """Each active flow's DCTCP rate, parallel to :class:`FlowSim`'s active arrays (the
    interface of :class:`_DcqcnState`): its rate (a cap on its share), its line rate and its
    last cut. Increases run for every flow at once, on a grid of round trips."""

    def __init__(self, rc: DctcpRates) -> None:
        self.rc, self.min_rate = rc, rc.min_rate_bps
        self.rate = np.zeros(0)
        self.line = np.zeros(0)
        self.t_cut = np.zeros(0)
        self._tick = 0  # the next increase is at _tick round trips

    def add(self, line: np.ndarray) -> None:
        n = len(line)
        self.rate = np.concatenate([self.rate, np.full(n, np.inf)])
        self.line = np.concatenate([self.line, line])
        self.t_cut = np.concatenate([self.t_cut, np.full(n, -np.inf)])

    def keep(self, keep: np.ndarray) -> None:
        for name in ("rate", "line", "t_cut"):
            setattr(self, name, getattr(self, name)[keep])

    def next_increase(self) -> float:
        if not (self.rate < self.line).any():
            return math.inf
        return self._tick * self.rc.round_trip_s

    def increase(self, now: float) -> bool:
        """The increases due by ``now``: each flow out of its CWR (no cut within a round trip)
        and below its line rate gains the AI once per round trip; whether any rate moved."""
        rtt = self.rc.round_trip_s
        ticks = math.floor(now / rtt * (1 + 1e-12))
        if ticks < self._tick:
            return False
        steps = ticks - self._tick + 1
        self._tick = ticks + 1
        due = np.flatnonzero((self.rate < self.line) & (now - self.t_cut >= rtt * (1 - 1e-9)))
        if not len(due):
            return False
        raised = self.rate[due] + steps * self.rc.rate_ai_bps
        self.rate[due] = np.minimum(raised, self.line[due])
        return True

    def cut(self, hit: np.ndarray, rates: np.ndarray, now: float) -> None:
        """The flows ``hit`` (indices) cut to their current shares ``rates``."""
        before = np.minimum(self.rate[hit], self.line[hit])
        self.rate[hit] = np.maximum(self.min_rate, np.minimum(rates, before))
        self.t_cut[hit] = now


@dataclass(kw_only=True, slots=True)
class FlowSimConfig:
    """flowSim settings. ``rate_cap_bps``: optional per-flow cap (NIC rate), None = links only;
    ``window_bytes``: a sender's fixed window (:class:`Window`, RDMA's), None = classic flowSim
    (no window; m3's and m4's baseline); ``ack_bytes`` the ACK's wire size for its round trip;
    ``ack_load``: ACKs (one per data packet) take their share of the reverse links
    (:func:`ack_capacity`; off: classic flowSim); ``queues``: a flow waits at its start for the
    standing queues on its path (:class:`StandingQueues`; None: classic flowSim);
    ``rate_control``: flows keep DCQCN's rates (:class:`DcqcnRates`; None: max-min shares)."""

    replay: ClassVar[str] = "dag"  # m4ray.sim.replays

    rate_cap_bps: float | None = None
    window_bytes: int | None = None
    ack_bytes: int = 64
    ack_load: bool = False
    # a dataclasses.field (added_field), not a shared default
    queues: StandingQueues | None = added_field(None, "standing queues (issue 32)")  # noqa: RUF009
    # DCQCN's sticky rates (DcqcnRates; None: max-min shares)
    rate_control: DcqcnRates | DctcpRates | None = added_field(None, "DCQCN's rates (issue 32)")  # noqa: RUF009
    # how a link serves the flows crossing it: "fair" (max-min) or "fifo" (in order of arrival)
    service: str = added_field("fair", "FIFO service (issue 29)")
    # under FIFO service, which flows it serves in order: those of at most this many bytes (the
    # rest share max-min what they leave); null: every flow; "window": RDMA's default window
    fifo_bytes: int | str | None = added_field(None, "FIFO's flows (issue 29)")

    def __post_init__(self) -> None:
        if isinstance(self.queues, dict):
            self.queues = StandingQueues(**self.queues)
        if isinstance(self.rate_control, dict):
            fields = dict(self.rate_control)
            cc = fields.pop("cc", "dcqcn")
            kinds = {"dcqcn": DcqcnRates, "dctcp": DctcpRates}
            if cc not in kinds:
                raise InputError(
                    f"expected one of {sorted(kinds)}, got {cc!r}", field="rate_control.cc"
                )
            self.rate_control = kinds[cc](**fields)
        if self.rate_cap_bps is not None and self.rate_cap_bps <= 0:
            raise InputError(f"must be > 0 or null, got {self.rate_cap_bps}", field="rate_cap_bps")
        if self.window_bytes is not None and self.window_bytes < 0:
            raise InputError(f"must be >= 0 or null, got {self.window_bytes}", field="window_bytes")
        if self.ack_bytes <= 0:
            raise InputError(f"must be > 0, got {self.ack_bytes}", field="ack_bytes")
        _check_service(self.service, ack_load=self.ack_load, rate_control=self.rate_control)
        if self.fifo_bytes is not None and self.fifo_bytes != "window":
            if isinstance(self.fifo_bytes, bool) or not isinstance(self.fifo_bytes, int):
                raise InputError(
                    f'expected bytes, "window" or null, got {self.fifo_bytes!r}', field="fifo_bytes"
                )
            if self.fifo_bytes < 0:
                raise InputError(f"must be >= 0, got {self.fifo_bytes}", field="fifo_bytes")

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
            queues=self.queues,
            ack_bytes=self.ack_bytes,
            rate_control=self.rate_control,
            service=self.service,
            fifo_bits=self.fifo_bits(routing),
        )

    def fifo_bits(self, routing: Routing) -> float:
        """The most bits on the wire a flow served in order of arrival carries (inf: any)."""
        if self.fifo_bytes is None:
            return math.inf
        if self.fifo_bytes == "window":
            from m4ray.sim.ns3.transports import bdp_window_bytes

            return wire_window(bdp_window_bytes(routing, self.ack_bytes), routing.wire) * 8.0
        return wire_window(self.fifo_bytes, routing.wire) * 8.0 if self.fifo_bytes else 0.0


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
        queues: StandingQueues | None = None,
        ack_bytes: int = 64,
        rate_control: DcqcnRates | DctcpRates | None = None,
        service: str = "fair",
        fifo_bits: float = math.inf,
    ):
        self.topology = topology
        self.routing = routing
        self.rate_cap_bps = rate_cap_bps
        self.window = window
        self.ack_fraction = ack_fraction
        self._reverse = reverse_links(topology.n_links)
        self.events = EventQueue()
        self._now = 0.0
        self._capacity = topology.bandwidth_bps.copy()
        # active flows, parallel arrays; their links as CSR (flow i: _idx over _lens[i] entries,
        # flows in order). Arrivals wait in _new until the next rate computation adds them in
        # one concatenation (an arrival is O(1), not a copy of every active flow's state).
        self._ids = np.zeros(0, dtype=np.int64)
        self._lens = np.zeros(0, dtype=np.int64)
        self._idx = np.zeros(0, dtype=np.int64)
        self._delay = np.zeros(0)
        self._caps = np.zeros(0)
        self._done_cb = np.empty(0, dtype=object)
        self._new: list[tuple] = []  # (id, links, delay, callback, cap, bits, rtt, start)
        self._remaining = np.zeros(0)  # bits
        self._rates = np.zeros(0)  # bits/s, valid while not self._dirty
        self._dirty = False
        self._n_events = 0  # arrivals + completions processed (for benchmarks)
        # standing queues: each link's cap, the window on the wire, the flows' round trips
        self.queues = queues
        self.ack_bytes = ack_bytes
        self._q_cap = None if queues is None else queues.caps(self._capacity)
        if queues is not None:  # a host's NIC paces its own flows: no switch queue there
            self._q_cap[np.isin(topology.link_src, topology.hosts)] = 0.0
        self._q_window = 0.0 if queues is None else queues.window_wire(routing.wire)
        self._rtt = np.zeros(0)
        self._start = np.zeros(0)  # arrival times (standing queues' first round trips)
        self._in_order = np.zeros(0, dtype=bool)  # FIFO service: served in order of arrival
        self._shared = self._capacity  # the capacity the last rate computation shared
        self._q_sums: tuple[np.ndarray, np.ndarray] | None = None  # per link, at these rates
        # the same state and the event loop in C (``_dagloop.c``), where it compiles: the
        # arrays above then stay empty, events wait in the loop's queue and run() is one call
        # per Python callback (and a replay's flows can run there too: dag_loop)
        self._core: NativeLoop | None = None
        self._dcqcn = None
        if isinstance(rate_control, DctcpRates):
            self._dcqcn = _DctcpState(rate_control)
        elif rate_control is not None:
            self._dcqcn = _DcqcnState(rate_control)
        if rate_control is not None:  # where CNPs come from, and where RED starts marking
            self._switch_link = ~np.isin(topology.link_src, topology.hosts)
            self._k_min = rate_control.k_min_bytes(self._capacity)
        _check_service(service, ack_load=bool(ack_fraction), rate_control=rate_control)
        self.service, self.fifo_bits = service, fifo_bits
        if native_fluid() and not isinstance(rate_control, DctcpRates):
            self._start_core(rate_control)

    def _start_core(self, rate_control: DcqcnRates | None) -> None:
        """The fluid state and event loop in C (``__init__``'s comment), set up alike."""
        capped = self.window is not None or self.rate_cap_bps is not None
        self._core = NativeLoop.make(self._capacity, self.ack_fraction, ACK_PASSES, capped)
        self.events = self._core.queue
        queues = self.queues
        if queues is not None:
            self._core.queued(self._q_window, self._q_cap, queues.first_rtt, queues.buffer_bytes)
        if rate_control is not None:
            rc = self._dcqcn.rc
            self._core.dcqcn(rc, rate_control.min_rate_bps, self._switch_link, self._k_min)
        if self.service == "fifo":
            self._core.fifo(self.fifo_bits)

    # ------------------------------------------------------------ protocol
    def send(self, flow: Flow, on_done: DoneCallback) -> None:
        path = self.routing.path(flow.src, flow.dst, flow.id)
        delay = self.routing.delivery_delay(flow.size_bytes, path)
        bits = self.routing.wire.wire_bytes(flow.size_bytes) * 8.0
        cap = np.inf if self.rate_cap_bps is None else self.rate_cap_bps
        if self.window is not None:
            window_cap, bits = self.window.limit(self.routing.wire, path, bits)
            cap = min(cap, window_cap)
        rtt = 0.0
        if self.queues is not None:
            rtt = round_trip(path, self.routing.wire, self.ack_bytes)
        if self._core is not None:
            self._core.add(
                flow.id,
                on_done,
                links=path.links,
                delay=delay,
                cap=cap,
                bits=bits,
                rtt=rtt if self.queues is not None else None,
                now=self._now,
            )
            return
        self._n_events += 1
        links = np.asarray(path.links, dtype=np.int64)
        if self.queues is not None:
            delay += self._queue_delay(links)
        self._new.append((flow.id, links, delay, on_done, cap, bits, rtt, self._now))
        self._dirty = True

    @property
    def n_events(self) -> int:
        """Arrivals and completions processed so far (for benchmarks)."""
        return self._n_events + (0 if self._core is None else self._core.n_events)

    def dag_loop(self) -> NativeLoop | None:
        """The compiled loop a replay's flows may run in (:mod:`m4ray.sim.dagloop`), or None:
        Python's fluid state, a sender window, queues or DCQCN's rates (not compiled there)."""
        plain = self.window is None and self.queues is None and self._dcqcn is None
        return self._core if plain else None

    def run(self, until: float | None = None) -> None:
        horizon = float("inf") if until is None else until
        if self._core is not None:
            self._core.run(self, horizon)
            return
        next_completion, advance, complete = self._next_completion, self._advance, self._complete
        events = self.events
        while True:
            t_event = events.peek_time()
            t_done, finishing = next_completion()
            t_next = min(t_event, t_done)
            if t_next == float("inf"):
                break
            if t_next > horizon:
                advance(horizon - self._now)
                self._now = horizon
                break
            if t_done <= t_event:
                advance(t_done - self._now)
                self._now = t_done
                complete(finishing)
            else:
                advance(t_event - self._now)
                self._now = t_event
                while events.peek_time() <= self._now:
                    _, fn = events.pop()
                    fn()

    def set_bandwidth(self, link: int, bandwidth_bps: float) -> None:
        """Change a directed link's rate now (a gray failure's onset); rates are recomputed."""
        self._capacity[link] = bandwidth_bps
        self._dirty = True
        if self.queues is not None:
            self._q_cap[link] = self.queues.caps(np.array([bandwidth_bps]))[0]
        if self._core is not None:
            self._core.set_capacity(link, bandwidth_bps)
            if self.queues is not None:
                self._core.set_queue_cap(link, self._q_cap[link])

    # ------------------------------------------------------------ fluid state
    def _flush(self) -> None:
        """Add the flows that arrived since the last rate computation to the active arrays."""
        new = self._new
        if not new:
            return
        ids, links, delay, callbacks, caps, bits, rtt, start = zip(*new, strict=True)
        done_cb = np.empty(len(new), dtype=object)
        done_cb[:] = callbacks
        self._ids = np.concatenate([self._ids, np.array(ids, dtype=np.int64)])
        self._lens = np.concatenate([self._lens, np.fromiter(map(len, links), np.int64, len(new))])
        self._idx = np.concatenate([self._idx, *links])
        self._delay = np.concatenate([self._delay, np.array(delay, dtype=np.float64)])
        self._caps = np.concatenate([self._caps, np.array(caps, dtype=np.float64)])
        self._done_cb = np.concatenate([self._done_cb, done_cb])
        self._remaining = np.concatenate([self._remaining, np.array(bits, dtype=np.float64)])
        self._rtt = np.concatenate([self._rtt, np.array(rtt, dtype=np.float64)])
        self._start = np.concatenate([self._start, np.array(start, dtype=np.float64)])
        in_order = np.array(bits, dtype=np.float64) <= self.fifo_bits
        self._in_order = np.concatenate([self._in_order, in_order])
        if self._dcqcn is not None:
            firsts = np.array([path[0] for path in links], dtype=np.int64)
            self._dcqcn.add(np.minimum(np.array(caps, dtype=np.float64), self._capacity[firsts]))
        self._new = []

    def _refresh(self) -> None:
        """Arrivals in, and the rates brought up to date if anything changed."""
        self._flush()
        if self._dcqcn is not None and len(self._ids) and self._dcqcn.increase(self._now):
            self._dirty = True
        if len(self._ids) and self._dirty:
            if self._dcqcn is not None:
                self._rates = self._dcqcn_rates()
            else:
                capped = self.window is not None or self.rate_cap_bps is not None
                self._rates = self._share(self._caps if capped else None)
            self._dirty = False
            self._q_sums = None

    def _dcqcn_rates(self) -> np.ndarray:
        """The shares under DCQCN's rates as caps; where they fill a switch's link, the flows
        crossing it not cut within the decrease interval are cut (module docstring)."""
        state, now = self._dcqcn, self._now
        caps = np.minimum(self._caps, state.rate)
        rates = self._share(caps)
        load = np.bincount(self._idx, np.repeat(rates, self._lens), len(self._capacity))
        # a link queues where it is full and holds back a flow that would send faster (below
        # its rate and its NIC's): a lone flow at line rate through a link as fast is not that
        held = rates < np.minimum(state.rate, state.line) * (1.0 - QUEUE_FULL)
        owner = np.repeat(np.arange(len(self._ids)), self._lens)
        full = (load >= self._shared * (1.0 - QUEUE_FULL)) & self._switch_link
        full &= np.bincount(self._idx, held[owner], len(self._capacity)) > 0
        # and marks: what its flows keep in flight beyond their bandwidth-delay products (each
        # at most its window and its bytes left; no queues given: no window, no round trip)
        # passes K_min there
        excess = self._excess(self._q_window if self.queues is not None else math.inf, rates)
        full &= np.bincount(self._idx, excess[owner], len(self._capacity)) > self._k_min
        met = np.bincount(owner, full[self._idx], len(self._ids)) > 0
        hit = np.flatnonzero(met & (now - state.t_cut >= state.rc.decrease_interval_s))
        if not len(hit):
            return rates
        state.cut(hit, rates[hit], now)
        return self._share(np.minimum(self._caps, state.rate))

    def _next_completion(self) -> tuple[float, np.ndarray]:
        self._refresh()
        if not len(self._ids):
            return float("inf"), np.zeros(0, dtype=np.int64)
        if self._dcqcn is not None:  # an increase timer before any completion: wake for it
            t_done, finishing = self._next_drain()
            t_increase = self._dcqcn.next_increase()
            if t_increase < t_done:
                return t_increase, np.zeros(0, dtype=np.int64)
            return t_done, finishing
        return self._next_drain()

    def _next_drain(self) -> tuple[float, np.ndarray]:
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
        off = np.zeros(len(self._lens) + 1, dtype=np.int64)
        np.cumsum(self._lens, out=off[1:])
        if self.service == "fifo":  # the flows are kept in arrival order
            return fifo_rates((off, self._idx), self._capacity, caps, self._start, self._in_order)
        csr = (off, self._idx)  # flow_csr's arrays, kept as flows come and go
        rates = compiled_max_min_rates(None, self._capacity, caps, csr)
        self._shared = self._capacity
        if not self.ack_fraction:
            return rates
        off, every = csr
        lengths = np.diff(off)
        for _ in range(ACK_PASSES - 1):
            data = np.bincount(
                every, weights=np.repeat(rates, lengths), minlength=len(self._capacity)
            )
            capacity = ack_capacity(self._capacity, self._reverse, self.ack_fraction, data)
            rates = compiled_max_min_rates(None, capacity, caps, csr)
            self._shared = capacity
        return rates

    def _queue_delay(self, links: np.ndarray) -> float:
        """The standing queues a flow arriving now on ``links`` waits for (module docstring;
        ``m4ray_fluidsim_queue_delay`` in ``_maxmin.c`` is its twin, sum for sum)."""
        self._refresh()  # earlier arrivals in, rates up to date
        if not len(self._ids):
            return 0.0
        rates = self._rates
        if self._dcqcn is not None:  # contention: the shares DCQCN's cuts answer
            rates = self._share(self._caps)
        if self.queues.buffer_bytes:
            return self._burst_delay(links, rates)
        # per link at the engine's rates (kept till they change); first round trips age and
        # contention's shares are made here: never reused
        sums = self._q_sums if rates is self._rates else None
        if sums is None or self.queues.first_rtt:
            n_links = len(self._capacity)
            excess = np.maximum(self._q_window - rates * self._rtt / 8.0, 0.0)
            if self.queues.first_rtt:  # only flows in their first round trip
                excess = np.where(self._now - self._start < self._rtt, excess, 0.0)
            sums = (
                np.bincount(self._idx, np.repeat(rates, self._lens), n_links),
                np.bincount(self._idx, np.repeat(excess, self._lens), n_links),
            )
            if rates is self._rates:
                self._q_sums = sums
        load, excess = sums
        total = 0.0
        for link in links.tolist():
            if load[link] < self._shared[link] * (1.0 - QUEUE_FULL):
                continue
            total += min(excess[link], self._q_cap[link]) * 8.0 / self._capacity[link]
        return total

    def _burst_delay(self, links: np.ndarray, rates: np.ndarray) -> float:
        """:meth:`_queue_delay` with first windows over the level
        (:attr:`StandingQueues.buffer_bytes`; ``fs_burst_sums`` in ``_maxmin.c`` is its twin).
        Without a window a young flow's in flight is at most what its line rate (its cap, else
        its first link) puts out in one round trip: all it can send before its first feedback
        (after it, its CC holds the link at the level)."""
        n_links = len(self._capacity)
        window = self._q_window
        young = self._now - self._start < self._rtt
        if math.isinf(window):  # no window: a young flow has out a round trip at line rate
            first = self._idx[np.concatenate([[0], np.cumsum(self._lens)[:-1]])]
            line = np.minimum(self._caps, self._capacity[first])
            window = np.where(young, line * self._rtt / 8.0, window)
        excess = self._excess(window, rates)
        old = np.where(young | self.queues.first_rtt, 0.0, excess)
        load = np.bincount(self._idx, np.repeat(rates, self._lens), n_links)
        old = np.bincount(self._idx, np.repeat(old, self._lens), n_links)
        new = np.bincount(self._idx, np.repeat(np.where(young, excess, 0.0), self._lens), n_links)
        buffer = float(self.queues.buffer_bytes)
        total = 0.0
        for link in links.tolist():
            if self._q_cap[link] <= 0 or load[link] < self._shared[link] * (1.0 - QUEUE_FULL):
                continue
            q = min(min(old[link], self._q_cap[link]) + new[link], buffer)
            total += q * 8.0 / self._capacity[link]
        return total

    def _excess(self, window, rates: np.ndarray) -> np.ndarray:
        """Each active flow's bytes in flight beyond its bandwidth-delay product at ``rates``:
        at most ``window`` (one for all, or each flow's) and what it has left."""
        inflight = np.minimum(window, self._remaining / 8.0)
        return np.maximum(inflight - rates * self._rtt / 8.0, 0.0)

    def _advance(self, dt: float) -> None:
        if dt > 0 and len(self._ids):
            self._remaining = self._remaining - self._rates * dt

    def _complete(self, finishing: np.ndarray) -> None:
        callbacks = list(
            zip(
                self._ids[finishing].tolist(),
                self._delay[finishing].tolist(),
                self._done_cb[finishing].tolist(),
                strict=True,
            )
        )
        keep = np.ones(len(self._ids), dtype=bool)
        keep[finishing] = False
        self._idx = self._idx[np.repeat(keep, self._lens)]
        self._lens = self._lens[keep]
        self._ids = self._ids[keep]
        self._delay = self._delay[keep]
        self._caps = self._caps[keep]
        self._done_cb = self._done_cb[keep]
        self._remaining = self._remaining[keep]
        self._rtt = self._rtt[keep]
        self._start = self._start[keep]
        self._in_order = self._in_order[keep]
        if self._dcqcn is not None:
            self._dcqcn.keep(keep)
        self._dirty = True
        self._n_events += len(callbacks)
        for flow_id, delay, on_done in callbacks:
            t = self._now + delay
            self.events.push(t, lambda f=flow_id, t=t, cb=on_done: cb(f, t))


def _check_service(service: str, *, ack_load: bool, rate_control) -> None:
    """A link's service (``fair`` or ``fifo``) and the settings FIFO cannot take (the config
    checks it before any task, the simulator for callers that build one directly)."""
    if service not in ("fair", "fifo"):
        raise InputError(f"expected fair or fifo, got {service!r}", field="service")
    if service == "fifo" and (ack_load or rate_control is not None):
        raise InputError(
            "FIFO service shares links as classic flowSim does (with a rate cap, window or "
            "standing queues at most): no ACK load or rate control with it",
            field="service",
        )


def native_fluid() -> bool:
    """Whether flowSim runs its fluid state and event loop in C (``_dagloop.c`` built;
    ``M4RAY_NATIVE=0``: no)."""
    return library() is not None
