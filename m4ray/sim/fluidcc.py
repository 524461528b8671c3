"""A fluid model of RDMA DCTCP with switch queues (the sweep's ``fluid_dctcp``): what a
max-min share cannot say about a congestion control's transients.

flowSim gives every flow its max-min share at once. A congestion control gets there by cutting
on marks and climbing back, and on the gray-failure study that path costs time: every chunk of
SimAI's rings is a new queue pair starting at line rate with DCTCP's α = 1, so a sender with
few flows meets marks made by others, halves, and its NIC idles until the additive increase
brings it back (docs/gray_failure_study.md, "The study's gap is made in closed loop"). This
model keeps what those dynamics need and nothing fitted, in the fluid form of DCTCP's
analyses (Alizadeh et al., SIGMETRICS 2011), time-stepped at ``dt_s``:

* every flow starts at its line rate (its NIC's, or the network's ``max_rate_bps`` where lower,
  as ns-3 caps a sender) and sends at ``x = min(rate, window / round trip)``; the round trip is
  its base round trip plus the queueing delay on its path now; a host's NIC serves its flows
  max-min with those caps (its queue pairs round robin). The window is scaled by the rate over
  the line rate where the network's is (HPCC's VAR_WIN, our ns-3's ``var_window``, the
  default), or held at the network's window (``var_window=False``: closer to ns-3 on the
  full-size study, far from it at other message sizes; docs/gray_failure_study.md);
* every switch egress link integrates its queue, ``q' = Σ x − C`` (at least 0): each link sees
  its flows' sending rates (the single-bottleneck fluid of the DCTCP and DCQCN papers);
* with ``ack_load`` (the default) the receivers' ACKs, one per data packet at high priority,
  take their share first: a link gives data ``C − a × (data on its reverse link, last step)``
  (``a`` = ACK bytes per data packet's wire bytes, 64 / 1,048 with 1,000 B payloads), in the
  NIC's share and the queues' drain alike. A ring step's link carries one neighbour's data and
  the other's ACKs: real ns-3 takes 1 + a of the wire's time there, and so does this (a test);
* RED marks with probability ``p(q)`` (K_min, K_max, P_max; a step at K where there is no
  K_max); links on an NVSwitch never mark; a sender sees the marks one base round trip late;
  F, a packet's chance of a mark on its path, and m = 1 − (1 − F)^(packets a round trip), the
  chance that a window of ACKs brings one;
* ``cuts="window"`` (the default): once a round trip per flow, at its own window's end, as the
  sender's CWR runs: α ← (1 − g) α + g F, then rate ← rate (1 − m α / 2) + (1 − m) AI. Flows
  that start together cut together, as packets make them. ``cuts="rate"``: the same per round
  trip as continuous rates (α relaxes to F at g a round trip, the rate falls by a factor
  (1 − α / 2)^m a round trip and gains (1 − m) AI): its answers hold still as ``dt_s`` shrinks,
  but it smooths away the synchronised cuts that idle the study's degraded senders. The rate
  stays between the minimum rate and the line rate;
* a flow is done when its last bit has left the sender plus the queueing delay on its path
  then plus the routing's delivery delay (propagation and the first packet's store and
  forward), so a flow alone takes its ideal FCT.

What it leaves out: PFC and the buffer's limit (the study's 100 MB never fill), a queue's
output split among its flows (each link sees what senders send, not what upstream queues let
through), packets and ECMP collisions beyond the routing's, and DCQCN, HPCC or TIMELY (it
refuses any CC but DCTCP). The steps run in C (``_fluidcc.c``, built on first use), this module's
numpy loop being the reference and the fallback (``M4RAY_NATIVE=0``).

Units: seconds, bits, bits/s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from m4ray.errors import InputError, SimulationError
from m4ray.models.fairshare import ack_capacity, ack_fraction, reverse_links, round_trip_s
from m4ray.models.wire import wire_window
from m4ray.sim.backend import DoneCallback, EventQueue, QueueClock
from m4ray.sim.flows import Flow
from m4ray.sim.routing import Routing
from m4ray.sim.topology import Topology

_LIB: list = []  # [library or None], loaded once per process


def library():
    """``_fluidcc.c`` built and loaded (once per process), or ``None`` without a compiler (or
    with ``M4RAY_NATIVE=0``): then the numpy steps below run, the reference."""
    if not _LIB:
        import ctypes
        from pathlib import Path

        from m4ray import native

        lib = native.load(Path(__file__).with_name("_fluidcc.c"), "compiled fluid DCTCP")
        if lib is not None:
            i64, f64, vp, cint = ctypes.c_int64, ctypes.c_double, ctypes.c_void_p, ctypes.c_int
            signatures = {
                "fcc_new": (vp, [i64, vp, vp, vp, vp, vp, vp, i64, vp, cint]),
                "fcc_free": (None, [vp]),
                "fcc_n": (i64, [vp]),
                "fcc_add": (cint, [vp, i64, i64, vp, f64, f64, f64, f64]),
                "fcc_run": (i64, [vp, ctypes.POINTER(f64), f64, vp, vp, i64]),
                "fcc_idle": (None, [vp, f64]),
            }
            for name, (res, args) in signatures.items():
                fn = getattr(lib, name)
                fn.restype, fn.argtypes = res, args
        _LIB.append(lib)
    return _LIB[0]


@dataclass(kw_only=True, slots=True)
class FluidDctcpConfig:
    """The fluid DCTCP of an ns-3 network config (``network``, an ``Ns3Config`` running RDMA
    DCTCP: its window, marking, gain, AI, minimum rate and α's start) and the time step."""

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
    first_window: bool = False

    def __post_init__(self) -> None:
        if not self.dt_s > 0:
            raise InputError(f"must be > 0, got {self.dt_s}", field="dt_s")
        if self.cuts not in ("rate", "window"):
            raise InputError(f"expected rate or window, got {self.cuts!r}", field="cuts")

    def build(self, topology: Topology, routing: Routing) -> FluidDctcp:
        network = self.network
        rdma = network.rdma if network.transport == "rdma" else None
        if rdma is None or rdma.cc != "dctcp":
            cc = network.transport if rdma is None else rdma.cc
            raise InputError(f"models RDMA DCTCP, not {cc}", field="fluid_dctcp.network")
        return FluidDctcp(
            topology,
            routing,
            rdma,
            self.dt_s,
            self.cuts,
            var_window=rdma.var_window if self.var_window is None else self.var_window,
            ack_load=self.ack_load,
            first_window=self.first_window,
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
        first_window: bool = False,
    ) -> None:
        self.topology, self.routing, self.dt_s, self.cuts = topology, routing, dt_s, cuts
        self.ack_bytes = rdma.ack_bytes
        self.gain, self.rate_ai, self.min_rate = (
            rdma.dctcp_gain,
            rdma.rate_ai_bps,
            rdma.min_rate_bps,
        )
        self.alpha_init = getattr(rdma, "dctcp_alpha_init", 1.0)
        window_bytes = int(rdma.window(routing) or 0)
        self.events = EventQueue()
        self._now = 0.0
        cap = topology.bandwidth_bps.astype(np.float64)
        self._cap = cap
        n_links = topology.n_links
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
                k_max[link], p_max[link] = red[1] * 8.0, red[2]
        self._k_min, self._k_max, self._p_max = k_min, k_max, p_max
        self._q = np.zeros(n_links)  # bits queued at each link
        self._lag = max(1, round(self._base_rtt() / dt_s))
        self._p_hist = np.zeros((self._lag, n_links))  # marking probability, one row per step
        self._step = 0
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
        # active flows
        self._ids = np.zeros(0, dtype=np.int64)
        self._links = np.zeros((0, 1), dtype=np.int64)  # padded with -1
        self._left = np.zeros(0)  # bits not yet sent
        self._bits = np.zeros(0)  # bits in all (sent: bits - left)
        self._rate = np.zeros(0)
        self._line = np.zeros(0)
        self._alpha = np.zeros(0)
        self._tick = np.zeros(0)  # cuts=window: each flow's next window end
        self._rtt0 = np.zeros(0)
        self._delay = np.zeros(0)
        self._cb: list[DoneCallback] = []
        self._new: list[tuple] = []
        self._groups: tuple[np.ndarray, np.ndarray] | None = None
        self._core = None  # the same steps in C (_fluidcc.c), where it compiles
        lib = library()
        if lib is not None:
            self._start_core(lib, topology)

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
        self._c_out = (np.zeros(0, dtype=np.int64), np.zeros(0))
        self._c_cb: dict[int, DoneCallback] = {}

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
        wire = self.routing.wire
        bits = wire.wire_bytes(flow.size_bytes) * 8.0
        rtt = round_trip_s(wire, path.latency_s, path.inverse_bw_sum, self.ack_bytes)
        delay = self.routing.delivery_delay(flow.size_bytes, path)
        if self._core is not None:
            links = np.asarray(path.links, dtype=np.int64)
            rc = self._lib.fcc_add(
                self._core, flow.id, len(links), links.ctypes.data, bits, rtt, delay, self._now
            )
            if rc:
                raise SimulationError(f"fluid DCTCP: flow {flow.id} not added (code {rc})")
            self._c_cb[flow.id] = on_done
            return
        self._new.append((flow.id, path.links, bits, rtt, delay, on_done))

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
        self._ids = np.concatenate([self._ids, ids])
        self._links = np.concatenate([old, pad])
        self._left = np.concatenate([self._left, bits])
        self._bits = np.concatenate([self._bits, bits])
        self._rate = np.concatenate([self._rate, line])
        self._line = np.concatenate([self._line, line])
        self._alpha = np.concatenate([self._alpha, np.full(len(ids), self.alpha_init)])
        self._tick = np.concatenate([self._tick, self._now + rtt])
        self._rtt0 = np.concatenate([self._rtt0, rtt])
        self._delay = np.concatenate([self._delay, delay])
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
                self._idle(t_event - self._now)
                self._now = t_event
            else:
                self._advance(min(t_event, horizon))
                if self._now >= horizon:
                    break
            while events.peek_time() <= self._now:
                _, fn = events.pop()
                fn()

    def _n_active(self) -> int:
        return len(self._ids) if self._core is None else self._lib.fcc_n(self._core)

    def _advance_core(self, t_far: float) -> None:
        """:meth:`_advance` in C: steps until ``t_far`` or until flows send their last bit,
        whose completions are pushed in the reference's order."""
        n = self._n_active()
        if len(self._c_out[0]) < n:
            self._c_out = (np.zeros(2 * n, dtype=np.int64), np.zeros(2 * n))
        ids, times = self._c_out
        self._c_now.value = self._now
        k = self._lib.fcc_run(
            self._core, self._c_now, t_far, ids.ctypes.data, times.ctypes.data, len(ids)
        )
        self._now = self._c_now.value
        for j in range(k):
            fid, t_done = int(ids[j]), float(times[j])
            cb = self._c_cb.pop(fid)
            self.events.push(t_done, lambda fid=fid, cb=cb, t=t_done: cb(fid, t))

    # ------------------------------------------------------------ the fluid
    def _idle(self, gap: float) -> None:
        """No flow sends for ``gap`` seconds: every queue drains at its link's rate, and the
        marks in flight are those of the drained queues (a gap of at least a round trip:
        what they say by then)."""
        if self._core is not None:
            self._lib.fcc_idle(self._core, gap)
            return
        if gap <= 0:
            return
        self._data[:] = 0.0  # nothing sent: no ACKs
        if not self._q.any():
            return
        sw = self._switch
        self._q[sw] = np.maximum(0.0, self._q[sw] - self._cap[sw] * gap)
        if gap >= self._lag * self.dt_s:
            self._p_hist[:] = self._marks_now()

    def _marks_now(self) -> np.ndarray:
        """Each link's marking probability at its queue now (RED; NVSwitch links never)."""
        q, k_min = self._q, self._k_min
        span = np.maximum(self._k_max - k_min, 1e-9)
        p = np.where(q <= k_min, 0.0, np.minimum(1.0, self._p_max * (q - k_min) / span))
        p = np.where(q >= self._k_max, 1.0, p)
        p[~self._marks] = 0.0
        return p

    def _queue_delay(self, links: np.ndarray) -> np.ndarray:
        """Each flow's queueing delay over its path now (s)."""
        valid = links >= 0
        per = np.where(valid, self._q[links] / self._cap[links], 0.0)
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
        x = self._nic_share(x, cap)
        with np.errstate(divide="ignore"):
            t_out = np.where(x > 0, self._left / x, np.inf)
        # queues: every switch egress link integrates what its flows send
        valid = links >= 0
        sent = np.broadcast_to(x[:, None], links.shape)[valid]
        arrive = np.bincount(links[valid], weights=sent, minlength=len(self._q))
        sw = self._switch
        quiet = (
            not self._q.any()
            and not self._p_hist.any()
            and (self._rate >= self._line).all()
            and (arrive[sw] <= cap[sw]).all()
            and (not self._ack_frac or np.array_equal(arrive, self._data))
        )
        t_next = t_far if quiet else min(t_far, self._now + self.dt_s)
        dt = min(t_next - self._now, float(t_out.min()))
        self._q[sw] = np.maximum(0.0, self._q[sw] + (arrive[sw] - cap[sw]) * dt)
        if self._ack_frac:
            self._data = arrive
        self._left -= x * dt
        self._now += dt
        self._control(x, self._rtt0 + qdelay, dt, self._marks_seen())
        done = np.flatnonzero(t_out <= dt * (1 + 1e-12))
        if len(done):
            self._finish(done)

    def _marks_seen(self) -> np.ndarray:
        """Each link's marking probability now, into the history; the one senders see now (a
        base round trip ago)."""
        p = self._marks_now()
        row = self._step % self._lag
        seen = self._p_hist[row].copy()  # written lag steps ago
        self._p_hist[row] = p
        self._step += 1
        return seen

    def _control(self, x: np.ndarray, rtt: np.ndarray, dt: float, seen: np.ndarray) -> None:
        """DCTCP's α and rate over ``dt``: per round trip (a window of ACKs), as rates."""
        links = self._links
        ok = links >= 0
        unmarked = np.where(ok, 1.0 - seen[np.where(ok, links, 0)], 1.0).prod(axis=1)
        frac = 1.0 - unmarked  # a packet's chance of a mark on the path
        pkts = np.maximum(1.0, x * rtt / self._pkt_bits)
        m = 1.0 - np.power(unmarked, pkts)  # a window's chance of a mark: a cut (its CWR)
        if self.cuts == "window":
            self._window_ends(frac, m, rtt)
            return
        step = dt / rtt
        self._alpha = frac + (self._alpha - frac) * np.exp(-self.gain * step)  # g a round trip
        r = self._rate  # a cut multiplies by 1 - α / 2: per round trip, in expectation over m
        r *= np.exp(m * np.log1p(-self._alpha / 2.0) * step)
        r += (1.0 - m) * self.rate_ai * step
        np.clip(r, self.min_rate, self._line, out=r)

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

    def _finish(self, done: np.ndarray) -> None:
        """The flows ``done`` (indices) have sent their last bit: each is delivered after the
        queues on its path now and its delivery delay; they leave the active set."""
        qd = self._queue_delay(self._links[done])
        for j, i in enumerate(done):
            t_done = self._now + qd[j] + self._delay[i]
            fid, cb = int(self._ids[i]), self._cb[i]
            self.events.push(t_done, lambda fid=fid, cb=cb, t=t_done: cb(fid, t))
        keep = np.ones(len(self._ids), dtype=bool)
        keep[done] = False
        names = (
            "_ids",
            "_left",
            "_bits",
            "_rate",
            "_line",
            "_alpha",
            "_tick",
            "_rtt0",
            "_delay",
            "_links",
        )
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
