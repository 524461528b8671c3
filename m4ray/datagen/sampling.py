"""Config ranges and the draws made from them, shared by the scenario families of m4's data
(:mod:`m4ray.datagen.families`) and m3's (:mod:`m4ray.m3.datagen`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from m4ray.datagen.traffic import SizeDistribution
from m4ray.errors import InputError
from m4ray.sim.ns3.cc import CCS


def check_range(
    values, name: str, *, lo: float | None = None, hi: float | None = None, open_=False
):
    """Check a ``[low, high]`` config range (inclusive); ``open_`` excludes ``lo``/``hi``."""
    if not isinstance(values, list | tuple) or len(values) != 2:
        raise InputError(f"expected [low, high], got {values!r}", field=name)
    a, b = values
    if a > b:
        raise InputError(f"low {a} > high {b}", field=name)
    bad_lo = lo is not None and (a <= lo if open_ else a < lo)
    bad_hi = hi is not None and (b >= hi if open_ else b > hi)
    if bad_lo or bad_hi:
        bounds = f"({lo}, {hi})" if open_ else f"[{lo}, {hi}]"
        raise InputError(f"{list(values)} is outside {bounds}", field=name)


def uniform(rng: np.random.Generator, bounds) -> float:
    """A uniform draw from ``[low, high]`` (``low`` itself when the range is one value)."""
    return float(rng.uniform(bounds[0], bounds[1])) if bounds[0] < bounds[1] else float(bounds[0])


def integer(rng: np.random.Generator, bounds) -> int:
    """A uniform integer from ``[low, high]``, both included."""
    return int(rng.integers(int(bounds[0]), int(bounds[1]) + 1))


def log_uniform(rng: np.random.Generator, bounds) -> float:
    """A log-uniform draw from ``[low, high]``."""
    return math.exp(uniform(rng, [math.log(bounds[0]), math.log(bounds[1])]))


def size_distribution(name: str, spec: Any) -> SizeDistribution:
    """A config's flow-size distribution (a mapping, or one already built); ``kind`` defaults
    to ``name``."""
    if isinstance(spec, SizeDistribution):
        return spec
    spec = dict(spec or {})
    spec.setdefault("kind", name)
    try:
        return SizeDistribution(**spec)
    except TypeError as err:
        raise InputError(f"size distribution '{name}': {err}", field="sizes") from None


def open_loop(rng: np.random.Generator, family) -> dict[str, Any]:
    """An open-loop traffic's parameters drawn from a family's ranges (``sizes``, ``n_flows``,
    ``size_mean_bytes``, ``min_size_bytes``, ``arrival_sigma``, ``max_load``), in this order:
    the size distribution's name, the flow count, the mean size, the arrival σ, the load."""
    size_name = sorted(family.sizes)[int(rng.integers(len(family.sizes)))]
    return {
        "n_flows": integer(rng, family.n_flows),
        "size_name": size_name,
        "size": family.sizes[size_name],
        "size_mean_bytes": round(log_uniform(rng, family.size_mean_bytes), 1),
        "min_size_bytes": family.min_size_bytes,
        "sigma": round(uniform(rng, family.arrival_sigma), 4),
        "max_load": round(uniform(rng, family.max_load), 4),
    }


@dataclass(kw_only=True, slots=True)
class CcRanges:
    """The congestion controls a family draws from (uniformly; one listed: no draw) and the
    ranges of their parameters, m4's evaluation ranges (reference/m4.md §10.4): DCQCN's K_min /
    K_max in KB per 25 Gbit/s of link rate (RED, P_max 0.2), HPCC's η and AI (Mbit/s), TIMELY's
    thresholds (µs). DCTCP's are the family's own network fields."""

    ccs: list[str] = field(default_factory=lambda: ["dctcp"])
    dcqcn_k_min_kb: list[float] = field(default_factory=lambda: [10.0, 30.0])
    dcqcn_k_max_kb: list[float] = field(default_factory=lambda: [30.0, 50.0])
    hpcc_eta: list[float] = field(default_factory=lambda: [0.70, 0.95])
    hpcc_ai_mbps: list[float] = field(default_factory=lambda: [50.0, 100.0])
    timely_t_low_us: list[float] = field(default_factory=lambda: [40.0, 60.0])
    timely_t_high_us: list[float] = field(default_factory=lambda: [100.0, 150.0])

    def check(self, at: str) -> None:
        if not self.ccs or set(self.ccs) - set(CCS):
            raise InputError(f"name congestion controls among {', '.join(CCS)}", field=f"{at}.ccs")
        for name in ("dcqcn_k_min_kb", "dcqcn_k_max_kb", "timely_t_low_us", "timely_t_high_us"):
            check_range(getattr(self, name), f"{at}.{name}", lo=0, open_=True)
        check_range(self.hpcc_eta, f"{at}.hpcc_eta", lo=0, hi=1)
        check_range(self.hpcc_ai_mbps, f"{at}.hpcc_ai_mbps", lo=0)
        if self.dcqcn_k_max_kb[0] < self.dcqcn_k_min_kb[1]:
            raise InputError("must lie above dcqcn_k_min_kb", field=f"{at}.dcqcn_k_max_kb")
        if self.timely_t_high_us[0] <= self.timely_t_low_us[1]:
            raise InputError("must lie above timely_t_low_us", field=f"{at}.timely_t_high_us")

    def draw(self, rng: np.random.Generator) -> tuple[str, dict[str, Any] | None]:
        """A congestion control and its ``cc_params`` (None for DCTCP)."""
        ccs = self.ccs
        cc = ccs[0] if len(ccs) == 1 else ccs[int(rng.integers(len(ccs)))]
        if cc == "dcqcn":  # K ∝ link rate (m4's rule: k · bw / 25 Gbit/s), 1 to 400 Gbit/s
            k_min, k_max = uniform(rng, self.dcqcn_k_min_kb), uniform(rng, self.dcqcn_k_max_kb)
            return cc, {
                "k_min_bytes": [[1e9, k_min * 1000 / 25], [400e9, k_min * 1000 * 16]],
                "k_max_bytes": [[1e9, k_max * 1000 / 25], [400e9, k_max * 1000 * 16]],
            }
        if cc == "hpcc":
            eta = round(uniform(rng, self.hpcc_eta), 4)
            return cc, {
                "target_utilization": eta,
                "rate_ai_bps": uniform(rng, self.hpcc_ai_mbps) * 1e6,
            }
        if cc == "timely":
            return cc, {
                "t_low_s": uniform(rng, self.timely_t_low_us) * 1e-6,
                "t_high_s": uniform(rng, self.timely_t_high_us) * 1e-6,
            }
        return cc, None


__all__ = [
    "CcRanges",
    "check_range",
    "integer",
    "log_uniform",
    "open_loop",
    "size_distribution",
    "uniform",
]
