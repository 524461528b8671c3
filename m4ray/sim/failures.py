"""Gray failures: links that stay up at a fraction of their rate.

The SimAI gray-failure study (``reference/gray_failure.md`` §2) degrades N GPUs, chosen
server-aligned, by a reduction factor R: every link attached to a degraded GPU (its NVSwitch link
and its rail link) runs at ``bandwidth // R``, integer division in Gbps as the SimAI files are
written (2400 // 7 = 342 Gbps). Rail–spine links are never touched by that rule.

Switch-level faults (``target``) degrade N uplinks of the switch fabric instead: ``asw_uplinks``
are the cables from the switches the GPUs' NICs attach to (ASW, rail or ToR switches: tier 1)
to the tier above (PSW / spine: tier 2); ``spine_uplinks`` the cables from tier 2 to a tier 3,
where the fabric has one. Tiers are read from the topology's structure (NVSwitches apart), so
any topology file or template works; the first N uplinks in (lower switch, upper switch) order
are degraded, both directions of each cable. ``spines`` degrades whole tier-2 switches (every
cable of each).

``at`` names the elements instead of the first-N rules: GPU indices (``gpus``), positions in the
uplink order (``asw_uplinks``, ``spine_uplinks``) or tier-2 switches in id order (``spines``);
``n_degraded`` then counts them. A multi-job run asks "which job does a fault *here* hurt?"
(:mod:`m4ray.sweeps.multi_tenant`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from m4ray.errors import InputError
from m4ray.fingerprint import added_field
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
    return degrade_cables(topo, host_cables(topo, hosts), reduction)


def host_cables(topo: Topology, hosts: tuple[int, ...] | list[int] | set[int]) -> list[int]:
    """Indices of the cables touching ``hosts`` (which must be hosts of ``topo``)."""
    host_set = set(hosts)
    unknown = host_set - set(topo.hosts)
    if unknown:
        raise InputError(f"not hosts of this topology: {sorted(unknown)}", field="degraded hosts")
    return [i for i, c in enumerate(topo.cables) if c.a in host_set or c.b in host_set]


def degrade_cables(
    topo: Topology, cables: list[int], reduction: int, loss_rate: float = 0.0
) -> Topology:
    """A copy of ``topo`` with the cables at these indices at ``bandwidth // reduction`` (both
    directions) and, when ``loss_rate`` is set, that packet-loss rate."""
    if not isinstance(reduction, int) or reduction < 1:
        raise InputError(f"must be an integer >= 1, got {reduction!r}", field="reduction")
    out = list(topo.cables)
    for i in cables:
        c = out[i]
        error_rate = loss_rate if loss_rate else c.error_rate
        out[i] = Cable(c.a, c.b, _reduced(c.bandwidth_bps, reduction), c.latency_s, error_rate)
    return topo.replace_cables(tuple(out))


def _reduced(bandwidth_bps: float, reduction: int) -> float:
    gbps = bandwidth_bps / 1e9
    if gbps >= reduction and float(gbps).is_integer():
        return float((int(gbps) // reduction) * 1e9)
    return bandwidth_bps / reduction  # sub-Gbps or fractional rates: plain division


TARGETS = ("gpus", "asw_uplinks", "spine_uplinks", "spines")


def switch_tiers(topo: Topology) -> dict[int, int]:
    """Tier of every switch that is not an NVSwitch: 1 for those a host's cable reaches (ASW,
    rail or ToR switches), k + 1 for those first reached from tier k."""
    nv = set(topo.nvswitches)
    fabric = set(topo.switches) - nv
    hosts = set(topo.hosts)
    neighbours: dict[int, set[int]] = {n: set() for n in range(topo.n_nodes)}
    for c in topo.cables:
        neighbours[c.a].add(c.b)
        neighbours[c.b].add(c.a)
    tiers = {s: 1 for s in sorted(fabric) if neighbours[s] & hosts}
    frontier = sorted(tiers)
    while frontier:
        nxt = []
        for s in frontier:
            for n in sorted(neighbours[s] & fabric):
                if n not in tiers:
                    tiers[n] = tiers[s] + 1
                    nxt.append(n)
        frontier = nxt
    return tiers


def uplink_cables(topo: Topology, tier: int) -> list[int]:
    """Indices of the cables from a tier-``tier`` switch to a tier ``tier + 1`` switch, in
    (lower switch, upper switch) order."""
    tiers = switch_tiers(topo)
    found = []
    for i, c in enumerate(topo.cables):
        ta, tb = tiers.get(c.a), tiers.get(c.b)
        if ta is None or tb is None:
            continue
        if {ta, tb} == {tier, tier + 1}:
            low, high = (c.a, c.b) if ta == tier else (c.b, c.a)
            found.append((low, high, i))
    return [i for _, _, i in sorted(found)]


def located_cables(topo: Topology, target: str, at: tuple[int, ...]) -> list[int]:
    """The cables of the elements ``at`` of ``target`` (:class:`GrayFailure`'s ``at``), each
    index checked against what the topology has."""
    if target == "gpus":
        hosts = topo.hosts
        _check_at(at, len(hosts), "GPUs")
        return host_cables(topo, {hosts[g] for g in at})
    if target == "spines":
        tier2 = sorted(s for s, tier in switch_tiers(topo).items() if tier == 2)
        _check_at(at, len(tier2), "tier-2 (spine) switches")
        hit = {tier2[i] for i in at}
        return [i for i, c in enumerate(topo.cables) if c.a in hit or c.b in hit]
    uplinks = uplink_cables(topo, 1 if target == "asw_uplinks" else 2)
    _check_at(at, len(uplinks), target.replace("_", " "))
    return [uplinks[i] for i in at]


def _check_at(at: tuple[int, ...], n: int, what: str) -> None:
    bad = [i for i in at if not 0 <= i < n]
    if bad or len(set(at)) != len(at):
        problem = f"{bad} outside 0..{n - 1}" if bad else f"{list(at)} repeats an element"
        raise InputError(f"the topology has {n} {what}: {problem}", field="at")


@dataclass(kw_only=True, slots=True)
class GrayFailure:
    """N degraded GPUs (server-aligned rule) at 1/R of their link rates — or, with ``target``
    ``asw_uplinks`` / ``spine_uplinks``, N degraded switch uplinks (module docstring); N = 0 is
    healthy.

    ``loss_rate``: packet-loss probability on the degraded links for the whole run (packet-level
    backends; fluid models have no loss). ``onset_s``: the rates drop at this simulated time
    instead of from the start (a mid-run gray failure).
    """

    n_degraded: int
    reduction: int
    loss_rate: float = 0.0
    onset_s: float = 0.0
    target: str = "gpus"
    at: tuple[int, ...] = added_field((), "faults at named GPUs, uplinks or spines (2026-11-27)")

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise InputError(
                f"must be one of {', '.join(TARGETS)}, got '{self.target}'", field="target"
            )
        self.at = tuple(int(i) for i in self.at)
        if self.at and self.n_degraded != len(self.at):
            raise InputError(
                f"names {len(self.at)} elements, but n_degraded is {self.n_degraded}", field="at"
            )
        if self.target == "spines" and self.n_degraded and not self.at:
            raise InputError("a spine fault names its spines (at: [...])", field="at")
        if not 0 <= self.loss_rate < 1:
            raise InputError(f"must be in [0, 1), got {self.loss_rate}", field="loss_rate")
        if self.onset_s < 0:
            raise InputError(f"must be >= 0, got {self.onset_s}", field="onset_s")

    def degraded(self, topo: Topology) -> Topology:
        """The topology with the failure in full effect."""
        if self.n_degraded == 0:
            return topo
        if self.at:
            hit = located_cables(topo, self.target, self.at)
        elif self.target == "gpus":
            servers = len(topo.hosts) // topo.gpus_per_server
            gpus = gray_failure_gpus(self.n_degraded, topo.gpus_per_server, servers)
            hit = host_cables(topo, {topo.hosts[g] for g in gpus})
        else:
            tier = 1 if self.target == "asw_uplinks" else 2
            uplinks = uplink_cables(topo, tier)
            if not 1 <= self.n_degraded <= len(uplinks):
                name = {1: "ASW (tier 1 to 2)", 2: "spine (tier 2 to 3)"}[tier]
                raise InputError(
                    f"must be in 0..{len(uplinks)}: the topology has {len(uplinks)} {name} "
                    f"uplinks, got {self.n_degraded}",
                    field="n_degraded",
                )
            hit = uplinks[: self.n_degraded]
        return degrade_cables(topo, hit, self.reduction, self.loss_rate)

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
