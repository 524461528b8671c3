"""Gray failures: links that stay up at a fraction of their rate.

The SimAI gray-failure study (``reference/gray_failure.md`` §2) degrades N GPUs, chosen
server-aligned, by a reduction factor R: every link attached to a degraded GPU (its NVSwitch link
and its rail link) runs at ``bandwidth // R``, integer division in Gbps as the SimAI files are
written (2400 // 7 = 342 Gbps). Rail–spine links are never touched.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from m4ray.errors import InputError
from m4ray.sim.topology import Cable, Topology


def gray_failure_gpus(
    n_degraded: int, gpus_per_server: int = 8, servers: int = 4
) -> tuple[int, ...]:
    """The degraded GPU set for ``n_degraded`` GPUs (reference rule, any server size).

    N ≤ g: the first ⌈N/2⌉ GPUs of server 0 and the first ⌊N/2⌋ of server 1.
    g < N ≤ 2g: all of server 0 and the first N − g GPUs of server 2.
    """
    g = gpus_per_server
    if n_degraded < 0 or n_degraded > 2 * g:
        raise InputError(f"must be in 0..{2 * g} for {g} GPUs per server", field="n_degraded")
    needed_servers = 2 if n_degraded <= g else 3
    if n_degraded > 1 and servers < needed_servers:
        raise InputError(f"needs at least {needed_servers} servers", field="n_degraded")
    if n_degraded <= g:
        first, second = math.ceil(n_degraded / 2), n_degraded // 2
        return tuple(range(first)) + tuple(range(g, g + second))
    return tuple(range(g)) + tuple(range(2 * g, 2 * g + n_degraded - g))


def degrade(topo: Topology, hosts: tuple[int, ...] | list[int], reduction: int) -> Topology:
    """A copy of ``topo`` with every cable touching ``hosts`` at ``bandwidth // reduction``."""
    if not isinstance(reduction, int) or reduction < 1:
        raise InputError(f"must be an integer >= 1, got {reduction!r}", field="reduction")
    host_set = set(hosts)
    unknown = host_set - set(topo.hosts)
    if unknown:
        raise InputError(f"not hosts of this topology: {sorted(unknown)}", field="degraded hosts")
    cables = tuple(
        Cable(c.a, c.b, _reduced(c.bandwidth_bps, reduction), c.latency_s, c.error_rate)
        if c.a in host_set or c.b in host_set
        else c
        for c in topo.cables
    )
    return topo.replace_cables(cables)


def _reduced(bandwidth_bps: float, reduction: int) -> float:
    gbps = bandwidth_bps / 1e9
    if gbps >= reduction and float(gbps).is_integer():
        return float((int(gbps) // reduction) * 1e9)
    return bandwidth_bps / reduction  # sub-Gbps or fractional rates: plain division


@dataclass(kw_only=True, slots=True)
class GrayFailure:
    """N degraded GPUs (server-aligned rule) at 1/R of their link rates; N = 0 is healthy.

    ``loss_rate``: packet-loss probability on the degraded links for the whole run (packet-level
    backends; fluid models have no loss). ``onset_s``: the rates drop at this simulated time
    instead of from the start (a mid-run gray failure).
    """

    n_degraded: int
    reduction: int
    loss_rate: float = 0.0
    onset_s: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.loss_rate < 1:
            raise InputError(f"must be in [0, 1), got {self.loss_rate}", field="loss_rate")
        if self.onset_s < 0:
            raise InputError(f"must be >= 0, got {self.onset_s}", field="onset_s")

    def degraded(self, topo: Topology) -> Topology:
        """The topology with the failure in full effect."""
        if self.n_degraded == 0:
            return topo
        servers = len(topo.hosts) // topo.gpus_per_server
        gpus = set(gray_failure_gpus(self.n_degraded, topo.gpus_per_server, servers))
        hosts = [topo.hosts[g] for g in gpus]
        slow = degrade(topo, hosts, self.reduction)
        if self.loss_rate == 0:
            return slow
        host_set = set(hosts)
        return slow.replace_cables(
            tuple(
                dataclasses.replace(c, error_rate=self.loss_rate) if {c.a, c.b} & host_set else c
                for c in slow.cables
            )
        )

    def apply(self, topo: Topology) -> Topology:
        """The topology a run starts with (rates still nominal when the onset is later)."""
        if self.onset_s == 0:
            return self.degraded(topo)
        degraded = self.degraded(topo)
        return degraded.replace_cables(
            tuple(
                dataclasses.replace(c, bandwidth_bps=base.bandwidth_bps)
                for c, base in zip(degraded.cables, topo.cables, strict=True)
            )
        )

    def onset_changes(self, topo: Topology) -> list[tuple[int, float]]:
        """``(directed link id, new bandwidth bits/s)`` to apply at ``onset_s`` (empty at 0)."""
        if self.onset_s == 0:
            return []
        after = self.degraded(topo).bandwidth_bps
        before = topo.bandwidth_bps
        return [(int(link), float(after[link])) for link in (after != before).nonzero()[0]]


@dataclass(kw_only=True, slots=True)
class GridConfig:
    """N degraded GPUs × reduction factors R × replicate seeds; every failure of the grid has the
    same packet-loss rate on its degraded links and the same onset time (0 = from the start)."""

    n: list[int] = field(default_factory=lambda: list(range(2, 17)))
    r: list[int] = field(default_factory=lambda: list(range(4, 11)))
    seeds: int = 1
    loss_rate: float = 0.0
    onset_s: float = 0.0
