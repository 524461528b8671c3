"""The m4 engine's component bookkeeping, once: which active flows share links: they step together.

* an arriving flow joins the component owning any of its links; several owners merge into the
  one with the most flows (ties: the lowest id), which keeps the oldest last-update times; no
  owner opens a new component;
* a leaving flow releases its links; a link with no flow left goes idle (no owner) and leaves its
  component; a component with no flow left ends. Components merge and never split;
* every component an event changed is *touched*; an update takes the touched set in id order.
* completion batching (:class:`Batching`, off unless given): a touched component of more than
  ``above_flows`` flows is taken only once it has had an arrival since its last update, or
  completions since then numbering at least ``fraction`` of its flows; until then it stays
  touched and its flows keep their last predictions. One completion among n flows moves the
  others' shares by ~1/n, so a component deferred over a fraction f of its flows' completions
  drifts by ~f over ~f of its life: the cost of a component's life falls from ~n²/2 stepped
  flows (one update per completion) to ~n/f.

The online engine (:class:`~m4ray.sim.m4.engine.M4Engine`) and training's replay of it
(:func:`~m4ray.train.periods.engine_schedule`) both keep their components here, so the model
learns the updates it gets online. ``_core.c`` is its compiled twin (the native engine), held to
the same updates flow for flow by ``tests/sim/test_m4_native.py``. Times are the caller's unit.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from m4ray.errors import InputError


@dataclass(slots=True)
class Component:
    flows: dict[int, None] = field(default_factory=dict)  # ordered set of flow ids
    links: set[int] = field(default_factory=set)
    t_last: float = 0.0  # its oldest last model update
    t_fluid: float = 0.0  # its fluid rows' oldest last update (the anchor's catch-up)
    arrived: bool = True  # a flow arrived since its last update
    left: int = 0  # completions since its last update


@dataclass(frozen=True, slots=True)
class Batching:
    """Completion batching of large components (module docstring): components of more than
    ``above_flows`` flows are updated at an arrival or once ``fraction`` of their flows have
    completed since their last update."""

    above_flows: int
    fraction: float
    # above this many flows too, the fluid anchor of a batched component is frozen between its
    # updates (``Fluid.catch_up_frozen``: its flows drain at the rates of its last update): its
    # exact re-share at each drain and completion costs ~n² max-min work over the component's
    # life. 0 (the default since 2026-11-29; 1,024 before): every batched component, which on
    # the 1,024-GPU MoE ladder job took a tenth of m4's time off and moved its answers less
    # than batching itself does (bench/m4_batching.py)
    frozen_above: int = 0

    @classmethod
    def of(cls, above_flows: int | None, fraction: float, frozen_above: int = 0) -> Batching | None:
        """The batching of a backend's ``batch_above_flows`` / ``batch_fraction`` /
        ``batch_frozen_above`` settings (None: off), checked."""
        if above_flows is not None and above_flows < 0:
            raise InputError(f"must be >= 0 or null, got {above_flows}", field="batch_above_flows")
        if not 0 < fraction <= 1:
            raise InputError(f"must be in (0, 1], got {fraction}", field="batch_fraction")
        if frozen_above < 0:
            raise InputError(f"must be >= 0, got {frozen_above}", field="batch_frozen_above")
        if above_flows is None:
            return None
        return cls(int(above_flows), float(fraction), int(frozen_above))

    def due(self, comp: Component) -> bool:
        n = len(comp.flows)
        return comp.arrived or n <= self.above_flows or comp.left >= self.fraction * n

    def frozen(self, n_flows: int) -> bool:
        """Whether a component of ``n_flows`` flows has its fluid anchor frozen between
        updates."""
        return n_flows > self.above_flows and n_flows > self.frozen_above


class Components:
    """Components of the active flows over links ``0..n_links-1``."""

    def __init__(self, n_links: int, batching: Batching | None = None) -> None:
        self.batching = batching
        self.users = [0] * n_links  # active flows per link (plain lists: paths are short)
        self.owner = [-1] * n_links  # a busy link's component
        self.comps: dict[int, Component] = {}
        self.comp_of: dict[int, int] = {}  # active flow -> its component
        self.touched: set[int] = set()
        self._next = 0

    def join(self, flow: int, links: Iterable[int], t: float) -> int:
        """``flow`` arrives at ``t`` on ``links``; returns its component (touched)."""
        links = tuple(links)
        owner, comps = self.owner, self.comps
        owners = sorted({owner[link] for link in links} - {-1})
        if not owners:
            root, self._next = self._next, self._next + 1
            comps[root] = Component(t_last=t, t_fluid=t)
        else:
            root = max(owners, key=lambda c: (len(comps[c].flows), -c))
            keep = comps[root]
            for other in owners:
                if other == root:
                    continue
                gone = comps.pop(other)
                self.touched.discard(other)
                for g in gone.flows:
                    self.comp_of[g] = root
                keep.flows.update(gone.flows)
                for link in gone.links:
                    owner[link] = root
                keep.links |= gone.links
                keep.t_last = min(keep.t_last, gone.t_last)
                keep.t_fluid = min(keep.t_fluid, gone.t_fluid)
                keep.left += gone.left
        users = self.users
        for link in links:
            owner[link] = root
            users[link] += 1
        comp = comps[root]
        comp.links.update(links)
        comp.flows[flow] = None
        comp.arrived = True
        self.comp_of[flow] = root
        self.touched.add(root)
        return root

    def of(self, flow: int) -> Component:
        """Active ``flow``'s component."""
        return self.comps[self.comp_of[flow]]

    def leave(self, flow: int, links: Iterable[int]) -> list[int]:
        """``flow`` (on ``links``) leaves; returns the links it leaves idle, in path order."""
        c = self.comp_of.pop(flow)
        comp = self.comps[c]
        del comp.flows[flow]
        users, owner = self.users, self.owner
        idle = []
        for link in links:
            users[link] -= 1
            if not users[link]:
                owner[link] = -1
                idle.append(link)
        if idle:
            comp.links.difference_update(idle)
        if comp.flows:
            comp.left += 1
            self.touched.add(c)
        else:
            del self.comps[c]
            self.touched.discard(c)
        return idle

    def take_touched(self) -> list[int]:
        """The touched components in id order (an update's), cleared; with batching, those
        due (the others stay touched)."""
        touched = sorted(self.touched)
        if self.batching is not None:
            due = self.batching.due
            touched = [c for c in touched if due(self.comps[c])]
            self.touched.difference_update(touched)
        else:
            self.touched = set()
        for c in touched:
            comp = self.comps[c]
            comp.arrived, comp.left = False, 0
        return touched

    def __len__(self) -> int:
        return len(self.comps)


__all__ = ["Batching", "Component", "Components"]
