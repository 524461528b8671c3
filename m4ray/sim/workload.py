"""The workload DAG: compute, collective and point-to-point nodes with dependencies.

Nodes belong to one rank (host ``rank`` of the topology's host list). A collective is one node per
member rank; the k-th collective a rank issues on a group matches the k-th of every other member
(ASTRA-sim semantics). Sends and receives match FIFO by ``(src, dst, tag)``. Units: seconds, bytes.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field, replace
from enum import StrEnum

from m4ray.errors import InputError


class CollectiveKind(StrEnum):
    ALL_REDUCE = "all_reduce"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_GATHER = "all_gather"
    ALL_TO_ALL = "all_to_all"
    BROADCAST = "broadcast"  # from the group's first rank


@dataclass(kw_only=True, slots=True)
class Compute:
    """Busy the rank's GPU for ``duration_s`` seconds, or with ``cpu`` its CPU (a host-side delay
    such as a slow NIC doorbell: it does not block GPU work; Chakra's ``is_cpu_op``)."""

    id: int
    rank: int
    duration_s: float
    deps: tuple[int, ...] = ()
    name: str = ""
    cpu: bool = False
    num_ops: int = 0  # FLOPs when known (synthetic workloads, Chakra ``num_ops``)


@dataclass(kw_only=True, slots=True)
class Collective:
    """This rank's part of a collective over ``group`` (sorted ranks) on a buffer of ``size_bytes``.

    ``size_bytes`` follows NCCL: the full per-rank buffer (all-reduce input = output; reduce-scatter
    input; all-gather output; all-to-all send buffer).
    """

    id: int
    rank: int
    kind: CollectiveKind
    size_bytes: int
    group: tuple[int, ...]
    deps: tuple[int, ...] = ()
    name: str = ""


@dataclass(kw_only=True, slots=True)
class _PointToPoint:
    id: int
    rank: int
    peer: int
    size_bytes: int
    tag: int = 0
    deps: tuple[int, ...] = ()
    name: str = ""


@dataclass(kw_only=True, slots=True)
class Send(_PointToPoint):
    """Send ``size_bytes`` to ``peer``; completes when delivered (eager)."""


@dataclass(kw_only=True, slots=True)
class Recv(_PointToPoint):
    """Receive ``size_bytes`` from ``peer``; matches sends FIFO by ``(src, dst, tag)``."""


Node = Compute | Collective | Send | Recv


@dataclass(kw_only=True, slots=True)
class Workload:
    """A validated DAG over ``n_ranks`` ranks."""

    n_ranks: int
    nodes: list[Node] = field(default_factory=list)
    name: str = ""

    def __post_init__(self) -> None:
        validate(self)

    @property
    def by_id(self) -> dict[int, Node]:
        return {node.id: node for node in self.nodes}


def validate(workload: Workload) -> None:
    """Unique ids, known deps, ranks in range, sane sizes and groups, no cycles."""
    ids = set()
    for node in workload.nodes:
        where = f"node {node.id}"
        if node.id in ids:
            raise InputError(f"duplicate node id {node.id}", field="id")
        ids.add(node.id)
        if not 0 <= node.rank < workload.n_ranks:
            raise InputError(
                f"{where}: rank {node.rank} outside 0..{workload.n_ranks - 1}", field="rank"
            )
        if isinstance(node, Compute) and node.duration_s < 0:
            raise InputError(f"{where}: negative duration", field="duration_s")
        if isinstance(node, Collective | Send | Recv) and node.size_bytes <= 0:
            raise InputError(
                f"{where}: size must be > 0, got {node.size_bytes}", field="size_bytes"
            )
        if isinstance(node, Collective) and node.rank not in node.group:
            raise InputError(f"{where}: rank {node.rank} is not in its group", field="group")
        if isinstance(node, Send | Recv) and not 0 <= node.peer < workload.n_ranks:
            raise InputError(f"{where}: unknown peer {node.peer}", field="peer")
    for node in workload.nodes:
        for dep in node.deps:
            if dep not in ids:
                raise InputError(f"node {node.id} depends on unknown node {dep}", field="deps")
    _check_acyclic(workload)


def _check_acyclic(workload: Workload) -> None:
    indegree = {node.id: len(node.deps) for node in workload.nodes}
    children: dict[int, list[int]] = {node.id: [] for node in workload.nodes}
    for node in workload.nodes:
        for dep in node.deps:
            children[dep].append(node.id)
    ready = deque(i for i, d in indegree.items() if d == 0)
    seen = 0
    while ready:
        node = ready.popleft()
        seen += 1
        for child in children[node]:
            indegree[child] -= 1
            if indegree[child] == 0:
                ready.append(child)
    if seen != len(indegree):
        stuck = sorted(i for i, d in indegree.items() if d > 0)[:5]
        raise InputError(f"dependency cycle among nodes {stuck}", field="deps")


def scaled_bytes(size_bytes: float, factor: float) -> int:
    """The one rule of ``workload.scale`` for every workload reader (SimAI, Chakra, synthetic):
    a message of ``size_bytes`` becomes ``ceil(size_bytes × factor)`` bytes, at least 1 (never
    rounded below its scaled size, so a scaled job keeps every message it had)."""
    return max(1, math.ceil(size_bytes * factor))


def scale_messages(workload: Workload, factor: float) -> Workload:
    """A copy with every collective and point-to-point size scaled (:func:`scaled_bytes`);
    compute is unchanged (the ``scale`` knob of the gray-failure sweep)."""
    if factor == 1.0:
        return workload
    if factor <= 0:
        raise InputError(f"must be > 0, got {factor}", field="workload.scale")
    nodes = [
        replace(node, size_bytes=scaled_bytes(node.size_bytes, factor))
        if isinstance(node, Collective | Send | Recv)
        else node
        for node in workload.nodes
    ]
    return Workload(n_ranks=workload.n_ranks, nodes=nodes, name=workload.name)
