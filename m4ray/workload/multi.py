"""Several jobs on one cluster: each job any workload m4ray reads, placed on its own GPUs, all
replayed together over one network backend.

A :class:`MultiJobSpec` is a workload spec like any other (``build(n_hosts)`` gives one DAG), so
every backend and the sweeps' scenario machinery run it unchanged. Its DAG is the jobs' DAGs side
by side in the cluster's GPU namespace: job ``j``'s rank ``r`` becomes GPU ``placement_j[r]``,
node ids are shifted past the jobs before it, and collective groups become GPU lists, so the
collective layer decomposes each group on the GPUs and servers it really occupies. Jobs share
nothing but the network: their flows meet wherever their paths do.

Placement (``JobEntry.placement``), settled in job order over the GPUs still free, explicit
placements first:

* ``packed`` — the free GPUs in index order, so a job fills servers one after another;
* ``spread`` — round-robin over the servers that still have free GPUs (rank 0 on the first such
  server, rank 1 on the next, ...): consecutive ranks land on different servers;
* ``random`` — ``gpus`` of the free GPUs drawn with the job's ``seed``, in index order;
* ``random_servers`` — whole servers with every GPU free, drawn with the job's ``seed`` (a
  scheduler that hands out nodes; what SimAI's rings need: every server holds the same share),
  the last one partly if ``gpus`` is not a multiple of the server size;
* a list of GPU indices — exactly those.

``start_s`` delays the job's first operation on each of its GPUs (a compute node of that length,
named ``start``); ``iterations`` repeats its DAG, each GPU starting iteration ``i + 1`` when its
own part of iteration ``i`` has ended (no barrier across GPUs, as a real training step proceeds).
Lockstep replay is refused by name: jobs that share links are not symmetric. A flow's ECMP
choice hashes (its source, its destination, its number among that pair's flows), as a switch
hashes a connection's addresses and ports, not the replay's global flow id: so a job takes the
same paths alone and among neighbours, and a neighbour slowdown is contention, not a reshuffle.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from m4ray.errors import InputError
from m4ray.sim.workload import Collective, Compute, Node, Recv, Send, Workload, scale_messages

POLICIES = ("packed", "spread", "random", "random_servers")


@dataclass(kw_only=True, slots=True)
class JobEntry:
    """One job of a :class:`MultiJobSpec` (module docstring): a workload spec, its GPU count,
    a placement policy or GPU list, a seed for ``random``, a start offset (s) and iterations."""

    name: str
    workload: Any
    gpus: int
    placement: Any = "packed"  # a policy name or a list of GPU indices
    seed: int = 0
    start_s: float = 0.0
    iterations: int = 1

    def __post_init__(self) -> None:
        if not hasattr(self.workload, "build"):
            raise InputError(
                f"job '{self.name}': its workload is not a workload spec (give it a _target_)",
                field="workload",
            )
        if not isinstance(self.placement, str):
            self.placement = tuple(int(g) for g in self.placement)


@dataclass(kw_only=True, slots=True)
class MultiJobSpec:
    """Jobs replayed at once on one cluster (module docstring); ``gpus_per_server`` is the
    cluster's (the placement policies' servers)."""

    jobs: list[JobEntry] = field(default_factory=list)
    gpus_per_server: int = 8
    lockstep: bool = False  # the replays read it: always refused (module docstring)
    pair_keys: bool = True  # ECMP keys per host pair, not per global flow id (Replay)
    scale: float = 1.0  # multiplies every job's message sizes (the house's workload.scale)

    def __post_init__(self) -> None:
        self.jobs = [j if isinstance(j, JobEntry) else JobEntry(**j) for j in self.jobs]
        if self.lockstep:
            raise InputError(
                "jobs that share a network are not rank-symmetric: no lockstep",
                field="workload.lockstep",
            )
        if self.gpus_per_server < 1:
            raise InputError(f"must be >= 1, got {self.gpus_per_server}", field="gpus_per_server")
        names = [j.name for j in self.jobs]
        for i, job in enumerate(self.jobs):
            where = f"workload.jobs[{i}]"
            if job.name in names[:i]:
                raise InputError(f"job name '{job.name}' is used twice", field=f"{where}.name")
            if job.gpus < 1:
                raise InputError(
                    f"job '{job.name}': needs >= 1 GPU, got {job.gpus}", field=f"{where}.gpus"
                )
            if job.iterations < 1 or job.start_s < 0:
                bad = "iterations" if job.iterations < 1 else "start_s"
                raise InputError(
                    f"job '{job.name}': {bad} must be {'>= 1' if bad == 'iterations' else '>= 0'}",
                    field=f"{where}.{bad}",
                )
            if getattr(job.workload, "lockstep", False):
                raise InputError(
                    f"job '{job.name}': jobs that share a network are not rank-symmetric; "
                    "replay it in full (lockstep: false)",
                    field=f"{where}.workload.lockstep",
                )
            if isinstance(job.placement, str):
                if job.placement not in POLICIES:
                    raise InputError(
                        f"job '{job.name}': unknown placement policy '{job.placement}' "
                        f"({', '.join(POLICIES)}, or a list of GPU indices)",
                        field=f"{where}.placement",
                    )
            elif len(job.placement) != job.gpus:
                raise InputError(
                    f"job '{job.name}': {len(job.placement)} GPUs listed for a job of {job.gpus}",
                    field=f"{where}.placement",
                )

    # ------------------------------------------------------------------ placement
    def placements(self, n_hosts: int) -> list[tuple[int, ...]]:
        """Each job's GPUs, in its rank order (module docstring), checked against the cluster."""
        if not self.jobs:
            raise InputError("needs at least one job", field="workload.jobs")
        taken: dict[int, str] = {}
        out: list[tuple[int, ...] | None] = [None] * len(self.jobs)
        for i, job in enumerate(self.jobs):  # explicit lists first: they reserve their GPUs
            if isinstance(job.placement, str):
                continue
            where = f"workload.jobs[{i}].placement"
            for gpu in job.placement:
                if not 0 <= gpu < n_hosts:
                    raise InputError(
                        f"job '{job.name}': GPU {gpu} outside the cluster's 0..{n_hosts - 1}",
                        field=where,
                    )
                if gpu in taken:
                    raise InputError(
                        f"job '{job.name}': GPU {gpu} is also placed for job '{taken[gpu]}'",
                        field=where,
                    )
                taken[gpu] = job.name
            out[i] = job.placement
        for i, job in enumerate(self.jobs):
            if out[i] is not None:
                continue
            free = [g for g in range(n_hosts) if g not in taken]
            if job.gpus > len(free):
                raise InputError(
                    f"job '{job.name}' needs {job.gpus} GPUs; the cluster has {n_hosts}, "
                    f"{len(free)} of them free after the jobs placed before it",
                    field=f"workload.jobs[{i}].gpus",
                )
            out[i] = self._choose(job, free, i)
            for gpu in out[i]:
                taken[gpu] = job.name
        return [tuple(p) for p in out]  # type: ignore[arg-type]

    def _choose(self, job: JobEntry, free: list[int], index: int) -> tuple[int, ...]:
        if job.placement == "packed":
            return tuple(free[: job.gpus])
        if job.placement == "random_servers":
            return self._random_servers(job, free, index)
        if job.placement == "random":
            rng = np.random.default_rng(job.seed)
            return tuple(sorted(int(g) for g in rng.choice(free, job.gpus, replace=False)))
        by_server: dict[int, list[int]] = {}
        for gpu in free:
            by_server.setdefault(gpu // self.gpus_per_server, []).append(gpu)
        queues = list(by_server.values())
        chosen: list[int] = []
        while len(chosen) < job.gpus:
            for queue in queues:
                if queue and len(chosen) < job.gpus:
                    chosen.append(queue.pop(0))
        return tuple(chosen)

    def _random_servers(self, job: JobEntry, free: list[int], index: int) -> tuple[int, ...]:
        per = self.gpus_per_server
        free_set = set(free)
        whole = [
            s
            for s in sorted({g // per for g in free})
            if all(g in free_set for g in range(s * per, (s + 1) * per))
        ]
        need = -(-job.gpus // per)
        if need > len(whole):
            raise InputError(
                f"job '{job.name}' needs {need} whole servers; {len(whole)} are free",
                field=f"workload.jobs[{index}].placement",
            )
        rng = np.random.default_rng(job.seed)
        servers = sorted(int(s) for s in rng.choice(whole, need, replace=False))
        gpus = [g for s in servers for g in range(s * per, (s + 1) * per)]
        return tuple(gpus[: job.gpus])

    # ------------------------------------------------------------------ the DAG
    def job_of_host(self, n_hosts: int) -> np.ndarray:
        """Each GPU's job index (-1: idle)."""
        owner = np.full(n_hosts, -1, dtype=np.int64)
        for j, gpus in enumerate(self.placements(n_hosts)):
            owner[list(gpus)] = j
        return owner

    def build(self, n_hosts: int | None = None) -> Workload:
        if n_hosts is None:
            raise InputError("a multi-job workload needs the cluster's size", field="n_hosts")
        nodes: list[Node] = []
        next_id = 0
        for i, (job, gpus) in enumerate(zip(self.jobs, self.placements(n_hosts), strict=True)):
            try:
                dag = job.workload.build(n_hosts=job.gpus)
            except InputError as err:
                raise InputError(
                    f"job '{job.name}': {err.message}",
                    field=f"workload.jobs[{i}].workload.{err.field or ''}".rstrip("."),
                ) from None
            if dag.n_ranks > job.gpus:
                raise InputError(
                    f"job '{job.name}': its workload '{dag.name}' has {dag.n_ranks} ranks, its "
                    f"placement {job.gpus} GPUs",
                    field=f"workload.jobs[{i}].gpus",
                )
            placed, next_id = _place(dag, gpus, job, next_id)
            nodes += placed
        name = "+".join(j.name for j in self.jobs)
        return scale_messages(Workload(n_ranks=n_hosts, nodes=nodes, name=name), self.scale)

    def check_groups(self, n_hosts: int, algorithm: Any) -> None:
        """Every distinct collective of every job decomposed once by ``algorithm`` on the GPUs
        it occupies: a group that does not fit its placement (e.g. SimAI's rings over servers
        holding unequal shares) is an error naming the job, before any simulation."""
        workload = self.build(n_hosts)
        owner = self.job_of_host(n_hosts)
        seen: set[tuple] = set()
        for node in workload.nodes:
            if not isinstance(node, Collective):
                continue
            key = (node.kind, node.group)
            if key in seen:
                continue
            seen.add(key)
            try:
                algorithm.decompose(node.kind, node.group, node.size_bytes)
            except InputError as err:
                j = int(owner[node.rank])
                raise InputError(
                    f"job '{self.jobs[j].name}': its {node.kind} group on GPUs "
                    f"{list(node.group)[:8]}{'...' if len(node.group) > 8 else ''} does not "
                    f"fit its placement: {err.message}",
                    field=f"workload.jobs[{j}].placement",
                ) from None

    def alone(self, index: int, n_hosts: int) -> MultiJobSpec:
        """Job ``index`` alone on the GPUs it has here (its solo run)."""
        gpus = self.placements(n_hosts)[index]
        job = replace(self.jobs[index], placement=gpus)
        return replace(self, jobs=[job])

    def job_times(self, rank_finish_s: list[float], n_hosts: int) -> dict[str, dict[str, float]]:
        """Per job: when its last GPU finished (s), and its mean iteration time (from its start
        offset, over its iterations)."""
        out = {}
        for job, gpus in zip(self.jobs, self.placements(n_hosts), strict=True):
            end = max(rank_finish_s[g] for g in gpus)
            out[job.name] = {"finish_s": end, "iteration_s": (end - job.start_s) / job.iterations}
        return out


def _place(dag: Workload, gpus: tuple[int, ...], job: JobEntry, first_id: int):
    """``dag``'s nodes on ``gpus`` with fresh ids from ``first_id``, its start offset and its
    iterations (module docstring); returns the nodes and the next free id."""
    out: list[Node] = []
    next_id = first_id
    ranks = sorted({n.rank for n in dag.nodes})
    gate: dict[int, tuple[int, ...]] = {}  # rank -> what its next iteration's roots wait for
    if job.start_s > 0:
        for rank in ranks:
            out.append(Compute(id=next_id, rank=gpus[rank], duration_s=job.start_s, name="start"))
            gate[rank] = (next_id,)
            next_id += 1
    children: set[int] = {d for n in dag.nodes for d in n.deps}
    for _ in range(job.iterations):
        ids = {n.id: next_id + k for k, n in enumerate(dag.nodes)}
        next_id += len(dag.nodes)
        sinks: dict[int, list[int]] = {}
        for node in dag.nodes:
            deps = tuple(ids[d] for d in node.deps) or gate.get(node.rank, ())
            moved = replace(node, id=ids[node.id], rank=gpus[node.rank], deps=deps)
            if isinstance(node, Collective):
                moved = replace(moved, group=tuple(sorted(gpus[r] for r in node.group)))
            elif isinstance(node, Send | Recv):
                moved = replace(moved, peer=gpus[node.peer])
            out.append(moved)
            if node.id not in children:
                sinks.setdefault(node.rank, []).append(ids[node.id])
        gate = {rank: tuple(s) for rank, s in sinks.items()}
    return out, next_id


__all__ = ["POLICIES", "JobEntry", "MultiJobSpec"]
