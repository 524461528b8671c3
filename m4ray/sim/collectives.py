"""Collective algorithms: how a collective over a group becomes point-to-point transfers.

An algorithm returns :class:`Transfer` records whose ``deps`` index earlier transfers of the same
collective; the replay engine injects a transfer once its deps are delivered. Ring phases follow
ASTRA-sim (``reference/workloads.md`` §3.5): every step each rank sends one message to the next
rank, and a rank's step-k send waits for the message it received at step k-1. Unlike ASTRA-sim it
also waits for its own step k-1 send to be delivered: one ring channel carries one step at a time
(NCCL), so a fast upstream rank cannot pile all its steps onto a degraded link at once, where
fair sharing would delay every one of them.

Messages (n ranks, buffer ``D`` bytes as defined on :class:`~m4ray.sim.workload.Collective`):

==============  ================  ==============
collective      ring steps        message bytes
==============  ================  ==============
all-reduce      2(n-1)            ceil(D/n)
reduce-scatter  n-1               ceil(D/n)
all-gather      n-1               ceil(D/n)
all-to-all      1 (direct)        ceil(D/n) to each peer
broadcast       2n-2 (pipeline)   ceil(D/n)
==============  ================  ==============

A broadcast pipelines ``n`` chunks down the chain of ranks from the group's first rank: chunk c
crosses hop h once it crossed hop h-1 and chunk c-1 left on hop h (NCCL's ring broadcast).

The hierarchical variant runs the intra-server part over the NVSwitch and the inter-server part
among GPUs with the same local index (one rail each): all-reduce = local reduce-scatter, then
all-reduce of ``D/m`` across servers, then local all-gather (m = GPUs of the group per server).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from m4ray.errors import InputError
from m4ray.sim.topology import Topology
from m4ray.sim.workload import CollectiveKind

Deps = dict[int, tuple[int, ...]]


@dataclass(frozen=True, slots=True)
class Transfer:
    """One message of a collective: ranks, bytes, indices of transfers it waits for (delivered),
    and ``after``: the index of a transfer that must have started before this one starts (a
    sender that issues a channel's sends in order, SimAI's NCCL model)."""

    src: int
    dst: int
    size_bytes: int
    deps: tuple[int, ...] = ()
    after: int | None = None


@dataclass(frozen=True, slots=True, eq=False)
class TransferTable:
    """A collective's transfers as columns (what the compiled replay takes: no object per
    transfer): ranks, bytes, ``after`` (-1: none) and the dependencies as CSR (transfer ``i``
    waits for ``deps[dep_off[i]:dep_off[i + 1]]``)."""

    src: np.ndarray
    dst: np.ndarray
    size: np.ndarray
    after: np.ndarray
    dep_off: np.ndarray
    deps: np.ndarray

    def __len__(self) -> int:
        return len(self.src)

    @classmethod
    def of(cls, transfers: Sequence[Transfer]) -> TransferTable:
        n = len(transfers)
        dep_off = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.fromiter((len(t.deps) for t in transfers), np.int64, n), out=dep_off[1:])
        return cls(
            src=np.fromiter((t.src for t in transfers), np.int64, n),
            dst=np.fromiter((t.dst for t in transfers), np.int64, n),
            size=np.fromiter((t.size_bytes for t in transfers), np.int64, n),
            after=np.fromiter((-1 if t.after is None else t.after for t in transfers), np.int64, n),
            dep_off=dep_off,
            deps=np.fromiter((d for t in transfers for d in t.deps), np.int64, int(dep_off[-1])),
        )


def decompose_table(
    algorithm: CollectiveAlgorithm, kind: CollectiveKind, group: Sequence[int], size: int
) -> TransferTable:
    """``algorithm``'s transfers as a table: its own ``decompose_table`` where it has one (no
    objects made), else its :meth:`~CollectiveAlgorithm.decompose` tabled."""
    own = getattr(algorithm, "decompose_table", None)
    if own is not None:
        return own(kind, group, size)
    return TransferTable.of(algorithm.decompose(kind, group, size))


class CollectiveAlgorithm(Protocol):
    def decompose(
        self, kind: CollectiveKind, group: Sequence[int], size_bytes: int
    ) -> list[Transfer]: ...


def ring_phase(
    order: Sequence[int], steps: int, msg: int, start: Deps, out: list[Transfer]
) -> Deps:
    """Append a ring phase to ``out``; return, per rank, the transfers that end its part (its last
    receive and its last send: the next phase reuses the same channel and buffers)."""
    n = len(order)
    if n < 2 or steps == 0:
        return dict(start)
    base = len(out)
    for step in range(steps):
        for pos, rank in enumerate(order):
            deps = start.get(rank, ())
            if step:  # the chunk received last step, and this rank's own previous send
                prev = base + (step - 1) * n
                deps = (*deps, prev + (pos - 1) % n, prev + pos)
            out.append(Transfer(rank, order[(pos + 1) % n], msg, deps))
    last = base + (steps - 1) * n  # a rank's part ends with its last receive and its last send
    return {order[(pos + 1) % n]: (last + pos, last + (pos + 1) % n) for pos in range(n)}


def direct_all_to_all(order: Sequence[int], msg: int, start: Deps, out: list[Transfer]) -> Deps:
    base = len(out)
    for src in order:
        out += [Transfer(src, dst, msg, start.get(src, ())) for dst in order if dst != src]
    ends: dict[int, list[int]] = {rank: [] for rank in order}
    for index in range(base, len(out)):
        ends[out[index].dst].append(index)
        ends[out[index].src].append(index)
    return {rank: tuple(v) for rank, v in ends.items()}


def pipeline_broadcast(order: Sequence[int], size: int, start: Deps, out: list[Transfer]) -> Deps:
    n = len(order)
    if n < 2:
        return dict(start)
    chunks, hops, base = n, n - 1, len(out)
    msg = max(1, math.ceil(size / chunks))
    for c in range(chunks):
        for h in range(hops):
            deps = start.get(order[h], ()) if c == 0 else ()
            if h:
                deps = (*deps, base + c * hops + h - 1)  # the chunk arrived at this rank
            if c:
                deps = (*deps, base + (c - 1) * hops + h)  # the previous chunk left on this hop
            out.append(Transfer(order[h], order[h + 1], msg, deps))
    last = base + (chunks - 1) * hops
    ends: Deps = {order[0]: (last,)}
    for h in range(1, n):
        ends[order[h]] = (last + h - 1,) + ((last + h,) if h < hops else ())
    return ends


def _ring_collective(
    kind: CollectiveKind, order: Sequence[int], size: int, start: Deps, out: list[Transfer]
) -> Deps:
    n = len(order)
    msg = max(1, math.ceil(size / n))
    if kind is CollectiveKind.ALL_TO_ALL:
        return direct_all_to_all(order, msg, start, out)
    if kind is CollectiveKind.BROADCAST:
        return pipeline_broadcast(order, size, start, out)
    steps = 2 * (n - 1) if kind is CollectiveKind.ALL_REDUCE else n - 1
    return ring_phase(order, steps, msg, start, out)


@dataclass(kw_only=True, slots=True)
class Ring:
    """Flat ring over the group in rank order (direct all-to-all)."""

    def decompose(
        self, kind: CollectiveKind, group: Sequence[int], size_bytes: int
    ) -> list[Transfer]:
        out: list[Transfer] = []
        _ring_collective(CollectiveKind(kind), list(group), size_bytes, {}, out)
        return out


@dataclass(kw_only=True, slots=True)
class Hierarchical:
    """Intra-server ring, inter-server ring on the per-server shard, intra-server ring again."""

    server_of: Callable[[int], int]

    def decompose(
        self, kind: CollectiveKind, group: Sequence[int], size_bytes: int
    ) -> list[Transfer]:
        kind = CollectiveKind(kind)
        local, cross = self._split(group)
        out: list[Transfer] = []
        flat = (CollectiveKind.ALL_TO_ALL, CollectiveKind.BROADCAST)
        if kind in flat or len(local) == 1 or len(cross) == 1:
            _ring_collective(kind, list(group), size_bytes, {}, out)
            return out
        m = len(cross)
        shard = max(1, math.ceil(size_bytes / m))
        done: Deps = {}
        if kind in (CollectiveKind.ALL_REDUCE, CollectiveKind.REDUCE_SCATTER):
            done = self._phase(local, CollectiveKind.REDUCE_SCATTER, size_bytes, done, out)
            done = self._phase(cross, kind, shard, done, out)
            if kind is CollectiveKind.ALL_REDUCE:
                self._phase(local, CollectiveKind.ALL_GATHER, size_bytes, done, out)
        else:  # all-gather: across servers on the shard, then within servers
            done = self._phase(cross, kind, shard, done, out)
            self._phase(local, kind, size_bytes, done, out)
        return out

    @staticmethod
    def _phase(groups, kind, size, start: Deps, out: list[Transfer]) -> Deps:
        done: Deps = {}
        for order in groups:
            done.update(_ring_collective(kind, order, size, start, out))
        return done

    def _split(self, group: Sequence[int]) -> tuple[list[list[int]], list[list[int]]]:
        by_server: dict[int, list[int]] = {}
        for rank in group:
            by_server.setdefault(self.server_of(rank), []).append(rank)
        local = list(by_server.values())
        if len({len(members) for members in local}) != 1:
            raise InputError(
                f"hierarchical collectives need the same number of group members on every server, "
                f"got {[len(v) for v in local]}",
                field="collective",
            )
        cross = [list(members) for members in zip(*local, strict=True)]
        return local, cross


@dataclass(kw_only=True, slots=True)
class RingSpec:
    """Config form of :class:`Ring`."""

    def build(self, topology: Topology) -> Ring:
        return Ring()


@dataclass(kw_only=True, slots=True)
class HierarchicalSpec:
    """Config form of :class:`Hierarchical`; servers come from the topology."""

    def build(self, topology: Topology) -> Hierarchical:
        hosts = topology.hosts
        return Hierarchical(server_of=lambda rank: topology.server_of(hosts[rank]))
