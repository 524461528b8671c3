"""Open-loop traffic for the training fabric: flow sizes, endpoints and arrivals.

Following m4's generator (``reference/m4.md`` §10.3) with the parametric size families of the
training-data issue: a flow size distribution scaled to a target mean, uniformly random
(src, dst) host pairs, and log-normal inter-arrival times whose mean makes the busiest directed
link carry ``max_load`` of its capacity on average::

    total_rate = min over links of  bandwidth_l / share_l · max_load     (bits/s)
    mean_iat   = mean_size · 8 / total_rate,     mu = ln(mean_iat) − sigma² / 2

where ``share_l`` is the fraction of all bytes whose path crosses link ``l``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np

from m4ray.errors import InputError, choice_error
from m4ray.sim.flows import Flow
from m4ray.sim.routing import Routing

SIZE_KINDS = ("exponential", "lognormal", "pareto", "gaussian", "empirical")


@dataclass(kw_only=True, slots=True)
class SizeDistribution:
    """A flow-size shape; :meth:`sample` scales it to a requested mean (bytes).

    ``sigma``: log-normal shape; ``alpha``: Pareto tail index (> 1 for a finite mean); ``cv``:
    Gaussian standard deviation / mean; ``cdf``: empirical ``[[bytes, cumulative probability],
    ...]`` points (piecewise-linear between them), rescaled to the requested mean.
    """

    kind: str
    sigma: float = 1.0
    alpha: float = 1.5
    cv: float = 0.5
    cdf: list[list[float]] | None = None

    def __post_init__(self) -> None:
        if self.kind not in SIZE_KINDS:
            raise choice_error("size distribution", self.kind, SIZE_KINDS)
        if self.sigma <= 0 or self.cv <= 0:
            raise InputError("sigma and cv must be > 0", field=f"sizes.{self.kind}")
        if self.kind == "pareto" and self.alpha <= 1:
            raise InputError(
                f"Pareto alpha must be > 1 for a finite mean, got {self.alpha}", field="alpha"
            )
        if self.kind == "empirical":
            _check_cdf(self.cdf)

    def sample(self, rng: np.random.Generator, mean: float, n: int, min_bytes: int) -> np.ndarray:
        """``n`` integer sizes ≥ ``min_bytes`` with (before clipping) mean ``mean``."""
        if self.kind == "exponential":
            x = rng.exponential(mean, n)
        elif self.kind == "lognormal":
            x = rng.lognormal(math.log(mean) - self.sigma**2 / 2, self.sigma, n)
        elif self.kind == "pareto":
            scale = mean * (self.alpha - 1) / self.alpha
            x = scale * (1 + rng.pareto(self.alpha, n))
        elif self.kind == "gaussian":
            x = rng.normal(mean, self.cv * mean, n)
        else:
            points = np.asarray(self.cdf, dtype=np.float64)
            sizes, probs = points[:, 0], points[:, 1]
            x = np.interp(rng.random(n), probs, sizes) * (mean / _cdf_mean(sizes, probs))
        return np.maximum(np.rint(x), min_bytes).astype(np.int64)


def _check_cdf(cdf) -> None:
    if not cdf or len(cdf) < 2 or any(len(p) != 2 for p in cdf):
        raise InputError("needs at least two [bytes, probability] points", field="cdf")
    sizes = [p[0] for p in cdf]
    probs = [p[1] for p in cdf]
    if any(b < a for a, b in pairwise(sizes)) or any(b < a for a, b in pairwise(probs)):
        raise InputError("sizes and probabilities must be non-decreasing", field="cdf")
    if probs[0] != 0 or probs[-1] != 1 or sizes[0] < 0:
        raise InputError("probabilities must run from 0 to 1 over sizes >= 0", field="cdf")


def _cdf_mean(sizes: np.ndarray, probs: np.ndarray) -> float:
    """Mean of the piecewise-uniform distribution the CDF points describe."""
    return float(np.sum(np.diff(probs) * (sizes[1:] + sizes[:-1]) / 2))


@dataclass(kw_only=True, slots=True)
class OpenLoopTraffic:
    """One scenario's open-loop traffic parameters (bytes, seconds); :meth:`flows` draws it."""

    n_flows: int
    size_name: str
    size: SizeDistribution
    size_mean_bytes: float
    min_size_bytes: int = 50
    sigma: float = 1.0
    max_load: float = 0.5
    kind: str = field(default="open_loop", init=False)

    def flows(self, routing: Routing, seed: int) -> list[Flow]:
        """The flows of this scenario on ``routing``'s topology (deterministic in ``seed``)."""
        rng = np.random.default_rng(seed)
        hosts = np.asarray(routing.topo.hosts)
        src = rng.integers(0, len(hosts), self.n_flows)
        dst = (src + rng.integers(1, len(hosts), self.n_flows)) % len(hosts)  # never src
        sizes = self.size.sample(rng, self.size_mean_bytes, self.n_flows, self.min_size_bytes)
        src, dst = hosts[src], hosts[dst]
        bits = np.zeros(routing.topo.n_links)  # bits each link carries
        total = 0.0  # bits all flows carry
        for i in range(self.n_flows):
            links = routing.path(int(src[i]), int(dst[i]), i).links
            flow_bits = routing.wire.wire_bytes(int(sizes[i])) * 8
            bits[list(links)] += flow_bits
            total += flow_bits
        share = bits / total
        busy = share > 0
        total_rate = self.max_load * np.min(routing.topo.bandwidth_bps[busy] / share[busy])
        mean_iat = total / self.n_flows / total_rate
        mu = math.log(mean_iat) - self.sigma**2 / 2
        gaps = rng.lognormal(mu, self.sigma, self.n_flows)
        starts = np.concatenate([[0.0], np.cumsum(gaps[:-1])])
        return [
            Flow(i, int(src[i]), int(dst[i]), int(sizes[i]), float(starts[i]))
            for i in range(self.n_flows)
        ]


@dataclass(kw_only=True, slots=True)
class IncastTraffic:
    """Rounds of k:1 incasts: in each round ``k`` senders start ``size_bytes`` each to one
    receiver together (within ``jitter_s``); a round starts ``gap_s`` after the previous one, so
    rounds overlap when the gap is short. Receivers and senders are drawn per round."""

    rounds: int
    k: int
    size_bytes: int
    gap_s: float
    jitter_s: float = 1e-6
    kind: str = field(default="incast", init=False)

    def flows(self, routing: Routing, seed: int) -> list[Flow]:
        """The flows of this scenario on ``routing``'s topology (deterministic in ``seed``)."""
        rng = np.random.default_rng(seed)
        hosts = np.asarray(routing.topo.hosts)
        if self.k >= len(hosts):
            raise InputError(
                f"a {self.k}:1 incast needs {self.k + 1} hosts, the topology has {len(hosts)}",
                field="k",
            )
        out: list[Flow] = []
        for r in range(self.rounds):
            chosen = rng.choice(len(hosts), self.k + 1, replace=False)
            receiver, senders = int(hosts[chosen[0]]), hosts[chosen[1:]]
            for src in senders:
                start = r * self.gap_s + float(rng.uniform(0, self.jitter_s))
                out.append(Flow(len(out), int(src), receiver, self.size_bytes, start))
        return sorted(out, key=lambda f: (f.start_s, f.id))


__all__ = ["SIZE_KINDS", "IncastTraffic", "OpenLoopTraffic", "SizeDistribution"]
