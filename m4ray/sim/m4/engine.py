"""The m4 online engine: one simulation's state, driven by flow arrivals and completions.

Semantics follow the standalone m4 engine (``reference/m4.md`` §7) and our training replay:

* an arriving flow gets an initial state and joins the component owning any of its links
  (several → they merge; none → a new component); components merge on arrival and never split;
* a completing flow leaves its component; a link with no active flow left is reset to its initial
  state and released; a component with no flow left ends;
* an **update** advances every touched component at time ``t``: one Δt = ``t`` − the component's
  oldest last-update time (µs) for all its flows and links, GRU time cells, GNN, GRU rate cells,
  then the head's slowdown ``ŝ`` for each of its flows; predicted completion = arrival + ŝ·ideal.
* a model with the fluid anchor (``ModelConfig.fluid``) also gets, at each update, flowSim's
  view of the updated flows (:class:`~m4ray.models.fluid.Fluid`: max-min rates over the touched
  components, fluid bytes left, projected slowdown), exactly as training replays it.

The engine has no clock: the caller says when things happen (:class:`M4Backend` in-process, or
the Serve session API). The neural work goes through ``stepper(graphs) -> outs`` in one call per
update (:class:`~m4ray.models.numpy_step.NumpyStepper` in-process, the torch
:class:`~m4ray.models.step.LocalStepper`, or the Serve model deployment); ``prepare`` /
``finish`` split an update around a remote call.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from dataclasses import dataclass
from itertools import accumulate, chain, pairwise

import numpy as np

from m4ray.errors import InputError, SimulationError
from m4ray.models import core
from m4ray.models.components import Batching, Component, Components
from m4ray.models.config import ModelConfig
from m4ray.models.fairshare import Window, reverse_links
from m4ray.models.fluid import N_FEATURES, Fluid, offsets
from m4ray.models.graph import StepGraph, StepOut
from m4ray.models.numpy_step import initial_link_state
from m4ray.models.wire import wire_window
from m4ray.sim.m4 import memo
from m4ray.sim.m4.arrival import Arrival
from m4ray.sim.routing import Routing, WireFormat

Stepper = Callable[[list[StepGraph]], list[StepOut]]

# Predicted completion times are rounded to the picosecond (ns-3's resolution here): completions
# that coincide stay together whatever the float rounding of the step (see load_model), so one
# update covers them however the simulation's steps were batched.
TICKS_PER_S = 1e12

# With the compiled pass (NativeM4Engine.use_compiled_pass), updates of at least this many
# flows go through the stepper (numpy_step's identical-component path) instead of the core's
# one call; None: none do. The core steps identical components of an update once too, so the
# answers are the same bits either way (tests route updates both ways by setting this); the
# stepper's round trip cost ~1.5 s of 14 s on the scale ladder's 1,024-GPU MoE job.
STEPPER_FROM_FLOWS: int | None = None


@dataclass(frozen=True, slots=True)
class Pending:
    """What an update sends to the stepper: the touched components packed into one graph (they
    share no link, so the step treats them apart), with their flow ids, flow state rows and
    links in the graph's order."""

    t: float
    comps: list[int]
    flow_ids: list[int] | np.ndarray  # (the compiled engine: an array)
    rows: np.ndarray
    links: np.ndarray
    graphs: list[StepGraph]
    # the compiled engine's, for its finish: the addresses of comps and rows, the finish times'
    # array and its address, the address of links
    native: tuple | None = None


class M4Engine:
    """Per-simulation m4 state over directed links ``0..len(link_bandwidth_bps)-1``; flows take
    ``routing``'s paths (:meth:`arrive`) or explicit ones (:meth:`arrive_path`).

    Per-flow state lives in arrays indexed by a row (reused after a flow leaves): the hidden
    state, the path (padded), its length, start, ideal FCT and last slowdown; an update gathers
    and scatters them with array indexing instead of per-flow Python."""

    def __new__(cls, *args, native: bool = True, **kwargs):
        compiled = cls is M4Engine and native and core.library() is not None
        # the same engine with its bookkeeping compiled
        return super().__new__(NativeM4Engine if compiled else cls)

    def __init__(
        self,
        link_bandwidth_bps: np.ndarray,
        model_cfg: ModelConfig,
        params13: list[float],
        stepper: Stepper | None = None,
        routing: Routing | None = None,
        *,
        window: Window | None = None,
        link_latency_s: np.ndarray | None = None,
        ack_fraction: float = 0.0,
        batching: Batching | None = None,
        native: bool = True,
        anchor_fifo: bool = False,
    ) -> None:
        if model_cfg.flow_prior:
            raise InputError(
                "this checkpoint reads classic flowSim's answer per flow (model flow_prior), "
                "which the engine does not compute yet: score it with the training replay "
                "(bench/m4_probe.py --m4, bench/m4_residual.py)",
                field="model.flow_prior",
            )
        if len(params13) != model_cfg.n_params:
            raise InputError(
                f"{len(params13)} network parameters, the model takes {model_cfg.n_params}",
                field="params13",
            )
        self.routing = routing
        self.cfg = model_cfg
        self.stepper = stepper
        self.params = np.asarray(params13, dtype=np.float64).reshape(1, -1)
        # what engine_for read at the edge of the checkpoint's trained span (ParamsRange.fit)
        self.params_notes: list[str] = []
        bw = np.asarray(link_bandwidth_bps, dtype=np.float64)
        self._link_init = initial_link_state(model_cfg, bw)
        self._h_link = self._link_init.copy()
        self._capacity = np.asarray(link_bandwidth_bps, dtype=np.float64).copy()
        # the anchor's ACK load (models with fluid_acks, over RDMA: ACK bits per data bit)
        self._ack_fraction = ack_fraction if model_cfg.fluid and model_cfg.fluid_acks else 0.0
        acks = (self._ack_fraction, reverse_links(len(bw))) if self._ack_fraction > 0 else None
        # the anchor's sender window (models with fluid_window; None: no window binds)
        self._window = window if model_cfg.fluid and model_cfg.fluid_window else None
        self._wire = routing.wire if routing is not None else WireFormat()
        # anchor_fifo: the anchor serves window-sized flows in order of arrival (flowSim's
        # service="fifo", fifo_bytes: the sender's window, whether or not the anchor drains by
        # it, as training's periods carry it; every flow without one)
        fifo_bits = None
        if anchor_fifo or model_cfg.fluid_fifo:  # asked for, or the model was trained on it
            fifo_bits = wire_window(0 if window is None else window.bytes, self._wire) * 8.0
        self._fifo_bits = fifo_bits if model_cfg.fluid else None
        self._fluid = (
            Fluid(0, hold=model_cfg.fluid_hold, acks=acks, fifo_bits=fifo_bits, native=native)
            if model_cfg.fluid
            else None
        )
        if self._window is not None and link_latency_s is None:
            raise InputError("a window needs the links' latencies", field="link_latency_s")
        self._latency = None if link_latency_s is None else np.asarray(link_latency_s, float)
        n_links = len(bw)
        self._components = Components(n_links, batching)  # links' users and owners, components
        self._slot = np.full(n_links, -1, dtype=np.int64)  # scratch: a link's row in a graph
        self._rows: dict[int, int] = {}  # active flow id -> row
        self._links_of: dict[int, tuple[int, ...]] = {}  # active flow id -> its path
        self._fresh: dict[int, tuple[int, int]] = {}  # rows awaiting their initial state
        self._alloc(64, 8)
        # counts of component updates that ran the model, those the compiled core's memo
        # answered whole, Σ flows over them, and of the components the stepper updated (the
        # compiled core adds to the first three itself: NativeM4Engine.use_compiled_pass)
        # updates, memo-answered updates, stepped flows, components through the stepper; the
        # core's: flows its passes carried, components answered by an identical one
        self._stats = np.zeros(6, dtype=np.int64)

    # ------------------------------------------------------------ events
    def arrive(self, flow: Arrival, t: float) -> float:
        """Register ``flow`` at ``t`` on its routed path; returns its ideal completion time."""
        path = self._route(flow)
        ideal = self.routing.ideal_fct(flow.size_bytes, path)
        wire = self.routing.wire.wire_bytes(flow.size_bytes)
        return self.arrive_path(flow.id, path.links, flow.size_bytes, ideal, t, wire_bytes=wire)

    def arrive_path(
        self,
        flow_id: int,
        links,
        size_bytes: int,
        ideal_s: float,
        t: float,
        *,
        wire_bytes: int | None = None,
    ) -> float:
        """Register a flow on explicit directed ``links`` (m4's ``flow_to_links``);
        ``wire_bytes`` (default ``size_bytes``) is what the fluid anchor drains."""
        if flow_id in self._rows:
            raise InputError(f"flow {flow_id} is already active", field="id")
        links = tuple(int(link) for link in links)
        n_links = len(self._capacity)
        if not links or min(links) < 0 or max(links) >= n_links:
            raise InputError(f"flow {flow_id}: links must be ids in [0, {n_links})", field="links")
        row = self._row(len(links))
        self._path[row, : len(links)] = links
        self._plen[row] = len(links)
        self._start[row] = t
        self._ideal[row] = ideal_s
        self._slow[row] = 1.0
        self._fresh[row] = (size_bytes, len(links))
        if self._fluid is not None:
            work = size_bytes if wire_bytes is None else wire_bytes
            rates = self._capacity[list(links)]
            window = None
            if self._window is not None:
                window = self._window.limit_links(
                    self._wire, self._latency[list(links)], rates, work * 8.0
                )
            self._fluid.add(row, work, ideal_s, rates.min(), t, window=window)
        self._rows[flow_id] = row
        self._links_of[flow_id] = links
        self._components.join(flow_id, links, t)
        return t + ideal_s

    def check(self, events: list[tuple[float, Arrival | int]]) -> None:
        """Raise :class:`InputError` if applying ``events`` — ``(t, Arrival)`` or
        ``(t, flow id)`` for a completion, in order — would be rejected; nothing changes. The
        Serve API checks a whole request before applying any of it."""
        active = set(self._rows)
        for _, event in events:
            if isinstance(event, Arrival):
                if event.id in active:
                    raise InputError(
                        f"arrival of flow {event.id}, which is already active", field="id"
                    )
                self._route(event)
                active.add(event.id)
            else:
                if event not in active:
                    raise InputError(f"completion of flow {event}, which is not active", field="id")
                active.discard(event)

    def apply(self, events: list[tuple[float, Arrival | int]]) -> None:
        """Apply ``events`` (see :meth:`check`) in order."""
        for t, event in events:
            if isinstance(event, Arrival):
                self.arrive(event, t)
            else:
                self.complete(event, t)

    def complete(self, flow_id: int, t: float) -> float:
        """Remove ``flow_id`` at ``t``; returns its last predicted slowdown."""
        if flow_id not in self._rows:
            raise InputError(f"flow {flow_id} is not active", field="id")
        if self._fluid is not None:  # the flows left behind shared with it until now
            comp = self._components.of(flow_id)
            if len(comp.flows) > 1 and not self._frozen(len(comp.flows)):
                self._fluid_catch_up(comp, t)
            self._fluid.release(self._rows[flow_id], self._links_of[flow_id])
        row = self._rows.pop(flow_id)
        self._fresh.pop(row, None)
        self._free_rows.append(row)
        idle = self._components.leave(flow_id, self._links_of.pop(flow_id))
        if idle:
            self._h_link[idle] = self._link_init[idle]
        return float(self._slow[row])

    def set_bandwidth(self, link: int, bandwidth_bps: float) -> None:
        """A link's rate changes (gray-failure onset): its initial state follows; an idle link
        takes it now, a busy one when it next goes idle. The fluid anchor's max-min rates use
        the new rate from the link's component's next update on."""
        self._capacity[link] = bandwidth_bps
        row = initial_link_state(self.cfg, np.array([float(bandwidth_bps)]))[0]
        self._link_init[link] = row
        if self._components.users[link] == 0:
            self._h_link[link] = row

    def update(self, t: float) -> dict[int, float]:
        """Advance the touched components to ``t``; predicted completion time per flow in them."""
        predicted = self.predict(t)
        if predicted is None:
            return {}
        _, flow_ids, finish = predicted
        return dict(zip(flow_ids.tolist(), finish.tolist(), strict=True))

    def predict(self, t: float) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """:meth:`update` as arrays (None when nothing changed): the updated flows' rows, ids
        and predicted completion times (what :class:`M4Backend` schedules, with no per-flow
        Python for the thousands of flows of an all-to-all's component)."""
        if self.stepper is None:
            raise SimulationError("this engine has no stepper; use prepare()/finish()")
        pending = self.prepare(t)
        if pending is None:
            return None
        finish = self._finish_times(pending, self.stepper(pending.graphs))
        return pending.rows, np.asarray(pending.flow_ids, dtype=np.int64), finish

    def row(self, flow_id: int) -> int:
        """The state row of active flow ``flow_id`` (reused once it leaves)."""
        return self._rows[flow_id]

    def prepare(self, t: float) -> Pending | None:
        """The touched components at ``t`` as one graph (None when nothing changed)."""
        if not self._components.touched:
            return None
        comps = self._components.take_touched()
        if not comps:  # every touched component waits (batching)
            return None
        self._init_fresh()
        flow_ids: list[int] = []
        link_lists: list[list[int]] = []
        n_flows, n_links, dts = [], [], []
        for c in comps:
            comp = self._components.comps[c]
            flow_ids += comp.flows
            link_lists.append(sorted(comp.links))
            n_flows.append(len(comp.flows))
            n_links.append(len(comp.links))
            dts.append(max(t - comp.t_last, 0.0) * 1e6)
        rows = np.fromiter(map(self._rows.__getitem__, flow_ids), np.int64, len(flow_ids))
        links = np.fromiter((x for ls in link_lists for x in ls), np.int64, sum(n_links))
        self._slot[links] = np.arange(len(links))
        plen, path_links = self._paths(rows)
        local = self._slot[path_links]
        if (local < 0).any():
            self._slot[links] = -1
            raise SimulationError(f"at t={t}: a flow's link is not in its component")
        self._slot[links] = -1
        incidence = np.stack([np.repeat(np.arange(len(rows)), plen), local])
        dt = np.asarray(dts, dtype=float)
        base = fluid = None
        if self._fluid is not None:
            frozen = np.repeat([self._frozen(n) for n in n_flows], n_flows)
            if frozen.any():
                self._fluid.catch_up_frozen(rows[frozen], t)
            csr = (offsets(plen), path_links)
            base, fluid = self._fluid.advance(rows, csr, self._capacity, t)
            for c in comps:
                self._components.comps[c].t_fluid = t
        graph = self._graph(rows, links, dt, n_flows, n_links, incidence, plen, base, fluid)
        return Pending(t=t, comps=comps, flow_ids=flow_ids, rows=rows, links=links, graphs=[graph])

    def _graph(  # noqa: PLR0917 (the arrays of one update)
        self, rows, links, dt, n_flows, n_links, incidence, plen, base, fluid
    ) -> StepGraph:
        """The step's graph of ``rows`` and ``links`` (arrays) with per-component Δt."""
        return StepGraph(
            h_flow=self._h_flow[rows],
            h_link=self._h_link[links],
            dt_flow_us=np.repeat(dt, n_flows),
            dt_link_us=np.repeat(dt, n_links),
            incidence=incidence,
            params=np.repeat(self.params, len(rows), axis=0),
            n_links=plen,
            base=base,
            fluid=fluid,
            comp_flows=n_flows,
            comp_links=n_links,
        )

    def _output(self, pending: Pending, outs: list[StepOut]) -> StepOut:
        """The stepper's one output for ``pending``'s graph, counted."""
        if len(outs) != len(pending.graphs):
            raise SimulationError(f"{len(outs)} step outputs for {len(pending.graphs)} graphs")
        (out,) = outs
        self._stats[[0, 3]] += len(pending.comps)
        self._stats[2] += len(pending.rows)
        return out

    def _write_back(self, pending: Pending, outs: list[StepOut]) -> np.ndarray:
        """The new states of ``pending``'s rows and links; returns the slowdowns."""
        out = self._output(pending, outs)
        self._h_flow[pending.rows] = np.asarray(out.h_flow)
        self._h_link[pending.links] = np.asarray(out.h_link)
        return np.asarray(out.slowdown)

    def finish(self, pending: Pending, outs: list[StepOut]) -> dict[int, float]:
        """Write back the stepper's ``outs`` for ``pending``; predicted completion per flow."""
        finish = self._finish_times(pending, outs)
        return dict(zip(np.asarray(pending.flow_ids).tolist(), finish.tolist(), strict=True))

    def _finish_times(self, pending: Pending, outs: list[StepOut]) -> np.ndarray:
        """:meth:`finish`'s write-back; the predicted completion times in ``pending``'s order."""
        slowdown = self._write_back(pending, outs)
        rows = pending.rows
        self._slow[rows] = slowdown
        for c in pending.comps:
            self._components.comps[c].t_last = pending.t
        finish = self._start[rows] + slowdown * self._ideal[rows]
        return np.round(finish * TICKS_PER_S) / TICKS_PER_S  # see TICKS_PER_S

    @property
    def n_updates(self) -> int:
        """Component updates that ran the model."""
        return int(self._stats[0])

    @property
    def n_stepped_flows(self) -> int:
        """Σ flows over those updates."""
        return int(self._stats[2])

    @property
    def n_active(self) -> int:
        return len(self._rows)

    @property
    def n_components(self) -> int:
        return len(self._components)

    # ------------------------------------------------------------ internals
    def _route(self, flow: Arrival):
        """``flow``'s path, or the :class:`InputError` that rejects the arrival."""
        if self.routing is None:
            raise SimulationError("this engine has no routing; use arrive_path()")
        if flow.size_bytes <= 0:
            raise InputError(
                f"flow {flow.id}: size must be > 0, got {flow.size_bytes}", field="size_bytes"
            )
        try:
            return self.routing.path(flow.src, flow.dst, flow.id)
        except InputError as err:
            raise InputError(f"flow {flow.id}: {err.message}", field=err.field) from None

    @property
    def batching(self) -> Batching | None:
        """Completion batching of large components (None: an update at every event)."""
        return self._components.batching

    def _frozen(self, n_flows: int) -> bool:
        """Whether a component of ``n_flows`` flows has its anchor frozen between its updates
        (the flows drain at their rates, not re-shared; ``Fluid.catch_up_frozen``): batched and
        above ``Batching.frozen_above`` flows."""
        return self.batching is not None and self.batching.frozen(n_flows)

    def _fluid_catch_up(self, comp: Component, t: float) -> None:
        if comp.t_fluid >= t:  # every row of it is already at t (or later)
            return
        rows = np.fromiter(map(self._rows.__getitem__, comp.flows), np.int64, len(comp.flows))
        plen, path_links = self._paths(rows)
        self._fluid.catch_up(rows, (offsets(plen), path_links), self._capacity, t)
        comp.t_fluid = t

    def _paths(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``rows``' path lengths and their links, concatenated in row order."""
        plen = self._plen[rows]
        paths = self._path[rows]
        return plen, paths[np.arange(paths.shape[1]) < plen[:, None]]

    def _alloc(self, n_rows: int, max_len: int) -> None:
        """Per-row arrays for ``n_rows`` flows with paths up to ``max_len`` links (grown as
        needed, contents kept)."""
        old = getattr(self, "_plen", None)
        n_old = 0 if old is None else len(old)
        h_flow = np.zeros((n_rows, self.cfg.hidden))
        path = np.zeros((n_rows, max_len), dtype=np.int64)
        arrays = {"_plen": np.int64, "_start": float, "_ideal": float, "_slow": float}
        if old is not None:
            h_flow[:n_old] = self._h_flow
            path[:n_old, : self._path.shape[1]] = self._path
        self._h_flow, self._path = h_flow, path
        for name, dtype in arrays.items():
            grown = np.zeros(n_rows, dtype=dtype)
            if old is not None:
                grown[:n_old] = getattr(self, name)
            setattr(self, name, grown)
        self._free_rows = [*getattr(self, "_free_rows", []), *range(n_rows - 1, n_old - 1, -1)]
        if self._fluid is not None:
            self._fluid.resize(n_rows)

    def _row(self, path_len: int) -> int:
        if not self._free_rows or path_len > self._path.shape[1]:
            n = len(self._plen)
            self._alloc(2 * n if not self._free_rows else n, max(path_len, self._path.shape[1]))
        return self._free_rows.pop()

    def _init_fresh(self) -> None:
        """Initial states of the rows of flows that arrived since the last update: the model's
        :func:`~m4ray.models.m4.initial_flow_state`, written into the rows directly (float32
        as there; a test holds the two equal)."""
        fresh = self._fresh
        if not fresh:
            return
        n = len(fresh)
        rows = np.fromiter(fresh, np.int64, n)
        info = np.fromiter(chain.from_iterable(fresh.values()), np.float64, 2 * n)
        init = np.zeros((n, self._h_flow.shape[1]))
        init[:, 0] = 1.0
        init[:, 2] = np.log2(info[0::2].astype(np.float32) / np.float32(1000) + np.float32(1))
        init[:, 3] = info[1::2]
        self._h_flow[rows] = init
        self._fresh = {}


@functools.lru_cache(maxsize=65536)
def size_feature(size_bytes: int) -> float:
    """A flow's size as its initial state holds it (:meth:`M4Engine._init_fresh`'s float32
    arithmetic, once per size: collectives send few distinct sizes)."""
    size = np.array([size_bytes], dtype=np.float64).astype(np.float32)
    return float(np.log2(size / np.float32(1000) + np.float32(1))[0])


class NativeM4Engine(M4Engine):
    """:class:`M4Engine` with its bookkeeping compiled (``_core.c``: links' users and owners,
    components, flow rows, the fluid anchor and its sender window): the same updates, flow
    for flow, at a fraction of the Python per event. ``M4Engine(...)`` builds one wherever the
    core builds (``native=False``, or ``M4RAY_NATIVE=0``: the Python reference). The core
    also keeps the flows' neural states: it writes fresh rows' initial states, gathers each
    update's graph rows and writes the step's new states back; the links' states (an array
    the core writes through) and the flow ids stay here."""

    def __init__(self, link_bandwidth_bps, model_cfg, params13, *args, **kwargs) -> None:
        super().__init__(link_bandwidth_bps, model_cfg, params13, *args, **kwargs)
        self._h_flow = None  # the core keeps the flows' states
        self._capacity = np.ascontiguousarray(self._capacity, dtype=np.float64)
        self._h_link = np.ascontiguousarray(self._h_link, dtype=np.float64)
        self._link_init = np.ascontiguousarray(self._link_init, dtype=np.float64)
        if self._latency is not None:
            self._latency = np.ascontiguousarray(self._latency, dtype=np.float64)
        window, wire = self._window, self._wire
        lib = self._lib = core.library()
        self._core = lib.m4ray_engine_new(
            len(self._capacity),
            self.cfg.hidden,
            self._capacity.ctypes.data,
            None if window is None else self._latency.ctypes.data,
            self._h_link.ctypes.data,
            self._link_init.ctypes.data,
            int(self._fluid is not None),
            int(self._fluid is not None and self._fluid.hold),
            float(wire.mtu_bytes),
            float(wire.header_bytes),
            0.0 if window is None else float(window.bytes),
            0.0 if window is None else float(window.ack_bytes),
            float(self._ack_fraction),
        )
        if not self._core:
            raise MemoryError("m4 engine core: out of memory")
        if self._fifo_bits is not None:
            lib.m4ray_engine_fifo(self._core, self._fifo_bits)
        if self.batching is not None:
            batching = self.batching
            lib.m4ray_engine_batching(
                self._core, batching.above_flows, batching.fraction, batching.frozen_above
            )
        self._fluid = None  # the core keeps the anchor's rows
        self._anchored = bool(model_cfg.fluid)
        self._flow_of = np.full(64, -1, dtype=np.int64)  # row -> flow id
        self._buf = np.zeros(64, dtype=np.int64)  # an arriving flow's links
        self._sizes = np.zeros(4, dtype=np.int64)
        self._sizes_ptr = self._sizes.ctypes.data
        # the core's graph_out: five output addresses (set per update), the parameter row's
        # address and the parameter count
        self._params_row = np.ascontiguousarray(self.params[0], dtype=np.float64)
        self._graph_out = np.zeros(7, dtype=np.int64)
        self._graph_out[5:] = [self._params_row.ctypes.data, len(self._params_row)]
        self._graph_out_ptr = self._graph_out.ctypes.data
        self._buf_ptr = self._buf.ctypes.data
        self._fused: tuple | None = None  # use_compiled_pass's model and weights

    def use_compiled_pass(
        self, model, *, memo_flows: int = memo.MAX_FLOWS, memo_bytes: int = memo.MAX_BYTES
    ) -> bool:
        """Run every update (of at most ``NATIVE_MAX_ROWS`` rows, and fewer than
        :data:`STEPPER_FROM_FLOWS` flows where that is set) in one call to the core: prepare,
        ``model``'s compiled pass (``_step.c``, by address, in the model's float type) and the
        write-back, with the core's memo of passes by their input bytes, component by
        component (components of at most ``memo_flows`` flows, up to ``memo_bytes``; what
        :class:`~m4ray.sim.m4.memo.StepMemo` does for whole graphs on the Python path), and
        identical components of one update stepped once (what the stepper's ``_distinct``
        does). The compiled pass gives each component the same bits alone or beside others,
        so the answers are those of :meth:`predict` through the stepper, to the bit
        (``tests/sim/test_m4_native.py``). False (nothing changes) where ``model`` is not a
        numpy model of this engine's config or the pass is not compiled here."""
        from m4ray.models import numpy_step

        lib = numpy_step.native_step_library()
        if lib is None or not isinstance(model, numpy_step.NumpyModel) or model.cfg != self.cfg:
            return False
        wbuf, offs, dims = model._packed
        address = ctypes.cast(model.pass_function(lib), ctypes.c_void_p).value
        rc = self._lib.m4ray_engine_model(
            self._core, address, dims.ctypes.data, wbuf.ctypes.data, offs.ctypes.data,
            self._params_row.ctypes.data, len(self._params_row), memo_flows, memo_bytes,
        )  # fmt: skip
        if rc:
            raise MemoryError("m4 engine core: out of memory")
        self._fused = (model, wbuf, offs, dims)  # kept alive: the core reads them
        # which updates the core runs: below this many flows, up to this many rows (the
        # compiled loop applies the same)
        below = STEPPER_FROM_FLOWS if STEPPER_FROM_FLOWS is not None else 1 << 62
        self.compiled_limits = (below, numpy_step.NATIVE_MAX_ROWS)
        return True

    def dag_loop(self):
        """This engine in a compiled loop's m4 mode (:meth:`NativeLoop.make_m4`), or None: its
        small updates are not compiled (:meth:`use_compiled_pass`), or nothing compiles."""
        from m4ray.sim.dagloop import NativeLoop

        return NativeLoop.make_m4(self) if self._fused else None

    def loop_update(self, t: float) -> tuple[np.ndarray, np.ndarray]:
        """An update the compiled loop hands back (beyond :attr:`compiled_limits`), through
        the stepper: the updated rows and their predicted completion times."""
        pending = self.prepare(t, ids=False)
        if pending is None:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        return pending.rows, self._finish_times(pending, self.stepper(pending.graphs))

    @property
    def memo_answers(self) -> int:
        """Updates the core's memo answered whole, without a pass (:meth:`use_compiled_pass`)."""
        return int(self._stats[1])

    def predict(self, t: float):
        if not self._fused:
            return super().predict(t)
        self._lib.m4ray_engine_pending(self._core, self._sizes_ptr)
        k, n_flows, n_links, _ = self._sizes.tolist()
        if not k:
            return None
        below, rows_max = self.compiled_limits
        if n_flows >= below or n_flows + n_links > rows_max:
            return super().predict(t)  # the stepper's path (identical components, numpy)
        rows = np.empty(n_flows, dtype=np.int64)
        finish = np.empty(n_flows)
        got = self._lib.m4ray_engine_update(
            self._core, float(t), self._sizes_ptr, rows.ctypes.data, finish.ctypes.data,
            self._stats.ctypes.data,
        )  # fmt: skip
        if got < 0:
            raise MemoryError("m4 engine core: out of memory")
        return rows, self._flow_of[rows], finish

    def __del__(self) -> None:
        if getattr(self, "_core", None):
            self._lib.m4ray_engine_free(self._core)
            self._core = None

    def arrive_path(self, flow_id, links, size_bytes, ideal_s, t, *, wire_bytes=None) -> float:
        if flow_id in self._rows:
            raise InputError(f"flow {flow_id} is already active", field="id")
        n = len(links)
        if n > len(self._buf):
            self._buf = np.zeros(2 * n, dtype=np.int64)
            self._buf_ptr = self._buf.ctypes.data
        self._buf[:n] = links
        work = size_bytes if wire_bytes is None else wire_bytes
        row = self._lib.m4ray_engine_arrive(
            self._core,
            self._buf_ptr,
            n,
            float(work),
            float(ideal_s),
            float(t),
            size_feature(size_bytes),
        )
        if row < 0:
            if row == -2:
                raise MemoryError("m4 engine core: out of memory")
            raise InputError(
                f"flow {flow_id}: links must be ids in [0, {len(self._capacity)})", field="links"
            )
        if row >= len(self._flow_of):
            grown = np.full(2 * row + 2, -1, dtype=np.int64)
            grown[: len(self._flow_of)] = self._flow_of
            self._flow_of = grown
        self._flow_of[row] = flow_id
        self._rows[flow_id] = row
        return t + ideal_s

    def complete(self, flow_id: int, t: float) -> float:
        row = self._rows.pop(flow_id, None)
        if row is None:
            raise InputError(f"flow {flow_id} is not active", field="id")
        slowdown = self._lib.m4ray_engine_slowdown(self._core, row)
        if self._lib.m4ray_engine_complete(self._core, row, float(t)):
            raise MemoryError("m4 engine core: out of memory")
        return slowdown

    def set_bandwidth(self, link: int, bandwidth_bps: float) -> None:
        self._capacity[link] = bandwidth_bps
        self._link_init[link] = initial_link_state(self.cfg, np.array([float(bandwidth_bps)]))[0]
        if self._lib.m4ray_engine_users(self._core, link) == 0:
            self._h_link[link] = self._link_init[link]

    def prepare(self, t: float, *, ids: bool = True) -> Pending | None:
        """``ids=False``: the flow ids are not looked up (the compiled loop keeps them)."""
        self._lib.m4ray_engine_pending(self._core, self._sizes_ptr)
        k, n_flows, n_links, n_edges = self._sizes.tolist()
        if not k:
            return None
        # two blocks per update (their views are the update's arrays), addressed by offset:
        # one ctypes address each instead of one per array (~1 µs apiece)
        hidden, n_params, anchored = self.cfg.hidden, self.params.shape[1], self._anchored
        f, e = n_flows, n_edges
        fa = f * anchored
        # ints: comps, flows_per, links_per, rows, plen, links, incidence; floats: dt, base,
        # features, finish, h_flow, h_link, dt_flow, dt_link, params
        ints_at = list(accumulate((k, k, k, f, f, n_links, 2 * e), initial=0))
        floats_at = list(
            accumulate(
                (k, fa, fa * N_FEATURES, f, f * hidden, n_links * hidden, f, n_links, f * n_params),
                initial=0,
            )
        )
        ints, floats = np.empty(ints_at[-1], dtype=np.int64), np.empty(floats_at[-1])
        i0, f0 = ints.ctypes.data, floats.ctypes.data
        ip = [i0 + 8 * x for x in ints_at]
        fp = [f0 + 8 * x for x in floats_at]
        iv = [ints[a:b] for a, b in pairwise(ints_at)]
        fv = [floats[a:b] for a, b in pairwise(floats_at)]
        g = self._graph_out
        g[:5] = [fp[4], fp[6], fp[5], fp[7], fp[8]]  # h_flow, dt_flow, h_link, dt_link, params
        n_used = self._lib.m4ray_engine_prepare(
            self._core, float(t), ip[0], ip[1], ip[2], fp[0], ip[3], ip[4], ip[5], ip[6],
            fp[1] if anchored else None, fp[2] if anchored else None, self._graph_out_ptr,
        )  # fmt: skip
        if n_used < 0:
            raise MemoryError("m4 engine core: out of memory")
        comps, flows_per, links_per, rows, plen, links, incidence = iv
        _, base, features, finish, h_flow, h_link, dt_flow, dt_link, params = fv
        graph = StepGraph(
            h_flow=h_flow.reshape(f, hidden),
            h_link=h_link[: n_used * hidden].reshape(n_used, hidden),
            dt_flow_us=dt_flow,
            dt_link_us=dt_link[:n_used],
            incidence=incidence.reshape(2, e),
            params=params.reshape(f, n_params),
            n_links=plen,
            base=base if anchored else None,
            fluid=features.reshape(f, N_FEATURES) if anchored else None,
            comp_flows=flows_per,
            comp_links=links_per,
        )
        return Pending(
            t=t,
            comps=comps,
            flow_ids=self._flow_of[rows] if ids else rows,
            rows=rows,
            links=links[:n_used],
            graphs=[graph],
            native=(ip[0], ip[3], finish, fp[3], ip[5]),
        )

    def _finish_times(self, pending: Pending, outs: list[StepOut]) -> np.ndarray:
        out = self._output(pending, outs)
        comps_at, rows_at, finish, finish_at, links_at = pending.native
        rows, links = pending.rows, pending.links
        arrays = [
            np.ascontiguousarray(a, dtype=np.float64)
            for a in (out.slowdown, out.h_flow, out.h_link)
        ]
        slowdown, h_flow, h_link = arrays
        hidden = self.cfg.hidden
        if h_flow.shape != (len(rows), hidden) or h_link.shape != (len(links), hidden):
            raise SimulationError(
                f"step output shapes {h_flow.shape} / {h_link.shape}, the update has "
                f"{len(rows)} flows and {len(links)} links of {hidden} states"
            )
        self._lib.m4ray_engine_finish(
            self._core,
            float(pending.t),
            len(pending.comps),
            comps_at,
            len(finish),
            rows_at,
            slowdown.ctypes.data,
            finish_at,
            h_flow.ctypes.data,
            len(links),
            links_at,
            h_link.ctypes.data,
        )
        return finish

    @property
    def n_components(self) -> int:
        return self._lib.m4ray_engine_components(self._core)


__all__ = ["Arrival", "M4Engine", "NativeM4Engine", "Pending", "Stepper"]
