"""Config ranges and the draws made from them, shared by the scenario families of m4's data
(:mod:`m4ray.datagen.families`) and m3's (:mod:`m4ray.m3.datagen`)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from m4ray.datagen.traffic import SizeDistribution
from m4ray.errors import InputError


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


__all__ = ["check_range", "integer", "log_uniform", "open_loop", "size_distribution", "uniform"]
