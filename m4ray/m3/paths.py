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

from collections import Counter, defaultdict
from dataclasses import dataclass

import numpy as np

from m4ray.errors import InputError
from m4ray.sim.flows import Flow
from m4ray.sim.routing import Routing


@dataclass(kw_only=True, slots=True)
class PathScenario:
    """One path's parking lot: ``L`` links, and one row per (pseudo-)flow on it.

    ``a``/``b``: the first path link a flow uses and the last + 1 (foreground: ``0, L``);
    ``origin``: index of the flow in the network-wide flow list; ``draws``: how often sampling
    picked this path.
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

    @property
    def n_links(self) -> int:
        return len(self.links)

    @property
    def n_foreground(self) -> int:
        return int(self.foreground.sum())


class RoutedFlows:
    """A network-wide flow set with every flow's route, indexed by path and by link."""

    def __init__(self, flows: list[Flow], routing: Routing) -> None:
        if not flows:
            raise InputError("the workload has no flows", field="flows")
        hosts = frozenset(routing.topo.hosts)
        for i, flow in enumerate(flows):
            for name in ("src", "dst"):
                node = getattr(flow, name)
                if node not in hosts:
                    raise InputError(
                        f"flow {flow.id} (#{i}) references node {node}, which is not a host of "
                        f"the topology ({len(hosts)} hosts)",
                        field=name,
                    )
        self.flows = flows
        self.routing = routing
        self.routes = [routing.path(f.src, f.dst, f.id).links for f in flows]
        self.by_path: dict[tuple[int, ...], list[int]] = defaultdict(list)
        self.by_link: dict[int, list[int]] = defaultdict(list)
        for i, route in enumerate(self.routes):
            self.by_path[route].append(i)
            for link in route:
                self.by_link[link].append(i)
        self.size_bytes = np.array([f.size_bytes for f in flows], dtype=np.int64)
        self.start_s = np.array([f.start_s for f in flows], dtype=np.float64)

    def sample(self, n_paths: int, seed: int) -> list[tuple[tuple[int, ...], int]]:
        """``n_paths`` draws of a path ∝ its foreground flows: the unique paths with their draw
        counts (which sum to ``n_paths``), in order of first draw."""
        if n_paths < 1:
            raise InputError(f"must be >= 1, got {n_paths}", field="n_paths")
        picks = np.random.default_rng(seed).integers(len(self.flows), size=n_paths)
        return list(Counter(self.routes[i] for i in picks.tolist()).items())

    def scenario(self, path: tuple[int, ...], draws: int = 1) -> PathScenario:
        """The parking lot of ``path``: its foreground, then background (pseudo-)flows."""
        if path not in self.by_path:
            raise InputError(f"no flow takes the path {list(path)}", field="path")
        position = {link: k for k, link in enumerate(path)}
        rows: list[tuple[int, int, int]] = [(0, len(path), i) for i in self.by_path[path]]
        n_fg = len(rows)
        crossing = sorted(
            {i for link in path for i in self.by_link[link]} - set(self.by_path[path])
        )
        for i in crossing:
            rows.extend((a, b, i) for a, b in _stretches(self.routes[i], position))
        a, b, origin = (np.array(col, dtype=np.int64) for col in zip(*rows, strict=True))
        topo = self.routing.topo
        links = np.asarray(path, dtype=np.int64)
        return PathScenario(
            links=tuple(path),
            capacity_bps=topo.bandwidth_bps[links].copy(),
            latency_s=topo.latency_s[links].copy(),
            a=a,
            b=b,
            size_bytes=self.size_bytes[origin],
            start_s=self.start_s[origin],
            origin=origin,
            foreground=np.arange(len(rows)) < n_fg,
            draws=draws,
        )


def _stretches(route: tuple[int, ...], position: dict[int, int]) -> list[tuple[int, int]]:
    """``(a, b)`` of each maximal run of the route on consecutive path links."""
    out: list[tuple[int, int]] = []
    start = last = None
    for link in route:
        k = position.get(link)
        if k is not None and last is not None and k == last + 1:
            last = k
            continue
        if start is not None:
            out.append((start, last + 1))
        start = last = k
    if start is not None:
        out.append((start, last + 1))
    return out
