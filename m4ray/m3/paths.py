"""Path decomposition of a routed network-wide flow set, path sampling, and per-path scenarios
(``reference/flowsim_m3.md`` B.2-B.4).

Every flow is routed once (the backends' own ECMP, :class:`~m4ray.sim.routing.Routing`); a path is
the tuple of directed links a flow takes, and the flows whose route is exactly that tuple are the
path's *foreground*. m3 samples paths with probability proportional to their foreground count
(pick a random flow, take its path) and simulates each sampled path as a parking lot: its links in
order, the foreground flows end to end, and every other flow crossing any of its links as
background that enters at the first path link it uses and leaves after the last. A flow that
leaves the path and rejoins it later becomes one background *pseudo-flow* per contiguous stretch
(same size and start; ``origin`` keeps the original flow's index).

Units: bytes, seconds.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from operator import attrgetter

import numpy as np

from m4ray.errors import InputError
from m4ray.m3.native import library as pathsim_library
from m4ray.m3.pathsim import first_appearance
from m4ray.sim.flows import Flow
from m4ray.sim.routing import Routing, route_sums


@dataclass(kw_only=True, slots=True)
class PathScenario:
    """One path's parking lot: ``L`` links, and one row per (pseudo-)flow on it.

    ``a``/``b``: the first path link a flow uses and the last + 1 (foreground: ``0, L``);
    ``origin``: index of the flow in the network-wide flow list; ``draws``: how often sampling
    picked this path; ``route_latency_s`` / ``route_inverse_bw``: where the lot was cut from a
    network, each row's whole network route (one-way latency s, Σ 1/bandwidth s/bit, as
    :class:`~m4ray.sim.routing.Path` has them; a background flow's segment is shorter), else
    None (the lot is its flows' whole network).
    """

    links: tuple[int, ...]
    capacity_bps: np.ndarray
    latency_s: np.ndarray
    a: np.ndarray
    b: np.ndarray
    size_bytes: np.ndarray
    start_s: np.ndarray
    origin: np.ndarray
    foreground: np.ndarray
    draws: int = 1
    route_latency_s: np.ndarray | None = None
    route_inverse_bw: np.ndarray | None = None

    @property
    def n_links(self) -> int:
        return len(self.links)

    @property
    def n_foreground(self) -> int:
        return int(self.foreground.sum())


_INT_COLUMNS = ("src", "dst", "id", "size_bytes")


_MAX_MERGE = 16  # the longest path the compiled merge takes (_pathsim.c's m4ray_lot_stretches)


def _column(flows: list[Flow], name: str, dtype) -> np.ndarray:
    """One attribute of every flow as an array (3x faster than a list of tuples)."""
    return np.fromiter(map(attrgetter(name), flows), dtype=dtype, count=len(flows))


def _index_type(n: int):
    """The smallest signed integer type holding ``0..n`` (a 16-bit key sorts by radix)."""
    return np.int16 if n <= np.iinfo(np.int16).max else np.int64


def _route_keys(table: np.ndarray, n_links: int) -> np.ndarray:
    """One key per row of a route table (links, -1 padded) that is equal exactly where the
    rows are: the links packed into one int64 where they fit (ids + 1 in ``bits`` each),
    else the rows' bytes."""
    bits = max(1, int(n_links).bit_length())
    if bits * table.shape[1] <= 63:
        shifts = np.arange(table.shape[1], dtype=np.int64) * bits
        return ((table + 1) << shifts).sum(axis=1)
    row = np.dtype((np.void, table.itemsize * table.shape[1]))
    return np.ascontiguousarray(table).view(row).reshape(-1)


def draw_flows(n_flows: int, n_paths: int, seed: int) -> np.ndarray:
    """The flows :meth:`RoutedFlows.sample` draws (uniform over the network's flows, so each
    draw takes a path ∝ its foreground flows)."""
    return np.random.default_rng(seed).integers(n_flows, size=n_paths)


class RoutedFlows:
    """A network-wide flow set with every flow's route, indexed by path and by link.

    Holds arrays only (it travels to the Ray tasks that build path scenarios): the unique
    routes as rows of a link table (``paths`` gives them as tuples, built on first use: a
    200,000-flow workload on a fat-tree has ~130,000 of them, and sampling reads a few hundred),
    ``path_of`` each flow's index into them, and CSR indexes of each route's flows
    (:meth:`members`) and of (flow, hop) by directed link (:meth:`on_link`).
    """

    def __init__(self, flows: list[Flow], routing: Routing) -> None:
        if not flows:
            raise InputError("the workload has no flows", field="flows")
        hosts = np.asarray(sorted(routing.topo.hosts), dtype=np.int64)
        src, dst, ids, size = (_column(flows, name, np.int64) for name in _INT_COLUMNS)
        for nodes, name in ((src, "src"), (dst, "dst")):
            bad = np.flatnonzero(~np.isin(nodes, hosts))
            if len(bad):
                i = int(bad[0])
                raise InputError(
                    f"flow {flows[i].id} (#{i}) references node {int(nodes[i])}, which is "
                    f"not a host of the topology ({len(hosts)} hosts)",
                    field=name,
                )
        topo = routing.topo
        self.capacity_bps = np.asarray(topo.bandwidth_bps, dtype=np.float64)
        self.latency_s = np.asarray(topo.latency_s, dtype=np.float64)
        self.n_flows = len(flows)
        table = routing.links_many(src, dst, ids)
        # unique routes, numbered in order of first appearance
        path_of, first = first_appearance(_route_keys(table, len(self.capacity_bps)))
        self.path_of = np.ascontiguousarray(path_of, dtype=np.int64)
        self._routes = table[first]  # one row per unique route, -1 padded
        self._route_sums = route_sums(self._routes, self.latency_s, self.capacity_bps)
        self._paths: list[tuple[int, ...]] | None = None
        self._sampled: dict[tuple[int, ...], int] = {}  # routes sample() drew, by path
        self._members = np.argsort(self.path_of, kind="stable")
        self._member_ptr = np.concatenate(
            [[0], np.cumsum(np.bincount(self.path_of, minlength=len(first)))]
        )
        # every (flow, hop) on every link, grouped by link, then by flow
        flow, hop = np.nonzero(table >= 0)  # row-major: by flow, then hop
        link = table[flow, hop]
        order = np.argsort(link.astype(_index_type(len(self.capacity_bps))), kind="stable")
        self._link_flow = np.ascontiguousarray(flow[order], dtype=np.int64)
        self._link_hop = np.ascontiguousarray(hop[order], dtype=np.int64)
        self._link_ptr = np.searchsorted(link[order], np.arange(len(self.capacity_bps) + 1))
        self.size_bytes = size
        self.start_s = _column(flows, "start_s", np.float64)

    @property
    def paths(self) -> list[tuple[int, ...]]:
        """The unique routes (tuples of directed links), in order of first appearance."""
        if self._paths is None:
            self._paths = [self._route(k) for k in range(len(self._routes))]
        return self._paths

    def _route(self, k: int) -> tuple[int, ...]:
        return tuple(x for x in self._routes[k].tolist() if x >= 0)

    @property
    def by_path(self) -> dict[tuple[int, ...], np.ndarray]:
        """Every route and its foreground flows (ascending)."""
        return {path: self._members_of(k) for k, path in enumerate(self.paths)}

    def members(self, path: tuple[int, ...]) -> np.ndarray:
        """The flows whose route is exactly ``path`` (its foreground), ascending: among the
        routes of the flows on its first link, the one that is ``path`` (no index of every
        route, which sampling a few hundred of ~10^5 would not repay; the routes
        :meth:`sample` drew it keeps)."""
        k = self._sampled.get(tuple(path))
        if k is not None:
            return self._members_of(k)
        if path and len(path) <= self._routes.shape[1]:
            want = np.full(self._routes.shape[1], -1, dtype=self._routes.dtype)
            want[: len(path)] = path
            routes = self.path_of[self.on_link(path[0])[0]]  # repeats: cheaper than unique
            found = routes[(self._routes[routes] == want).all(axis=1)]
            if len(found):
                return self._members_of(int(found[0]))
        raise InputError(f"no flow takes the path {list(path)}", field="path")

    def _members_of(self, k: int) -> np.ndarray:
        return self._members[self._member_ptr[k] : self._member_ptr[k + 1]]

    def route(self, i: int) -> tuple[int, ...]:
        """The directed links flow ``i`` takes."""
        return self._route(int(self.path_of[i]))

    def on_link(self, link: int) -> tuple[np.ndarray, np.ndarray]:
        """The flows crossing directed ``link`` (ascending) and the hop at which each does."""
        lo, hi = self._link_ptr[link], self._link_ptr[link + 1]
        return self._link_flow[lo:hi], self._link_hop[lo:hi]

    def sample(self, n_paths: int, seed: int) -> list[tuple[tuple[int, ...], int]]:
        """``n_paths`` draws of a path ∝ its foreground flows: the unique paths with their draw
        counts (which sum to ``n_paths``), in order of first draw."""
        if n_paths < 1:
            raise InputError(f"must be >= 1, got {n_paths}", field="n_paths")
        picks = draw_flows(self.n_flows, n_paths, seed)
        drawn = Counter(self.path_of[picks].tolist())
        self._sampled.update((self._route(k), k) for k in drawn)
        return [(self._route(k), n) for k, n in drawn.items()]

    def scenario(
        self, path: tuple[int, ...], draws: int = 1, *, compiled: bool = True
    ) -> PathScenario:
        """The parking lot of ``path``: its foreground, then background (pseudo-)flows in flow
        order, each flow's stretches in route order. The stretches are found by the compiled
        merge of the links' (flow, hop) lists where it builds (``compiled=False``: the numpy
        below, the reference; the same lot)."""
        fg = self.members(path)
        lib = pathsim_library() if compiled and len(path) <= _MAX_MERGE else None
        if lib is not None:
            origin, a, b = self._stretches(lib, path, fg)
        else:
            origin, a, b = self._stretches_numpy(path, fg)
        links = np.asarray(path, dtype=np.int64)
        return PathScenario(
            links=tuple(path),
            capacity_bps=self.capacity_bps[links].copy(),
            latency_s=self.latency_s[links].copy(),
            a=a,
            b=b,
            size_bytes=self.size_bytes[origin],
            start_s=self.start_s[origin],
            origin=origin,
            foreground=np.arange(len(origin)) < len(fg),
            draws=draws,
            route_latency_s=self._route_sums[0][self.path_of[origin]],
            route_inverse_bw=self._route_sums[1][self.path_of[origin]],
        )

    def _stretches(self, lib, path, fg) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``origin``, ``a``, ``b`` of the lot (foreground first), compiled."""
        ranges = np.array(
            [x for link in path for x in (self._link_ptr[link], self._link_ptr[link + 1])],
            dtype=np.int64,
        )
        most = int((ranges[1::2] - ranges[0::2]).sum())
        n_fg, n_links = len(fg), len(path)
        origin = np.empty(n_fg + most, dtype=np.int64)
        a = np.zeros(n_fg + most, dtype=np.int64)
        b = np.full(n_fg + most, n_links, dtype=np.int64)
        origin[:n_fg] = fg
        n = lib.m4ray_lot_stretches(
            n_links, ranges.ctypes.data, self._link_flow.ctypes.data,
            self._link_hop.ctypes.data, self.path_of.ctypes.data, int(self.path_of[fg[0]]),
            origin[n_fg:].ctypes.data, a[n_fg:].ctypes.data, b[n_fg:].ctypes.data,
        )  # fmt: skip
        end = n_fg + n
        return origin[:end], a[:end], b[:end]

    def _stretches_numpy(self, path, fg) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``origin``, ``a``, ``b`` of the lot (foreground first): the reference."""
        parts = [self.on_link(link) for link in path]
        flow = np.concatenate([f for f, _ in parts])
        hop = np.concatenate([h for _, h in parts])
        pos = np.repeat(np.arange(len(path)), [len(f) for f, _ in parts])
        other = self.path_of[flow] != self.path_of[fg[0]]
        flow, hop, pos = flow[other], hop[other], pos[other]
        order = np.lexsort((hop, flow))
        flow, hop, pos = flow[order], hop[order], pos[order]
        # a stretch goes on while the flow's next hop is the path's next link
        new = np.ones(len(flow), dtype=bool)
        new[1:] = (flow[1:] != flow[:-1]) | (hop[1:] != hop[:-1] + 1) | (pos[1:] != pos[:-1] + 1)
        first = np.flatnonzero(new)
        last = np.append(first[1:], len(flow)) - 1
        n_links = len(path)
        a = np.concatenate([np.zeros(len(fg), dtype=np.int64), pos[first]])
        b = np.concatenate([np.full(len(fg), n_links, dtype=np.int64), pos[last] + 1])
        return np.concatenate([fg, flow[first]]), a, b
