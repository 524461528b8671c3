"""The m4 engine's component bookkeeping, once: which active flows share links: they step together.

* an arriving flow joins the component owning any of its links; several owners merge into the
  one with the most flows (ties: the lowest id), which keeps the oldest last-update times; no
  owner opens a new component;
* a leaving flow releases its links; a link with no flow left goes idle (no owner) and leaves its
  component; a component with no flow left ends. Components merge and never split;
* every component an event changed is *touched*; an update takes the touched set in id order.

The online engine (:class:`~m4ray.sim.m4.engine.M4Engine`) and training's replay of it
(:func:`~m4ray.train.periods.engine_schedule`) both keep their components here, so the model
learns the updates it gets online. ``_core.c`` is its compiled twin (the native engine), held to
the same updates flow for flow by ``tests/sim/test_m4_native.py``. Times are the caller's unit.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(slots=True)
class Component:
    flows: dict[int, None] = field(default_factory=dict)  # ordered set of flow ids
    links: set[int] = field(default_factory=set)
    t_last: float = 0.0  # its oldest last model update
    t_fluid: float = 0.0  # its fluid rows' oldest last update (the anchor's catch-up)


class Components:
    """Components of the active flows over links ``0..n_links-1``."""

    def __init__(self, n_links: int) -> None:
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
        users = self.users
        for link in links:
            owner[link] = root
            users[link] += 1
        comp = comps[root]
        comp.links.update(links)
        comp.flows[flow] = None
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
            self.touched.add(c)
        else:
            del self.comps[c]
            self.touched.discard(c)
        return idle

    def take_touched(self) -> list[int]:
        """The touched components in id order (an update's), cleared."""
        touched, self.touched = sorted(self.touched), set()
        return touched

    def __len__(self) -> int:
        return len(self.comps)


__all__ = ["Component", "Components"]
