"""Chakra execution traces (ET) in and out, through the ``mlc-chakra`` package.

Layout (``reference/workloads.md`` §1): one file per rank, ``<prefix>.<rank>.et``, each a
``GlobalMetadata`` (version ``0.0.4``) then length-delimited ``Node`` messages, plus
``<prefix>.comm_groups.json`` mapping numeric process-group ids (from 1, as ASTRA-sim wants) to
rank lists. What we write, per node of our DAG:

==============  ==========================================================================
ours            Chakra
==============  ==========================================================================
Compute (GPU)   ``COMP_NODE``: ``num_ops`` (the node's FLOPs, else duration × the given
                rate), ``tensor_size`` 1
                (compute-bound under ASTRA-sim's roofline), ``duration_micros`` (≥ 1),
                ``duration_ns`` (exact; our extension, ignored by ASTRA-sim), ``is_cpu_op``
Compute (CPU)   ``COMP_NODE`` with ``is_cpu_op`` true (replayed by duration)
Collective      ``COMM_COLL_NODE``: ``comm_type``, ``comm_size``, ``pg_name`` = group id
Send / Recv     ``COMM_SEND_NODE`` / ``COMM_RECV_NODE``: ``comm_src``, ``comm_dst``,
                ``comm_tag``, ``comm_size``
deps            ``data_deps`` (same rank only; ASTRA-sim treats data and ctrl deps alike)
==============  ==========================================================================

Reading accepts our files and other producers' (e.g. ``chakra_generator``): attributes are read
by name, both dependency lists count, a compute node's time is ``duration_ns`` if present, else
``num_ops`` over the given GPU rate (roofline, compute-bound), else ``duration_micros``;
metadata and memory nodes become zero-time CPU nodes; ``pg_name`` empty or ``"0"`` means every
rank. Anything that cannot be replayed raises an :class:`InputError` naming the file, the node
and the attribute.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from m4ray.errors import InputError
from m4ray.sim.lockstep import SymmetricProgram
from m4ray.sim.workload import (
    Collective,
    CollectiveKind,
    Compute,
    Node,
    Recv,
    Send,
    Workload,
    scale_messages,
)

VERSION = "0.0.4"
_KINDS = {
    CollectiveKind.ALL_REDUCE: "ALL_REDUCE",
    CollectiveKind.ALL_GATHER: "ALL_GATHER",
    CollectiveKind.REDUCE_SCATTER: "REDUCE_SCATTER",
    CollectiveKind.ALL_TO_ALL: "ALL_TO_ALL",
    CollectiveKind.BROADCAST: "BROADCAST",
}


def _pb():
    try:
        from chakra.schema.protobuf import et_def_pb2
        from chakra.src.third_party.utils import protolib
    except ImportError as err:  # pragma: no cover - the package is part of the install
        raise InputError(
            "the mlc-chakra package is missing: pip install --no-deps mlc-chakra==1.0.0 "
            "(make setup does this)"
        ) from err
    return et_def_pb2, protolib


def rank_file(prefix: str | Path, rank: int) -> Path:
    return Path(f"{prefix}.{rank}.et")


def groups_file(prefix: str | Path) -> Path:
    return Path(f"{prefix}.comm_groups.json")


def write(workload: Workload, prefix: str | Path, flops_per_s: float | None = None) -> list[Path]:
    """Write ``workload`` as Chakra files; returns the rank files (and the groups file exists).

    GPU compute nodes carry their own ``num_ops``; for nodes without, ``flops_per_s`` derives it
    from the duration (without either, consumers use the durations).
    """
    pb, protolib = _pb()
    prefix = Path(prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    groups: dict[tuple[int, ...], int] = {}
    for node in workload.nodes:
        if isinstance(node, Collective):
            groups.setdefault(node.group, len(groups) + 1)
    rank_of = {node.id: node.rank for node in workload.nodes}
    per_rank: list[list[Node]] = [[] for _ in range(workload.n_ranks)]
    for node in workload.nodes:
        for dep in node.deps:
            if rank_of[dep] != node.rank:
                raise InputError(
                    f"node {node.id} on rank {node.rank} depends on node {dep} of rank "
                    f"{rank_of[dep]}; Chakra dependencies stay within one rank",
                    field="deps",
                )
        per_rank[node.rank].append(node)
    attr = pb.AttributeProto
    paths = []
    for rank, nodes in enumerate(per_rank):
        path = rank_file(prefix, rank)
        with open(path, "wb") as f:
            protolib.encodeMessage(f, pb.GlobalMetadata(version=VERSION))
            for node in nodes:
                out = pb.Node(id=node.id, name=node.name or f"node{node.id}")
                out.data_deps.extend(node.deps)
                if isinstance(node, Compute):
                    out.type = pb.COMP_NODE
                    ns = round(node.duration_s * 1e9)
                    out.duration_micros = max(1, round(ns / 1000))
                    out.attr.append(attr(name="is_cpu_op", bool_val=node.cpu))
                    out.attr.append(attr(name="duration_ns", uint64_val=ns))
                    ops = node.num_ops or (
                        round(node.duration_s * flops_per_s) if flops_per_s else 0
                    )
                    if ops and not node.cpu:
                        out.attr.append(attr(name="num_ops", int64_val=ops))
                        out.attr.append(attr(name="tensor_size", uint64_val=1))
                elif isinstance(node, Collective):
                    out.type = pb.COMM_COLL_NODE
                    out.attr.append(attr(name="is_cpu_op", bool_val=False))
                    kind = pb.CollectiveCommType.Value(_KINDS[node.kind])
                    out.attr.append(attr(name="comm_type", int64_val=kind))
                    out.attr.append(attr(name="comm_size", int64_val=node.size_bytes))
                    out.attr.append(attr(name="pg_name", string_val=str(groups[node.group])))
                else:
                    send = isinstance(node, Send)
                    out.type = pb.COMM_SEND_NODE if send else pb.COMM_RECV_NODE
                    src, dst = (node.rank, node.peer) if send else (node.peer, node.rank)
                    out.attr.append(attr(name="is_cpu_op", bool_val=False))
                    out.attr.append(attr(name="comm_src", int32_val=src))
                    out.attr.append(attr(name="comm_dst", int32_val=dst))
                    out.attr.append(attr(name="comm_tag", int32_val=node.tag))
                    out.attr.append(attr(name="comm_size", int64_val=node.size_bytes))
                protolib.encodeMessage(f, out)
        paths.append(path)
    table = {str(i): list(g) for g, i in sorted(groups.items(), key=lambda kv: kv[1])}
    groups_file(prefix).write_text(json.dumps(table, indent=1) + "\n")
    return paths


def rank_files(prefix: str | Path) -> list[Path]:
    """``<prefix>.<rank>.et`` files, ranks 0..n−1 without gaps."""
    prefix = Path(prefix)
    pattern = re.compile(re.escape(prefix.name) + r"\.(\d+)\.et(\.gz)?$")
    found = {}
    for path in prefix.parent.glob(f"{prefix.name}.*"):
        hit = pattern.match(path.name)
        if hit:
            found[int(hit.group(1))] = path
    if not found:
        raise InputError(f"no Chakra files {prefix.name}.<rank>.et", file=prefix.parent)
    missing = sorted(set(range(max(found) + 1)) - set(found))
    if missing:
        raise InputError(f"rank files missing for ranks {missing[:10]}", file=prefix)
    return [found[r] for r in range(len(found))]


def _attrs(node) -> dict:
    return {a.name: getattr(a, a.WhichOneof("value")) for a in node.attr if a.WhichOneof("value")}


def _decode(path: Path) -> list:
    pb, protolib = _pb()
    handle = protolib.openFileRd(str(path))
    try:
        meta = pb.GlobalMetadata()
        if not protolib.decodeMessage(handle, meta):
            raise InputError("empty or unreadable Chakra file (no GlobalMetadata)", file=path)
        nodes = []
        while True:
            node = pb.Node()
            if not protolib.decodeMessage(handle, node):
                break
            nodes.append(node)
    except InputError:
        raise
    except Exception as err:  # protobuf DecodeError and truncated streams
        raise InputError(f"not a Chakra execution trace: {err}", file=path) from err
    finally:
        handle.close()
    return nodes


@dataclass(slots=True)
class _Reader:
    """Converts one rank file's nodes; every error names the file, the node and the field."""

    path: Path
    rank: int
    n_ranks: int
    groups: dict[str, tuple[int, ...]]
    flops_per_s: float | None
    gid: Callable[[int], int]
    where: tuple = field(default=(0, None))  # (index, node) being converted

    def node(self, index: int, n) -> Node:
        pb, _ = _pb()
        self.where = (index, n)
        attrs = _attrs(n)
        deps = list(dict.fromkeys([*n.data_deps, *n.ctrl_deps]))
        common = {
            "id": self.gid(n.id),
            "rank": self.rank,
            "deps": tuple(self.gid(d) for d in deps),
            "name": n.name,
        }
        kind = pb.NodeType.Name(n.type)
        if kind == "COMP_NODE":
            if "duration_ns" in attrs:
                seconds = attrs["duration_ns"] / 1e9
            elif self.flops_per_s and attrs.get("num_ops"):
                seconds = attrs["num_ops"] / self.flops_per_s
            else:
                seconds = n.duration_micros * 1e-6
            cpu = bool(attrs.get("is_cpu_op"))
            ops = int(attrs.get("num_ops", 0)) if not cpu else 0
            return Compute(duration_s=seconds, cpu=cpu, num_ops=ops, **common)
        if kind in ("METADATA_NODE", "MEM_LOAD_NODE", "MEM_STORE_NODE"):
            return Compute(duration_s=0.0, cpu=True, **common)
        if kind == "COMM_COLL_NODE":
            return self._collective(attrs, common)
        if kind in ("COMM_SEND_NODE", "COMM_RECV_NODE"):
            return self._p2p(kind == "COMM_SEND_NODE", attrs, common)
        raise self.bad(f"node type {kind} cannot be replayed", "type")

    def bad(self, message: str, field: str) -> InputError:
        index, n = self.where
        return InputError(
            f"node #{index} (id {n.id}, {n.name!r}): {message}", file=self.path, field=field
        )

    def need(self, attrs: dict, key: str):
        if key not in attrs:
            raise self.bad(f"missing attribute {key!r}", key)
        return attrs[key]

    def _size(self, attrs: dict) -> int:
        size = int(self.need(attrs, "comm_size"))
        if size <= 0:
            raise self.bad(f"comm_size must be > 0, got {size}", "comm_size")
        return size

    def _collective(self, attrs: dict, common: dict) -> Collective:
        pb, _ = _pb()
        kinds = {v: k for k, v in _KINDS.items()}
        ctype = pb.CollectiveCommType.Name(self.need(attrs, "comm_type"))
        if ctype not in kinds:
            raise self.bad(
                f"collective {ctype} is not supported (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, "
                "ALL_TO_ALL)",
                "comm_type",
            )
        pg = str(attrs.get("pg_name", ""))
        if pg in ("", "0"):
            group = tuple(range(self.n_ranks))
        elif pg in self.groups:
            group = self.groups[pg]
        else:
            raise self.bad(f"unknown process group {pg!r} (not in comm_groups.json)", "pg_name")
        return Collective(kind=kinds[ctype], size_bytes=self._size(attrs), group=group, **common)

    def _p2p(self, send: bool, attrs: dict, common: dict) -> Send | Recv:
        peer_key, own_key = ("comm_dst", "comm_src") if send else ("comm_src", "comm_dst")
        peer = int(self.need(attrs, peer_key))
        own = attrs.get(own_key, self.rank)
        if own != self.rank:
            raise self.bad(f"own side {own} is not this file's rank {self.rank}", own_key)
        if not 0 <= peer < self.n_ranks:
            raise self.bad(f"peer {peer} outside 0..{self.n_ranks - 1}", peer_key)
        size = self._size(attrs)
        cls = Send if send else Recv
        return cls(peer=peer, size_bytes=size, tag=int(self.need(attrs, "comm_tag")), **common)


def read(prefix: str | Path, flops_per_s: float | None = None, name: str = "") -> Workload:
    """The workload in ``<prefix>.<rank>.et`` (+ ``<prefix>.comm_groups.json`` when present).

    Node ids are kept when unique across the files, else offset per rank."""
    prefix = Path(prefix)
    paths = rank_files(prefix)
    groups = {}
    if groups_file(prefix).exists():
        try:
            raw = json.loads(groups_file(prefix).read_text())
            groups = {str(k): tuple(sorted(int(r) for r in v)) for k, v in raw.items()}
        except (ValueError, TypeError, AttributeError) as err:
            raise InputError(f"bad comm groups: {err}", file=groups_file(prefix)) from err
    decoded = [_decode(path) for path in paths]
    ids = [n.id for nodes in decoded for n in nodes]
    unique = len(ids) == len(set(ids))
    stride = max(ids, default=0) + 1
    out: list[Node] = []
    for rank, (path, nodes) in enumerate(zip(paths, decoded, strict=True)):
        reader = _Reader(
            path,
            rank,
            len(paths),
            groups,
            flops_per_s,
            (lambda i: i) if unique else (lambda i, r=rank: r * stride + i),
        )
        local = {n.id for n in nodes}
        for index, n in enumerate(nodes):
            node = reader.node(index, n)
            for dep in [*n.data_deps, *n.ctrl_deps]:
                if dep not in local:
                    raise reader.bad(f"depends on unknown node {dep}", "data_deps")
            out.append(node)
    out.sort(key=lambda node: node.id)
    try:
        return Workload(n_ranks=len(paths), nodes=out, name=name or prefix.name)
    except InputError as err:
        raise InputError(err.message, file=prefix, field=err.field) from err


@dataclass(kw_only=True, slots=True)
class ChakraWorkloadSpec:
    """Config form (``workload=chakra``): replay ``<prefix>.<rank>.et`` on any backend.

    ``sha256`` pins the files' content into the scenario id (filled in from the files when
    empty, so editing a trace re-runs its scenarios instead of reusing stale rows)."""

    lockstep: ClassVar[bool] = False  # a trace's ranks are not one program

    prefix: str
    flops_per_s: float | None = None  # for compute nodes that only carry num_ops
    scale: float = 1.0  # multiplies message sizes (the sweep's knob), not compute
    sha256: str = ""

    def __post_init__(self) -> None:
        if not self.sha256:
            digest = hashlib.sha256()
            for path in rank_files(self.prefix):
                digest.update(path.read_bytes())
            if groups_file(self.prefix).exists():
                digest.update(groups_file(self.prefix).read_bytes())
            self.sha256 = digest.hexdigest()[:16]

    def build(self, n_hosts: int | None = None) -> Workload:
        """The DAG (one rank per trace file; ``n_hosts`` is not needed)."""
        return scale_messages(read(self.prefix, self.flops_per_s), self.scale)

    def lockstep_program(self, n_hosts: int | None = None) -> SymmetricProgram:
        """The lockstep replay's program: the DAG's, when every rank runs the same one."""
        return SymmetricProgram(self.build(n_hosts))


__all__ = [
    "VERSION",
    "ChakraWorkloadSpec",
    "groups_file",
    "rank_file",
    "rank_files",
    "read",
    "write",
]
