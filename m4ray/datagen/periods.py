"""Busy periods: connected components in time of flows that share directed links while active.

As m4's post-processing does (``reference/m4.md`` §6.1): sweep arrivals and completions in
simulated order; an arriving flow merges every component owning one of its links; a completing
flow releases its links; a component whose last active flow completes is emitted as a period.
Components merge only on arrival and never split. Every flow belongs to exactly one period.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from m4ray.errors import SimulationError


@dataclass(frozen=True, slots=True)
class Periods:
    """``period_of_flow[i]`` for flow index ``i``; per period (numbered by first arrival):
    number of flows, most flows active at once, first and last event index."""

    period_of_flow: np.ndarray
    n_flows: np.ndarray
    max_active: np.ndarray
    first_event: np.ndarray
    last_event: np.ndarray


class _Components:
    """Union-find over components of active flows, keyed by the links they occupy."""

    def __init__(self) -> None:
        self.parent: list[int] = []
        self.members: list[list[int]] = []
        self.active: list[int] = []
        self.peak: list[int] = []
        self.first: list[int] = []
        self.owner: dict[int, int] = {}  # active link -> a component that holds it
        self.users: dict[int, int] = {}  # active link -> active flows on it

    def find(self, c: int) -> int:
        parent = self.parent
        while parent[c] != c:
            parent[c] = parent[parent[c]]
            c = parent[c]
        return c

    def arrive(self, flow: int, links: tuple[int, ...], event: int) -> int:
        roots = {self.find(self.owner[link]) for link in links if link in self.owner}
        if roots:
            root = min(roots, key=lambda c: self.first[c])
            for other in roots - {root}:
                self.parent[other] = root
                self.members[root] += self.members[other]
                self.active[root] += self.active[other]
                self.peak[root] = max(self.peak[root], self.peak[other])
                self.first[root] = min(self.first[root], self.first[other])
        else:
            root = len(self.parent)
            self.parent.append(root)
            self.members.append([])
            self.active.append(0)
            self.peak.append(0)
            self.first.append(event)
        self.members[root].append(flow)
        self.active[root] += 1
        self.peak[root] = max(self.peak[root], self.active[root])
        for link in links:
            self.owner[link] = root
            self.users[link] = self.users.get(link, 0) + 1
        return root

    def complete(self, component: int, links: tuple[int, ...]) -> int | None:
        """Release the flow's links; the component's root if it has no active flow left."""
        root = self.find(component)
        for link in links:
            self.users[link] -= 1
            if self.users[link] == 0:
                del self.users[link], self.owner[link]
        self.active[root] -= 1
        return root if self.active[root] == 0 else None


def ack_coupled(flow_links: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """Each flow's links and their reverses (:func:`~m4ray.models.fairshare.reverse_links`: where
    its per-packet ACKs travel), as :func:`busy_periods`' keys: a period then also joins flows
    whose data share a cable with another's ACKs."""
    return [(*links, *(link ^ 1 for link in links)) for links in flow_links]


def busy_periods(
    event_flow: np.ndarray, event_kind: np.ndarray, flow_links: list[tuple[int, ...]]
) -> Periods:
    """Periods of flows ``0..len(flow_links)-1`` from their events (kind 0 arrival, 1 completion),
    given in time order; ``flow_links[i]`` are flow ``i``'s directed links."""
    n = len(flow_links)
    comps = _Components()
    comp_of = np.full(n, -1, dtype=np.int64)
    done: list[tuple[int, list[int], int, int]] = []  # (first event, flows, peak, last event)
    for event, (flow, kind) in enumerate(
        zip(event_flow.tolist(), event_kind.tolist(), strict=True)
    ):
        if kind == 0:
            comp_of[flow] = comps.arrive(flow, flow_links[flow], event)
            continue
        if comp_of[flow] < 0:
            raise SimulationError(f"flow {flow} completes before it arrives")
        root = comps.complete(int(comp_of[flow]), flow_links[flow])
        if root is not None:
            done.append((comps.first[root], comps.members[root], comps.peak[root], event))
    if sum(len(d[1]) for d in done) != n:
        raise SimulationError("some flows never completed; busy periods are incomplete")
    done.sort(key=lambda d: d[0])
    period_of_flow = np.empty(n, dtype=np.int64)
    for period, (_, flows, _, _) in enumerate(done):
        period_of_flow[flows] = period
    return Periods(
        period_of_flow=period_of_flow,
        n_flows=np.array([len(d[1]) for d in done], dtype=np.int64),
        max_active=np.array([d[2] for d in done], dtype=np.int64),
        first_event=np.array([d[0] for d in done], dtype=np.int64),
        last_event=np.array([d[3] for d in done], dtype=np.int64),
    )


__all__ = ["Periods", "ack_coupled", "busy_periods"]
