"""Gray failures: links that stay up at a fraction of their rate.

The SimAI gray-failure study (``reference/gray_failure.md`` §2) degrades N GPUs, chosen
server-aligned, by a reduction factor R: every link attached to a degraded GPU (its NVSwitch link
and its rail link) runs at ``bandwidth // R``, integer division in Gbps as the SimAI files are
written (2400 // 7 = 342 Gbps). Rail–spine links are never touched.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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
    """N degraded GPUs (server-aligned rule) at 1/R of their link rates; N = 0 is healthy."""

    n_degraded: int
    reduction: int

    def apply(self, topo: Topology) -> Topology:
        if self.n_degraded == 0:
            return topo
        servers = len(topo.hosts) // topo.gpus_per_server
        gpus = gray_failure_gpus(self.n_degraded, topo.gpus_per_server, servers)
        return degrade(topo, [topo.hosts[g] for g in gpus], self.reduction)
