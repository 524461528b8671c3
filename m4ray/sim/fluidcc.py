"""A fluid model of RDMA's congestion controls (DCTCP, DCQCN, HPCC, TIMELY) with switch queues
(the sweep's ``fluid_dctcp``): what a max-min share cannot say about a CC's transients.

flowSim gives every flow its max-min share at once. A congestion control gets there by cutting
on marks and climbing back, and on the gray-failure study that path costs time: every chunk of
SimAI's rings is a new queue pair starting at line rate with DCTCP's α = 1, so a sender with
few flows meets marks made by others, halves, and its NIC idles until the additive increase
brings it back (docs/gray_failure_study.md, "The study's gap is made in closed loop"). Under
DCQCN a flow cut deep in its first microseconds climbs back only at its increase timer
(900 µs), so ns-3 runs rail collectives 2.5-10x slower than any max-min share. This model
keeps what those dynamics need and nothing fitted, in the fluid form of DCTCP's analyses
(Alizadeh et al., SIGMETRICS 2011) and DCQCN's NIC algorithm as our ns-3 runs it,
time-stepped at ``dt_s``:

* every flow starts at its line rate (its NIC's, or the network's ``max_rate_bps`` where lower,
  as ns-3 caps a sender) and sends at ``x = min(rate, window / round trip)``; the round trip is
  its base round trip plus the queueing delay on its path now; a host's NIC serves its flows
  max-min with those caps (its queue pairs round robin). The window is scaled by the rate over
  the line rate where the network's is (HPCC's VAR_WIN, our ns-3's ``var_window``, the
  default), or held at the network's window (``var_window=False``); with ``first_window`` (the
  default) a flow that has sent less than its window is not held by it (its first window
  leaves at its rate, before any ACK is back);
* every switch egress link integrates its queue, ``q' = Σ in − C`` (at least 0). With
  ``tandem`` (the default) each hop sees what the hops before it let through: an overloaded
  link passes at most its capacity, shared in proportion to what arrives, so a burst through
  two shared hops queues once, at the first, as in ns-3; without, each link sees its flows'
  sending rates (the single-bottleneck fluid of the DCTCP and DCQCN papers);
* with ``backlog`` (the default, with ``tandem``) each switch queue keeps what each flow holds
  there and passes what it sends on to each flow's next hop, so a burst held at a shared uplink
  still reaches the degraded port behind it (the study's N = 16 gap, docs/gray_failure_study.md).
  A queue sends at most its rate: a flow whose last bit waits there sends what it holds evenly
  from when the first of it leaves to when that bit leaves (FIFO: both when the queue ahead of
  them, at their arrival, has gone), the rest goes to the other flows' bits and what arrives in
  proportion. The ACKs to come are those of what each link sent (a queue: its rate), not of
  what arrived at it;
* with ``ack_load`` (the default) the receivers' ACKs, one per data packet at high priority,
  take their share first: a link gives data ``C − a × (data on its reverse link, last step)``
  (``a`` = ACK bytes per data packet's wire bytes, 64 / 1,048 with 1,000 B payloads), in the
  NIC's share, the queues' drain and the waits they make alike (a queue's delay is what it
  holds over what the ACKs leave of its link: a round trip's queueing, a last bit's wait). A
  ring step's link carries one neighbour's data and the other's ACKs: real ns-3 takes 1 + a of
  the wire's time there, and so does this (a test; another holds a chunk's last bit queued
  behind a reverse flow's ACKs to ns-3's FCT);
* RED marks with probability ``p(q)`` (K_min, K_max, P_max; a step at K where there is no
  K_max); links on an NVSwitch never mark. A mark comes back to the sender as long after as a
  packet takes from that hop's egress to the receiver and its ACK back (``mark_delay="hop"``,
  the default; ``"rtt"``: the network's largest base round trip for every hop), counted in
  time: the history keeps a row per ``dt_s`` of time, each step's marks averaged into its row
  over the time the step covers, so events that split steps do not bring marks back sooner.
  F is a packet's chance of a mark on its path (HPCC's and TIMELY's telemetry the same);
* DCTCP, ``cuts="window"`` (the default): once a round trip per flow, at its own window's end,
  as the sender's CWR runs: with m = 1 − (1 − F)^(packets a round trip), the chance that a
  window of ACKs brings a mark, α ← (1 − g) α + g F, then rate ← rate (1 − m α / 2) +
  (1 − m) AI. Flows that start together cut together, as packets make them. ``cuts="rate"``:
  the same per round trip as continuous rates (α relaxes to F at g a round trip, the rate
  falls by a factor (1 − α / 2)^m a round trip and gains (1 − m) AI): its answers hold still
  as ``dt_s`` shrinks, but it smooths away the synchronised cuts that idle the study's
  degraded senders. The rate stays between the minimum rate and the line rate;
* DCQCN (a network whose ``rdma.cc`` is ``dcqcn``; its ``cc_params``): the ACKs back are
  clocked by what is in flight (in flight / round trip, in flight growing by what is sent), so
  a sender held by its window still hears of the marks on the packets it has queued; each
  brings a CNP with the chance F, and whether one came since a timer's tick is drawn per flow
  and tick from ``seed`` (``cnp="sampled"``: flows at one queue are cut a different number of
  times, as packets make them; ``"expected"``: each change in expectation). The first CNP
  starts the α (every 1 µs), decrease (4 µs) and increase (900 µs) timers as ns-3's do: a
  decrease tick with a CNP since the last halves the rate at α = 1 and restarts the increase
  timer; an increase tick moves the rate half way to its target (fast recovery, then the
  target + AI, then + hyper AI);
* HPCC (``rdma.cc: hpcc``; its ``cc_params``): every data packet carries its telemetry's
  bytes (and every ACK its echo's); a sender whose ACKs come back reads each hop's tx rate and
  queue as the hop stamped them (a return trip ago, per hop), takes the most utilised hop's
  U = tx / C + queue x line rate / (C x window), smooths it over T (the largest base round
  trip) and sets its rate to its reference rate / (U / η) + AI at once (fast react), the
  reference taking that rate once a window; a lone flow settles at η of its line;
* TIMELY (``rdma.cc: timely``): every data packet carries an 8 B send time; once a window per
  flow the RTT its ACKed packet met (its base round trip and the wait at each hop's queue a
  return trip ago, the queue at what the ACKs leave of its link) and the EWMA of its change
  set the rate as our ns-3's ``Timely`` does (below T_low or a gradient at most 0: + AI, five
  times, then + hyper AI; above T_high a cut by β (1 − T_high / RTT); else by β x gradient);
* a flow posted at the instant another was starts up to ``stagger`` packet times later (a draw
  per flow from ``seed``): the fluid finishes symmetric flows together to the bit, packets do
  not, and without it the children they post run in lockstep;
* a flow is done when its last bit has left the sender and waited out each hop's queue in turn
  (``backlog``; without it, the queueing delay on its path when it left the sender), plus the
  routing's delivery delay (propagation and the first packet's store and forward), so a flow
  alone takes its ideal FCT; what its flow still holds at a hop when the last bit is due out
  of it (the split passed others' bits in its place) moves on ahead of it to the next hop's
  queue (FIFO: it left first), so a queue downstream gets every bit of the flows through it.

What it leaves out: PFC and the buffer's limit (the study's 100 MB never fill), a FIFO's exact
order among the flows still arriving at a queue (``backlog`` splits what it sends by what each
holds and what arrives; without it, ``tandem`` by what arrives, and the bits a hop holds never
reach the next), packets and ECMP collisions beyond the routing's, and TCP (it refuses it by
field). The steps
run in C (``_fluidcc.c``, built on first use), this module's numpy loop being the reference and
the fallback (``M4RAY_NATIVE=0``; the two agree to the bit with the C library's exp and pow).

Units: seconds, bits, bits/s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from m4ray.errors import InputError, SimulationError
from m4ray.fingerprint import added_field
from m4ray.models.fairshare import ack_capacity, ack_fraction, reverse_links, round_trip_s
from m4ray.models.wire import wire_window
from m4ray.sim.backend import DoneCallback, EventQueue, QueueClock
from m4ray.sim.flows import Flow
from m4ray.sim.routing import Routing
from m4ray.sim.topology import Topology

_LIB: list = []  # [library or None], loaded once per process

# numpy's element-wise exp, power and log1p (SIMD where the CPU has it): they may round a last
# bit apart from the C library's that _fluidcc.c calls, and the dynamics amplify it; the tests
# swap in the C library's to hold the two to the bit
_exp, _power, _log1p = np.exp, np.power, np.log1p
CCS = ("dcqcn", "hpcc", "timely")  # the CCs beside DCTCP, each with its own parameters
_MIX = (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB)
_STAGGER_DRAW = 1 << 40  # the draw index of a flow's stagger (DCQCN's ticks count from 0)


def uniform(seed: int, ids: np.ndarray, k) -> np.ndarray:
    """A draw in [0, 1) per flow ``ids`` (its id) and draw ``k`` (an index, per flow or one),
    from ``seed``: SplitMix64's finaliser over the three, so a flow's draws do not depend on
    which other flows are active or in what order (``_fluidcc.c`` has the same function)."""
    m = [np.uint64(c) for c in _MIX]
    with np.errstate(over="ignore"):
        z = np.uint64(seed) * m[0] + np.asarray(ids).astype(np.uint64) * m[1]
        z = z + (np.asarray(k).astype(np.uint64) + np.uint64(1)) * m[2]
        z ^= z >> np.uint64(30)
        z *= m[1]
        z ^= z >> np.uint64(27)
        z *= m[2]
        z ^= z >> np.uint64(31)
    return (z >> np.uint64(11)).astype(np.float64) * 2.0**-53


def uniform_one(seed: int, flow_id: int, k: int) -> float:
    """:func:`uniform` for one flow, in Python's integers (a numpy call per flow costs 15x)."""
    mask = (1 << 64) - 1
    m0, m1, m2 = _MIX
    z = (seed * m0 + flow_id * m1 + (k + 1) * m2) & mask
    z ^= z >> 30
    z = (z * m1) & mask
    z ^= z >> 27
    z = (z * m2) & mask
    z ^= z >> 31
    return (z >> 11) * 2.0**-53


def _mean_in(old, now, w_old: float, dt: float):
    """A history slot's mean: ``old`` over ``w_old`` seconds and ``now`` over ``dt`` more
    (``now`` alone where both are 0 long; ``_fluidcc.c``'s ``mean_in``)."""
    w_new = w_old + dt
    return (old * w_old + now * dt) / w_new if w_new > 0.0 else now


def library():
    """``_fluidcc.c`` built and loaded (once per process), or ``None`` without a compiler (or
    with ``M4RAY_NATIVE=0``): then the numpy steps below run, the reference."""
    if not _LIB:
        import ctypes
        from pathlib import Path

        from m4ray import native

        lib = native.load(Path(__file__).with_name("_fluidcc.c"), "compiled RDMA fluid")
        if lib is not None:
            i64, f64, vp, cint = ctypes.c_int64, ctypes.c_double, ctypes.c_void_p, ctypes.c_int
            signatures = {
                "fcc_new": (vp, [i64, vp, vp, vp, vp, vp, vp, i64, vp, cint]),
                "fcc_free": (None, [vp]),
                "fcc_n": (i64, [vp]),
                "fcc_queues": (None, [vp, vp]),
                "fcc_add": (cint, [vp, i64, i64, vp, vp, f64, f64, f64, f64]),
                "fcc_run": (i64, [vp, ctypes.POINTER(f64), f64, vp, vp, i64]),
                "fcc_idle": (None, [vp, f64, f64]),
            }
            for name, (res, args) in signatures.items():
                fn = getattr(lib, name)
                fn.restype, fn.argtypes = res, args
        _LIB.append(lib)
    return _LIB[0]


@dataclass(kw_only=True, slots=True)
class FluidDctcpConfig:
    """The fluid of an ns-3 network config (``network``, an ``Ns3Config`` running RDMA: its
    congestion control and that CC's parameters, its window, marking and minimum rate) and the
    time step and modelling rules below."""

    replay: ClassVar[str] = "dag"

    network: Any
    dt_s: float = 0.5e-6
    # how a flow's rate moves: "window" (once a round trip per flow, at its own ticks: DCTCP's
    # CWR as a packet simulator runs it; flows that start together cut together) or "rate"
    # (per round trip as continuous rates: the mean over when each window's ACKs come back)
    cuts: str = "window"
    # the window as HPCC's VAR_WIN scales it (window x rate / line rate) or held at the
    # network's window; None (the default): as the network says (its ``var_window``)
    var_window: bool | None = None
    # the receivers' ACKs (one per data packet, high priority) take their share of the reverse
    # links, as in ns-3: a ring step's link carries one neighbour's data and the other's ACKs
    ack_load: bool = True
    # a flow that has sent less than its window is not held by it (its first window leaves at
    # its rate, as a packet sender's does before any ACK is back); else the window's W / round
    # trip holds it from its first bit
    first_window: bool = True
    # DCQCN: whether a CNP came since a timer's tick is drawn per flow and tick ("sampled", by
    # ``seed``), or each change taken in expectation ("expected": every flow the average one)
    cnp: str = added_field("sampled", "the fluid's DCQCN (issue 32)")
    seed: int = added_field(0, "the fluid's DCQCN (issue 32)")
    # how long a mark takes back to its sender: "rtt" (the network's largest base round trip,
    # for every hop) or "hop" (from that hop's egress to the receiver and the ACK back)
    mark_delay: str = added_field("hop", "the fluid's DCQCN (issue 32)", ids_had="rtt")
    # each hop sees what the hops before it let through (an overloaded link passes at most its
    # capacity, split in proportion to what arrives), not what the senders send
    tandem: bool = added_field(True, "the fluid's DCQCN (issue 32)", ids_had=False)
    # with tandem: each switch queue keeps what each flow has queued there and passes on its
    # share of what it sends (by what each has queued and what arrives), so a backlog built at
    # one hop reaches the hops after it; a flow is delivered when its last bit has waited out
    # each hop's queue in turn (FIFO), not at the queues on its path when it left the sender
    backlog: bool = added_field(True, "the N = 16 gap (issue 29)", ids_had=False)
    # a flow posted at the instant another was (a tie: a closed loop's symmetric flows finish
    # at the same instant to the bit, and their children are posted together) starts up to
    # this many packet times (at its sender's line rate) later, drawn per flow from ``seed``, as
    # packets never finish together; with 0 such flows start, cut and finish in lockstep, and
    # the study at full size ran 4 % slow
    stagger: float = added_field(1.0, "the full-size closed loop (issue 29)", ids_had=0.0)

    def __post_init__(self) -> None:
        if not self.dt_s > 0:
            raise InputError(f"must be > 0, got {self.dt_s}", field="dt_s")
        if self.cuts not in ("rate", "window"):
            raise InputError(f"expected rate or window, got {self.cuts!r}", field="cuts")
        if self.cnp not in ("sampled", "expected"):
            raise InputError(f"expected sampled or expected, got {self.cnp!r}", field="cnp")
        if self.mark_delay not in ("rtt", "hop"):
            raise InputError(f"expected rtt or hop, got {self.mark_delay!r}", field="mark_delay")
        if not self.stagger >= 0:
            raise InputError(f"must be >= 0 packets, got {self.stagger}", field="stagger")

    def build(self, topology: Topology, routing: Routing) -> FluidDctcp:
        network = self.network
        rdma = network.rdma if network.transport == "rdma" else None
        if rdma is None:
            raise InputError(
                f"models RDMA's congestion controls, not {network.transport}",
                field="fluid_dctcp.network",
            )
        return FluidDctcp(
            topology,
            routing,
            rdma,
            self.dt_s,
            self.cuts,
            var_window=rdma.var_window if self.var_window is None else self.var_window,
            ack_load=self.ack_load,
            cnp=self.cnp,
            seed=self.seed,
            first_window=self.first_window,
            mark_delay=self.mark_delay,
            tandem=self.tandem,
            backlog=self.backlog,
            stagger=self.stagger,
        )


class FluidDctcp(QueueClock):
    """The time-stepped fluid (module docstring), a ``NetworkBackend``."""

    def __init__(
        self,
        topology: Topology,
        routing: Routing,
        rdma,
        dt_s: float,
        cuts: str = "window",
        *,
        var_window: bool = False,
        ack_load: bool = False,
        first_window: bool = True,
        cnp: str = "sampled",
        seed: int = 0,
        mark_delay: str = "hop",
        tandem: bool = True,
        backlog: bool = True,
        stagger: float = 0.0,
    ) -> None:
        self._tandem = tandem
        self._stagger = stagger
        self._posted_at = -math.inf  # when the last flow was posted (stagger's ties)
        self._backlog = tandem and backlog
        self.cnp, self.seed = cnp, seed
        self.topology, self.routing, self.dt_s, self.cuts = topology, routing, dt_s, cuts
        self.ack_bytes = rdma.ack_bytes
        self.gain, self.rate_ai, self.min_rate = (
            rdma.dctcp_gain,
            rdma.rate_ai_bps,
            rdma.min_rate_bps,
        )
        self.alpha_init = getattr(rdma, "dctcp_alpha_init", 1.0)
        # DCQCN's, HPCC's or TIMELY's parameters (ns3.cc's DcqcnParams, HpccParams,
        # TimelyParams) where rdma.cc is that CC, else None (DCTCP: its settings are rdma's)
        self.dcqcn, self.hpcc, self.timely = (
            rdma.cc_config() if rdma.cc == cc else None for cc in CCS
        )
        window_bytes = int(rdma.window(routing) or 0)
        self.events = EventQueue()
        self._now = 0.0
        cap = topology.bandwidth_bps.astype(np.float64)
        self._cap = self._eff = cap  # (_eff: less the ACKs' share, set each step)
        n_links = topology.n_links
        self._marking(topology, rdma)
        self._q = np.zeros(n_links)  # bits queued at each link
        self._rtt_max = self._base_rtt()  # the network's largest base round trip
        self._lag = max(1, round(self._rtt_max / dt_s))
        # marking probability, a row per slot of dt of time (lag + 1 rows: the marks of lag
        # slots back and the slot being written); the time each row has averaged so far; the
        # slot last written and the last that marked
        self._p_hist = np.zeros((self._lag + 1, n_links))
        self._w_hist = np.zeros(self._lag + 1)
        self._slot, self._last_mark = 0, -(1 << 30)
        self._win_bits = wire_window(window_bytes, routing.wire) * 8.0 if window_bytes else 0.0
        # HPCC's VAR_WIN (the window x rate / line rate); the first window leaves unheld
        self._var_window, self._first_window = var_window, first_window
        # ACK bits per data bit on each link's reverse (0: off), and each link's data rate
        # last step, whose ACKs take their share of the reverse link this step
        self._ack_frac = ack_fraction(rdma.ack_bytes, routing.wire) if ack_load else 0.0
        # every sender's line rate: its NIC's, or the network's max_rate_bps where lower (a
        # parking lot's mid-path senders on fast access links, as ns-3 caps them)
        self._max_rate = float(rdma.max_rate_bps or np.inf)
        self._reverse, self._data = reverse_links(n_links), np.zeros(n_links)
        self._pkt_bits = routing.wire.wire_bytes(routing.wire.mtu_bytes) * 8.0
        self._int_bits, self._q_hist, self._tx_hist = 0.0, None, None
        if self.hpcc is not None or self.timely is not None:
            self._telemetry(rdma, topology.n_links, ack_load)
        # active flows: ids, paths (padded with -1) and their per-flow columns (_columns)
        self._ids = np.zeros(0, dtype=np.int64)
        self._links = np.zeros((0, 1), dtype=np.int64)
        empty = np.zeros(0)
        columns = self._new_columns(empty, empty, empty, empty)
        self._columns = tuple(columns)
        for name, column in columns.items():
            setattr(self, name, column)
        # mark_delay="hop": each flow's steps from each hop's egress back to it (padded as
        # _links); None: every hop a base round trip (the history's depth)
        self._hop_lag = np.zeros((0, 1), dtype=np.int64) if mark_delay == "hop" else None
        # backlog: each flow's bits queued at each hop of its path (padded as _links), and
        # when the first of them leaves (FIFO: the queue there when they came, at its rate)
        self._held = np.zeros((0, 1))
        self._head = np.zeros((0, 1))
        self._latency = topology.latency_s
        self._cb: list[DoneCallback] = []
        self._new: list[tuple] = []
        self._routes: dict = {}  # send's per-path (links, base round trip, lags)
        self._groups: tuple[np.ndarray, np.ndarray] | None = None
        self._core = None  # the same steps in C (_fluidcc.c), where it compiles
        lib = library()
        if lib is not None:
            self._start_core(lib, topology)

    def _telemetry(self, rdma, n_links: int, ack_load: bool) -> None:
        """HPCC and TIMELY: the bytes their telemetry (TIMELY's: a send time) adds to every
        data packet and (HPCC's) ACK, HPCC's T, and each link's queue and tx rate, one row a
        step, as the hops stamp them (TIMELY's RTT samples read the queues)."""
        cc = self.hpcc if self.hpcc is not None else self.timely
        self._int_bits = 8.0 * cc.int_bytes
        self._pkt_bits += self._int_bits
        ack_int = self.hpcc.ack_int_bytes if self.hpcc is not None else 0
        if ack_load:
            self._ack_frac = 8.0 * (rdma.ack_bytes + ack_int) / self._pkt_bits
        self._q_hist = np.zeros((self._lag + 1, n_links))
        if self.hpcc is not None:  # its T, and what each link sent, one row a slot
            self._hpcc_t = self.hpcc.base_rtt_s or self._rtt_max
            self._tx_hist = np.zeros((self._lag + 1, n_links))

    def _marking(self, topology: Topology, rdma) -> None:
        """Which links queue (switch egress ports) and mark (unless on an NVSwitch), and each
        one's RED: K_min, K_max (bits) and P_max (a step at K where there is no K_max)."""
        cap, n_links = self._cap, topology.n_links
        src, dst = topology.link_src, topology.link_dst
        hosts = np.zeros(topology.n_nodes, dtype=bool)
        hosts[list(topology.hosts)] = True
        nv = np.zeros_like(hosts)
        nv[list(topology.nvswitches)] = True
        self._switch = ~hosts[src]  # a switch's egress port queues
        self._marks = self._switch & ~nv[src] & ~nv[dst]  # and marks unless on an NVSwitch
        k_min = np.array([rdma.ecn_k(c) for c in cap], dtype=np.float64) * 8.0
        k_max, p_max = k_min.copy(), np.ones(n_links)
        for link, c in enumerate(cap):
            red = rdma.red_marking(c)
            if red is not None:
                k_min[link], k_max[link], p_max[link] = red[0] * 8.0, red[1] * 8.0, red[2]
        self._k_min, self._k_max, self._p_max = k_min, k_max, p_max

    def _start_core(self, lib, topology: Topology) -> None:
        """The state in C: the links' arrays are kept here (C reads them in place)."""
        import ctypes

        self._c_arrays = [
            np.ascontiguousarray(a)
            for a in (
                self._cap,
                self._switch.astype(np.uint8),
                self._marks.astype(np.uint8),
                self._k_min,
                self._k_max,
                self._p_max,
                np.array(
                    [
                        self.gain,
                        self.rate_ai,
                        self.min_rate,
                        self._win_bits,
                        self._pkt_bits,
                        self.alpha_init,
                        self.dt_s,
                        float(self._var_window),
                        self._ack_frac,
                        float(self._first_window),
                        self._max_rate,
                        *self._cc_params(),
                    ]
                ),
            )
        ]
        ptrs = [a.ctypes.data for a in self._c_arrays]
        core = lib.fcc_new(len(self._cap), *ptrs[:6], self._lag, ptrs[6], self.cuts == "window")
        if not core:
            raise MemoryError("fluid DCTCP: no memory for its state")
        self._lib, self._core = lib, ctypes.c_void_p(core)
        self._c_now = ctypes.c_double(0.0)
        self._c_out = (np.zeros(0, dtype=np.int64), np.zeros(0), None, None)  # and addresses
        self._c_cb: dict[int, DoneCallback] = {}

    def _cc_params(self) -> list[float]:
        """The C core's params past the eleventh: DCQCN's flag, CNPs drawn, seed, per-hop
        mark delays, tandem, DCQCN's nine, then HPCC's (its flag, η, AI, max stage, T) and
        TIMELY's (its flag, T_low, T_high, β, EWMA weight, min RTT, AI, hyper AI), then
        backlog."""
        p, h = self.dcqcn, self.hpcc
        common = [float(self.cnp == "sampled"), float(self.seed)]
        common += [float(self._hop_lag is not None), float(self._tandem)]
        dcqcn = [0.0] * 9
        if p is not None:
            dcqcn = [p.gain, p.alpha_interval_s, p.decrease_interval_s, p.increase_interval_s]
            dcqcn += [float(p.fast_recovery_steps), p.rate_ai_bps, p.rate_hai_bps]
            dcqcn += [float(p.clamp_target_rate), p.rate_on_first_cnp]
        hpcc = [0.0] * 5
        if h is not None:
            hpcc = [1.0, h.target_utilization, h.rate_ai_bps, float(h.max_stage), self._hpcc_t]
        t = self.timely
        timely = [0.0] * 8
        if t is not None:
            timely = [1.0, t.t_low_s, t.t_high_s, t.beta, t.ewma, t.min_rtt_s]
            timely += [t.rate_ai_bps, t.rate_hai_bps]
        return [float(p is not None), *common, *dcqcn, *hpcc, *timely, float(self._backlog)]

    def __del__(self) -> None:
        if getattr(self, "_core", None) is not None:
            self._lib.fcc_free(self._core)
            self._core = None

    def _base_rtt(self) -> float:
        """The largest base round trip over host pairs (the marks' feedback delay)."""
        from m4ray.sim.ns3.transports import max_base_rtt_s

        return max_base_rtt_s(self.routing, self.ack_bytes)

    # ------------------------------------------------------------ protocol
    def send(self, flow: Flow, on_done: DoneCallback) -> None:
        path = self.routing.path(flow.src, flow.dst, flow.id)
        tied, self._posted_at = self._now == self._posted_at, self._now
        if tied and self._stagger > 0:  # not the first posted now: it starts a draw later
            line = min(self._cap[path.links[0]], self._max_rate)
            draw = uniform_one(self.seed, flow.id, _STAGGER_DRAW)
            self.schedule(
                draw * self._stagger * self._pkt_bits / line,
                lambda: self._post(flow, path, on_done),
            )
        else:
            self._post(flow, path, on_done)

    def _post(self, flow: Flow, path, on_done: DoneCallback) -> None:
        """``flow`` joins the fluid now, on ``path``."""
        wire = self.routing.wire
        bits = wire.wire_bytes(flow.size_bytes) * 8.0
        if self._int_bits:  # HPCC: every data packet carries its telemetry
            bits += -(-flow.size_bytes // wire.mtu_bytes) * self._int_bits
        route = self._routes.get(path)
        if route is None:  # a path's links, base round trip and marks' lags, once per path
            # (the arrays stay here, alive for the addresses C reads them at)
            links = np.asarray(path.links, dtype=np.int64)
            rtt = round_trip_s(wire, path.latency_s, path.inverse_bw_sum, self.ack_bytes)
            lags = self._lags_of(links, rtt) if self._hop_lag is not None else None
            at = (links.ctypes.data, None if lags is None else lags.ctypes.data)
            route = self._routes[path] = (links, rtt, lags, *at)
        links, rtt, _, links_at, lags_at = route
        delay = self.routing.delivery_delay(flow.size_bytes, path)
        if self._core is not None:
            rc = self._lib.fcc_add(
                self._core,
                flow.id,
                len(links),
                links_at,
                lags_at,
                bits,
                rtt,
                delay,
                self._now,
            )
            if rc:
                raise SimulationError(f"fluid DCTCP: flow {flow.id} not added (code {rc})")
            self._c_cb[flow.id] = on_done
            return
        self._new.append((flow.id, path.links, bits, rtt, delay, on_done))

    def _new_columns(self, bits, rtt, delay, line) -> dict[str, np.ndarray]:
        """Every per-flow column's values for new flows of these wire bits, base round trips,
        delivery delays and line rates (:meth:`_flush` appends them, :meth:`_finish` drops
        the done flows' rows of each)."""
        n = len(bits)
        zero, one, inf = np.zeros(n), np.ones(n), np.full(n, np.inf)
        return {
            "_left": bits,  # bits not yet sent
            "_bits": bits,  # bits in all (sent: bits - left)
            "_rate": line,
            "_line": line,
            "_alpha": np.full(n, self.alpha_init),
            # cuts=window, HPCC, TIMELY: the next window end (HPCC: none until its first ACKs
            # set its reference)
            "_tick": inf if self.hpcc is not None else self._now + rtt,
            "_rtt0": rtt,
            "_delay": delay,
            # DCQCN: target rate, increase stage (HPCC's and TIMELY's too), the next α,
            # decrease and increase ticks (inf: none before the first CNP), the chance of no
            # CNP since the last α and decrease ticks (since the start before the first CNP)
            # and the decrease ticks drawn (cnp="sampled")
            "_target": line,
            "_stage": zero,
            "_t_alpha": inf,
            "_t_dec": inf,
            "_t_inc": inf,
            "_u_alpha": one,
            "_u_dec": one,
            "_n_dec": zero,
            # DCQCN, HPCC: the bits in flight (the ACKs' clock)
            "_inflight": zero,
            # HPCC, TIMELY: the reference rate (once a window); HPCC: the smoothed
            # utilisation; TIMELY: the last RTT sample (NaN: none yet), its change's EWMA
            "_cur": line,
            "_util": one,
            "_last_rtt": np.full(n, np.nan),
            "_rtt_diff": zero,
            # backlog: the hop its last bit waits at (-1: still sending) and when it leaves
            # that hop's queue
            "_lb_hop": np.full(n, -1, dtype=np.int64),
            "_lb_t": inf,
        }

    def _lags_of(self, links: np.ndarray, rtt: float) -> np.ndarray:
        """``mark_delay="hop"``: the steps a mark made at each hop's egress takes back to the
        sender (the round trip less the time from the sender to that hop's egress: each hop
        before it a packet's store and forward and its propagation), between 1 and a base
        round trip's."""
        hop = self._latency[links] + self._pkt_bits / self._cap[links]
        ahead = rtt - np.concatenate([[0.0], np.cumsum(hop)[:-1]])
        return np.clip(np.round(ahead / self.dt_s), 1, self._lag).astype(np.int64)

    def _flush(self) -> None:
        if not self._new:
            return
        ids, links, bits, rtt, delay, cbs = zip(*self._new, strict=True)
        self._new = []
        self._groups = None
        width = max(self._links.shape[1], *map(len, links))
        pad = np.full((len(ids), width), -1, dtype=np.int64)
        for i, ls in enumerate(links):
            pad[i, : len(ls)] = ls
        old = np.full((len(self._ids), width), -1, dtype=np.int64)
        old[:, : self._links.shape[1]] = self._links
        line = np.minimum(self._cap[pad[:, 0]], self._max_rate)
        rtt = np.asarray(rtt)
        if self._hop_lag is not None:
            lags = np.ones((len(ids), width), dtype=np.int64)
            for i, ls in enumerate(links):
                lags[i, : len(ls)] = self._lags_of(np.asarray(ls, dtype=np.int64), rtt[i])
            old_lag = np.ones((len(self._ids), width), dtype=np.int64)
            old_lag[:, : self._hop_lag.shape[1]] = self._hop_lag
            self._hop_lag = np.concatenate([old_lag, lags])
        for name in ("_held", "_head"):
            grown = np.zeros((len(self._ids) + len(ids), width))
            grown[: len(self._ids), : getattr(self, name).shape[1]] = getattr(self, name)
            setattr(self, name, grown)
        self._ids = np.concatenate([self._ids, ids])
        self._links = np.concatenate([old, pad])
        new = self._new_columns(np.asarray(bits, dtype=np.float64), rtt, np.asarray(delay), line)
        for name, column in new.items():
            setattr(self, name, np.concatenate([getattr(self, name), column]))
        self._cb.extend(cbs)

    def run(self, until: float | None = None) -> None:
        horizon = math.inf if until is None else until
        events = self.events
        while True:
            self._flush()
            t_event = events.peek_time()
            if not self._n_active():
                if t_event == math.inf or t_event > horizon:
                    break
                self._idle(t_event)
                self._now = t_event
            else:
                self._advance(min(t_event, horizon))
                if self._now >= horizon:
                    break
            while events.peek_time() <= self._now:
                _, fn = events.pop()
                fn()

    def queue_bytes(self) -> np.ndarray:
        """Each directed link's queue now (bytes): what its egress holds (a probe's view, as
        ns-3's ``Backlog``; ``bench/study_queues.py``)."""
        if self._core is None:
            return self._q / 8.0
        out = np.zeros(len(self._cap))
        self._lib.fcc_queues(self._core, out.ctypes.data)
        return out / 8.0

    def _n_active(self) -> int:
        # the core's flows are those whose completion is still to come back (fcc_n's count)
        return len(self._ids) if self._core is None else len(self._c_cb)

    def _advance_core(self, t_far: float) -> None:
        """:meth:`_advance` in C: steps until ``t_far`` or until flows send their last bit,
        whose completions are pushed in the reference's order."""
        n = self._n_active()
        if len(self._c_out[0]) < n:
            ids, times = np.zeros(2 * n, dtype=np.int64), np.zeros(2 * n)
            self._c_out = (ids, times, ids.ctypes.data, times.ctypes.data)
        ids, times, ids_at, times_at = self._c_out
        self._c_now.value = self._now
        k = self._lib.fcc_run(self._core, self._c_now, t_far, ids_at, times_at, len(ids))
        self._now = self._c_now.value
        for j in range(k):
            fid, t_done = int(ids[j]), float(times[j])
            cb = self._c_cb.pop(fid)
            self.events.push(t_done, lambda fid=fid, cb=cb, t=t_done: cb(fid, t))

    # ------------------------------------------------------------ the fluid
    def _idle(self, t_end: float) -> None:
        """No flow sends from now to ``t_end``: every queue drains at its link's rate, and the
        marks in flight are those of the drained queues (a gap of at least a round trip:
        what they say by then)."""
        gap = t_end - self._now
        if self._core is not None:
            self._lib.fcc_idle(self._core, gap, t_end)
            return
        if gap <= 0:
            return
        self._data[:] = 0.0  # nothing sent: no ACKs
        if not self._q.any():
            return
        sw = self._switch
        self._q[sw] = np.maximum(0.0, self._q[sw] - self._cap[sw] * gap)
        if gap >= self._lag * self.dt_s:
            marks = self._marks_now()
            self._p_hist[:] = marks
            self._w_hist[:] = 0.0
            self._slot = math.floor(t_end / self.dt_s)
            self._last_mark = self._slot - (0 if marks.any() else self._lag + 1)

    def _marks_now(self) -> np.ndarray:
        """Each link's marking probability at its queue now (RED; NVSwitch links never)."""
        q, k_min = self._q, self._k_min
        span = np.maximum(self._k_max - k_min, 1e-9)
        p = np.where(q <= k_min, 0.0, np.minimum(1.0, self._p_max * (q - k_min) / span))
        p = np.where(q >= self._k_max, 1.0, p)
        p[~self._marks] = 0.0
        return p

    def _wait(self, links):
        """A queue's wait: what ``links``' queues hold over what the ACKs leave of them (every
        delay of the fluid: a round trip's queueing, a last bit's, a first bit's, TIMELY's;
        ``_fluidcc.c``'s ``wait_at``)."""
        return self._q[links] / self._eff[links]

    def _queue_delay(self, links: np.ndarray) -> np.ndarray:
        """Each flow's queueing delay over its path now (s)."""
        valid = links >= 0
        per = np.where(valid, self._wait(links), 0.0)
        return per.sum(axis=1)

    def _advance(self, t_far: float) -> None:
        """Step the fluid from now by ``dt_s``, or to ``t_far`` (the next event) where nothing
        moves meanwhile (no queue, no mark in flight, every flow at its line rate and no port
        overfilled: then every rate holds), or less where a flow's last bit leaves first."""
        if self._core is not None:
            self._advance_core(t_far)
            return
        links = self._links
        cap = self._cap
        if self._ack_frac:  # the ACKs of last step's data on each reverse link
            cap = ack_capacity(cap, self._reverse, self._ack_frac, self._data)
        self._eff = cap  # what the queues drain at this step (their delays)
        qdelay = self._queue_delay(links)
        x = self._rate.copy()
        if self._win_bits:
            w, held = self._win_bits / (self._rtt0 + qdelay), self._win_bits
            if self._var_window:  # VAR_WIN: the window x rate / line rate
                scale = self._rate / self._line
                w, held = w * scale, held * scale
            if self._first_window:  # a flow that has sent less than its window: no hold
                w = np.where(self._bits - self._left < held, np.inf, w)
            x = np.minimum(x, w)
        if self._backlog:  # a flow whose last bit has left sends no more
            x = np.where(self._lb_hop >= 0, 0.0, x)
        x = self._nic_share(x, cap)
        with np.errstate(divide="ignore", invalid="ignore"):
            t_out = np.where(x > 0, self._left / x, np.inf)
        # queues: every switch egress link integrates what its flows send
        valid = links >= 0
        sent = np.broadcast_to(x[:, None], links.shape)[valid]
        arrive = np.bincount(links[valid], weights=sent, minlength=len(self._q))
        if self._tandem and not self._backlog:  # what each hop lets through: at most C
            arrive = self._tandem_arrivals(x, arrive, cap)
        sw = self._switch
        sending = self._lb_hop < 0  # (every flow without backlog)
        quiet = (
            self.hpcc is None  # HPCC moves a lone flow at its line rate too (to η of it)
            and not self._q.any()
            and self._slot - self._last_mark > self._lag  # no mark in flight
            and (self._rate[sending] >= self._line[sending]).all()
            and (arrive[sw] <= cap[sw]).all()
            and (not self._ack_frac or np.array_equal(arrive, self._data))
        )
        t_next = t_far if quiet else min(t_far, self._now + self.dt_s)
        dt = min(t_next - self._now, float(t_out.min()))
        if self._backlog:  # up to the next last bit due out of a queue, then through the hops
            waiting = self._lb_t[self._lb_t > self._now]
            if len(waiting):
                dt = min(dt, float(waiting.min()) - self._now)
            arrive = self._pass_backlogs(x, arrive, cap, dt)  # (and the queues)
        else:
            self._q[sw] = np.maximum(0.0, self._q[sw] + (arrive[sw] - cap[sw]) * dt)
        if self._ack_frac and not self._backlog:
            self._data = arrive
        elif self._ack_frac:  # what each link sent (a queue at its rate): the ACKs to come
            self._data = np.where(self._q > 0, cap, np.minimum(arrive, cap))
        self._left -= x * dt
        self._now += dt
        if self.dcqcn is not None or self.hpcc is not None:
            self._ack_clock(x, dt, self._rtt0 + qdelay, arrive, cap)
        self._control(x, self._rtt0 + qdelay, dt, self._unmarked(dt))
        self._sent_all(np.flatnonzero(t_out <= dt * (1 + 1e-12)))

    def _tandem_arrivals(self, x: np.ndarray, arrive: np.ndarray, cap: np.ndarray):
        """``tandem`` without ``backlog``: each link's arrivals when each hop lets through at
        most its capacity, split by what arrives (a pass per later hop)."""
        links = self._links
        valid = links >= 0
        for _ in range(int(valid.sum(axis=1).max()) - 1):
            over = arrive > cap
            through = np.ones(len(arrive))
            through[over] = cap[over] / arrive[over]
            hop = np.where(valid, through[np.where(valid, links, 0)], 1.0)
            ahead = np.cumprod(hop, axis=1)[:, :-1]  # the share left before each hop
            sent = x[:, None] * np.concatenate([np.ones((len(x), 1)), ahead], axis=1)
            arrive = np.bincount(links[valid], weights=sent[valid], minlength=len(self._q))
        return arrive

    def _sent_all(self, done: np.ndarray) -> None:
        """The flows ``done`` (indices) have sent their last bit: with ``backlog`` it joins
        their first hop's queue (:meth:`_last_bits`); without, each is delivered after the
        queues on its path now and its delivery delay."""
        if self._backlog:
            first = self._links[done, 0]
            self._left[done], self._lb_hop[done] = 0.0, 0
            self._lb_t[done] = self._now + self._wait(first)
            self._last_bits()
        elif len(done):
            qd = self._queue_delay(self._links[done])
            self._finish(done, self._now + qd + self._delay[done])

    def _pass_backlogs(self, x: np.ndarray, arrive: np.ndarray, cap: np.ndarray, dt: float):
        """``backlog``: what each switch queue sends over ``dt`` (at most C), passed on to each
        flow's next hop. A flow whose last bit waits in the queue sends what it has there from
        when the first of it leaves to when that bit leaves, evenly (FIFO: what came before it
        goes first); the rest of C goes to every other flow's bits there and what arrives, in
        proportion (and to the queue's bits no flow holds any more, as one more). A pass per
        hop (from the senders' rates at every hop), the last one kept. Each link's arrivals
        (bits/s) come out; each flow's bits queued per hop, when the first of them leaves, and
        each queue are updated."""
        links, q, held, now = self._links, self._q, self._held, self._now
        sw = self._switch
        if not q[sw].any() and (arrive[sw] <= cap[sw]).all():
            return arrive  # no queue and none to come: every hop passes what arrives
        valid = links >= 0
        at = np.where(valid, links, 0)
        n_links = len(q)
        here = np.arange(links.shape[1])[None, :] == self._lb_hop[:, None]
        first = np.maximum(now, (self._head * here).sum(axis=1))
        span = self._lb_t - first
        with np.errstate(divide="ignore", invalid="ignore"):
            frac = np.where(span > 0, np.clip((now + dt - first) / span, 0.0, 1.0), 1.0)
        must = np.where(here, held * frac[:, None], 0.0)
        mine = np.bincount(links[here], weights=held[here], minlength=n_links)
        due = np.bincount(links[here], weights=must[here], minlength=n_links)
        anon = np.maximum(q - np.bincount(links[valid], weights=held[valid], minlength=n_links), 0)
        out_max = np.where(sw, cap * dt, np.inf)
        with np.errstate(divide="ignore", invalid="ignore"):
            psi = np.where(due > out_max, out_max / due, 1.0)
        room = np.maximum(out_max - due, 0.0)
        a = np.empty(links.shape)
        for _ in range(int(valid.sum(axis=1).max())):
            content = np.maximum(q - mine + arrive * dt, 0.0)
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                phi = np.where(content > room, room / content, 1.0)
            cur = x
            for k in range(links.shape[1]):
                a[:, k] = cur
                link = at[:, k]
                nxt = phi[link] * (held[:, k] / dt + cur)
                nxt = np.where(here[:, k], psi[link] * must[:, k] / dt, nxt)
                cur = np.where(valid[:, k], nxt, cur)
            arrive = np.bincount(links[valid], weights=a[valid], minlength=n_links)
        came = valid & (held == 0) & (a > 0)  # the first bits to wait here: when they leave
        self._head = np.where(came, now + self._wait(at), self._head)
        held = held + a * dt
        passed = np.where(here, psi[at] * must, phi[at] * held)
        self._held = np.where(valid, held - passed, 0.0)
        out = np.bincount(links[valid], weights=passed[valid], minlength=n_links) + phi * anon
        left = q[sw] + arrive[sw] * dt - out[sw]
        q[sw] = np.where(left > 1.0, left, 0.0)  # (under a bit: the sums' rounding, gone)
        return arrive

    def _last_bits(self) -> None:
        """``backlog``: each flow's last bit due out of the queue it waits at leaves it and
        joins the next hop's queue, to leave it when what is queued there now has gone (at
        what the ACKs leave of the link); those out of their last hop are delivered after their
        delivery delay. What the flow still has at the hop it leaves has left before its last
        bit (FIFO) though the split passed others' bits in its place: it moves on with the last
        bit, ahead of it, to the next hop's queue (at the last hop it stays as others'). Flow by
        flow in the state's order, as C runs it (a move changes the queues the next one meets)."""
        hop, t, links, held, q = self._lb_hop, self._lb_t, self._links, self._held, self._q
        n_hops = (links >= 0).sum(axis=1)
        due = np.flatnonzero((hop >= 0) & (hop < n_hops) & (t <= self._now))
        for i in due.tolist():
            while hop[i] < n_hops[i] and t[i] <= self._now:
                k = hop[i]
                left, held[i, k] = held[i, k], 0.0
                hop[i] = k + 1
                if k + 1 < n_hops[i]:
                    here, there = links[i, k], links[i, k + 1]
                    if left > 0.0 and self._switch[there]:  # FIFO: it left first, queued ahead
                        if held[i, k + 1] == 0.0:
                            self._head[i, k + 1] = t[i] + self._wait(there)
                        held[i, k + 1] += left
                        q[here] = max(q[here] - left, 0.0)
                        q[there] += left
                    t[i] = t[i] + self._wait(there)
        out = np.flatnonzero(hop >= n_hops)
        if len(out):
            self._finish(out, np.maximum(self._now, t[out] + self._delay[out]))

    def _ack_clock(self, x, dt: float, rtt, arrive: np.ndarray, cap: np.ndarray) -> None:
        """DCQCN and HPCC: each flow's bits acknowledged over ``dt`` (what is in flight over a
        round trip, in flight growing by what it sends); HPCC: what each link sent (its data
        and the ACKs on it), which its telemetry stamps."""
        keep = _exp(-dt / rtt)
        was = self._inflight
        self._inflight = was * keep + x * rtt * (1.0 - keep)
        self._acked = was + x * dt - self._inflight
        if self.hpcc is not None:
            busy = self._q > 0
            self._tx = np.where(busy, cap, np.minimum(arrive, cap)) + (self._cap - cap)

    def _unmarked(self, dt: float) -> np.ndarray:
        """Each flow's chance that a packet's ACK back now carries no mark: the marks its path's
        queues made a base round trip ago (``mark_delay="rtt"``: the network's largest), or,
        per hop, as long ago as a packet takes from that hop's egress to the receiver and its
        ACK back (``"hop"``: a mark made at the last hop comes back sooner than one at the
        first). Then this step's marks (and telemetry) go into the history, averaged over the
        ``dt`` of its slot they cover: a mark comes back after its delay in time, however many
        events split the steps between."""
        links = self._links
        ok = links >= 0
        ring = self._lag + 1
        slot = math.floor(self._now / self.dt_s)
        if slot > self._slot:  # slots no step ended in, and this one: empty rows
            fresh = np.arange(max(self._slot + 1, slot - ring + 1), slot + 1) % ring
            for hist in (self._p_hist, self._q_hist, self._tx_hist):
                if hist is not None:
                    hist[fresh] = 0.0
            self._w_hist[fresh] = 0.0
            self._slot = slot
        row = slot % ring
        # each hop's row: lag slots back (rtt), or as many as its own delay (hop)
        rows = (slot - (self._lag if self._hop_lag is None else self._hop_lag)) % ring
        at = np.where(ok, links, 0)
        unmarked = np.where(ok, 1.0 - self._p_hist[rows, at], 1.0).prod(axis=1)
        w_old = self._w_hist[row]
        if self._q_hist is not None:  # each hop's telemetry as stamped a return trip ago
            self._int_q = np.where(ok, self._q_hist[rows, at], 0.0)
            # HPCC's hops stamp their queues (bits); TIMELY's packets the wait they meet there,
            # each queue at what the ACKs leave of its link (as a last bit waits)
            stamp = self._q if self.hpcc is not None else self._wait(slice(None))
            self._q_hist[row] = _mean_in(self._q_hist[row], stamp, w_old, dt)
        if self.hpcc is not None:
            self._int_tx = np.where(ok, self._tx_hist[rows, at], 0.0)
            self._tx_hist[row] = _mean_in(self._tx_hist[row], self._tx, w_old, dt)
        marks = self._marks_now()
        self._p_hist[row] = _mean_in(self._p_hist[row], marks, w_old, dt)
        self._w_hist[row] = w_old + dt
        if marks.any():
            self._last_mark = slot
        return unmarked

    def _control(self, x: np.ndarray, rtt: np.ndarray, dt: float, unmarked: np.ndarray) -> None:
        """DCTCP's α and rate over ``dt``: per round trip (a window of ACKs), as rates."""
        if self.dcqcn is not None:
            self._dcqcn_step(x, dt, unmarked)
            return
        if self.hpcc is not None:
            self._hpcc_step(dt, rtt)
            return
        if self.timely is not None:
            self._timely_step(rtt)
            return
        frac = 1.0 - unmarked  # a packet's chance of a mark on the path
        pkts = np.maximum(1.0, x * rtt / self._pkt_bits)
        m = 1.0 - _power(unmarked, pkts)  # a window's chance of a mark: a cut (its CWR)
        if self.cuts == "window":
            self._window_ends(frac, m, rtt)
            return
        step = dt / rtt
        self._alpha = frac + (self._alpha - frac) * _exp(-self.gain * step)  # g a round trip
        r = self._rate  # a cut multiplies by 1 - α / 2: per round trip, in expectation over m
        r *= _exp(m * _log1p(-self._alpha / 2.0) * step)
        r += (1.0 - m) * self.rate_ai * step
        np.clip(r, self.min_rate, self._line, out=r)

    def _dcqcn_step(self, x: np.ndarray, dt: float, unmarked: np.ndarray) -> None:
        """DCQCN over ``dt`` (ns-3's ``Cnp`` and its three timers, per flow). The ACKs of this
        step's packets bring a CNP with the chance their marks give (marks of a base round
        trip ago, one ACK a packet); whether one came since a timer's last tick is drawn, per
        flow and tick, from a hash of the seed, the flow and the tick (:func:`uniform`), as
        packets make it in ns-3, so flows that see the same queue are cut a different number
        of times, and one cut deep waits out the increase timer (``cnp="expected"``: each
        change in expectation instead, which keeps every flow the average one). The first
        CNP starts the timers (α = 1, target = rate x ``rate_on_first_cnp``); each α tick
        α <- (1 - g) α + g P(CNP since the last); a decrease tick with a CNP since the last:
        target <- rate (clamped, or past stage 0), rate <- max(min, rate (1 - α / 2)), stage
        0, the increase timer restarted; each increase tick: fast recovery, then the target
        + AI, then + hyper AI, and rate <- (rate + target) / 2."""
        sampled = self.cnp == "sampled"
        # marked ACKs come as a thinned stream: none in this step with chance e^(-n F), for n
        # packets a step (often below one: a flow's share of a busy NIC) marked with chance F
        no_cnp = _exp(-(self._acked / self._pkt_bits) * (1.0 - unmarked))
        self._u_alpha *= no_cnp
        self._u_dec *= no_cnp
        # the first CNP: when its chance since the start passes the flow's own draw (or 1/2)
        waiting = np.flatnonzero(np.isinf(self._t_alpha))
        first_at = uniform(self.seed, self._ids[waiting], 0) if sampled else 0.5
        first = waiting[1.0 - self._u_dec[waiting] >= first_at]
        self._dcqcn_first(first)
        self._dcqcn_alpha()
        self._dcqcn_decrease(sampled)
        self._dcqcn_increase()

    def _hpcc_step(self, dt: float, rtt: np.ndarray) -> None:
        """HPCC over ``dt`` (our ns-3's ``Hpcc``, reference ``CC_MODE 3``, with fast react):
        a flow whose ACKs come back reads its path's telemetry as the switch egresses stamped
        it (a return trip ago, per hop; the sender's own NIC stamps none): U, the most utilised
        hop's tx rate / C + queue x line rate / (C x window), smoothed over T (the base round
        trip) into its utilisation; its rate is then its reference rate / (utilisation / η) +
        AI (or + AI only below η for the first ``max_stage`` rounds), between the minimum and
        the line rate; once a round trip (a window of data) the reference rate takes it. A
        flow's first ACKs only set its reference."""
        p = self.hpcc
        acking = np.flatnonzero(self._acked > 0)
        if not len(acking):
            return
        fresh = acking[np.isinf(self._tick[acking])]  # the first window: keep the reference
        self._tick[fresh] = self._now + rtt[fresh]
        on = np.setdiff1d(acking, fresh)
        if not len(on):
            return
        # the hops that stamp telemetry: switch egresses (NVSwitches too), not the sender's
        # NIC; a path with none brings no telemetry and its rate holds (ns-3 skips that ACK)
        links = self._links[on]
        at = np.where(links >= 0, links, 0)
        stamped = (links >= 0) & self._switch[at]
        keep = stamped.any(axis=1)
        on, at, stamped = on[keep], at[keep], stamped[keep]
        if not len(on):
            return
        cap = self._cap[at]
        window = self._win_bits if self._win_bits else np.inf
        u_hop = self._int_tx[on] / cap + self._int_q[on] * self._line[on, None] / (cap * window)
        big_u = np.where(stamped, u_hop, 0.0).max(axis=1)
        decay = _exp(-min(dt, self._hpcc_t) / self._hpcc_t)
        util = big_u + (self._util[on] - big_u) * decay
        self._util[on] = util
        max_c = util / p.target_utilization
        mult = (max_c >= 1.0) | (self._stage[on] >= p.max_stage)
        cur = self._cur[on]
        rate = np.where(mult, cur / np.maximum(max_c, 1e-12), cur) + p.rate_ai_bps
        rate = np.minimum(self._line[on], np.maximum(self.min_rate, rate))
        self._rate[on] = rate
        full = self._now >= self._tick[on]
        done = on[full]
        self._cur[done] = rate[full]
        self._stage[done] = np.where(mult[full], 0.0, self._stage[done] + 1.0)
        self._tick[done] = self._now + rtt[done]

    def _timely_step(self, rtt: np.ndarray) -> None:
        """TIMELY (our ns-3's ``Timely``, reference ``CC_MODE 7``), once a window per flow (at
        its own ticks): the RTT its ACKed packet met (its base round trip and the waits at the
        queues on its path as each hop held them a return trip ago) and the EWMA of its change,
        normalised by the minimum RTT, set the rate: below T_low, or with a gradient at most 0,
        an increase (AI five times, then hyper AI); above T_high a cut by β (1 − T_high / RTT);
        else a cut by β x gradient. A flow's first sample only sets its last RTT."""
        p = self.timely
        due = np.flatnonzero(self._now >= self._tick)
        if not len(due):
            return
        ok = self._links[due] >= 0
        sample = self._rtt0[due] + np.where(ok, self._int_q[due], 0.0).sum(axis=1)
        last = self._last_rtt[due]
        on = ~np.isnan(last)
        diff = (1.0 - p.ewma) * self._rtt_diff[due] + p.ewma * (sample - last)
        gradient = diff / p.min_rtt_s
        up = (sample < p.t_low_s) | ((sample <= p.t_high_s) & (gradient <= 0.0))
        high = p.t_high_s / sample
        c = np.where(sample > p.t_high_s, 1.0 - p.beta * (1.0 - high), 1.0 - p.beta * gradient)
        c = np.maximum(0.0, c)
        cur, stage = self._cur[due], self._stage[due]
        step = np.where(stage < 5, p.rate_ai_bps, p.rate_hai_bps)
        rate = np.where(
            up, np.minimum(self._line[due], cur + step), np.maximum(self.min_rate, cur * c)
        )
        rate = np.where(on, rate, self._rate[due])
        self._rate[due] = rate
        self._cur[due] = np.where(on, rate, cur)
        self._stage[due] = np.where(on, np.where(up, stage + 1.0, 0.0), stage)
        self._rtt_diff[due] = np.where(on, diff, self._rtt_diff[due])
        self._last_rtt[due] = sample
        self._tick[due] = self._now + rtt[due]

    def _dcqcn_first(self, first: np.ndarray) -> None:
        """The flows ``first`` have their first CNP now: their timers start."""
        p, now, t_alpha, t_dec = self.dcqcn, self._now, self._t_alpha, self._t_dec
        if len(first):
            self._alpha[first] = 1.0
            t_alpha[first] = now + p.alpha_interval_s
            t_dec[first] = now + p.decrease_interval_s + 1e-9
            self._rate[first] *= p.rate_on_first_cnp
            self._target[first] = self._rate[first]
            self._u_alpha[first], self._u_dec[first] = 1.0, 0.0  # its decrease tick cuts

    def _dcqcn_alpha(self) -> None:
        """The α ticks due by now."""
        p, t_alpha = self.dcqcn, self._t_alpha
        due = np.flatnonzero(self._now >= t_alpha)
        if len(due):  # n ticks since (several only after a jump, with no CNP after the first)
            n = np.floor((self._now - t_alpha[due]) / p.alpha_interval_s) + 1.0
            keep = _power(1.0 - p.gain, n - 1.0)
            a = (1.0 - p.gain) * self._alpha[due] + p.gain * (1.0 - self._u_alpha[due])
            self._alpha[due] = a * keep
            self._u_alpha[due] = 1.0
            t_alpha[due] += n * p.alpha_interval_s

    def _dcqcn_decrease(self, sampled: bool) -> None:
        """The decrease ticks due by now: a cut where a CNP came since the last."""
        p, t_dec, t_inc = self.dcqcn, self._t_dec, self._t_inc
        due = np.flatnonzero(self._now >= t_dec)
        if len(due):
            n = np.floor((self._now - t_dec[due]) / p.decrease_interval_s) + 1.0
            chance = 1.0 - self._u_dec[due]
            if sampled:  # this tick's draw: a CNP came or not
                self._n_dec[due] += 1.0
                draw = uniform(self.seed, self._ids[due], self._n_dec[due])
                cnp = (draw < chance).astype(np.float64)
            else:
                cnp = chance
            cut, pc = due[cnp > 0], cnp[cnp > 0]
            if len(cut):
                rate = self._rate[cut]
                hold = (self._stage[cut] != 0) | p.clamp_target_rate
                self._target[cut] += np.where(hold, pc * (rate - self._target[cut]), 0.0)
                r = rate * (1.0 - pc * self._alpha[cut] / 2.0)
                self._rate[cut] = np.maximum(self.min_rate, r)
                self._stage[cut] = np.where(pc >= 0.5, 0.0, self._stage[cut])
                restart, old = t_dec[cut] + p.increase_interval_s, t_inc[cut]
                blend = pc * restart + (1.0 - pc) * np.where(np.isinf(old), 0.0, old)
                t_inc[cut] = np.where(np.isinf(old) | (pc >= 1.0), restart, blend)
            self._u_dec[due] = 1.0
            t_dec[due] += n * p.decrease_interval_s

    def _dcqcn_increase(self) -> None:
        """The increase ticks due by now (several only after a jump, every rate at its line)."""
        p, t_inc = self.dcqcn, self._t_inc
        while True:
            due = np.flatnonzero(self._now >= t_inc)
            if not len(due):
                break
            stage, target = self._stage[due], self._target[due]
            raise_by = np.where(stage == p.fast_recovery_steps, p.rate_ai_bps, 0.0)
            raise_by = np.where(stage > p.fast_recovery_steps, p.rate_hai_bps, raise_by)
            target = np.minimum(self._line[due], target + raise_by)
            self._target[due] = target
            self._rate[due] = self._rate[due] / 2.0 + target / 2.0
            self._stage[due] = stage + 1.0
            t_inc[due] += p.increase_interval_s

    def _window_ends(self, frac: np.ndarray, m: np.ndarray, rtt: np.ndarray) -> None:
        """``cuts="window"``: the flows whose window ended by now update once, as DCTCP's
        sender does at a window's last ACK (α by g, then a cut by α / 2 if the window saw a
        mark, else the AI; in expectation over m), and start their next window."""
        due = np.flatnonzero(self._now >= self._tick)
        if not len(due):
            return
        a = (1 - self.gain) * self._alpha[due] + self.gain * frac[due]
        self._alpha[due] = a
        r = self._rate[due] * (1.0 - m[due] * a / 2.0) + (1.0 - m[due]) * self.rate_ai
        self._rate[due] = np.clip(r, self.min_rate, self._line[due])
        self._tick[due] = self._now + rtt[due]

    def _finish(self, done: np.ndarray, times: np.ndarray) -> None:
        """The flows ``done`` (indices) are delivered at ``times``; they leave the active set."""
        for j, i in enumerate(done):
            t_done = float(times[j])
            fid, cb = int(self._ids[i]), self._cb[i]
            self.events.push(t_done, lambda fid=fid, cb=cb, t=t_done: cb(fid, t))
        keep = np.ones(len(self._ids), dtype=bool)
        keep[done] = False
        names = ("_ids", "_links", "_held", "_head", *self._columns)
        if self._hop_lag is not None:
            names = (*names, "_hop_lag")
        for name in names:
            setattr(self, name, getattr(self, name)[keep])
        self._groups = None
        self._cb = [cb for cb, k in zip(self._cb, keep, strict=True) if k]

    def _nic_share(self, x: np.ndarray, capacity: np.ndarray) -> np.ndarray:
        """Each host link's flows max-min over its ``capacity`` with caps ``x`` (round
        robin)."""
        if self._groups is None:  # the active flows changed: their NICs again
            self._groups = np.unique(self._links[:, 0], return_inverse=True)
        groups, inv = self._groups
        cap = capacity[groups]
        total = np.bincount(inv, weights=x, minlength=len(groups))
        over = total > cap * (1 + 1e-12)
        if not over.any():
            return x
        sel = over[inv]
        level = cap / np.bincount(inv, minlength=len(groups))
        for _ in range(64):  # water-filling: flows under the level keep their caps
            under = sel & (x < level[inv])
            used = np.bincount(inv[under], weights=x[under], minlength=len(groups))
            n_free = np.bincount(inv[sel & ~under], minlength=len(groups))
            new = np.where(n_free > 0, (cap - used) / np.maximum(n_free, 1), level)
            if (np.abs(new - level) <= 1e-12 * level).all():
                break
            level = new
        out = x.copy()
        out[sel] = np.minimum(x[sel], level[inv[sel]])
        return out
