"""What a synthetic training job is: the model, its parallelism, the GPUs, and the schedule.

MLSynth's input (``reference/workloads.md`` §2.1) with its accounting bugs fixed (§2.8): every
per-rank quantity uses the per-rank microbatch ``nb = B / (dp · m)`` and divides matrix work by
``tp``. Every constraint is checked up front and a violation names the field and the rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from m4ray.errors import InputError


class Schedule(StrEnum):
    GPIPE = "gpipe"  # all forwards, then all backwards
    ONE_F_ONE_B = "1f1b"  # warm-up forwards, alternate one forward / one backward, drain


@dataclass(kw_only=True, slots=True)
class ModelSpec:
    """A decoder-only Transformer (optionally MoE). ``batch_size`` is the global batch."""

    name: str = "gpt"
    num_layers: int = 4
    hidden_size: int = 1024
    num_heads: int = 16
    sequence_len: int = 1024
    vocab_size: int = 32000
    batch_size: int = 8
    num_microbatches: int = 2
    bytes_per_val: int = 2
    scale: float = 1.0  # multiplies every FLOP count and byte size
    num_experts: int = 0  # 0 = dense; otherwise every ``moe_every``-th layer is MoE
    top_k: int = 1
    moe_every: int = 1
    capacity_factor: float = 1.25  # all-to-all bytes per routed token, as MLSynth
    embedding: bool = True  # embedding on the first stage and LM head on the last

    @property
    def moe(self) -> bool:
        return self.num_experts > 0


@dataclass(kw_only=True, slots=True)
class ParallelSpec:
    """Degrees of data, tensor, pipeline and expert parallelism (``ep`` divides ``dp``)."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1
    schedule: Schedule = Schedule.GPIPE

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp

    def rank(self, dp: int, stage: int, tp: int) -> int:
        """MLSynth / Megatron order: tensor shards fastest, then stages, then replicas."""
        return dp * self.pp * self.tp + stage * self.tp + tp


@dataclass(kw_only=True, slots=True)
class GpuSpec:
    """Achieved compute rate: ``peak_tflops · efficiency`` FLOP/s for every compute node."""

    peak_tflops: float = 312.0  # A100 dense bf16
    efficiency: float = 0.5

    @property
    def flops_per_s(self) -> float:
        return self.peak_tflops * 1e12 * self.efficiency


@dataclass(kw_only=True, slots=True)
class JobSpec:
    """One synthetic job: ``iterations`` training steps of ``model`` under ``parallel``."""

    model: ModelSpec
    parallel: ParallelSpec
    gpu: GpuSpec
    iterations: int = 1
    n_gpus: int | None = None  # the cluster size, when given it must equal dp · tp · pp

    def __post_init__(self) -> None:
        for name in ("model", "parallel", "gpu"):
            value = getattr(self, name)
            if isinstance(value, dict):
                cls = {"model": ModelSpec, "parallel": ParallelSpec, "gpu": GpuSpec}[name]
                setattr(self, name, cls(**value))
        if not isinstance(self.parallel.schedule, Schedule):
            try:
                self.parallel.schedule = Schedule(self.parallel.schedule)
            except ValueError:
                raise InputError(
                    f"unknown schedule {self.parallel.schedule!r}; use one of "
                    f"{[s.value for s in Schedule]}",
                    field="parallel.schedule",
                ) from None
        check(self)

    @property
    def microbatch(self) -> int:
        """Per-rank microbatch size ``B / (dp · m)``."""
        return self.model.batch_size // (self.parallel.dp * self.model.num_microbatches)


def _positive(value, field: str) -> None:
    if not value > 0:
        raise InputError(f"must be > 0, got {value}", field=field)


def check(job: JobSpec) -> None:
    """Every constraint between model, parallelism and cluster, each with its own message."""
    m, p = job.model, job.parallel
    for name in (
        "num_layers",
        "hidden_size",
        "num_heads",
        "sequence_len",
        "vocab_size",
        "batch_size",
        "num_microbatches",
        "bytes_per_val",
        "scale",
    ):
        _positive(getattr(m, name), f"model.{name}")
    for name in ("dp", "tp", "pp", "ep"):
        _positive(getattr(p, name), f"parallel.{name}")
    _positive(job.iterations, "iterations")
    _positive(job.gpu.flops_per_s, "gpu.peak_tflops")
    if m.hidden_size % m.num_heads:
        raise InputError(
            f"hidden_size {m.hidden_size} is not divisible by num_heads {m.num_heads}",
            field="model.num_heads",
        )
    if m.num_heads % p.tp:
        raise InputError(
            f"tp={p.tp} does not divide num_heads={m.num_heads} (each tensor shard owns whole "
            "attention heads)",
            field="parallel.tp",
        )
    if m.hidden_size % p.tp:
        raise InputError(
            f"tp={p.tp} does not divide hidden_size={m.hidden_size}", field="parallel.tp"
        )
    if p.pp > m.num_layers:
        raise InputError(
            f"pp={p.pp} is larger than num_layers={m.num_layers} (every stage needs a layer)",
            field="parallel.pp",
        )
    if m.num_layers % p.pp:
        raise InputError(
            f"pp={p.pp} does not divide num_layers={m.num_layers} (stages get equal layers)",
            field="parallel.pp",
        )
    if m.batch_size % (p.dp * m.num_microbatches):
        raise InputError(
            f"batch_size={m.batch_size} is not divisible by dp × num_microbatches = "
            f"{p.dp} × {m.num_microbatches} (each replica splits its share into equal "
            "microbatches)",
            field="model.batch_size",
        )
    if p.ep > 1 and not m.moe:
        raise InputError(f"ep={p.ep} needs an MoE model (num_experts > 0)", field="parallel.ep")
    if p.dp % p.ep:
        raise InputError(
            f"ep={p.ep} does not divide dp={p.dp} (expert groups are carved out of data-parallel "
            "replicas)",
            field="parallel.ep",
        )
    if m.moe:
        if m.num_experts % p.ep:
            raise InputError(
                f"ep={p.ep} does not divide num_experts={m.num_experts}", field="parallel.ep"
            )
        if not 1 <= m.top_k <= m.num_experts:
            raise InputError(
                f"top_k={m.top_k} must be in 1..num_experts={m.num_experts}", field="model.top_k"
            )
        _positive(m.moe_every, "model.moe_every")
    if job.n_gpus is not None and job.n_gpus != p.world:
        raise InputError(
            f"dp × tp × pp = {p.dp} × {p.tp} × {p.pp} = {p.world} does not equal the "
            f"{job.n_gpus} GPUs of the cluster",
            field="parallel",
        )


__all__ = ["GpuSpec", "JobSpec", "ModelSpec", "ParallelSpec", "Schedule", "check"]
