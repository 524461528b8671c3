"""MLSynth-style workload synthesis: Layer → Model → Orchestrator → Wrapper.

* **Layers** (:class:`TransformerLayer`, :class:`MoELayer`, :class:`EmbeddingLayer`,
  :class:`LMHead`) know their FLOPs and communication for one microbatch on one rank and emit
  them through a :class:`Builder`, which chains each rank's nodes in program order.
* The **model** (:func:`build_model`) is the list of layers of each pipeline stage.
* The **orchestrator** (:func:`synthesize`) maps (replica, stage, shard) to ranks, runs the
  pipeline schedule (GPipe or 1F1B) per stage with point-to-point activations and gradients,
  and ends each iteration with the data-parallel gradient all-reduces.
* **Wrappers** (:mod:`m4ray.workload.wrappers`) hook into the builder to add slowdowns.

Formulas (``reference/workloads.md`` §2.3, per rank and microbatch, ``nb = B/(dp·m)``, ``b``
bytes per value, everything × ``scale``): attention forward ``(8·nb·S·d² + 4·nb·S²·d)/tp``
FLOPs, MLP forward ``16·nb·S·d²/tp``, backward 2× forward; tensor-parallel all-reduce
``b·nb·S·d`` bytes after attention and after the MLP in both passes; pipeline message
``b·nb·S·d``; MoE: router ``2·nb·S·d·E`` FLOPs, expert MLP ``16·nb·S·d²·k/tp`` (tokens spread
evenly over the expert-parallel group), all-to-all ``capacity·b·nb·S·d·k`` bytes before and
after the experts in both passes; LM head ``2·nb·S·d·V/tp``. Gradient all-reduce: the stage's
dense parameters ``/tp`` over the data-parallel group, expert parameters over the expert-data
group (replicas holding the same experts).

Compute durations are FLOPs over the GPU's achieved rate, rounded to whole nanoseconds, so a
Chakra round trip (which stores nanoseconds) gives back the identical DAG.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from m4ray.fingerprint import added_field
from m4ray.sim.lockstep import SymmetricProgram
from m4ray.sim.workload import (
    Collective,
    CollectiveKind,
    Compute,
    Node,
    Recv,
    Send,
    Workload,
    scale_messages,
)
from m4ray.workload.spec import JobSpec, Schedule

FWD, BWD = "fwd", "bwd"


@dataclass(frozen=True, slots=True)
class Where:
    """What a compute node belongs to (wrappers match on it)."""

    rank: int
    layer: int  # global layer index; -1 embedding, num_layers = LM head
    microbatch: int
    pass_: str
    iteration: int


@dataclass(slots=True)
class Builder:
    """Creates nodes with unique ids and chains each rank's program order.

    ``hooks`` see every compute node (after it is added) and may append nodes behind it;
    ``send_hooks`` see every send or collective before it is added and return a host-side delay
    in seconds (0 for none) that a CPU wait node puts in front of it.
    """

    job: JobSpec
    nodes: list[Node] = field(default_factory=list)
    groups: dict[tuple[int, ...], int] = field(default_factory=dict)
    last: dict[int, int] = field(default_factory=dict)  # rank -> last node of its chain
    hooks: list[Callable[[Builder, Compute, Where, int], None]] = field(default_factory=list)
    send_hooks: list[Callable[[int, Where], float]] = field(default_factory=list)
    meta: dict[int, Where] = field(default_factory=dict)
    gate: dict[int, tuple[int, ...]] = field(default_factory=dict)  # rank -> deps of its next node
    _ids: itertools.count = field(default_factory=itertools.count)

    def next_id(self) -> int:
        return next(self._ids)

    def seconds(self, flops: float) -> float:
        return round(flops / self.job.gpu.flops_per_s * 1e9) / 1e9

    def _deps(self, rank: int) -> tuple[int, ...]:
        """The rank's last node, plus what :attr:`gate` holds for it (consumed here)."""
        deps = ([self.last[rank]] if rank in self.last else []) + list(self.gate.pop(rank, ()))
        return tuple(dict.fromkeys(deps))

    def compute(self, where: Where, flops: float, name: str) -> Compute:
        flops = round(flops)
        node = Compute(
            id=self.next_id(),
            rank=where.rank,
            duration_s=self.seconds(flops),
            deps=self._deps(where.rank),
            name=name,
            num_ops=flops,
        )
        self.nodes.append(node)
        self.meta[node.id] = where
        self.last[where.rank] = node.id
        for hook in self.hooks:
            hook(self, node, where, flops)
        return node

    def _nic_wait(self, where: Where, name: str) -> tuple[int, ...] | None:
        """A CPU wait in front of a communication node when a send hook asks for one: its id
        (the communication's dependency), or None."""
        delay = sum(hook(where.rank, where) for hook in self.send_hooks)
        if delay <= 0:
            return None
        deps = (self.last[where.rank],) if where.rank in self.last else ()
        node = Compute(
            id=self.next_id(),
            rank=where.rank,
            duration_s=round(delay * 1e9) / 1e9,
            deps=deps,
            name=f"{name}.nic_wait",
            cpu=True,
        )
        self.nodes.append(node)
        return (node.id,)

    def collective(
        self, where: Where, kind: CollectiveKind, size: float, group: tuple[int, ...], name: str
    ) -> Collective:
        wait = self._nic_wait(where, name)
        if wait:
            self.last[where.rank] = wait[0]
        self.groups.setdefault(group, len(self.groups) + 1)
        node = Collective(
            id=self.next_id(),
            rank=where.rank,
            kind=kind,
            size_bytes=max(1, round(size)),
            group=group,
            deps=self._deps(where.rank),
            name=name,
        )
        self.nodes.append(node)
        self.last[where.rank] = node.id
        return node

    def send(self, where: Where, peer: int, size: float, tag: int, name: str) -> Send:
        """A send behind the rank's last node; the chain does not wait for it."""
        wait = self._nic_wait(where, name)
        node = Send(
            id=self.next_id(),
            rank=where.rank,
            peer=peer,
            size_bytes=max(1, round(size)),
            tag=tag,
            deps=wait or ((self.last[where.rank],) if where.rank in self.last else ()),
            name=name,
        )
        self.nodes.append(node)
        return node

    def recv(self, rank: int, peer: int, size: float, tag: int, name: str) -> Recv:
        """A receive with no dependencies (posted early); the caller makes compute wait on it."""
        node = Recv(
            id=self.next_id(),
            rank=rank,
            peer=peer,
            size_bytes=max(1, round(size)),
            tag=tag,
            name=name,
        )
        self.nodes.append(node)
        return node


# ---------------------------------------------------------------------------------- layers
@dataclass(frozen=True, slots=True)
class Context:
    """Where a layer runs: its rank's tensor-parallel and expert-parallel groups."""

    tp_group: tuple[int, ...]
    ep_group: tuple[int, ...]


class Layer:
    """One layer's work for one microbatch on one rank."""

    index: int

    def forward(self, b: Builder, where: Where, ctx: Context) -> None: ...

    def backward(self, b: Builder, where: Where, ctx: Context) -> None: ...

    def dense_params(self) -> float:
        return 0.0

    def expert_params(self) -> float:
        return 0.0


def _tp_all_reduce(b: Builder, where: Where, ctx: Context, size: float, name: str) -> None:
    if len(ctx.tp_group) > 1:
        b.collective(where, CollectiveKind.ALL_REDUCE, size, ctx.tp_group, name)


@dataclass(slots=True)
class TransformerLayer(Layer):
    """Attention + MLP, Megatron tensor parallelism (two all-reduces per pass)."""

    index: int
    job: JobSpec

    def _sizes(self) -> tuple[float, float, float]:
        m, tp = self.job.model, self.job.parallel.tp
        nb, s, d, sc = self.job.microbatch, m.sequence_len, m.hidden_size, m.scale
        attention = sc * (8 * nb * s * d * d + 4 * nb * s * s * d) / tp
        mlp = sc * 16 * nb * s * d * d / tp
        activation = sc * m.bytes_per_val * nb * s * d
        return attention, mlp, activation

    def _mlp_forward(self, b, where, ctx, mlp, activation) -> None:
        b.compute(where, mlp, f"L{self.index}.mlp.fwd")
        _tp_all_reduce(b, where, ctx, activation, f"L{self.index}.mlp.fwd.tp_ar")

    def _mlp_backward(self, b, where, ctx, mlp, activation) -> None:
        b.compute(where, 2 * mlp, f"L{self.index}.mlp.bwd")
        _tp_all_reduce(b, where, ctx, activation, f"L{self.index}.mlp.bwd.tp_ar")

    def forward(self, b, where, ctx) -> None:
        attention, mlp, activation = self._sizes()
        b.compute(where, attention, f"L{self.index}.attn.fwd")
        _tp_all_reduce(b, where, ctx, activation, f"L{self.index}.attn.fwd.tp_ar")
        self._mlp_forward(b, where, ctx, mlp, activation)

    def backward(self, b, where, ctx) -> None:
        attention, mlp, activation = self._sizes()
        self._mlp_backward(b, where, ctx, mlp, activation)
        b.compute(where, 2 * attention, f"L{self.index}.attn.bwd")
        _tp_all_reduce(b, where, ctx, activation, f"L{self.index}.attn.bwd.tp_ar")

    def dense_params(self) -> float:
        d = self.job.model.hidden_size
        return (12 * d * d + 13 * d) / self.job.parallel.tp


@dataclass(slots=True)
class MoELayer(TransformerLayer):
    """Attention, a top-k router, and expert MLPs behind all-to-alls (expert parallelism)."""

    def _expert(self) -> tuple[float, float, float]:
        m, tp = self.job.model, self.job.parallel.tp
        nb, s, d, sc = self.job.microbatch, m.sequence_len, m.hidden_size, m.scale
        router = sc * 2 * nb * s * d * m.num_experts
        experts = sc * 16 * nb * s * d * d * m.top_k / tp
        a2a = sc * m.capacity_factor * m.bytes_per_val * nb * s * d * m.top_k
        return router, experts, a2a

    def _a2a(self, b, where, ctx, size, name) -> None:
        if len(ctx.ep_group) > 1:
            b.collective(where, CollectiveKind.ALL_TO_ALL, size, ctx.ep_group, name)

    def _mlp_forward(self, b, where, ctx, mlp, activation) -> None:
        router, experts, a2a = self._expert()
        b.compute(where, router, f"L{self.index}.router.fwd")
        self._a2a(b, where, ctx, a2a, f"L{self.index}.dispatch.fwd")
        b.compute(where, experts, f"L{self.index}.experts.fwd")
        self._a2a(b, where, ctx, a2a, f"L{self.index}.combine.fwd")
        _tp_all_reduce(b, where, ctx, activation, f"L{self.index}.moe.fwd.tp_ar")

    def _mlp_backward(self, b, where, ctx, mlp, activation) -> None:
        router, experts, a2a = self._expert()
        self._a2a(b, where, ctx, a2a, f"L{self.index}.combine.bwd")
        b.compute(where, 2 * experts, f"L{self.index}.experts.bwd")
        self._a2a(b, where, ctx, a2a, f"L{self.index}.dispatch.bwd")
        b.compute(where, 2 * router, f"L{self.index}.router.bwd")
        _tp_all_reduce(b, where, ctx, activation, f"L{self.index}.moe.bwd.tp_ar")

    def dense_params(self) -> float:
        d = self.job.model.hidden_size
        return (4 * d * d + d * self.job.model.num_experts) / self.job.parallel.tp

    def expert_params(self) -> float:
        m, p = self.job.model, self.job.parallel
        return m.num_experts // p.ep * 8 * m.hidden_size**2 / p.tp


@dataclass(slots=True)
class EmbeddingLayer(Layer):
    """Token + position lookup on the first stage (vocab-parallel: one all-reduce per pass)."""

    index: int
    job: JobSpec

    def _sizes(self) -> tuple[float, float]:
        m = self.job.model
        tokens = self.job.microbatch * m.sequence_len
        return m.scale * tokens * m.hidden_size, m.scale * m.bytes_per_val * tokens * m.hidden_size

    def forward(self, b, where, ctx) -> None:
        flops, activation = self._sizes()
        b.compute(where, flops, "embedding.fwd")
        _tp_all_reduce(b, where, ctx, activation, "embedding.fwd.tp_ar")

    def backward(self, b, where, ctx) -> None:
        flops, _ = self._sizes()
        b.compute(where, flops, "embedding.bwd")

    def dense_params(self) -> float:
        m = self.job.model
        return (m.vocab_size + m.sequence_len) * m.hidden_size / self.job.parallel.tp


@dataclass(slots=True)
class LMHead(Layer):
    """The output projection to the vocabulary on the last stage (weights tied, no params)."""

    index: int
    job: JobSpec

    def _flops(self) -> float:
        m = self.job.model
        tokens = self.job.microbatch * m.sequence_len
        return m.scale * 2 * tokens * m.hidden_size * m.vocab_size / self.job.parallel.tp

    def forward(self, b, where, ctx) -> None:
        b.compute(where, self._flops(), "lm_head.fwd")

    def backward(self, b, where, ctx) -> None:
        b.compute(where, 2 * self._flops(), "lm_head.bwd")


def build_model(job: JobSpec) -> list[list[Layer]]:
    """Layers per pipeline stage: embedding on the first, LM head on the last."""
    m, p = job.model, job.parallel
    per_stage = m.num_layers // p.pp
    stages: list[list[Layer]] = []
    for stage in range(p.pp):
        layers: list[Layer] = [EmbeddingLayer(-1, job)] if stage == 0 and m.embedding else []
        for i in range(stage * per_stage, (stage + 1) * per_stage):
            moe = m.moe and i % m.moe_every == m.moe_every - 1
            layers.append(MoELayer(i, job) if moe else TransformerLayer(i, job))
        if stage == p.pp - 1 and m.embedding:
            layers.append(LMHead(m.num_layers, job))
        stages.append(layers)
    return stages


# ---------------------------------------------------------------------------------- schedule
def schedule(kind: Schedule, stage: int, stages: int, microbatches: int) -> list[tuple[str, int]]:
    """The (pass, microbatch) order of one pipeline stage."""
    m = microbatches
    if kind == Schedule.GPIPE:
        return [(FWD, i) for i in range(m)] + [(BWD, i) for i in range(m)]
    warmup = min(stages - stage - 1, m)
    order = [(FWD, i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [(FWD, warmup + i), (BWD, i)]
    order += [(BWD, i) for i in range(m - warmup, m)]
    return order


def p2p_tag(iteration: int, direction: str, microbatch: int, microbatches: int) -> int:
    """Distinct tags per (iteration, direction, microbatch) (MLSynth uses 0 everywhere)."""
    return (iteration * 2 + (direction == BWD)) * microbatches + microbatch


def synthesize(job: JobSpec, wrappers: list | None = None) -> Workload:
    """The per-rank DAG of ``job.iterations`` training iterations."""
    m, p = job.model, job.parallel
    b = Builder(job)
    for wrapper in wrappers or []:
        wrapper.install(b)
    stages = build_model(job)
    nb, s, d = job.microbatch, m.sequence_len, m.hidden_size
    p2p_bytes = m.scale * m.bytes_per_val * nb * s * d
    ranks = [
        (rank := p.rank(r, stage, t), r, stage, t)
        for r in range(p.dp)
        for stage in range(p.pp)
        for t in range(p.tp)
    ]
    ctx = {}
    for rank, r, stage, t in ranks:
        tp_group = tuple(p.rank(r, stage, x) for x in range(p.tp))
        first = r // p.ep * p.ep
        ep_group = tuple(p.rank(x, stage, t) for x in range(first, first + p.ep))
        ctx[rank] = Context(tp_group, ep_group)
    for it in range(job.iterations):
        for rank, r, stage, t in ranks:
            layers = stages[stage]
            for pass_, mb in schedule(p.schedule, stage, p.pp, m.num_microbatches):
                where = Where(rank, -2, mb, pass_, it)
                # the pass's first node waits for the activation (gradient) it receives
                if pass_ == FWD and stage > 0:
                    peer = p.rank(r, stage - 1, t)
                    tag = p2p_tag(it, FWD, mb, m.num_microbatches)
                    b.gate[rank] = (b.recv(rank, peer, p2p_bytes, tag, f"mb{mb}.fwd.recv").id,)
                if pass_ == BWD and stage < p.pp - 1:
                    peer = p.rank(r, stage + 1, t)
                    tag = p2p_tag(it, BWD, mb, m.num_microbatches)
                    b.gate[rank] = (b.recv(rank, peer, p2p_bytes, tag, f"mb{mb}.bwd.recv").id,)
                ordered = layers if pass_ == FWD else list(reversed(layers))
                for layer in ordered:
                    at = Where(rank, layer.index, mb, pass_, it)
                    (layer.forward if pass_ == FWD else layer.backward)(b, at, ctx[rank])
                if pass_ == FWD and stage < p.pp - 1:
                    peer = p.rank(r, stage + 1, t)
                    tag = p2p_tag(it, FWD, mb, m.num_microbatches)
                    b.send(where, peer, p2p_bytes, tag, f"mb{mb}.fwd.send")
                if pass_ == BWD and stage > 0:
                    peer = p.rank(r, stage - 1, t)
                    tag = p2p_tag(it, BWD, mb, m.num_microbatches)
                    b.send(where, peer, p2p_bytes, tag, f"mb{mb}.bwd.send")
            where = Where(rank, -2, -1, "grad", it)
            bytes_per = m.scale * m.bytes_per_val
            if p.dp > 1:
                dense = sum(layer.dense_params() for layer in layers) * bytes_per
                dp_group = tuple(p.rank(x, stage, t) for x in range(p.dp))
                b.collective(where, CollectiveKind.ALL_REDUCE, dense, dp_group, "grad.dp_ar")
            experts = sum(layer.expert_params() for layer in layers) * bytes_per
            if experts and p.dp // p.ep > 1:
                group = tuple(p.rank(x, stage, t) for x in range(r % p.ep, p.dp, p.ep))
                b.collective(where, CollectiveKind.ALL_REDUCE, experts, group, "grad.edp_ar")
    name = (
        f"{m.name}_{p.dp}dp_{p.tp}tp_{p.pp}pp_{p.ep}ep_{m.batch_size}B_{m.num_microbatches}m_"
        f"{p.schedule.value}"
    )
    return Workload(n_ranks=p.world, nodes=b.nodes, name=name)


@dataclass(kw_only=True, slots=True)
class SyntheticWorkloadSpec:
    """Config form (``workload=synthetic``): synthesize a job and replay it on any backend."""

    model: dict = field(default_factory=dict)
    parallel: dict = field(default_factory=dict)
    gpu: dict = field(default_factory=dict)
    iterations: int = 1
    wrappers: list[dict] = field(default_factory=list)  # {kind: gpu|nic, ...}
    scale: float = 1.0  # multiplies message sizes after synthesis (the sweep's knob)
    # replay by rank symmetry (m4ray.sim.lockstep): jobs whose ranks all run the same program
    lockstep: bool = added_field(False, "lockstep replay (2026-11)")

    def job(self) -> JobSpec:
        return JobSpec(
            model=dict(self.model),
            parallel=dict(self.parallel),
            gpu=dict(self.gpu),
            iterations=self.iterations,
        )

    def build(self, n_hosts: int | None = None) -> Workload:
        """The synthesized DAG (its size comes from the parallel layout, not ``n_hosts``)."""
        from m4ray.workload.wrappers import make

        workload = synthesize(self.job(), [make(w) for w in self.wrappers])
        return scale_messages(workload, self.scale)

    def lockstep_program(self, n_hosts: int | None = None) -> SymmetricProgram:
        """The lockstep replay's program: the DAG's, when every rank runs the same one."""
        return SymmetricProgram(self.build(n_hosts))


def compute_seconds(workload: Workload) -> dict[int, float]:
    """GPU compute seconds per rank (for checks and reports)."""
    out: dict[int, float] = defaultdict(float)
    for node in workload.nodes:
        if isinstance(node, Compute) and not node.cpu:
            out[node.rank] += node.duration_s
    return dict(out)


__all__ = [
    "BWD",
    "FWD",
    "Builder",
    "EmbeddingLayer",
    "LMHead",
    "MoELayer",
    "SyntheticWorkloadSpec",
    "TransformerLayer",
    "Where",
    "build_model",
    "compute_seconds",
    "p2p_tag",
    "schedule",
    "synthesize",
]
