"""flowSim's event loop and the DAG replay's flows, compiled (``_dagloop.c``).

Two layers, each the twin of Python code that stays the reference and the fallback:

* :class:`NativeLoop` — :class:`~m4ray.sim.flowsim.FlowSim`'s event queue and fluid steps: one C
  call runs arrivals, completions and its own events until a Python callback is due, then comes
  back to run it. Python's events share the queue, and its order (time, then insertion rank).
* :class:`CompiledFlows` — the flow half of :class:`~m4ray.sim.replay.Replay` on that loop: a
  collective's transfers (send latency, ``after`` order, parents), every flow's path (the same
  ECMP hash as :class:`~m4ray.sim.routing.Routing`), ideal FCT and ACK trip, and the flow table.
  Python keeps workload nodes, decomposing collectives, and what they call back.

The loop's other mode runs m4 instead of the fluid (:meth:`NativeLoop.make_m4`): the m4
backend's per-instant updates and batched completions, calling the m4 engine core's functions
(``_core.c``: its bookkeeping, the compiled pass and its memo) by address; an update beyond
the engine's ``compiled_limits`` (none by default: ``m4ray.sim.m4.engine.STEPPER_FROM_FLOWS``)
comes back to Python's stepper.

Answers equal the Python replay's to the bit (``tests/sim/test_dagloop.py``,
``tests/sim/test_m4_loop.py``): the same arithmetic in the same order, compiled without
contraction (``m4ray.native``). A replay runs compiled where its backend offers a loop (flowSim
in C without a sender window; m4 on a CPU with updates once per instant), with flows
keyed by id or, up to 2,048 ranks, per rank pair (``pair_keys``: several jobs);
``Replay(compiled=False)`` or ``M4RAY_NATIVE=0`` keeps it in
Python. Units: seconds, bits, bits/s, bytes.
"""

from __future__ import annotations

import ctypes
import functools
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from m4ray import native
from m4ray.errors import SimulationError

if TYPE_CHECKING:
    from m4ray.sim.collectives import TransferTable
    from m4ray.sim.replay import FlowLog, Replay, _CollectiveRun

_RET_DONE, _RET_PY, _RET_PYDONE, _RET_FLOW, _RET_FINISH, _RET_M4 = range(6)
_ERRORS = {
    -2: (MemoryError, "compiled flowSim loop: out of memory"),
    -3: (SimulationError, "active flows with zero rate: a link has no capacity left"),
    -4: (SimulationError, "compiled replay: a flow found no route (routes not given)"),
    -5: (SimulationError, "compiled m4 loop: a flow size without its feature (a bug)"),
    -6: (SimulationError, "compiled m4 loop: the engine refused a flow's links"),
}
_MASK = (1 << 64) - 1
_PAIR_RANKS = 2048  # pair-keyed replays compile up to this many ranks (a counter per pair)


@functools.cache
def library() -> ctypes.CDLL | None:
    """``_dagloop.c`` built and loaded (once per process), or ``None`` without a compiler."""
    here = Path(__file__)
    maxmin = here.parents[1] / "models" / "_maxmin.c"
    lib = native.load(here.with_name("_dagloop.c"), "compiled flowSim loop", (maxmin,))
    if lib is None:
        return None
    i64, f64, vp, cint = ctypes.c_int64, ctypes.c_double, ctypes.c_void_p, ctypes.c_int
    signatures = {
        "m4ray_loop_new": (vp, [i64, vp, f64, i64, cint]),
        "m4ray_loop_free": (None, [vp]),
        "m4ray_loop_fluid": (vp, [vp]),
        "m4ray_loop_n_events": (i64, [vp]),
        "m4ray_loop_n_flows": (i64, [vp]),
        "m4ray_loop_pending": (i64, [vp]),
        "m4ray_loop_peek": (f64, [vp]),
        "m4ray_loop_push": (cint, [vp, f64, i64]),
        "m4ray_loop_add": (cint, [vp, i64, i64, vp, f64, f64, f64]),
        "m4ray_loop_topology": (
            cint,
            [vp, i64, vp, vp, i64, vp, vp, vp, ctypes.c_uint64, i64, i64],
        ),
        "m4ray_loop_routes": (cint, [vp, i64, vp]),
        "m4ray_loop_replay": (cint, [vp, i64, vp, f64, i64, f64, cint]),
        "m4ray_loop_start_flow": (i64, [vp, i64, i64, i64, i64, i64, cint, i64, i64]),
        "m4ray_loop_flow_table": (None, [vp, vp, vp]),
        "m4ray_loop_launch": (i64, [vp, i64, vp, vp, vp, vp, vp, vp, vp]),
        "m4ray_loop_run": (cint, [vp, f64, vp, vp, vp]),
        "m4ray_fluidsim_set_capacity": (None, [vp, i64, f64]),
        "m4ray_fluidsim_queued": (cint, [vp, f64, vp, cint, f64]),
        "m4ray_fluidsim_queue_delay": (cint, [vp, i64, vp, f64, vp]),
        "m4ray_fluidsim_set_queue_cap": (None, [vp, i64, f64]),
        "m4ray_fluidsim_set_rtt": (None, [vp, f64, f64]),
        "m4ray_fluidsim_fifo": (cint, [vp, f64]),
        "m4ray_fluidsim_dcqcn": (cint, [vp, f64, f64, i64, f64, f64, cint, f64, vp, vp]),
        "m4ray_fluidsim_trace": (cint, [vp, i64, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp]),
        "m4ray_loop_m4": (cint, [vp] * 7 + [i64, i64]),
        "m4ray_loop_m4_feature": (cint, [vp, i64, f64]),
        "m4ray_loop_m4_schedule": (cint, [vp, i64, vp, vp]),
        "m4ray_route_many": (
            cint,
            [vp, vp, vp, vp, ctypes.c_uint64, i64, i64, vp, vp, vp, i64, vp],
        ),
    }
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


def _check(rc: int) -> int:
    if rc < 0 and rc in _ERRORS:
        kind, message = _ERRORS[rc]
        raise kind(message)
    return rc


def _ptr(array: np.ndarray) -> int:
    return array.ctypes.data


class NativeQueue:
    """The :class:`~m4ray.sim.backend.EventQueue` a native flowSim schedules into: Python's
    callbacks wait here under ids the loop's queue carries."""

    def __init__(self, loop: NativeLoop) -> None:
        self.loop = loop
        self.fns: dict[int, Callable[[], None]] = {}
        self.next_id = 0

    def push(self, t: float, fn: Callable[[], None]) -> None:
        self.next_id += 1
        self.fns[self.next_id] = fn
        _check(self.loop.lib.m4ray_loop_push(self.loop.handle, t, self.next_id))

    def peek_time(self) -> float:
        return self.loop.lib.m4ray_loop_peek(self.loop.handle)

    def __len__(self) -> int:
        return self.loop.lib.m4ray_loop_pending(self.loop.handle)


class NativeLoop:
    """A native flowSim's fluid state, event queue and loop (``m4ray_loop_*``)."""

    def __init__(self, lib: ctypes.CDLL, handle: int) -> None:
        self.lib, self.handle = lib, handle
        self.fluid = lib.m4ray_loop_fluid(handle)
        self.queue = NativeQueue(self)
        self.sends: dict[int, tuple[int, Callable[[int, float], None]]] = {}  # FlowSim.send's
        self.flows: dict[int, Callable[[float], None]] = {}  # flows Python started in the loop
        self.on_finish: Callable[[int, int], None] | None = None  # a rank's part done
        self.paths: dict[tuple[int, ...], tuple[np.ndarray, int]] = {}
        self.next_tag = 0
        self._t, self._a, self._b = ctypes.c_double(), ctypes.c_int64(), ctypes.c_int64()
        self._queue_s = ctypes.c_double()
        self._out = (ctypes.byref(self._t), ctypes.byref(self._a), ctypes.byref(self._b))
        self.m4 = None  # m4 mode's engine (make_m4), kept alive while the loop calls it
        self.sizes: set[int] = set()  # m4 mode: flow sizes whose feature the loop has

    @classmethod
    def make(cls, capacity: np.ndarray, ack_fraction: float, ack_passes: int, capped: bool):
        """A loop over fresh fluid state, or None where nothing compiles."""
        lib = library()
        if lib is None:
            return None
        capacity = np.ascontiguousarray(capacity, dtype=np.float64)
        handle = lib.m4ray_loop_new(
            len(capacity), _ptr(capacity), ack_fraction, ack_passes, int(capped)
        )
        if not handle:
            raise MemoryError("compiled flowSim loop: out of memory")
        loop = cls(lib, handle)
        weakref.finalize(loop, lib.m4ray_loop_free, handle)
        return loop

    @classmethod
    def make_m4(cls, engine) -> NativeLoop | None:
        """A loop in m4 mode over ``engine`` (a :class:`~m4ray.sim.m4.engine.NativeM4Engine`
        running its small updates compiled): the loop calls the engine core's functions by
        address and runs ``M4Backend``'s per-instant updates and batched completions itself;
        updates beyond the engine's ``compiled_limits`` come back to Python
        (``M4Backend._m4_update``). None where nothing compiles."""
        lib = library()
        if lib is None:
            return None
        one = np.ones(1)
        handle = lib.m4ray_loop_new(1, _ptr(one), 0.0, 0, 0)  # (its fluid stays empty)
        if not handle:
            raise MemoryError("compiled m4 loop: out of memory")
        loop = cls(lib, handle)
        weakref.finalize(loop, lib.m4ray_loop_free, handle)
        core = engine._lib
        address = [
            ctypes.cast(getattr(core, f"m4ray_engine_{name}"), ctypes.c_void_p).value
            for name in ("arrive", "complete", "pending", "update")
        ]
        _check(
            lib.m4ray_loop_m4(
                handle, engine._core, *address, _ptr(engine._stats), *engine.compiled_limits,
            )
        )  # fmt: skip
        loop.m4 = engine
        return loop

    def m4_sizes(self, sizes) -> None:
        """m4 mode: give the loop the size feature of each of ``sizes`` it lacks."""
        from m4ray.sim.m4.engine import size_feature

        for size in sizes:
            if size not in self.sizes:
                _check(self.lib.m4ray_loop_m4_feature(self.handle, size, size_feature(size)))
                self.sizes.add(size)

    def m4_schedule(self, rows: np.ndarray, finish: np.ndarray) -> None:
        """m4 mode: an update Python ran (its rows and predicted completion times)."""
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        finish = np.ascontiguousarray(finish, dtype=np.float64)
        _check(self.lib.m4ray_loop_m4_schedule(self.handle, len(rows), _ptr(rows), _ptr(finish)))

    @property
    def n_events(self) -> int:
        return self.lib.m4ray_loop_n_events(self.handle)

    def add(
        self,
        flow_id: int,
        on_done: Callable[[int, float], None],
        *,
        links: tuple[int, ...],
        delay: float,
        cap: float,
        bits: float,
        rtt: float | None = None,
        now: float = 0.0,
    ) -> None:
        """A flow from :meth:`FlowSim.send` at time ``now``: ``on_done(flow_id, t)`` at its
        delivery; with ``rtt`` (standing queues, :meth:`queued`) it waits for the queues on
        its path too."""
        self.next_tag += 1
        self.sends[self.next_tag] = (flow_id, on_done)
        known = self.paths.get(links)  # a path's links as a C array, made once per path
        if known is None:
            array = np.array(links, dtype=np.int64)
            known = (array, _ptr(array))
            if len(self.paths) < 1 << 16:  # bounded, as Routing's own path memo
                self.paths[links] = known
        if rtt is not None:
            rc = self.lib.m4ray_fluidsim_queue_delay(
                self.fluid, len(links), known[1], now, ctypes.byref(self._queue_s)
            )
            _check(-rc)  # the fluid state's 2 / 3: out of memory / no rate
            delay += self._queue_s.value
        _check(
            self.lib.m4ray_loop_add(
                self.handle, self.next_tag, len(links), known[1], delay, cap, bits
            )
        )
        if rtt is not None:
            self.lib.m4ray_fluidsim_set_rtt(self.fluid, rtt, now)

    def queued(
        self, window_wire_bytes: float, caps: np.ndarray, first_rtt: bool, buffer_bytes: float = 0
    ) -> None:
        """Standing queues on (``flowsim.StandingQueues``): the window on the wire, each
        link's most queued bytes, whether only flows in their first round trip queue, and the
        buffer their first windows fill over the level (0: off)."""
        caps = np.ascontiguousarray(caps, dtype=np.float64)
        rc = self.lib.m4ray_fluidsim_queued(
            self.fluid, window_wire_bytes, _ptr(caps), first_rtt, float(buffer_bytes)
        )
        _check(-rc)

    def fifo(self, bits: float) -> None:
        """FIFO service on (``FlowSim``'s ``service="fifo"``) for flows of at most ``bits`` on
        the wire (inf: every flow)."""
        _check(-self.lib.m4ray_fluidsim_fifo(self.fluid, bits))

    def dcqcn(self, params, min_rate_bps: float, switch_link: np.ndarray, k_min: np.ndarray):
        """DCQCN's rates on (``flowsim.DcqcnRates``): its parameters
        (:class:`~m4ray.sim.ns3.cc.DcqcnParams`), the minimum rate, and per link whether a
        switch sends on it and K_min (bytes)."""
        switch_link = np.ascontiguousarray(switch_link, dtype=np.uint8)  # C copies both
        k_min = np.ascontiguousarray(k_min, dtype=np.float64)
        rc = self.lib.m4ray_fluidsim_dcqcn(
            self.fluid,
            params.decrease_interval_s,
            params.increase_interval_s,
            params.fast_recovery_steps,
            params.rate_ai_bps,
            params.rate_hai_bps,
            int(params.clamp_target_rate),
            min_rate_bps,
            _ptr(switch_link),
            _ptr(k_min),
        )
        _check(-rc)

    def trace(  # noqa: PLR0917 (the C function's arrays)
        self,
        links: tuple[np.ndarray, np.ndarray],
        bits: np.ndarray,
        start_s: np.ndarray,
        cap: np.ndarray,
        rtt: np.ndarray,
        line: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Flows known up front through the fluid state alone, no Python in between
        (``m4ray_fluidsim_trace``): each flow's links as CSR ``(off, idx)``, wire bits, arrival,
        cap, round trip (standing queues) and DCQCN line rate (None: its cap or first link).
        Each flow's finish (its last bit drained) and the queues it waited for at arrival."""
        n = len(bits)
        arrays = [
            np.ascontiguousarray(links[0], dtype=np.int64),
            np.ascontiguousarray(links[1], dtype=np.int64),
            np.ascontiguousarray(bits, dtype=np.float64),
            np.ascontiguousarray(start_s, dtype=np.float64),
            np.ascontiguousarray(cap, dtype=np.float64),
            np.ascontiguousarray(rtt, dtype=np.float64),
        ]  # kept alive here while C reads them
        order = np.argsort(arrays[3], kind="stable")
        line_ = None if line is None else np.ascontiguousarray(line, dtype=np.float64)
        finish, wait = np.full(n, np.nan), np.zeros(n)
        off, idx, bits_, start, cap_, rtt_ = map(_ptr, arrays)
        rc = self.lib.m4ray_fluidsim_trace(
            self.fluid, n, _ptr(order), off, idx, bits_, start, cap_, rtt_,
            None if line_ is None else _ptr(line_), _ptr(finish), _ptr(wait),
        )  # fmt: skip
        _check(-rc)
        return finish, wait

    def set_queue_cap(self, link: int, bytes_: float) -> None:
        self.lib.m4ray_fluidsim_set_queue_cap(self.fluid, link, bytes_)

    def set_capacity(self, link: int, bps: float) -> None:
        self.lib.m4ray_fluidsim_set_capacity(self.fluid, link, bps)

    def run(self, sim, horizon: float) -> None:
        """FlowSim.run: the loop in C, Python's callbacks here as they fall due (``sim._now``
        is the loop's time whenever one runs)."""
        lib, handle, out = self.lib, self.handle, self._out
        t, a, b = self._t, self._a, self._b
        fns, sends, flows = self.queue.fns, self.sends, self.flows
        while True:
            rc = lib.m4ray_loop_run(handle, horizon, *out)
            sim._now = t.value
            if rc == _RET_PY:
                fns.pop(a.value)()
            elif rc == _RET_PYDONE:
                flow_id, on_done = sends.pop(a.value)
                on_done(flow_id, t.value)
            elif rc == _RET_FLOW:
                flows.pop(a.value)(t.value)
            elif rc == _RET_FINISH:
                self.on_finish(a.value, b.value)
            elif rc == _RET_M4:
                sim._m4_update()
            elif rc == _RET_DONE:
                return
            else:
                _check(rc)
                raise SimulationError(f"compiled flowSim loop: unknown answer {rc}")


class CompiledFlows:
    """:class:`~m4ray.sim.replay.Replay`'s flows on a :class:`NativeLoop` (module docstring)."""

    def __init__(self, replay: Replay, loop: NativeLoop) -> None:
        self.replay, self.loop, self.lib, self.handle = replay, loop, loop.lib, loop.handle
        routing = replay.routing
        topo = routing.topo
        self.routing = routing
        self.out_off, self.out_link = routing.out_csr
        self.host_of = np.asarray(replay.host_of, dtype=np.int64)
        link_dst = np.ascontiguousarray(topo.link_dst, dtype=np.int64)
        lat = np.asarray(routing._lat, dtype=np.float64)
        bw = np.asarray(routing._bw, dtype=np.float64)
        _check(
            self.lib.m4ray_loop_topology(
                self.handle,
                topo.n_nodes,
                _ptr(self.out_off),
                _ptr(self.out_link),
                topo.n_links,
                _ptr(link_dst),
                _ptr(lat),
                _ptr(bw),
                routing.seed & _MASK,
                routing.wire.mtu_bytes,
                routing.wire.header_bytes,
            )
        )
        ack = replay.ack_bytes if replay.ack_bytes is not None else -1
        cap = replay.backend.rate_cap_bps
        _check(
            self.lib.m4ray_loop_replay(
                self.handle,
                len(self.host_of),
                _ptr(self.host_of),
                replay.send_latency_s,
                ack,
                np.inf if cap is None else cap,
                int(replay._pairs is not None),
            )
        )
        self.routed: set[int] = set()
        self.runs: dict[int, dict] = {}  # run id -> its nodes by rank
        self.checked: dict[int, TransferTable] = {}  # tables whose hosts were routed
        loop.on_finish = self._finish

    @classmethod
    def of(cls, replay: Replay) -> CompiledFlows | None:
        """The replay's flows compiled, where its backend and keys allow (module docstring)."""
        if replay.routing._keys or replay._acks_itself:
            return None
        if replay._pairs is not None and (replay._pairs or len(replay.host_of) > _PAIR_RANKS):
            return None
        offer = getattr(replay.backend, "dag_loop", None)  # (last: m4's moves into the loop)
        loop = offer() if offer is not None else None
        return None if loop is None else cls(replay, loop)

    # ------------------------------------------------------------------ routes
    def _route(self, pairs: np.ndarray) -> None:
        """Check host pairs with :meth:`Routing.path` (its errors: hosts that are the same or
        not connected), and give the loop the next hops toward every destination it has not
        seen (both ways: ACKs come back)."""
        routing, n_nodes = self.routing, self.routing.topo.n_nodes
        codes = np.unique(pairs[:, 0] * n_nodes + pairs[:, 1])
        for src, dst in zip((codes // n_nodes).tolist(), (codes % n_nodes).tolist(), strict=True):
            routing.path(src, dst)
        for dst in np.unique(pairs).tolist():
            if dst in self.routed:
                continue
            flags = routing.next_hop_flags(dst)
            _check(self.lib.m4ray_loop_routes(self.handle, dst, _ptr(flags)))
            self.routed.add(dst)

    # ------------------------------------------------------------------ flows
    def start_flow(
        self,
        src: int,
        dst: int,
        size: int,
        *,
        node_id: int,
        on_done: Callable[[float], None],
        parent: int,
        ack: bool,
    ) -> int:
        """Replay._start_flow for a flow Python starts (a workload's send)."""
        self._route(self.host_of[[[src, dst]]])
        if self.loop.m4 is not None:
            self.loop.m4_sizes((size,))
        self.loop.next_tag += 1
        tag = self.loop.next_tag
        self.loop.flows[tag] = on_done
        return _check(
            self.lib.m4ray_loop_start_flow(
                self.handle, src, dst, size, node_id, parent, int(ack), -1, tag
            )
        )

    def launch(self, run: _CollectiveRun, table: TransferTable) -> None:
        """Replay._launch after decomposing: ranks with nothing to move are done now, then the
        transfers wait in the loop."""
        n = len(table)
        if id(table) not in self.checked:  # the replay hands the same table for a repeat
            if n:
                self._route(self.host_of[np.stack([table.src, table.dst], axis=1)])
                if self.loop.m4 is not None:
                    self.loop.m4_sizes(np.unique(table.size).tolist())
            if len(self.checked) > 64:
                self.checked.clear()
            self.checked[id(table)] = table
        rank_node = np.zeros(len(self.host_of), dtype=np.int64)
        for rank, node in run.nodes.items():
            rank_node[rank] = node.id
        busy = np.zeros(len(self.host_of), dtype=bool)
        busy[table.src] = True
        busy[table.dst] = True
        for rank, node in run.nodes.items():
            if not busy[rank]:
                self.replay._finish(node)
        if not n:
            return
        node_of = rank_node[table.src]  # kept alive through the call
        deps = table.deps if len(table.deps) else np.zeros(1, dtype=np.int64)
        columns = (table.src, table.dst, table.size, table.after, node_of, table.dep_off, deps)
        columns = tuple(np.ascontiguousarray(c, dtype=np.int64) for c in columns)
        run_id = _check(self.lib.m4ray_loop_launch(self.handle, n, *map(_ptr, columns)))
        self.runs[run_id] = run.nodes

    def _finish(self, run_id: int, rank: int) -> None:
        self.replay._finish(self.runs[run_id][rank])

    def flow_log(self) -> FlowLog:
        """The flow table so far, as the Python replay logs it."""
        from m4ray.sim.replay import FlowLog

        n = self.lib.m4ray_loop_n_flows(self.handle)
        ints = np.zeros((n, 6), dtype=np.int64)
        dbl = np.zeros((n, 4))
        if n:
            self.lib.m4ray_loop_flow_table(self.handle, _ptr(ints), _ptr(dbl))
        node, src, dst, size, parent, flow_id = ints.T.tolist()
        start, finish, ideal, done = dbl.T.tolist()
        return FlowLog(
            flow_id=flow_id,
            node_id=node,
            src=src,
            dst=dst,
            size_bytes=size,
            start_s=start,
            finish_s=finish,
            ideal_fct_s=ideal,
            parent_id=parent,
            done_s=done,
        )


__all__ = ["CompiledFlows", "NativeLoop", "NativeQueue", "library"]
