"""SimAI's NCCL-style collectives: the flows SimAI's ns-3 mode sends (``reference/simai_nccl.md``).

The field's published gray-failure study runs its collectives through SimAI's NCCL flow model,
and this layer reproduces those flows, one for one, from the behaviour described there (no code
is copied):

* **Channels** = the group's members per server (8 for a group of whole 8-GPU servers, 1 for a
  group of one GPU per server, ``n`` for a group inside one server). Channel ``c`` visits each
  server's members in their local order rotated by ``c``, servers in the group's order, then back
  to the start. With whole servers every inter-server hop is therefore *cross-rail*: local GPU
  ``c - 1`` of one server sends to local GPU ``c`` of the next.
* **Chunks**: a collective of ``S`` bytes on ``n`` ranks and ``C`` channels sends
  ``floor(floor(S / n) / C)`` bytes per flow (16 MiB on 16 ranks and 8 channels: 131,072 B), at
  least 1 (SimAI would send nothing for a smaller collective).
* **Steps**: all-reduce ``2(n - 1)``, reduce-scatter and all-gather ``n - 1``; in each step every
  rank of every channel sends one chunk to its ring successor.
* **No barrier**: a flow's one *parent* is the previous-step flow its sender received in that
  channel; it leaves ``send_latency_s`` after its parent completes, but never before its sender
  started its own previous-step flow of that channel (SimAI's per-flow logs show it: 94 of the
  shared run's 14,848 child flows start then). Every flow is its own queue pair, so consecutive
  chunks to one peer may overlap.
* **Completion at the last ACK**: a flow counts as done when its sender holds the ACK of its last
  byte, one ACK's trip after delivery (``ack_bytes`` on the wire over the reverse path).
* **All-to-all** is direct: one flow of ``floor(S / n)`` per ordered pair, all at once, no
  channels. **Broadcast** has no flows in SimAI's NCCL model; m4ray sends it as a chain from the
  group's first rank, pipelined in ``n`` chunks per channel (its own choice, said here).

GPU types: SimAI rings every collective on A100/A800 (and on a type it does not know). On
H100/H800 it would run a TP all-reduce inside one server over NVLS (the NVSwitch's in-network
reduction, with ``AS_NVLS_ENABLE``); m4ray does not model NVLS and rings those too, which is what
SimAI does with NVLS off (its default). PXN (``pxn=True``, SimAI's ``AS_PXN_ENABLE``) applies to
all-reduce and reduce-scatter over several servers: an inter-server hop first goes over NVLink to
the sender's server peer on the receiver's rail, which then sends it rail-aligned.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from m4ray.errors import InputError
from m4ray.sim.collectives import Transfer, TransferTable
from m4ray.sim.topology import GPU_TYPES, Topology
from m4ray.sim.workload import CollectiveKind

RING_GPUS = ("A100", "A800", "H100", "H800", "NONE")  # NONE: plain hosts, one per server
PXN_KINDS = (CollectiveKind.ALL_REDUCE, CollectiveKind.REDUCE_SCATTER)


@dataclass(kw_only=True, slots=True)
class SimAICollective:
    """SimAI's NCCL flow model over ranks ``0..`` laid out as ``server_of`` / ``local_of`` say."""

    server_of: Sequence[int]  # per rank
    local_of: Sequence[int]  # per rank: index within its server
    channels: int | None = None  # None: the group's members per server (SimAI)
    pxn: bool = False
    ack_bytes: int | None = 64  # completion at the ACK of the last byte (None: at delivery)
    barrier_free: ClassVar[bool] = True  # no step barrier: lockstep refuses it
    _by_place: dict[tuple[int, int], int] = field(default_factory=dict, init=False, repr=False)

    def decompose(
        self, kind: CollectiveKind, group: Sequence[int], size_bytes: int
    ) -> list[Transfer]:
        kind = CollectiveKind(kind)
        group = list(group)
        n = len(group)
        if n < 2:
            return []
        if kind is CollectiveKind.ALL_TO_ALL:  # no rings: any group layout goes
            share = max(1, size_bytes // n)
            return [Transfer(a, b, share) for a in group for b in group if a != b]
        per_server = self._check_servers(group)
        channels = self.channels or per_server
        rings = [self._ring(group, c) for c in range(channels)]
        chunk = max(1, size_bytes // n // channels)
        out: list[Transfer] = []
        if kind is CollectiveKind.BROADCAST:
            for ring in rings:
                root = ring.index(group[0])
                _chain(ring[root:] + ring[:root], chunk, out)
            return out
        steps = 2 * (n - 1) if kind is CollectiveKind.ALL_REDUCE else n - 1
        for ring in rings:
            _ring_steps(ring, steps, chunk, out)
        crosses = len(group) > per_server and channels > 1
        return self._via_pxn(out) if self.pxn and crosses and kind in PXN_KINDS else out

    def decompose_table(
        self, kind: CollectiveKind, group: Sequence[int], size_bytes: int
    ) -> TransferTable:
        """:meth:`decompose` as columns, rings built in numpy (no object per flow: the compiled
        replay's way in); PXN, broadcast and all-to-all through :meth:`decompose`. Equal to
        ``TransferTable.of(decompose(...))`` (``tests/sim/test_nccl.py``)."""
        kind = CollectiveKind(kind)
        group = list(group)
        n = len(group)
        if n < 2 or kind in (CollectiveKind.ALL_TO_ALL, CollectiveKind.BROADCAST):
            return TransferTable.of(self.decompose(kind, group, size_bytes))
        per_server = self._check_servers(group)
        channels = self.channels or per_server
        crosses = len(group) > per_server and channels > 1
        if self.pxn and crosses and kind in PXN_KINDS:
            return TransferTable.of(self.decompose(kind, group, size_bytes))
        chunk = max(1, size_bytes // n // channels)
        steps = 2 * (n - 1) if kind is CollectiveKind.ALL_REDUCE else n - 1
        rings = np.array([self._ring(group, c) for c in range(channels)], dtype=np.int64)
        # transfer (channel c, step k, position p) is number (c * steps + k) * n + p
        pos = np.arange(n)
        src = np.broadcast_to(rings[:, None, :], (channels, steps, n))
        dst = np.broadcast_to(np.roll(rings, -1, axis=1)[:, None, :], (channels, steps, n))
        prev = ((np.arange(channels)[:, None] * steps + np.arange(steps)[None, :] - 1) * n)[
            :, :, None
        ]
        later = np.broadcast_to(np.arange(steps)[None, :, None] > 0, (channels, steps, n))
        dep = (prev + (pos - 1) % n)[later]
        after = np.where(later, prev + pos, -1)
        dep_off = np.zeros(channels * steps * n + 1, dtype=np.int64)
        np.cumsum(later.ravel(), out=dep_off[1:])
        return TransferTable(
            src=src.ravel().copy(),
            dst=dst.ravel().copy(),
            size=np.full(channels * steps * n, chunk, dtype=np.int64),
            after=after.ravel().astype(np.int64),
            dep_off=dep_off,
            deps=dep.astype(np.int64),
        )

    def _check_servers(self, group: list[int]) -> int:
        """The group's members per server; the same on every server it spans, or an error."""
        counts: dict[int, int] = {}
        for rank in group:
            counts[self.server_of[rank]] = counts.get(self.server_of[rank], 0) + 1
        if len(set(counts.values())) != 1:
            raise InputError(
                f"group {group[:8]}{'...' if len(group) > 8 else ''} does not divide into servers: "
                f"members per server {sorted(counts.items())} (SimAI's rings need the same number "
                "on every server the group spans)",
                field="group",
            )
        return next(iter(counts.values()))

    def _ring(self, group: list[int], channel: int) -> list[int]:
        """Channel ``channel``'s ring: each server's members rotated by the channel index."""
        by_server: dict[int, list[int]] = {}
        for rank in group:
            by_server.setdefault(self.server_of[rank], []).append(rank)
        ring = []
        for members in by_server.values():
            members.sort(key=lambda r: self.local_of[r])
            shift = channel % len(members)
            ring += members[shift:] + members[:shift]
        return ring

    def _via_pxn(self, transfers: list[Transfer]) -> list[Transfer]:
        """Inter-server transfers off the receiver's rail go over NVLink to the sender's server
        peer on that rail first (a forwarding flow the real send waits for)."""
        out: list[Transfer] = []
        moved: dict[int, int] = {}  # old index -> new index of its last transfer
        for index, t in enumerate(transfers):
            deps = tuple(moved[d] for d in t.deps)
            after = None if t.after is None else moved[t.after]
            src = t.src
            if self.server_of[t.src] != self.server_of[t.dst]:
                proxy = self._peer(t.src, self.local_of[t.dst])
                if proxy is not None and proxy != t.src:
                    out.append(Transfer(t.src, proxy, t.size_bytes, deps, after))
                    deps, after, src = (len(out) - 1,), None, proxy
            out.append(Transfer(src, t.dst, t.size_bytes, deps, after))
            moved[index] = len(out) - 1
        return out

    def _peer(self, rank: int, local: int) -> int | None:
        """The rank on ``rank``'s server with local index ``local`` (None: the server has none)."""
        if not self._by_place:
            places = zip(self.server_of, self.local_of, strict=True)
            self._by_place.update((place, r) for r, place in enumerate(places))
        return self._by_place.get((self.server_of[rank], local))


def _ring_steps(ring: list[int], steps: int, chunk: int, out: list[Transfer]) -> None:
    """``steps`` ring steps of one channel; step k of position p waits for step k-1 of p-1."""
    n, base = len(ring), len(out)
    for step in range(steps):
        for pos, rank in enumerate(ring):
            if step:
                prev = base + (step - 1) * n
                out.append(
                    Transfer(
                        rank, ring[(pos + 1) % n], chunk, (prev + (pos - 1) % n,), after=prev + pos
                    )
                )
            else:
                out.append(Transfer(rank, ring[(pos + 1) % n], chunk))


def _chain(order: list[int], chunk: int, out: list[Transfer]) -> None:
    """A pipelined chain: ``len(order)`` chunks, chunk c crosses hop h after hop h-1."""
    n, base = len(order), len(out)
    hops = n - 1
    for c in range(n):
        for h in range(hops):
            deps = (base + c * hops + h - 1,) if h else ()
            after = base + (c - 1) * hops + h if c else None
            out.append(Transfer(order[h], order[h + 1], chunk, deps, after))


@dataclass(kw_only=True, slots=True)
class SimAISpec:
    """Config form of :class:`SimAICollective`. ``channels=None``: the group's members per
    server (SimAI); ``gpu_type=None``: the topology's; ``ack_bytes=None`` ends a flow at delivery
    instead of at its last ACK."""

    channels: int | None = None
    gpu_type: str | None = None
    pxn: bool = False
    ack_bytes: int | None = 64

    def build(self, topology: Topology) -> SimAICollective:
        gpu = self.gpu_type or topology.gpu_type
        if gpu not in RING_GPUS:
            raise InputError(
                f"unknown GPU type '{gpu}'; SimAI's collectives know {', '.join(GPU_TYPES)}",
                field="collective.gpu_type",
            )
        if self.channels is not None and self.channels < 1:
            raise InputError(
                f"must be >= 1 or null, got {self.channels}", field="collective.channels"
            )
        if self.ack_bytes is not None and self.ack_bytes <= 0:
            raise InputError(
                f"must be > 0 or null, got {self.ack_bytes}", field="collective.ack_bytes"
            )
        per = topology.gpus_per_server
        ranks = range(len(topology.hosts))
        return SimAICollective(
            server_of=[i // per for i in ranks],
            local_of=[i % per for i in ranks],
            channels=self.channels,
            pxn=self.pxn,
            ack_bytes=self.ack_bytes,
        )
