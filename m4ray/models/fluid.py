"""flowSim's view of the active flows, kept where m4 updates: the fluid anchor of an m4 model with
``ModelConfig.fluid``.

At every update m4 already knows which flows share which links; this module adds what a max-min
fluid model says about them. Per flow (a row, reused after the flow leaves): its work (bits on
the wire, as flowSim drains), the bits a fluid model has not yet drained, its max-min fair rate,
when it drained (if it has) and when the row was last brought up to date.

* :meth:`Fluid.catch_up` brings rows to ``t`` as flowSim would have moved them since their last
  update: rows last updated together (one component then; components share no link) drain at
  their rates, and when one of them drains the others are re-shared — the drain ends that happen
  between m4's updates (flowSim's events, not m4's) are simulated here. A flow that has drained
  keeps no share, though it stays active until m4 (or, in training, ns-3) completes it.
* :meth:`Fluid.advance` (an update at ``t``) catches the rows up, re-shares among them
  (:func:`~m4ray.models.fairshare.max_min_rates`) and projects each flow's completion as if nothing
  else changed: ``t + left / rate + delay`` (or its drain end + ``delay`` once drained), where
  ``delay = ideal − work / bottleneck`` is what the ideal FCT adds to draining the wire bytes at
  the bottleneck (latency and the first packet's store-and-forward: flowSim's delivery delay),
  so a flow alone gets exactly 1.
* With a sender window (``ModelConfig.fluid_window``; :class:`~m4ray.models.fairshare.Window`), a
  flow's rate is at most its window's packets per round trip and its work is set so that,
  alone, it drains when the packet model says: flowSim with that window. RDMA's fixed window
  below a path's bandwidth-delay product is what made ns-3's 10–100 KB flows 1.9x (fat-tree)
  to 5x (rail) slower than flowSim on topologies m4 never saw.
* With ACK load (``ModelConfig.fluid_acks``; ``acks``), the receivers' ACKs take their share of
  the links, as in flowSim with ``ack_load`` (:func:`~m4ray.models.fairshare.ack_capacity`): a link
  gives data what the ACKs of the data on its reverse link leave. The data rate per link is
  that of every active row, kept here as rows' rates change, so one component's ACKs slow
  another's data (a ring's step: each flow's ACKs ride with the next flow's data); a share runs
  three times, its rows' rates counted after each (from idle links: 1, 1 − a, 1 − a + a²
  of a ring step's link, where ns-3 gives 1 / (1 + a)). RDMA ACKs every packet, and ns-3's ring
  steps took 1 / (1 + ack / packet) of a link where flowSim gave all of it (0.2–0.7 % on the
  gray-failure grid).
* A departing flow's rows are caught up first (:meth:`Fluid.catch_up` from the engine's
  ``complete``), so the flows left behind shared with it until it went; then its rate leaves
  its links (:meth:`Fluid.release`).

The projected slowdown ``base = (projection − start) / ideal`` is flowSim's answer for that flow
given the events so far; the model predicts ``base × (1 + correction)`` and reads three features:
``log2(base)``, ``rate / bottleneck`` and the fraction not yet drained.

Left from flowSim, by construction: the projection uses today's rates (a flow that will speed up
when a companion drains is projected late until the next update re-projects it); with a model
whose correction is 0 the engine gives flowSim's FCTs, windowed or not (a test). The online engine
and the training replay (:func:`m4ray.models.m4.engine_schedule`) call the same methods with the
same rows at the same event times, so training sees the features inference computes.
"""

from __future__ import annotations

import numpy as np

from m4ray.errors import SimulationError
from m4ray.models.core import library
from m4ray.models.fairshare import ACK_PASSES, ack_capacity, fifo_rates, max_min_rates

N_FEATURES = 3
_REL_TIE = 1e-9  # drains within this relative distance of the earliest happen together (flowSim)

Links = list[np.ndarray] | tuple[np.ndarray, np.ndarray]
"""Each row's link ids: one array per row, or CSR ``(offsets [n + 1], ids)``."""


def offsets(lengths: np.ndarray) -> np.ndarray:
    """CSR offsets ``[n + 1]`` of runs of ``lengths``."""
    off = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=off[1:])
    return off


def csr(links: Links) -> tuple[np.ndarray, np.ndarray]:
    """``links`` as contiguous int64 CSR ``(offsets, ids)``."""
    if isinstance(links, tuple):
        off, idx = links
    else:
        off = offsets(np.fromiter(map(len, links), np.int64, len(links)))
        idx = np.concatenate(links) if len(links) else np.zeros(0, dtype=np.int64)
    return (
        np.ascontiguousarray(off, dtype=np.int64),
        np.ascontiguousarray(idx, dtype=np.int64),
    )


def _lists(links: Links) -> list[np.ndarray]:
    if isinstance(links, tuple):
        off, idx = links
        return [idx[a:b] for a, b in zip(off[:-1].tolist(), off[1:].tolist(), strict=True)]
    return links


def _next_drain(left: np.ndarray, rate: np.ndarray) -> tuple[float, np.ndarray] | None:
    """The next drain among rows with ``left`` bits at ``rate``: how long until it and which
    rows drain then (within the tie), or None when no row drains."""
    live = (left > 0) & (rate > 0)
    if not live.any():
        return None
    to_go = np.where(live, left / np.where(live, rate, 1.0), np.inf)
    dt = float(to_go.min())
    return dt, live & (to_go <= dt * (1 + _REL_TIE))


class Fluid:
    """Fluid state per flow row (see the module docstring); ``resize`` keeps rows' contents.

    The per-row arrays are the rows of one block ``[len(_ARRAYS), n_rows]`` (what the compiled
    twin reads). ``native``: use it when it builds (the default; ``False`` runs the Python
    loops, the reference). ``acks``: (ACK bits per data bit, each link's reverse link or -1)
    for the ACK load (None: off)."""

    _ARRAYS = (
        "work",
        "left",
        "rate",
        "cap",
        "t_last",
        "start",
        "ideal",
        "delay",
        "bottleneck",
        "drained",
    )  # the field order of _core.c

    def __init__(
        self,
        n_rows: int = 64,
        *,
        hold: bool = True,
        native: bool = True,
        acks: tuple[float, np.ndarray] | None = None,
        fifo_bits: float | None = None,
    ) -> None:
        # hold: a drained flow that is still active is projected no earlier than now (m4-v2);
        # otherwise at its drain end + delay, possibly past (the backend then completes it at
        # once), so a correction > 0 cannot compound through a projection that grows with time
        self.hold = hold
        # fifo_bits: rows of at most this much work are shared in order of arrival (flowSim's
        # service="fifo"; None: max-min)
        self.fifo_bits = fifo_bits
        self.native = native and library() is not None
        self._state = np.zeros((len(self._ARRAYS), 0))
        self._slot = np.zeros(0, dtype=np.int64)  # the compiled twin's per-link scratch
        self.ack_fraction, self.reverse, self.data = 0.0, None, None
        if acks is not None:
            self.ack_fraction = float(acks[0])
            self.reverse = np.ascontiguousarray(acks[1], dtype=np.int64)
            self.data = np.zeros(len(self.reverse))  # Σ rates of the rows on each link
        self.resize(n_rows)

    def resize(self, n_rows: int) -> None:
        old = self._state
        self._state = np.zeros((len(self._ARRAYS), n_rows))
        keep = min(n_rows, old.shape[1])
        self._state[:, :keep] = old[:, :keep]
        for k, name in enumerate(self._ARRAYS):
            setattr(self, name, self._state[k])

    def add(
        self,
        row: int,
        wire_bytes: float,
        ideal_s: float,
        bottleneck_bps: float,
        t: float,
        *,
        window: tuple[float, float] | None = None,
    ):
        """A flow of ``wire_bytes`` (payload and headers) arrives at ``t`` in ``row`` (it gets
        a share at the next :meth:`advance`). ``window``: its sender's window as (rate cap,
        bits to drain) (:meth:`~m4ray.models.fairshare.Window.limit`), as windowed flowSim
        drains."""
        bits = float(wire_bytes) * 8.0
        cap, work = (np.inf, bits) if window is None else window
        self._state[:, row] = (
            work,
            work,
            0.0,
            cap,
            t,
            t,
            ideal_s,
            max(ideal_s - bits / bottleneck_bps, 0.0),
            bottleneck_bps,
            np.inf,
        )

    def _native_args(self, rows, links: Links, capacity_bps: np.ndarray, t: float):
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        off, idx = csr(links)
        capacity = np.ascontiguousarray(capacity_bps, dtype=np.float64)
        if len(self._slot) < len(capacity):
            self._slot = np.full(len(capacity), -1, dtype=np.int64)
        keep = (rows, off, idx, capacity)  # alive while C reads them
        if self.reverse is not None and len(self.reverse) < len(capacity):
            raise ValueError(f"ACK load over {len(self.reverse)} links, {len(capacity)} given")
        args = (
            self._state.ctypes.data,
            self._state.shape[1],
            len(rows),
            rows.ctypes.data,
            off.ctypes.data,
            idx.ctypes.data,
            capacity.ctypes.data,
            self._slot.ctypes.data,
            float(t),
        )
        return keep, args

    @staticmethod
    def _check(rc: int) -> None:
        if rc == 2:
            raise MemoryError("compiled m4 core: out of memory")
        if rc:
            raise SimulationError(f"compiled m4 core failed ({rc})")

    def catch_up(self, rows: np.ndarray, links: Links, capacity_bps: np.ndarray, t: float) -> None:
        """Move ``rows`` (with their ``links``, ids into ``capacity_bps``) from their last update
        to ``t``: each set of rows last updated together drains at its rates, re-shared among
        itself whenever one of its flows drains."""
        if self.native:
            _keep, args = self._native_args(rows, links, capacity_bps, t)
            rc = library().m4ray_fluid_catch_up(*args, *self._native_acks(), self._native_fifo())
            self._check(rc)
            return
        links = _lists(links)
        rows = np.asarray(rows, dtype=np.int64)
        t_last = self.t_last[rows]
        for t0 in np.unique(t_last[t_last < t]):
            at = np.flatnonzero(t_last == t0)
            self._drain(rows[at], [links[i] for i in at], capacity_bps, float(t0), t)
        self.t_last[rows] = t

    def catch_up_frozen(self, rows: np.ndarray, t: float) -> None:
        """Move ``rows`` from their last update to ``t`` at their rates, not re-shared when one
        drains (a batched component's flows between its updates,
        :class:`~m4ray.models.components.Batching`): each drains on its own, in O(1). A drained
        row keeps its rate until the next share sets it to zero (and, with ACK load, takes it
        off its links then)."""
        if self.native:
            rows = np.ascontiguousarray(rows, dtype=np.int64)
            library().m4ray_fluid_catch_up_frozen(
                self._state.ctypes.data, self._state.shape[1], len(rows), rows.ctypes.data, float(t)
            )
            return
        rows = np.asarray(rows, dtype=np.int64)
        t0, left, rate = self.t_last[rows], self.left[rows], self.rate[rows]
        live = (left > 0) & (rate > 0) & (t0 < t)
        with np.errstate(divide="ignore", invalid="ignore"):
            end = t0 + left / rate
        done = live & (end <= t)
        self.drained[rows[done]] = end[done]
        going = live & ~done
        left = np.where(done, 0.0, left)
        left[going] = np.maximum(left[going] - rate[going] * (t - t0[going]), 0.0)
        self.left[rows] = left
        self.t_last[rows] = np.maximum(t0, t)

    def _drain(self, rows, links, capacity_bps, now: float, t: float) -> None:
        left, rate = self.left[rows], self.rate[rows]
        while (step := _next_drain(left, rate)) is not None:
            dt, done = step
            if now + dt > t:
                left = np.maximum(left - rate * (t - now), 0.0)
                break
            left = np.where(done, 0.0, np.maximum(left - rate * dt, 0.0))
            now += dt
            self.drained[rows[done]] = now
            rate = self._share(rows, left, links, capacity_bps)
        self.left[rows], self.rate[rows] = left, rate

    def _native_acks(self) -> tuple:
        if self.reverse is None:
            return (0.0, None, None)
        return (self.ack_fraction, self.reverse.ctypes.data, self.data.ctypes.data)

    def _native_fifo(self) -> float:
        return -1.0 if self.fifo_bits is None else float(self.fifo_bits)

    def release(self, row: int, links) -> None:
        """``row``'s flow has left (caught up first): its rate leaves its ``links``."""
        if self.reverse is not None:
            self._set_rates([row], [np.asarray(links)], np.zeros(1))

    def _set_rates(self, rows, links, rate: np.ndarray) -> bool:
        """Rows take their new rates; their links' data rates follow (``_core.c`` set_rates,
        in the same order: the two agree to the bit). Returns whether any rate changed."""
        data, old = self.data, self.rate
        changed = False
        for r, ls, new in zip(list(rows), links, rate.tolist(), strict=True):
            d = new - old[r]
            if d == 0:
                continue
            for link in ls.tolist():
                data[link] += d
            old[r] = new
            changed = True
        return changed

    def _share(self, rows, left, links, capacity_bps) -> np.ndarray:
        if self.reverse is None:
            return self._rates(rows, left, links, capacity_bps)
        for _ in range(ACK_PASSES):  # a pass that changes no rate ends it (the rest would too)
            capacity = ack_capacity(capacity_bps, self.reverse, self.ack_fraction, self.data)
            rate = self._rates(rows, left, links, capacity)
            if not self._set_rates(rows, links, rate):
                break
        return rate

    def _rates(self, rows, left, links, capacity_bps) -> np.ndarray:
        rate = np.zeros(len(left))
        live = np.flatnonzero(left > 0)
        if len(live):
            caps = self.cap[rows[live]]
            paths = [links[i] for i in live]
            caps = caps if np.isfinite(caps).any() else None
            if self.fifo_bits is not None:  # flowSim's FIFO service: by arrival, window-sized
                r = rows[live]
                fits = self.work[r] <= self.fifo_bits
                rate[live] = fifo_rates(csr(paths), capacity_bps, caps, self.start[r], fits)
            else:
                rate[live] = max_min_rates(paths, capacity_bps, caps)
        return rate

    def _fifo_ends(self, rows, left, rate, links, capacity_bps, *, t, ends) -> np.ndarray:
        """Under FIFO service a flow's projection is when it drains if nothing else arrives:
        the rows drained forward from ``t``, re-shared as each drains (without moving the
        state); a row with no rate yet gets its turn."""
        ends = ends.copy()
        left, now = left.copy(), t
        capacity = capacity_bps
        if self.reverse is not None:
            capacity = ack_capacity(capacity_bps, self.reverse, self.ack_fraction, self.data)
        while (step := _next_drain(left, rate)) is not None:
            dt, done = step
            left = np.where(done, 0.0, np.maximum(left - rate * dt, 0.0))
            now += dt
            ends[done] = now
            rate = self._rates(rows, left, links, capacity)
        return ends

    def advance(
        self, rows: np.ndarray, links: Links, capacity_bps: np.ndarray, t: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """An update at ``t`` over ``rows``: catch up, re-share, project; returns ``base [n]``
        (projected slowdown, ≥ 1) and ``features [n, 3]``."""
        if self.native:
            keep, args = self._native_args(rows, links, capacity_bps, t)
            base = np.empty(len(keep[0]))
            features = np.empty((len(keep[0]), N_FEATURES))
            rc = library().m4ray_fluid_advance(
                *args,
                int(self.hold),
                base.ctypes.data,
                features.ctypes.data,
                *self._native_acks(),
                self._native_fifo(),
            )
            self._check(rc)
            return base, features
        links = _lists(links)
        rows = np.asarray(rows, dtype=np.int64)
        self.catch_up(rows, links, capacity_bps, t)
        left = self.left[rows]
        rate = self._share(rows, left, links, capacity_bps)
        self.rate[rows] = rate
        with np.errstate(divide="ignore", invalid="ignore"):
            drain_end = np.where(left > 0, t + left / rate, self.drained[rows])
        if self.fifo_bits is not None:  # a flow queued behind others has no rate yet
            drain_end = self._fifo_ends(rows, left, rate, links, capacity_bps, t=t, ends=drain_end)
        end = drain_end + self.delay[rows]
        projected = (np.maximum(end, t) if self.hold else end) - self.start[rows]
        base = np.maximum(projected / self.ideal[rows], 1.0)
        features = np.stack(
            [np.log2(base), rate / self.bottleneck[rows], left / self.work[rows]], axis=1
        )
        return base, features


__all__ = ["N_FEATURES", "Fluid", "Links", "csr", "offsets"]
