"""The m4 online engine: one simulation's state, driven by flow arrivals and completions.

Semantics follow the standalone m4 engine (``reference/m4.md`` §7) and our training replay:

* an arriving flow gets an initial state and joins the component owning any of its links
  (several → they merge; none → a new component); components merge on arrival and never split;
* a completing flow leaves its component; a link with no active flow left is reset to its initial
  state and released; a component with no flow left ends;
* an **update** advances every touched component at time ``t``: one Δt = ``t`` − the component's
  oldest last-update time (µs) for all its flows and links, GRU time cells, GNN, GRU rate cells,
  then the head's slowdown ``ŝ`` for each of its flows; predicted completion = arrival + ŝ·ideal.

The engine has no clock: the caller says when things happen (:class:`M4Backend` in-process, or
the Serve session API). The neural work goes through ``stepper(graphs) -> outs`` in one call per
update (:class:`~m4ray.sim.m4.step.LocalStepper` or the Serve model deployment); ``prepare`` /
``finish`` split an update around a remote call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from m4ray.errors import InputError, SimulationError
from m4ray.sim.m4.step import StepGraph, StepOut
from m4ray.sim.routing import Routing
from m4ray.train.model import ModelConfig, initial_flow_state, initial_link_state

Stepper = Callable[[list[StepGraph]], list[StepOut]]


@dataclass(frozen=True, slots=True)
class Arrival:
    """A flow entering the network now: ``id`` unique within the simulation, host ids, bytes."""

    id: int
    src: int
    dst: int
    size_bytes: int


@dataclass(slots=True)
class _Flow:
    row: int
    links: np.ndarray
    start_s: float
    ideal_s: float
    comp: int
    slowdown: float = 1.0


@dataclass(slots=True)
class _Component:
    flows: dict[int, None] = field(default_factory=dict)  # ordered set of flow ids
    links: set[int] = field(default_factory=set)
    t_last: float = 0.0


@dataclass(frozen=True, slots=True)
class Pending:
    """What an update sends to the stepper: per graph its component, flows, their state rows,
    and links."""

    t: float
    comps: list[int]
    flows: list[list[int]]
    rows: list[torch.Tensor]
    links: list[np.ndarray]
    graphs: list[StepGraph]


class M4Engine:
    """Per-simulation m4 state over directed links ``0..len(link_bandwidth_bps)-1``; flows take
    ``routing``'s paths (:meth:`arrive`) or explicit ones (:meth:`arrive_path`)."""

    def __init__(
        self,
        link_bandwidth_bps: np.ndarray,
        model_cfg: ModelConfig,
        params13: list[float],
        stepper: Stepper | None = None,
        routing: Routing | None = None,
    ) -> None:
        if len(params13) != model_cfg.n_params:
            raise InputError(
                f"{len(params13)} network parameters, the model takes {model_cfg.n_params}",
                field="params13",
            )
        self.routing = routing
        self.cfg = model_cfg
        self.stepper = stepper
        self.params = torch.tensor(params13, dtype=torch.float32).reshape(1, -1)
        bw = torch.tensor(np.asarray(link_bandwidth_bps), dtype=torch.float32)
        self._link_init = initial_link_state(model_cfg, bw)
        self._h_link = self._link_init.clone()
        self._users = np.zeros(len(bw), dtype=np.int64)
        self._owner = np.full(len(bw), -1, dtype=np.int64)
        self._h_flow = torch.zeros(64, model_cfg.hidden)
        self._free_rows = list(range(63, -1, -1))
        self._flows: dict[int, _Flow] = {}
        self._comps: dict[int, _Component] = {}
        self._next_comp = 0
        self._touched: set[int] = set()
        self.n_updates = 0  # updates that ran the model
        self.n_stepped_flows = 0  # Σ flows over all graphs stepped

    # ------------------------------------------------------------ events
    def arrive(self, flow: Arrival, t: float) -> float:
        """Register ``flow`` at ``t`` on its routed path; returns its ideal completion time."""
        path = self._route(flow)
        ideal = self.routing.ideal_fct(flow.size_bytes, path)
        return self.arrive_path(flow.id, path.links, flow.size_bytes, ideal, t)

    def arrive_path(self, flow_id: int, links, size_bytes: int, ideal_s: float, t: float) -> float:
        """Register a flow on explicit directed ``links`` (m4's ``flow_to_links``)."""
        if flow_id in self._flows:
            raise InputError(f"flow {flow_id} is already active", field="id")
        links = np.asarray(links, dtype=np.int64)
        if not len(links) or links.min() < 0 or links.max() >= len(self._users):
            raise InputError(
                f"flow {flow_id}: links must be ids in [0, {len(self._users)})", field="links"
            )
        comp = self._join(links, t)
        row = self._row()
        self._h_flow[row] = initial_flow_state(
            self.cfg, torch.tensor([size_bytes]), torch.tensor([len(links)])
        )[0]
        self._flows[flow_id] = _Flow(row, links, t, ideal_s, comp)
        self._comps[comp].flows[flow_id] = None
        self._users[links] += 1
        self._touched.add(comp)
        return t + ideal_s

    def check(self, events: list[tuple[float, Arrival | int]]) -> None:
        """Raise :class:`InputError` if applying ``events`` — ``(t, Arrival)`` or
        ``(t, flow id)`` for a completion, in order — would be rejected; nothing changes. The
        Serve API checks a whole request before applying any of it."""
        active = set(self._flows)
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
        flow = self._flows.pop(flow_id, None)
        if flow is None:
            raise InputError(f"flow {flow_id} is not active", field="id")
        comp = self._comps[flow.comp]
        del comp.flows[flow_id]
        self._free_rows.append(flow.row)
        self._users[flow.links] -= 1
        for link in flow.links[self._users[flow.links] == 0].tolist():
            self._owner[link] = -1
            self._h_link[link] = self._link_init[link]
            comp.links.discard(link)
        if comp.flows:
            self._touched.add(flow.comp)
        else:
            del self._comps[flow.comp]
            self._touched.discard(flow.comp)
        return flow.slowdown

    def set_bandwidth(self, link: int, bandwidth_bps: float) -> None:
        """A link's rate changes (gray-failure onset): its initial state follows; an idle link
        takes it now, a busy one when it next goes idle."""
        row = initial_link_state(self.cfg, torch.tensor([float(bandwidth_bps)]))[0]
        self._link_init[link] = row
        if self._users[link] == 0:
            self._h_link[link] = row

    def update(self, t: float) -> dict[int, float]:
        """Advance the touched components to ``t``; predicted completion time per flow in them."""
        if self.stepper is None:
            raise SimulationError("this engine has no stepper; use prepare()/finish()")
        pending = self.prepare(t)
        if pending is None:
            return {}
        return self.finish(pending, self.stepper(pending.graphs))

    def prepare(self, t: float) -> Pending | None:
        """The graphs of the touched components at ``t`` (None when nothing changed)."""
        if not self._touched:
            return None
        comps = sorted(self._touched)
        self._touched = set()
        flows, rows_of, links, graphs = [], [], [], []
        for c in comps:
            comp = self._comps[c]
            ids = list(comp.flows)
            link_ids = np.fromiter(sorted(comp.links), dtype=np.int64, count=len(comp.links))
            paths = np.concatenate([self._flows[f].links for f in ids])
            lengths = [len(self._flows[f].links) for f in ids]
            local = np.searchsorted(link_ids, paths)  # each path link's row in link_ids
            if (local >= len(link_ids)).any() or (link_ids[local % len(link_ids)] != paths).any():
                raise SimulationError(f"component {c}: a flow's link is not in the component")
            incidence = np.stack([np.repeat(np.arange(len(ids)), lengths), local])
            rows = torch.tensor([self._flows[f].row for f in ids])
            graphs.append(
                StepGraph(
                    h_flow=self._h_flow[rows],
                    h_link=self._h_link[torch.from_numpy(link_ids)],
                    dt_us=max(t - comp.t_last, 0.0) * 1e6,
                    incidence=torch.from_numpy(incidence),
                    params=self.params.expand(len(ids), -1),
                    n_links=torch.tensor(lengths),
                )
            )
            flows.append(ids)
            rows_of.append(rows)
            links.append(link_ids)
        return Pending(t=t, comps=comps, flows=flows, rows=rows_of, links=links, graphs=graphs)

    def finish(self, pending: Pending, outs: list[StepOut]) -> dict[int, float]:
        """Write back the stepper's ``outs`` for ``pending``; predicted completion per flow."""
        if len(outs) != len(pending.graphs):
            raise SimulationError(f"{len(outs)} step outputs for {len(pending.graphs)} graphs")
        predictions: dict[int, float] = {}
        for c, ids, rows, link_ids, out in zip(
            pending.comps, pending.flows, pending.rows, pending.links, outs, strict=True
        ):
            self._h_flow[rows] = out.h_flow
            self._h_link[torch.from_numpy(link_ids)] = out.h_link
            self._comps[c].t_last = pending.t
            for f, s in zip(ids, out.slowdown.tolist(), strict=True):
                flow = self._flows[f]
                flow.slowdown = s
                predictions[f] = flow.start_s + s * flow.ideal_s
            self.n_updates += 1
            self.n_stepped_flows += len(ids)
        return predictions

    @property
    def n_active(self) -> int:
        return len(self._flows)

    @property
    def n_components(self) -> int:
        return len(self._comps)

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

    def _join(self, links: np.ndarray, t: float) -> int:
        owners = sorted({int(c) for c in self._owner[links] if c >= 0})
        if not owners:
            root = self._next_comp
            self._next_comp += 1
            self._comps[root] = _Component(t_last=t)
        else:
            root = max(owners, key=lambda c: (len(self._comps[c].flows), -c))
            keep = self._comps[root]
            for other in owners:
                if other == root:
                    continue
                gone = self._comps.pop(other)
                self._touched.discard(other)
                for f in gone.flows:
                    self._flows[f].comp = root
                keep.flows.update(gone.flows)
                moved = np.fromiter(gone.links, dtype=np.int64, count=len(gone.links))
                self._owner[moved] = root
                keep.links |= gone.links
                keep.t_last = min(keep.t_last, gone.t_last)
        self._owner[links] = root
        self._comps[root].links.update(links.tolist())
        return root

    def _row(self) -> int:
        if not self._free_rows:
            n = len(self._h_flow)
            self._h_flow = torch.cat([self._h_flow, torch.zeros(n, self.cfg.hidden)])
            self._free_rows = list(range(2 * n - 1, n - 1, -1))
        return self._free_rows.pop()


__all__ = ["Arrival", "M4Engine", "Pending", "Stepper"]
