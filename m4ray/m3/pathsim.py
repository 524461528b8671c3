"""flowSim on one path (a "parking lot"): max-min fair fluid rates for flows that enter and leave a
chain of ``L`` directed links at any point (``reference/flowsim_m3.md`` A.1, A.2, B.4).

A flow of class ``(a, b)`` crosses links ``a .. b-1``. Every flow of a class gets the same max-min
rate, so the rates are a water-filling over at most ``L(L+1)/2`` classes weighted by their flow
counts, and within a class flows finish in order of the bits they still have: each class keeps the
service (bits) one of its flows has received since the class began, and a heap of the service at
which each of its flows is done. An event costs O(L² + log n) instead of O(links × flows), with
the same answers as the generic :mod:`m4ray.sim.flowsim` on the equivalent topology.

Every flow is also capped at ``nic_cap_bps`` (m3: a flow entering mid-path still comes from a host
NIC, so a lone flow on a 40G middle link runs at 10G). Completion wins ties with arrivals; flows
finishing at the same instant finish together. The output is each flow's *sojourn*: arrival until
its last bit has drained; latency terms are the caller's (:mod:`m4ray.m3.lot`). With ``queues``
(:class:`~m4ray.sim.flowsim.StandingQueues`' model on the path) a flow arriving also waits for
the standing queues of the full path links it crosses, and the wait is part of its sojourn.

The loop below is the reference; :func:`path_drain_times` runs its compiled twin
(``_pathsim.c`` via :mod:`m4ray.m3.native`, the same operations in the same order) where a C
compiler is available (a 3,000-flow 6-hop lot: 5 ms vs 260 ms).

Units: bits, bits/s, seconds.
"""

from __future__ import annotations

import collections
import heapq
import math

import numpy as np

from m4ray.errors import InputError, SimulationError
from m4ray.m3.native import library as native_library
from m4ray.m3.native import path_finish as native_finish
from m4ray.sim.flowsim import QUEUE_FULL

_REL_TIE = 1e-9  # as m4ray.sim.flowsim: events this close (relative) happen together


def class_rates(
    classes: list[tuple[int, int]],
    counts: list[int],
    capacity_bps: list[float],
    nic_cap_bps: float | None,
) -> list[float]:
    """Max-min fair per-flow rate (bits/s) of each class ``(a, b)`` holding ``counts`` flows, by
    progressive filling; classes with no flows get 0."""
    rate = [0.0] * len(classes)
    open_ = [i for i, n in enumerate(counts) if n > 0]
    remaining = list(capacity_bps)
    cap = math.inf if nic_cap_bps is None else nic_cap_bps
    while open_:
        load = [0] * len(remaining)
        for i in open_:
            a, b = classes[i]
            for link in range(a, b):
                load[link] += counts[i]
        level = min(remaining[link] / n for link, n in enumerate(load) if n)
        if cap <= level:
            for i in open_:
                rate[i] = cap
            return rate
        level = max(level, 0.0)
        limit = level * (1 + _REL_TIE)
        bottleneck = [n > 0 and remaining[link] / n <= limit for link, n in enumerate(load)]
        still = []
        for i in open_:
            a, b = classes[i]
            if any(bottleneck[a:b]):
                rate[i] = level
                for link in range(a, b):
                    remaining[link] -= counts[i] * level
            else:
                still.append(i)
        open_ = still
    return rate


def check_flows(n_links: int, a: np.ndarray, b: np.ndarray, bits: np.ndarray, start_s: np.ndarray):
    """Reject flows that do not fit the path (field named; nothing is simulated)."""
    if not len(a) == len(b) == len(bits) == len(start_s):
        raise InputError("a, b, bits and start_s must have one entry per flow", field="flows")
    if len(a) and (a.min() < 0 or (b <= a).any() or b.max() > n_links):
        raise InputError(f"every flow needs 0 <= a < b <= {n_links} (path links)", field="a/b")
    if len(bits) and (bits <= 0).any():
        raise InputError("every flow must carry > 0 bits", field="bits")
    if len(start_s) and not np.isfinite(start_s).all():
        raise InputError("start times must be finite", field="start_s")


def _drained(heaps, service, rates, tick: float) -> list[tuple[int, int]]:
    """Pop ``(class, flow)`` of every flow whose last bit has drained."""
    out = []
    for c, heap in enumerate(heaps):
        while heap and heap[0][0] - service[c] <= max(
            _REL_TIE * max(heap[0][0], 1.0), rates[c] * tick
        ):
            out.append((c, heapq.heappop(heap)[1]))
    return out


def path_drain_times(
    a: np.ndarray,
    b: np.ndarray,
    bits: np.ndarray,
    start_s: np.ndarray,
    capacity_bps: np.ndarray | list[float],
    *,
    nic_cap_bps: float | None = None,
    queues: tuple | None = None,
    native: bool | None = None,
    rates=None,
) -> np.ndarray:
    """Seconds from each flow's arrival until its last bit drained (index order of the input).

    ``a``/``b``: first path link and last link + 1 of each flow; ``bits``: wire bits; ``start_s``:
    arrival times; ``capacity_bps``: the path's links in order. ``queues``: standing queues, as
    (each flow's round trip s, the senders' window on the wire in bytes, each path link's most
    queued bytes[, first[, buffer]]): a flow also waits for the queues of the full links it
    crosses; with ``first`` true only flows in their first round trip keep their excess in
    flight (HPCC's first windows, :attr:`~m4ray.sim.flowsim.StandingQueues.first_rtt`); with a
    ``buffer`` (bytes, > 0) flows in their first round trip queue their excess on top of the
    level, up to it, every flow's in flight at most the bits it has left
    (:attr:`~m4ray.sim.flowsim.StandingQueues.buffer_bytes`). ``native``:
    run the compiled loop (:mod:`m4ray.m3.native`, same answers to rounding; ``None``: where it
    builds) or this module's.

    ``rates`` (:class:`~m4ray.sim.flowsim.DcqcnRates`): flows keep DCQCN's rates, each its own
    (cut to its share where a switch's link fills and marks, back up at the increase timer), so
    a class no longer shares one rate: the lot runs per flow in flowSim's compiled fluid state
    (:func:`dcqcn_drain_times`), not this loop.
    """
    a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
    bits, start_s = np.asarray(bits, dtype=np.float64), np.asarray(start_s, dtype=np.float64)
    capacity = [float(c) for c in capacity_bps]
    check_flows(len(capacity), a, b, bits, start_s)
    flow_class, classes = _classes(a, b, len(capacity))
    order = np.argsort(start_s, kind="stable")
    if native is None:
        native = native_library() is not None
    if queues is not None:
        rtt, window, qcap, *rest = queues
        rtt = np.asarray(rtt, dtype=np.float64)
        if len(rtt) != len(a) or len(qcap) != len(capacity):
            raise InputError("one round trip per flow and one cap per path link", field="queues")
        first = bool(rest and rest[0])
        buffer = float(rest[1]) if len(rest) > 1 and rest[1] else 0.0
        if buffer < 0:
            raise InputError(f"must be >= 0 (0: off), got {buffer}", field="queues.buffer")
        queues = (rtt, float(window), [float(q) for q in qcap], first, buffer)
    if rates is not None:
        return dcqcn_drain_times(a, b, bits, start_s, capacity, nic_cap_bps, queues, rates)
    run = native_finish if native else _finish
    finish = run(
        flow_class, bits, start_s, order, classes, capacity, nic_cap_bps=nic_cap_bps, queues=queues
    )
    return finish - start_s


def dcqcn_drain_times(  # noqa: PLR0917 (path_drain_times' checked arguments)
    a: np.ndarray,
    b: np.ndarray,
    bits: np.ndarray,
    start_s: np.ndarray,
    capacity: list[float],
    nic_cap_bps: float | None,
    queues: tuple | None,
    rates,
) -> np.ndarray:
    """:func:`path_drain_times` under DCQCN's rates: flowSim's fluid state
    (:class:`~m4ray.sim.flowsim.FlowSim` with ``rate_control``, compiled) over the path's links
    alone. Link 0 leaves the source host (no CNPs, no queue); every other leaves a switch. A
    flow entering mid-path comes from a host NIC: its line rate is the NIC cap (on the lot's
    topology its first link is an access link far faster). Answers equal the generic flowSim's
    on the lot topology when no path link is slower than the NIC cap (m3's lots;
    ``tests/m3/test_pathsim.py``). Needs the compiled loop: the Python reference is that
    generic flowSim, whose round trips are the lot routes' own."""
    from m4ray.models.fairshare import ACK_PASSES
    from m4ray.sim.dagloop import NativeLoop

    loop = NativeLoop.make(np.asarray(capacity, dtype=np.float64), 0.0, ACK_PASSES, True)
    if loop is None:
        raise SimulationError(
            "path flowSim with DCQCN's rates runs in flowSim's compiled fluid state, and no C "
            "compiler was found (or M4RAY_NATIVE=0)"
        )
    n, n_links = len(a), len(capacity)
    cap = math.inf if nic_cap_bps is None else float(nic_cap_bps)
    rtt = np.zeros(n)
    if queues is not None:
        rtt, window, qcap, first, buffer = queues
        loop.queued(window, np.asarray(qcap, dtype=np.float64), first, buffer)
    params = rates.params()
    switch = np.arange(n_links) > 0
    loop.dcqcn(params, rates.min_rate_bps, switch, rates.k_min_bytes(capacity))
    lens = b - a
    off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lens, out=off[1:])
    idx = np.repeat(a - off[:-1], lens) + np.arange(off[-1])  # links a .. b-1 of each flow
    line = np.where(a > 0, cap, min(cap, capacity[0]))
    finish, wait = loop.trace((off, idx), bits, start_s, np.full(n, cap), rtt, line)
    return finish + wait - start_s


def first_appearance(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each item's code with distinct keys numbered in order of first appearance, and the index
    of each code's first item."""
    keys = np.asarray(keys)
    small = keys.ndim == 1 and keys.dtype.kind in "iu" and len(keys) > 0
    if small:
        low = int(keys.min())
        small = int(keys.max()) - low < np.iinfo(np.int16).max
    if small:  # small keys (a path's classes): np.unique's sort by radix, stably
        order = np.argsort((keys - low).astype(np.int16), kind="stable")
        ordered = keys[order]
        new = np.r_[True, ordered[1:] != ordered[:-1]]
        first = order[new]  # each distinct key's first item, in key order
        inverse = np.empty(len(keys), dtype=np.int64)
        inverse[order] = np.cumsum(new) - 1
    else:
        _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    by_first = np.argsort(first)
    rank = np.empty(len(first), dtype=np.int64)
    rank[by_first] = np.arange(len(first))
    return rank[inverse.reshape(-1)], first[by_first]


def _classes(a: np.ndarray, b: np.ndarray, n_links: int) -> tuple[np.ndarray, list]:
    """Each flow's class index and the classes ``(a, b)``, numbered in order of first appearance."""
    codes, first = first_appearance(a * (n_links + 1) + b)
    return codes, [(int(a[i]), int(b[i])) for i in first]


def _finish(  # noqa: PLR0917 (the compiled loop's signature)
    flow_class: np.ndarray,
    bits: np.ndarray,
    start_s: np.ndarray,
    order: np.ndarray,
    classes: list[tuple[int, int]],
    capacity: list[float],
    *,
    nic_cap_bps: float | None,
    queues: tuple[np.ndarray, float, list[float], bool, float] | None = None,
) -> np.ndarray:
    """The event loop in Python: the time each flow's last bit drained (plus, with ``queues``,
    what it waited for standing queues at its arrival)."""
    n, k = len(flow_class), len(classes)
    finish = np.full(n, np.nan)
    wait = np.zeros(n)
    standing = (
        None if queues is None else _Queues(flow_class, k, queues, capacity, start_s, nic_cap_bps)
    )
    counts, service = [0] * k, [0.0] * k
    heaps: list[list[tuple[float, int]]] = [[] for _ in range(k)]
    order = order.tolist()
    starts = start_s[order].tolist()
    cls, bits = flow_class.tolist(), bits.tolist()
    rates: list[float] = [0.0] * k
    now, nxt, active, dirty = 0.0, 0, 0, False
    while nxt < n or active:
        t_done = math.inf
        if active:
            if dirty:
                rates = class_rates(classes, counts, capacity, nic_cap_bps)
                dirty = False
            for c in range(k):
                if counts[c]:
                    if rates[c] <= 0:
                        raise SimulationError("flows with zero rate: a path link has no capacity")
                    t_done = min(t_done, now + max(heaps[c][0][0] - service[c], 0.0) / rates[c])
        t_arrive = starts[nxt] if nxt < n else math.inf
        t = t_done if t_done <= t_arrive else t_arrive
        for c in range(k):
            if counts[c]:
                service[c] += rates[c] * (t - now)
        now = t
        if t_done <= t_arrive:
            # every flow whose last bit drains now, ties included: within a relative tolerance
            # in bits, or closer than the clock can resolve (a few ulps of `now`: a remainder
            # that advances no time must still finish, or the loop would spin)
            done = _drained(heaps, service, rates, 4 * math.ulp(now))
            for c, i in done:
                finish[i] = now
                counts[c] -= 1
            active -= len(done)
            dirty = True
        else:
            while nxt < n and starts[nxt] <= now:
                i = order[nxt]
                c = cls[i]
                if standing is not None:
                    if dirty:
                        rates = class_rates(classes, counts, capacity, nic_cap_bps)
                        dirty = False
                    wait[i] = standing.wait(
                        c, classes, counts, rates, now=now, finish=finish, active=(heaps, service)
                    )
                    standing.arrived(c, i)
                heapq.heappush(heaps[c], (service[c] + bits[i], i))
                counts[c] += 1
                active += 1
                nxt += 1
                dirty = True
    if queues is not None:
        finish = finish + wait
    return finish


class _Queues:
    """Standing queues on a path (``_pathsim.c``'s, sum for sum): per path link the data rate
    and the bytes the flows crossing it keep in flight beyond their bandwidth-delay product,
    summed by class in class order once per rate computation (with ``first``: only the flows
    in their first round trip keep theirs, so the sums age with time and are made at every
    arrival); a flow arriving waits for the queues of the full links it crosses. With a
    ``buffer`` the young flows' excess (each flow's in flight at most its bits left) queues on
    top of the others', which stand at most at the level, up to the buffer; made at every
    arrival."""

    def __init__(  # noqa: PLR0917 (the compiled loop's arguments)
        self,
        flow_class: np.ndarray,
        k: int,
        queues: tuple,
        capacity: list[float],
        start_s,
        nic_cap_bps: float | None = None,
    ) -> None:
        rtt, self.window, self.qcap, self.first, self.buffer = queues
        self.capacity = capacity
        self.nic_cap = math.inf if nic_cap_bps is None else nic_cap_bps
        self.rtt = rtt.tolist()  # each flow's own (bursts); the other modes take its class's
        self.class_rtt = [0.0] * k
        for i in range(len(flow_class) - 1, -1, -1):  # each class's first flow's
            self.class_rtt[int(flow_class[i])] = float(rtt[i])
        self.rates: list[float] | None = None
        self.sums: tuple[list[float], list[float]] = ([], [])
        self.start = start_s.tolist()
        self.recent: list[collections.deque] = [collections.deque() for _ in range(k)]

    def arrived(self, c: int, i: int) -> None:
        if self.first and not self.buffer:
            self.recent[c].append(i)

    def _young(self, j: int, now: float, finish: np.ndarray) -> int:
        """Class ``j``'s active flows that arrived less than its round trip ago."""
        recent = self.recent[j]
        while recent and not (now - self.start[recent[0]] < self.class_rtt[j]):
            recent.popleft()
        return sum(1 for i in recent if math.isnan(finish[i]))

    def wait(
        self, c: int, classes, counts, rates: list[float], *, now: float, finish, active
    ) -> float:
        if self.buffer:
            return self._burst_wait(c, classes, counts, rates, now=now, active=active)
        if self.first or rates is not self.rates:  # new rates (or time): sum again
            self.rates = rates
            load, excess = [0.0] * len(self.capacity), [0.0] * len(self.capacity)
            for j, (a, b) in enumerate(classes):
                if not counts[j]:
                    continue
                e = max(self.window - rates[j] * self.class_rtt[j] / 8.0, 0.0)
                keep = float(self._young(j, now, finish) if self.first else counts[j])
                for link in range(a, b):
                    load[link] += counts[j] * rates[j]
                    excess[link] += keep * e
            self.sums = (load, excess)
        load, excess = self.sums
        total = 0.0
        for link in range(*classes[c]):
            if load[link] < self.capacity[link] * (1.0 - QUEUE_FULL):
                continue
            total += min(excess[link], self.qcap[link]) * 8.0 / self.capacity[link]
        return total

    def _burst_wait(self, c: int, classes, counts, rates, *, now: float, active) -> float:
        """The wait with first windows over the level (``buffer``): every active flow's excess
        over its bandwidth-delay product at its own round trip, its in flight at most the bits
        it has left; the old flows' stands at most at the level (none with ``first``), the
        young flows' (in their first round trip) on top. Without a window a young flow has out
        at most what its sender's line rate (the lesser of the NIC cap and its class's first
        link) puts on the wire in one round trip, all it can send before its first feedback
        (before, its whole remainder counted: a 1 MB flow queued its megabyte)."""
        heaps, service = active
        n_links = len(self.capacity)
        load, old, young = [0.0] * n_links, [0.0] * n_links, [0.0] * n_links
        rtt, window = self.rtt, self.window
        unbounded = math.isinf(window)
        for j, (a, b) in enumerate(classes):
            if not counts[j]:
                continue
            e_old = e_young = 0.0
            line = min(self.nic_cap, self.capacity[a])  # the class's senders' line rate
            for key, i in heaps[j]:
                is_young = now - self.start[i] < rtt[i]
                # no window: before its first feedback a flow has out one round trip at its
                # line rate; after it, its CC holds the link at the level (the cap below)
                w = line * rtt[i] / 8.0 if unbounded and is_young else window
                e = max(min(w, (key - service[j]) / 8.0) - rates[j] * rtt[i] / 8.0, 0.0)
                if is_young:
                    e_young += e
                elif not self.first:
                    e_old += e
            for link in range(a, b):
                load[link] += counts[j] * rates[j]
                old[link] += e_old
                young[link] += e_young
        total = 0.0
        for link in range(*classes[c]):
            if self.qcap[link] <= 0 or load[link] < self.capacity[link] * (1.0 - QUEUE_FULL):
                continue
            q = min(min(old[link], self.qcap[link]) + young[link], self.buffer)
            total += q * 8.0 / self.capacity[link]
        return total
