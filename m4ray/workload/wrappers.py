"""Performance-variation wrappers: slow GPUs and slow NICs, visible to any consumer.

MLSynth's ``ComputeWrapper`` idea (``reference/workloads.md`` §2.6) without its bugs (§2.8): a
slowdown is extra work in the graph, never a zero-size node, and never a dependency cycle.

* :class:`GpuSlowdown`: behind each matching compute node, a ``<name>.slowdown`` compute node
  (same rank, chained) with ``factor`` × the original FLOPs (relative, so every compute node
  of a matching layer call grows by that fraction), or, with ``seconds``, that much work once
  per matching layer call (behind its first compute node). Matching: ranks, layers,
  microbatches, passes, iterations (``None`` = all); with ``probability`` < 1 each match is
  drawn from ``default_rng(seed)`` in program order.
* :class:`NicSlowdown`: in front of each matching send or collective of the chosen ranks, a
  CPU-side wait of ``seconds`` (parent → wait → communication), as a slow NIC or driver would;
  compute after a send does not wait for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from m4ray.errors import InputError
from m4ray.workload.synth import Builder, Where


def _match(value, allowed) -> bool:
    return allowed is None or value in allowed


@dataclass(kw_only=True, slots=True)
class GpuSlowdown:
    """Extra compute on chosen GPUs / layers / microbatches / passes."""

    ranks: list[int] | None = None
    layers: list[int] | None = None
    microbatches: list[int] | None = None
    passes: list[str] | None = None  # "fwd", "bwd"
    iterations: list[int] | None = None
    factor: float | None = None  # extra FLOPs relative to the node's
    seconds: float | None = None  # or absolute extra time per node
    probability: float = 1.0
    seed: int = 0
    _rng: np.random.Generator = field(init=False, repr=False)
    _done: set = field(init=False, repr=False, default_factory=set)

    def __post_init__(self) -> None:
        if (self.factor is None) == (self.seconds is None):
            raise InputError("give exactly one of factor or seconds", field="gpu_slowdown")
        amount = self.factor if self.factor is not None else self.seconds
        if amount <= 0:
            raise InputError(f"must be > 0, got {amount}", field="gpu_slowdown.factor")
        if not 0 < self.probability <= 1:
            raise InputError("must be in (0, 1]", field="gpu_slowdown.probability")
        for name in self.passes or []:
            if name not in ("fwd", "bwd"):
                raise InputError(f"unknown pass {name!r} (fwd, bwd)", field="gpu_slowdown.passes")
        self._rng = np.random.default_rng(self.seed)

    def install(self, builder: Builder) -> None:
        builder.hooks.append(self._hook)

    def _hook(self, b: Builder, node, where: Where, flops: int) -> None:
        if not (
            _match(where.rank, self.ranks)
            and _match(where.layer, self.layers)
            and _match(where.microbatch, self.microbatches)
            and _match(where.pass_, self.passes)
            and _match(where.iteration, self.iterations)
        ):
            return
        if self.seconds is not None:
            if where in self._done:  # absolute delays apply once per layer call
                return
            self._done.add(where)
        if self.probability < 1 and self._rng.random() >= self.probability:
            return
        hooks, b.hooks = b.hooks, []  # the slowdown node itself is not slowed again
        try:
            if self.factor is not None:
                b.compute(where, self.factor * flops, f"{node.name}.slowdown")
            else:
                extra = self.seconds * b.job.gpu.flops_per_s
                b.compute(where, extra, f"{node.name}.slowdown")
        finally:
            b.hooks = hooks


@dataclass(kw_only=True, slots=True)
class NicSlowdown:
    """A host-side delay before each send / collective of the chosen ranks."""

    ranks: list[int]
    seconds: float
    microbatches: list[int] | None = None
    iterations: list[int] | None = None

    def __post_init__(self) -> None:
        if self.seconds <= 0:
            raise InputError(f"must be > 0, got {self.seconds}", field="nic_slowdown.seconds")

    def install(self, builder: Builder) -> None:
        builder.send_hooks.append(self._hook)

    def _hook(self, rank: int, where: Where) -> float:
        hit = (
            rank in self.ranks
            and _match(where.microbatch, self.microbatches)
            and _match(where.iteration, self.iterations)
        )
        return self.seconds if hit else 0.0


def make(spec: dict) -> GpuSlowdown | NicSlowdown:
    """A wrapper from config: ``{kind: gpu|nic, ...}``."""
    spec = dict(spec)
    kind = spec.pop("kind", None)
    if kind == "gpu":
        return GpuSlowdown(**spec)
    if kind == "nic":
        return NicSlowdown(**spec)
    raise InputError(f"unknown wrapper kind {kind!r} (gpu, nic)", field="wrappers.kind")


__all__ = ["GpuSlowdown", "NicSlowdown", "make"]
