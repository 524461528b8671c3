"""Shortest-path routing with deterministic per-flow ECMP, and the ideal FCT of a routed flow.

Hosts never forward traffic, so GPUs on one server meet through their NVSwitch (2 hops) and GPUs
on different servers go out through their NICs. Where several next hops are equally short, a
64-bit hash of ``(seed, src, dst, flow key, node)`` picks one, so a flow always takes the same
path (no reordering), different flows spread, and the choice is reproducible from the seed.

**The FCT convention** of every backend (ns-3, flowSim, m4, datagen, trace output): a flow's FCT
runs from its start to the moment its last byte is delivered at the receiver (one way, no ACK).
Its *ideal* FCT is what the transport achieves for that flow alone on an idle path — the HPCC
ns-3 ``standalone_fct`` that m4 and m3 use (``reference/flowsim_m3.md`` B.9)::

    first       = wire_bytes(min(S, mtu))               # the first packet, headers included
    ideal_fct   = sum(latency)                          # one-way propagation
                + sum(first * 8 / bandwidth)            # store-and-forward of the first packet
                + (wire_bytes(S) - first) * 8 / min(bandwidth)   # the rest at the bottleneck

with ``wire_bytes(S) = S + ceil(S / mtu) * header`` (the wire format's MTU and per-packet
headers). Slowdown = FCT / ideal FCT, kept raw (a value below 1 is a measurement, not an error;
anything that clamps says so). :meth:`Routing.delivery_delay` is the part of the ideal that does
not drain at the bottleneck: fluid models deliver a flow that long after its last bit drained.

Units: bytes, bits/s, seconds.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from m4ray.errors import InputError, SimulationError
from m4ray.models.wire import WireFormat
from m4ray.sim.dagloop import library as dagloop_library
from m4ray.sim.topology import Topology

_MASK = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class Path:
    """A routed flow: directed link ids in order, one-way propagation latency (s), the sum of
    ``1 / bandwidth`` over its links (s/bit) and the bottleneck bandwidth (bits/s)."""

    links: tuple[int, ...]
    latency_s: float
    inverse_bw_sum: float
    bottleneck_bps: float


def mix64(*values: int) -> int:
    """SplitMix64-style hash of small non-negative integers; stable across runs and platforms."""
    h = 0x9E3779B97F4A7C15
    for value in values:
        h = (h ^ (value & _MASK)) * 0xBF58476D1CE4E5B9 & _MASK
        h = (h ^ (h >> 31)) * 0x94D049BB133111EB & _MASK
        h ^= h >> 29
    return h


def mix64_array(*values: np.ndarray) -> np.ndarray:
    """:func:`mix64` elementwise over integer arrays (uint64 arithmetic wraps as ``& _MASK``)."""
    h = np.full(np.broadcast(*values).shape, 0x9E3779B97F4A7C15, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for value in values:
            h = (h ^ np.asarray(value).astype(np.uint64)) * np.uint64(0xBF58476D1CE4E5B9)
            h = (h ^ (h >> np.uint64(31))) * np.uint64(0x94D049BB133111EB)
            h ^= h >> np.uint64(29)
    return h


_MAX_PATHS = 1 << 16  # path descriptions a Routing keeps (bounded memory at 1,024+ GPUs)


def route_sums(
    table: np.ndarray, latency_s: np.ndarray, bandwidth_bps: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Each row's :attr:`Path.latency_s` and :attr:`Path.inverse_bw_sum` for a table of routes
    (a row of links, -1 padded, as :meth:`Routing.links_many` gives), summed hop by hop in link
    order as :meth:`Routing.path` sums them, so equal to the bit at any route length (a numpy
    row sum pairs its terms from 8 on)."""
    latency = np.zeros(len(table))
    inverse = np.zeros(len(table))
    for hop in range(table.shape[1]):
        link = table[:, hop]
        on = link >= 0
        latency[on] += latency_s[link[on]]
        inverse[on] += 1.0 / bandwidth_bps[link[on]]
    return latency, inverse


class Routing:
    """Routes flows over a :class:`Topology`; distances are computed lazily per destination host."""

    def __init__(self, topo: Topology, *, seed: int = 0, wire: WireFormat | None = None) -> None:
        self.topo = topo
        self.seed = seed
        self.wire = wire or WireFormat()
        self._dist: dict[int, np.ndarray] = {}
        self._last: tuple[tuple[int, int, int], Path] | None = None  # see path()
        self._prev: tuple[tuple[int, int, int], Path] | None = None
        # flow id -> the key its ECMP choice hashes instead (set_key; empty: the flow id)
        self._keys: dict[int, int] = {}
        # kept: each (switch, dst)'s next-hop links toward dst (hosts have a port or two: not
        # worth their memory), and the descriptions of the first _MAX_PATHS paths (a
        # collective's flows take the same few again and again)
        self._next: dict[tuple[int, int], list[int]] = {}
        self._paths: dict[tuple[int, ...], Path] = {}
        # host pairs whose walk met no ECMP choice: their path whatever the flow (bounded too)
        self._only: dict[tuple[int, int], Path] = {}
        self.memo: dict = {}  # what callers derive from this routing once (max_bdp_bytes)
        self._host_set = frozenset(topo.hosts)
        self._bw = topo.bandwidth_bps.tolist()
        self._lat = topo.latency_s.tolist()
        self._dst_of = topo.link_dst.tolist()
        self._src_of = topo.link_src.tolist()
        self._in_links: list[list[int]] = [[] for _ in range(topo.n_nodes)]
        for link, node in enumerate(self._dst_of):
            self._in_links[node].append(link)

    def _distances_to(self, dst: int) -> np.ndarray:
        """Hop counts from every node to ``dst`` never transiting hosts (-1 = unreachable).

        A host's are derived from its switches' (every route to a host ends with a hop from one
        of the switches it hangs off, or comes straight from a neighbouring host), so a cluster
        of thousands of GPUs walks its graph once per switch, not once per GPU."""
        dist = self._dist.get(dst)
        if dist is not None:
            return dist
        if dst not in self._host_set:
            dist = self._walk(dst)
        else:
            dist = np.full(self.topo.n_nodes, np.iinfo(np.int16).max, dtype=np.int16)
            for link in self._in_links[dst]:
                prev = self._src_of[link]
                if prev in self._host_set:
                    dist[prev] = min(dist[prev], 1)
                else:
                    via = self._distances_to(prev)
                    np.minimum(dist, np.where(via >= 0, via + 1, dist), out=dist)
            dist[dist == np.iinfo(np.int16).max] = -1
            dist[dst] = 0
        self._dist[dst] = dist
        return dist

    def _walk(self, dst: int) -> np.ndarray:
        """Breadth-first hop counts to ``dst`` over the reversed links, not through hosts."""
        dist = np.full(self.topo.n_nodes, -1, dtype=np.int16)
        dist[dst] = 0
        frontier = deque([dst])
        while frontier:
            node = frontier.popleft()
            if node != dst and node in self._host_set:
                continue  # hosts are endpoints: reachable, but nothing routes through them
            for link in self._in_links[node]:
                prev = self._src_of[link]
                if dist[prev] < 0:
                    dist[prev] = dist[node] + 1
                    frontier.append(prev)
        return dist

    @property
    def out_csr(self) -> tuple[np.ndarray, np.ndarray]:
        """Every node's out-links as CSR (node ``v``: ``out_link[out_off[v]:out_off[v + 1]]``,
        in ``Topology.out_links`` order: the order ECMP picks among them)."""
        csr = self.memo.get("out_csr")
        if csr is None:
            out_links = self.topo.out_links
            out_off = np.zeros(self.topo.n_nodes + 1, dtype=np.int64)
            np.cumsum([len(links) for links in out_links], out=out_off[1:])
            out_link = np.fromiter((x for links in out_links for x in links), np.int64)
            csr = self.memo["out_csr"] = (out_off, out_link)
        return csr

    def next_hop_flags(self, dst: int) -> np.ndarray:
        """Per entry of :attr:`out_csr`'s ``out_link``: 1 where that link leads one hop closer
        to host ``dst`` without transiting another host (the candidates :meth:`path` hashes
        among), else 0 (int8; the compiled walks' table)."""
        ends = self.memo.get("out_ends")  # each out_link's ends, and whether its head is a host
        if ends is None:
            _, out_link = self.out_csr
            link_dst = self.topo.link_dst[out_link]
            into_host = np.isin(link_dst, list(self._host_set))
            ends = self.memo["out_ends"] = (self.topo.link_src[out_link], link_dst, into_host)
        link_src, link_dst, into_host = ends
        dist = self._distances_to(dst).astype(np.int64)
        ok = (dist[link_dst] == dist[link_src] - 1) & ((link_dst == dst) | ~into_host)
        return np.ascontiguousarray(ok, dtype=np.int8)

    def set_key(self, flow_id: int, key: int) -> None:
        """Let flow ``flow_id``'s ECMP choice hash ``key`` instead of its id, wherever its path
        is asked for (the replay of several jobs keys a flow by its own job's traffic, so a
        job's paths do not depend on how many flows its neighbours started)."""
        self._keys[flow_id] = key

    def path(self, src: int, dst: int, flow_key: int = 0) -> Path:
        """The path of flow ``flow_key`` from host ``src`` to host ``dst`` (the last two answers
        are kept: the replay asks for each new flow's path, then for its ACKs' way back under
        SimAI's collectives, and then the backend for the path again)."""
        if self._keys:
            flow_key = self._keys.get(flow_key, flow_key)
        key = (src, dst, flow_key)
        last, prev = self._last, self._prev
        if last is not None and last[0] == key:
            return last[1]
        if prev is not None and prev[0] == key:
            self._last, self._prev = prev, last
            return prev[1]
        path = self._only.get((src, dst))
        if path is None:
            path = self._path(src, dst, flow_key)
        self._last, self._prev = (key, path), last
        return path

    def links_many(
        self, src: np.ndarray, dst: np.ndarray, flow_key: np.ndarray, *, chunk: int = 1 << 16
    ) -> np.ndarray:
        """The links of many flows at once, hop by hop in numpy: row ``i`` holds
        ``path(src[i], dst[i], flow_key[i]).links``, padded with -1 (same choices, same errors
        naming the first bad flow by its index)."""
        src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
        keys = np.asarray(flow_key)
        if keys.dtype == np.int64:  # two's complement: the same bits as int(k) & _MASK
            keys = keys.view(np.uint64)
        else:
            keys = np.array([int(k) & _MASK for k in keys.tolist()], dtype=np.uint64)
        is_host = np.zeros(self.topo.n_nodes + 1, dtype=bool)
        is_host[list(self._host_set)] = True
        for name, nodes in (("src", src), ("dst", dst)):
            bad = np.flatnonzero((nodes < 0) | (nodes >= self.topo.n_nodes) | ~is_host[nodes])
            if len(bad):
                raise InputError(
                    f"flow #{bad[0]}: node {nodes[bad[0]]} is not a host of the topology",
                    field=name,
                )
        if (same := np.flatnonzero(src == dst)).size:
            raise InputError(
                f"flow #{same[0]}: source and destination are the same host {src[same[0]]}",
                field="dst",
            )
        targets, target_of = np.unique(dst, return_inverse=True)
        dist = np.stack([self._distances_to(int(d)) for d in targets.tolist()])
        dist = np.concatenate([dist, np.full((len(targets), 1), -2)], axis=1)  # pad column
        if (cut := np.flatnonzero(dist[target_of, src] < 0)).size:
            i = cut[0]
            raise InputError(
                f"flow #{i}: hosts {src[i]} and {dst[i]} are not connected", field="dst"
            )
        degree = max(len(out) for out in self.topo.out_links)
        out = np.full((self.topo.n_nodes, degree), -1, dtype=np.int64)
        for node, links in enumerate(self.topo.out_links):
            out[node, : len(links)] = links
        link_dst = np.append(self.topo.link_dst, self.topo.n_nodes)  # link -1 -> the pad node
        hops = int(dist[target_of, src].max())
        table = np.full((len(src), hops), -1, dtype=np.int64)
        if (lib := dagloop_library()) is not None:  # the same walk compiled
            self._walk_compiled(lib, src, keys, targets, target_of=target_of, table=table)
            return table
        for lo in range(0, len(src), chunk):
            rows = np.arange(lo, min(lo + chunk, len(src)))
            node = src[rows].copy()
            for hop in range(hops):
                live = node != dst[rows]
                if not live.any():
                    break
                r, v, d, t = rows[live], node[live], dst[rows][live], target_of[rows][live]
                cand = out[v]
                nxt = link_dst[cand]
                here = dist[t, v]
                ok = (cand >= 0) & (dist[t[:, None], nxt] == here[:, None] - 1)
                ok &= (nxt == d[:, None]) | ~is_host[nxt]
                count = ok.sum(axis=1)
                pick = np.zeros(len(r), dtype=np.int64)
                many = count > 1
                if many.any():
                    h = mix64_array(self.seed, src[r[many]], d[many], keys[r[many]], v[many])
                    pick[many] = (h % count[many].astype(np.uint64)).astype(np.int64)
                col = np.argmax(np.cumsum(ok, axis=1) > pick[:, None], axis=1)
                link = cand[np.arange(len(r)), col]
                table[r, hop] = link
                node[live] = self.topo.link_dst[link]
        return table

    def _walk_compiled(self, lib, src, keys, targets, *, target_of, table) -> None:
        """:meth:`links_many`'s hop walk in C (``m4ray_route_many``), one destination at a
        time over its :meth:`next_hop_flags`: the same choices, into ``table``."""
        out_off, out_link = self.out_csr
        link_dst = np.ascontiguousarray(self.topo.link_dst, dtype=np.int64)
        signed = np.ascontiguousarray(keys.view(np.int64))
        src = np.ascontiguousarray(src, dtype=np.int64)
        by_target = np.argsort(target_of, kind="stable")
        bounds = np.searchsorted(target_of[by_target], np.arange(len(targets) + 1))
        for t, target in enumerate(targets.tolist()):
            rows = np.ascontiguousarray(by_target[bounds[t] : bounds[t + 1]])
            flags = self.next_hop_flags(target)
            rc = lib.m4ray_route_many(
                out_off.ctypes.data,
                out_link.ctypes.data,
                link_dst.ctypes.data,
                flags.ctypes.data,
                self.seed & _MASK,
                target,
                len(rows),
                rows.ctypes.data,
                src.ctypes.data,
                signed.ctypes.data,
                table.shape[1],
                table.ctypes.data,
            )
            if rc:
                raise SimulationError(f"no route toward host {target} (compiled walk)")

    def _path(self, src: int, dst: int, flow_key: int) -> Path:
        for name, node in (("src", src), ("dst", dst)):
            if node not in self._host_set:
                raise InputError(f"node {node} is not a host of the topology", field=name)
        if src == dst:
            raise InputError(f"source and destination are the same host {src}", field="dst")
        dist = self._distances_to(dst)
        if dist[src] < 0:
            raise InputError(f"hosts {src} and {dst} are not connected", field="dst")
        links = []
        node = src
        chose = False
        while node != dst:
            candidates = self._next.get((node, dst))
            if candidates is None:
                candidates = [
                    link
                    for link in self.topo.out_links[node]
                    if dist[self._dst_of[link]] == dist[node] - 1
                    and (self._dst_of[link] == dst or self._dst_of[link] not in self._host_set)
                ]
                if node not in self._host_set:
                    self._next[node, dst] = candidates
            if len(candidates) > 1:
                link = candidates[mix64(self.seed, src, dst, flow_key, node) % len(candidates)]
                chose = True
            else:
                link = candidates[0]
            links.append(link)
            node = self._dst_of[link]
        key = tuple(links)
        path = self._paths.get(key)
        if path is None:
            path = self._describe(key)
            if len(self._paths) < _MAX_PATHS:
                self._paths[key] = path
        if not chose and len(self._only) < _MAX_PATHS:
            self._only[src, dst] = path
        return path

    def _describe(self, links: tuple[int, ...]) -> Path:  # route_sums: the same, vectorised
        bw = [self._bw[link] for link in links]
        return Path(
            links=links,
            latency_s=sum(self._lat[link] for link in links),
            inverse_bw_sum=sum(1.0 / b for b in bw),
            bottleneck_bps=min(bw),
        )

    def ideal_fct(self, size_bytes: int, path: Path) -> float:
        """Seconds a flow of ``size_bytes`` needs alone on ``path`` (the convention above)."""
        wire_bits = self.wire.wire_bytes(size_bytes) * 8
        return self.delivery_delay(size_bytes, path) + wire_bits / path.bottleneck_bps

    def delivery_delay(self, size_bytes: int, path: Path) -> float:
        """Ideal FCT minus the time all wire bytes take at the bottleneck (seconds): a fluid
        model that drains a lone flow at the bottleneck rate delivers it this much later."""
        first = self.wire.wire_bytes(min(size_bytes, self.wire.mtu_bytes))
        return path.latency_s + first * 8 * (path.inverse_bw_sum - 1 / path.bottleneck_bps)
