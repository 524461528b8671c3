"""Grid expansion: a pure function from the grid and a scenario template to Scenario records.

Seeds are data: replicate ``k`` gets the k-th child of ``numpy.random.SeedSequence(root_seed)``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from m4ray.config import GridConfig
from m4ray.errors import InputError, choice_error
from m4ray.sim.failures import GrayFailure
from m4ray.sim.scenario import Scenario


def child_seeds(root_seed: int, count: int) -> list[int]:
    """``count`` independent 32-bit seeds derived from ``root_seed``."""
    return [int(s.generate_state(1)[0]) for s in np.random.SeedSequence(root_seed).spawn(count)]


def expand(
    grid: GridConfig,
    template: Scenario,
    backends: list[str],
    backend_options: dict[str, Any],
    root_seed: int,
) -> list[Scenario]:
    """Every (N, R, seed, backend) combination, in that nesting order."""
    for name in backends:
        if name not in backend_options:
            raise choice_error("backend", name, list(backend_options))
    if not backends:
        raise InputError("no backend selected", field="backends")
    if grid.seeds < 1:
        raise InputError(f"must be >= 1, got {grid.seeds}", field="grid.seeds")
    for key, values in (("grid.n", grid.n), ("grid.r", grid.r)):
        if not values:
            raise InputError("empty list", field=key)
        if len(set(values)) != len(values):
            raise InputError(f"repeated values in {list(values)}", field=key)
    seeds = child_seeds(root_seed, grid.seeds)
    return [
        dataclasses.replace(
            template,
            failure=GrayFailure(
                n_degraded=n,
                reduction=r,
                loss_rate=grid.loss_rate,
                onset_s=grid.onset_s,
                target=grid.target,
            ),
            seed=seed,
            backend=name,
            backend_config=backend_options[name],
        )
        for n in grid.n
        for r in grid.r
        for seed in seeds
        for name in backends
    ]
