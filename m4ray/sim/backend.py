"""The NetworkBackend protocol the replay engine drives, and a shared event queue.

Modelled on ASTRA-sim's network API: ``send`` injects a flow now and calls ``on_done(flow_id, t)``
when it is delivered; ``schedule`` runs a callback after a delay on the backend's own clock;
``run`` advances until no events remain (or ``until``). Backends are built from small config
dataclasses (``FlowSimConfig`` …) with ``build(topology, routing)``; callers never branch on the
backend's name.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import ClassVar, Protocol, runtime_checkable

from m4ray.errors import SimulationError
from m4ray.sim.flows import Flow
from m4ray.sim.routing import Routing
from m4ray.sim.topology import Topology

DoneCallback = Callable[[int, float], None]


@runtime_checkable
class NetworkBackend(Protocol):
    """What the replay engine and the trace mode need from a network model (times in seconds).
    A backend may also say ``done_at_ack = True``: it calls ``on_done`` when the sender has the
    flow's last ACK (ns-3 RDMA with ``done_at_ack``), so a replay whose collective counts flows
    done at their last ACK adds no ACK trip of its own."""

    def now(self) -> float: ...

    def schedule(self, delay_s: float, fn: Callable[[], None]) -> None: ...

    def send(self, flow: Flow, on_done: DoneCallback) -> None: ...

    def run(self, until: float | None = None) -> None: ...


class BackendConfig(Protocol):
    """A backend's settings; ``build`` makes one backend instance for one simulation.
    ``replay`` names the replay it runs under (:mod:`m4ray.sim.replays`): ``dag``, or
    ``emulation`` for a backend that runs whole workloads itself."""

    replay: ClassVar[str]

    def build(self, topology: Topology, routing: Routing) -> NetworkBackend: ...


class EventQueue:
    """Time-ordered callbacks; ties run in insertion order (FIFO)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = 0

    def push(self, t: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self._heap, (t, self._seq, fn))
        self._seq += 1

    def reserve(self, n: int) -> int:
        """The first of ``n`` insertion ranks set aside now, for :meth:`push_ranked` later: an
        event pushed with one of them sorts as if it had been pushed now."""
        first = self._seq
        self._seq += n
        return first

    def push_ranked(self, t: float, rank: int, fn: Callable[[], None]) -> None:
        heapq.heappush(self._heap, (t, rank, fn))

    def peek_time(self) -> float:
        return self._heap[0][0] if self._heap else float("inf")

    def pop(self) -> tuple[float, Callable[[], None]]:
        t, _, fn = heapq.heappop(self._heap)
        return t, fn

    def drain(self) -> list[tuple[float, Callable[[], None]]]:
        """Every queued callback with its time, in the order they would run; the queue is left
        empty (to move them into another queue: M4Backend.dag_loop)."""
        out = [(t, fn) for t, _, fn in sorted(self._heap, key=lambda e: e[:2])]
        self._heap.clear()
        return out

    def __len__(self) -> int:
        return len(self._heap)


class QueueClock:
    """``now``/``schedule`` of the protocol for backends that keep their own :class:`EventQueue`
    in ``self.events`` and their time in ``self._now`` (flowSim, m4)."""

    events: EventQueue
    _now: float

    def now(self) -> float:
        return self._now

    def schedule(self, delay_s: float, fn: Callable[[], None]) -> None:
        if delay_s < 0:
            raise SimulationError(f"cannot schedule {delay_s} s in the past")
        self.events.push(self._now + delay_s, fn)
