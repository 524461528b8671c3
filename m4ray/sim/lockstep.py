"""Lockstep replay: SimAI jobs too large for the per-rank DAG (and any DAG whose ranks all run
the same program), replayed by rank symmetry.

A SimAI file gives every rank the same program (the layers' computes and collectives); only the
groups differ. :class:`~m4ray.sim.replay.Replay` unrolls it per rank and decomposes every
collective into its flows, which at thousands of GPUs is ~10^8 DAG nodes and flows (the 9,216-GPU
``workload_analytical.txt``). Lockstep replay keeps the network model and drops the repetition:

1. **One program.** Each workload spec builds its own (:class:`LockstepProgram`: rank 0's nodes,
   each collective's group kind, the groups of each kind): a SimAI file's is
   :class:`~m4ray.workload.simai.SimAIProgram`, never unrolled; a workload DAG (a synthetic job, a
   Chakra trace) qualifies when every rank's nodes match rank 0's but for their groups
   (:class:`SymmetricProgram`); a collective's groups are then the ranks' groups at its place.
   The program is scheduled by the replay's own issue rules (ascending id; one GPU compute and
   one collective in flight). Every rank runs it in lockstep: the same line's collective starts
   at the same time on every group of its kind (TP, DP, EP, DP_EP).
2. **Rounds.** A collective on one group is decomposed by the configured algorithm
   (:mod:`m4ray.sim.collectives`) and its transfers are levelled: level 0 needs nothing, level k
   waits for level k-1 (a ring's step k). Groups of a kind are translates of one another, so
   the group's decomposition is done once per placement shape (members per server) and mapped
   onto every group; level k of all groups together is one **round**: the flows the whole
   cluster sends at that step.
3. **Network.** Each distinct round runs on a fresh backend (flowSim by default; any
   :class:`~m4ray.sim.backend.BackendConfig`), all its flows from time 0, over the full topology
   with its failures: groups that share a link share it. The round takes the send latency plus
   its last delivery; a collective takes the sum of its rounds (consecutive identical rounds,
   e.g. the 2(n-1) steps of a ring, are run once and counted).

What it assumes, beyond the full replay: a step ends when its last flow does (a barrier per
step: exact for a symmetric ring and where one slow link paces every ring anyway), collectives
of different lines that overlap in time (a non-blocking weight-gradient collective under the next
layer's compute) do not slow each other, and every rank's computes take the same time. ECMP: a
round's flows are hashed by their own ids, and a round repeated k times is the mean of
``min(k, ecmp_draws)`` hash draws (in the full replay each step is new flows, hashed anew); a
draw whose flows take an earlier draw's paths is not run again (on a rail there is no choice).

Measured (flowSim, ``bench/simai_workloads.py`` and ``tests/sim/test_lockstep.py``): the same
iteration time as the full replay, to rounding, on every shared SimAI/AICB file that fits both ways
(12 files, 32 GPUs) and on a 32-GPU MoE job with TP, DP, EP, DP_EP groups and two pipeline stages,
with and without a gray failure. Where it loses: a flat ring across a multi-spine fabric with no
failure, where an unlucky ECMP hash is a whole step's barrier in lockstep but one flow's delay in
the full replay: +2.8 % on average over 12 routing seeds, +25 % on the worst (the hierarchical
collectives stay on their rail and match exactly). The same with the scale ladder's synthetic MoE
job on healthy Spectrum-X (its EP all-to-all crosses the spines): +5.6 % at 512 GPUs (34.56
against 32.72 ms), +21.8 % at 1,024 (41.93 against 34.42 ms); exact with 8 GPUs at 1/4, on
AlibabaHPN 1,024 and for the GPT-13B job on every rung. In the full replay the EP groups drift
out of step (at 512 GPUs the first all-to-all ends over a 0.53 ms spread and the later ones start
0.27–0.64 ms apart), so their all-to-alls overlap less; lockstep starts them together. More hash
draws do not close it (16 per call: +16 % at 1,024). No per-flow table. Units: seconds, bytes.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import heapq
import pathlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from m4ray import native
from m4ray.errors import InputError, SimulationError
from m4ray.sim.backend import BackendConfig
from m4ray.sim.collectives import CollectiveAlgorithm, Transfer
from m4ray.sim.flows import Flow
from m4ray.sim.flowsim import FlowSimConfig
from m4ray.sim.routing import Path, Routing
from m4ray.sim.topology import Topology
from m4ray.sim.workload import Collective, CollectiveKind, Compute, Node, Recv, Send, Workload

GroupKey = tuple[str, str | None]  # ("tp" | "wg", SimAI suffix group), or ("dag", partition #)


class LockstepProgram(Protocol):
    """What lockstep replays of a workload (built by its spec's ``lockstep_program(n_hosts)``):
    its rank count, rank 0's nodes with each collective's group kind, and each kind's groups
    (a partition of the ranks)."""

    n_ranks: int

    def program(self) -> tuple[list[Node], dict[int, GroupKey]]: ...

    def partition(self, key: GroupKey) -> list[tuple[int, ...]]: ...


def transfer_levels(transfers: Sequence[Transfer]) -> list[int]:
    """Each transfer's level: 0 without deps, else one more than its deepest dep (deps index
    earlier transfers, as every algorithm writes them)."""
    level = [0] * len(transfers)
    for i, transfer in enumerate(transfers):
        if transfer.deps:
            level[i] = 1 + max(level[d] for d in transfer.deps)
    return level


@dataclass(frozen=True, slots=True)
class Round:
    """Flows sent together, ``repeat`` times in a row: ``flows`` rows are (src rank, dst rank,
    bytes)."""

    flows: np.ndarray
    repeat: int


def group_rounds(
    algorithm: CollectiveAlgorithm, kind: CollectiveKind, group: Sequence[int], size: int
) -> list[tuple[np.ndarray, int]]:
    """The group's collective as levels of (src position, dst position, bytes) rows — positions
    index ``group`` — with consecutive identical levels merged into one with a repeat count."""
    transfers = algorithm.decompose(kind, group, size)
    position = {rank: i for i, rank in enumerate(group)}
    by_level: dict[int, list[tuple[int, int, int]]] = {}
    for transfer, level in zip(transfers, transfer_levels(transfers), strict=True):
        by_level.setdefault(level, []).append(
            (position[transfer.src], position[transfer.dst], transfer.size_bytes)
        )
    out: list[tuple[np.ndarray, int]] = []
    for level in sorted(by_level):
        rows = np.array(sorted(by_level[level]), dtype=np.int64).reshape(-1, 3)
        if out and out[-1][0].shape == rows.shape and np.array_equal(out[-1][0], rows):
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((rows, 1))
    return out


def merge_rounds(
    per_group: Sequence[tuple[np.ndarray, list[tuple[np.ndarray, int]]]],
) -> list[Round]:
    """Rounds of groups running in lockstep: step k of every group together. ``per_group`` holds
    (the group's ranks, its :func:`group_rounds`); a round ends where any group's level changes."""
    cursors = [[0, levels[0][1] if levels else 0] for _, levels in per_group]
    out: list[Round] = []
    while True:
        live = [i for i, (_, levels) in enumerate(per_group) if cursors[i][0] < len(levels)]
        if not live:
            return out
        take = min(cursors[i][1] for i in live)
        parts = []
        for i in live:
            ranks, levels = per_group[i]
            rows = levels[cursors[i][0]][0]
            parts.append(np.column_stack((ranks[rows[:, 0]], ranks[rows[:, 1]], rows[:, 2])))
            cursors[i][1] -= take
            if cursors[i][1] == 0:
                cursors[i][0] += 1
                if cursors[i][0] < len(levels):
                    cursors[i][1] = levels[cursors[i][0]][1]
        out.append(Round(np.concatenate(parts), take))


@dataclass(slots=True)
class CollectiveTiming:
    """One distinct collective of the program (kind, group kind, bytes) on the whole cluster."""

    kind: CollectiveKind
    group: GroupKey
    size_bytes: int
    n_groups: int
    group_size: int
    rounds: int  # steps, repeats counted
    flows: int  # flows the full replay would send, all groups
    seconds: float = 0.0
    calls: int = 0


@dataclass(slots=True)
class LockstepResult:
    completion_time_s: float
    compute_s: float  # the program's GPU compute
    n_ranks: int
    collectives: list[CollectiveTiming]
    rounds_simulated: int  # distinct rounds run on the backend
    flows_simulated: int  # their flows

    @property
    def exposed_comm_s(self) -> float:
        return self.completion_time_s - self.compute_s

    @property
    def rank0_time_s(self) -> float:
        """Rank 0's finish: every rank runs the same program in lockstep, so the job's."""
        return self.completion_time_s

    @property
    def flows_represented(self) -> int:
        """Flows of one iteration in the full replay (every collective call, every group)."""
        return sum(c.flows * c.calls for c in self.collectives)


@functools.cache
def library() -> ctypes.CDLL | None:
    """The compiled round flowSim (``_rounds.c``), or ``None`` (one warning) without a compiler."""
    lib = native.load(pathlib.Path(__file__).with_name("_rounds.c"), "compiled round flowSim")
    if lib is not None:
        ptr = ctypes.c_void_p
        fn = lib.m4ray_round_finish
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_int64, ptr, ptr, ctypes.c_int64, ptr, ptr, ptr, ptr]
    return lib


def round_finish(
    routing: Routing,
    capacity_bps: np.ndarray,
    flows: Sequence[Flow],
    paths: Sequence[Path] | None = None,
) -> np.ndarray:
    """Delivery times of ``flows`` all sent at time 0 under classic flowSim (no window, cap or
    ACK load), by the compiled twin of :class:`~m4ray.sim.flowsim.FlowSim` (same arithmetic:
    the two agree to rounding; a test holds them to it). ``paths``: theirs, if already routed."""
    lib = library()
    if lib is None:
        raise SimulationError("the compiled round flowSim is not available")
    if paths is None:
        paths = [routing.path(f.src, f.dst, f.id) for f in flows]
    lengths = np.fromiter((len(p.links) for p in paths), dtype=np.int64, count=len(paths))
    off = np.zeros(len(paths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=off[1:])
    idx = np.fromiter((link for p in paths for link in p.links), dtype=np.int64, count=off[-1])
    wire = routing.wire
    bits = np.array([wire.wire_bytes(f.size_bytes) * 8.0 for f in flows])
    delay = np.array(
        [routing.delivery_delay(f.size_bytes, p) for f, p in zip(flows, paths, strict=True)]
    )
    capacity = np.ascontiguousarray(capacity_bps, dtype=np.float64)
    finish = np.empty(len(flows))
    rc = lib.m4ray_round_finish(
        len(flows),
        off.ctypes.data,
        idx.ctypes.data,
        len(capacity),
        capacity.ctypes.data,
        bits.ctypes.data,
        delay.ctypes.data,
        finish.ctypes.data,
    )
    if rc == 2:
        raise MemoryError("compiled round flowSim: out of memory")
    if rc:
        raise SimulationError("active flows with zero rate: a link has no capacity left")
    return finish


def _classic(config: BackendConfig) -> bool:
    """Whether the compiled rounds model ``config`` exactly: flowSim without window, cap, ACKs."""
    return (
        type(config) is FlowSimConfig
        and config.window_bytes is None
        and config.rate_cap_bps is None
        and not config.ack_load
    )


class RoundTimer:
    """Seconds of one round: its flows from time 0 on a fresh backend, cached by content
    (classic flowSim runs compiled, :func:`round_finish`, where a C compiler is found)."""

    def __init__(
        self,
        topology: Topology,
        routing: Routing,
        backend: BackendConfig,
        *,
        send_latency_s: float = 3e-6,
        n_ranks: int,
        compiled: bool = True,
        draws: int = 4,
    ) -> None:
        self.topology, self.routing, self.backend = topology, routing, backend
        self.send_latency_s = send_latency_s
        self.host_of = np.asarray(topology.hosts[:n_ranks], dtype=np.int64)
        self._cache: dict[tuple[bytes, bytes], float] = {}  # (flows, paths) -> seconds
        self.flows_simulated = 0
        self.compiled = compiled and _classic(backend) and library() is not None
        if draws < 1:
            raise InputError(f"must be >= 1, got {draws}", field="ecmp_draws")
        self.draws = draws

    def seconds(self, flows: np.ndarray, repeat: int = 1) -> float:
        """Mean seconds of the round over ``min(repeat, draws)`` ECMP draws: in the full replay
        each of a ring's steps is new flows, hashed anew (flow ids start at ``draw · len``).
        Draws whose flows take the same paths as an earlier one's (no choice to make, as on a
        rail) are that run again."""
        key = hashlib.sha256(np.ascontiguousarray(flows).tobytes()).digest()
        times = []
        for draw in range(min(repeat, self.draws)):
            batch = self._flows(flows, draw * len(flows))
            paths = [self.routing.path(f.src, f.dst, f.id) for f in batch]
            digest = hashlib.sha256()
            for path in paths:
                digest.update(np.asarray(path.links, dtype=np.int64).tobytes() + b"|")
            run = (key, digest.digest())
            if run not in self._cache:
                self._cache[run] = self._run(batch, paths)
            times.append(self._cache[run])
        return sum(times) / len(times)

    def _flows(self, flows: np.ndarray, first_id: int) -> list[Flow]:
        hosts = self.host_of
        return [
            Flow(first_id + i, int(hosts[s]), int(hosts[d]), int(b), 0.0)
            for i, (s, d, b) in enumerate(flows.tolist())
        ]

    @property
    def rounds_simulated(self) -> int:
        return len(self._cache)

    def _run(self, batch: list[Flow], paths: list[Path]) -> float:
        self.flows_simulated += len(batch)
        if self.compiled:
            finish = round_finish(self.routing, self.topology.bandwidth_bps, batch, paths)
            return self.send_latency_s + float(finish.max(initial=0.0))
        backend = self.backend.build(self.topology, self.routing)
        last = [0.0]
        left = [len(batch)]

        def done(_: int, t: float) -> None:
            last[0] = max(last[0], t)
            left[0] -= 1

        for flow in batch:
            backend.send(flow, done)
        backend.run()
        if left[0]:
            raise SimulationError(
                f"{left[0]} of {len(batch)} flows of a round were never delivered"
            )
        return self.send_latency_s + last[0]


@dataclass(slots=True)
class _Step:
    id: int
    deps: tuple[int, ...]
    seconds: float
    slot: str  # "gpu" | "cpu" | "comm": what it occupies while it runs
    children: list[int] = field(default_factory=list)


def schedule(steps: Sequence[_Step]) -> float:
    """Finish time of one rank's program under the replay's issue rules: ready steps start in
    ascending id order, one GPU compute, one CPU op and one collective at a time."""
    by_id = {s.id: s for s in steps}
    waiting = {s.id: len(s.deps) for s in steps}
    for s in steps:
        for d in s.deps:
            by_id[d].children.append(s.id)
    ready = sorted(s.id for s in steps if not s.deps)
    busy = {"gpu": False, "cpu": False, "comm": False}
    events: list[tuple[float, int]] = []
    now, done = 0.0, 0
    while True:
        for sid in list(ready):
            step = by_id[sid]
            if busy[step.slot]:
                continue
            busy[step.slot] = True
            ready.remove(sid)
            heapq.heappush(events, (now + step.seconds, sid))
        if not events:
            break
        now, sid = heapq.heappop(events)
        finished = [sid]
        while events and events[0][0] == now:
            finished.append(heapq.heappop(events)[1])
        for sid in finished:
            step = by_id[sid]
            busy[step.slot] = False
            done += 1
            for child in step.children:
                waiting[child] -= 1
                if waiting[child] == 0:
                    ready.append(child)
        ready.sort()
    if done != len(steps):
        raise SimulationError(f"lockstep program deadlocked: {len(steps) - done} steps never ran")
    return now


def symmetric_program(
    workload: Workload,
) -> tuple[list[Node], dict[int, GroupKey], dict[GroupKey, list[tuple[int, ...]]]]:
    """Rank 0's nodes of a DAG whose every rank runs the same program (same nodes in the same
    order, same kinds, bytes, durations and dependencies; only the groups differ), each
    collective's group kind, and the groups of each kind: the ranks' groups at that position.
    A DAG that is not so (a straggler, pipeline sends, per-rank traces) is refused by name."""
    n = workload.n_ranks
    by_rank: list[list[Node]] = [[] for _ in range(n)]
    for node in workload.nodes:
        by_rank[node.rank].append(node)
    reference = _signature(by_rank[0], 0)
    for rank in range(1, n):
        other = _signature(by_rank[rank], rank)
        if other != reference:
            at = next(
                (i for i, (a, b) in enumerate(zip(reference, other, strict=False)) if a != b),
                min(len(reference), len(other)),
            )
            raise InputError(
                f"rank {rank}'s program differs from rank 0's at its node #{at} "
                f"({_describe_at(by_rank[rank], at)} vs {_describe_at(by_rank[0], at)}): "
                "lockstep needs every rank to run the same program",
                field="workload.lockstep",
            )
    kinds: dict[int, GroupKey] = {}
    partitions: dict[GroupKey, list[tuple[int, ...]]] = {}
    index: dict[tuple[tuple[int, ...], ...], GroupKey] = {}
    for at, node in enumerate(by_rank[0]):
        if not isinstance(node, Collective):
            continue
        groups = tuple(sorted({by_rank[r][at].group for r in range(n)}))
        if sum(len(g) for g in groups) != n:
            raise InputError(
                f"the groups of collective '{node.name}' overlap: no partition of the ranks",
                field="workload.lockstep",
            )
        key = index.setdefault(groups, ("dag", str(len(index))))
        partitions[key] = list(groups)
        kinds[node.id] = key
    return by_rank[0], kinds, partitions


class SymmetricProgram:
    """The :class:`LockstepProgram` of a workload DAG whose ranks all run the same program
    (:func:`symmetric_program`, which refuses any other by name)."""

    def __init__(self, workload: Workload) -> None:
        self.n_ranks = workload.n_ranks
        self._nodes, self._kinds, self._partitions = symmetric_program(workload)

    def program(self) -> tuple[list[Node], dict[int, GroupKey]]:
        return self._nodes, self._kinds

    def partition(self, key: GroupKey) -> list[tuple[int, ...]]:
        return self._partitions[key]


def _signature(nodes: list[Node], rank: int) -> list[tuple]:
    position = {node.id: i for i, node in enumerate(nodes)}
    out = []
    for node in nodes:
        if isinstance(node, Send | Recv):
            raise InputError(
                f"rank {rank} sends or receives point to point ('{node.name}'): pipeline "
                "stages are not replayed in lockstep",
                field="workload.lockstep",
            )
        if any(d not in position for d in node.deps):
            raise InputError(
                f"node {node.id} of rank {rank} waits on another rank's node: not in lockstep",
                field="workload.lockstep",
            )
        deps = tuple(position[d] for d in node.deps)
        if isinstance(node, Collective):
            out.append(("collective", node.kind, node.size_bytes, len(node.group), deps))
        else:
            out.append(("compute", node.duration_s, node.cpu, deps))
    return out


def _describe_at(nodes: list[Node], at: int) -> str:
    return f"'{nodes[at].name}'" if at < len(nodes) else "nothing"


def check_algorithm(algorithm: CollectiveAlgorithm) -> None:
    """Refuse a collective layer whose flows must not be levelled into rounds: SimAI's NCCL
    model (``collective=simai``) lets each flow follow its parent alone, with no step barrier,
    which is the behaviour the gray-failure study turns on; rounds would put the barrier back."""
    if getattr(algorithm, "barrier_free", False):
        raise InputError(
            "lockstep cannot replay collective=simai: its flows wait only for their parent (no "
            "step barrier), and lockstep's rounds would add one; use the full replay "
            "(workload.lockstep=false) or collective=hierarchical / ring",
            field="workload.lockstep",
        )


class LockstepReplay:
    """A workload's :class:`LockstepProgram` (or a symmetric workload DAG, taken as its
    :class:`SymmetricProgram`) on ``topology`` in lockstep; see the module docstring."""

    def __init__(
        self,
        program: LockstepProgram | Workload,
        topology: Topology,
        routing: Routing,
        backend: BackendConfig,
        algorithm: CollectiveAlgorithm,
        *,
        send_latency_s: float = 3e-6,
        progress: Callable[[Iterable], Iterable] | None = None,
        compiled: bool = True,
        ecmp_draws: int = 4,
    ) -> None:
        check_algorithm(algorithm)
        if isinstance(program, Workload):
            program = SymmetricProgram(program)
        self.source = program
        self.n_ranks = program.n_ranks
        if self.n_ranks > len(topology.hosts):
            raise SimulationError(
                f"the job has {self.n_ranks} ranks but the topology only {len(topology.hosts)} "
                "hosts"
            )
        self.topology, self.algorithm = topology, algorithm
        self.timer = RoundTimer(
            topology,
            routing,
            backend,
            send_latency_s=send_latency_s,
            n_ranks=self.n_ranks,
            compiled=compiled,
            draws=ecmp_draws,
        )
        self.progress = progress or (lambda items: items)
        server_of = getattr(algorithm, "server_of", None)
        self._server_of = server_of or (lambda rank: rank // max(1, topology.gpus_per_server))

    @classmethod
    def of_spec(
        cls,
        spec,
        topology: Topology,
        routing: Routing,
        backend: BackendConfig,
        algorithm: CollectiveAlgorithm,
        *,
        send_latency_s: float = 3e-6,
    ) -> LockstepReplay:
        """The lockstep replay of a workload spec: the program it builds for this topology's
        hosts (``spec.lockstep_program(n_hosts)``)."""
        program = spec.lockstep_program(n_hosts=len(topology.hosts))
        return cls(program, topology, routing, backend, algorithm, send_latency_s=send_latency_s)

    def partition(self, key: GroupKey) -> list[tuple[int, ...]]:
        """Every group of one kind: the ranks split by their group of that kind."""
        return self.source.partition(key)

    def _shape(self, group: tuple[int, ...]) -> tuple[int, ...]:
        first: dict[int, int] = {}
        return tuple(first.setdefault(self._server_of(r), len(first)) for r in group)

    def rounds(self, kind: CollectiveKind, key: GroupKey, size: int) -> list[Round]:
        decomposed: dict[tuple[int, ...], list[tuple[np.ndarray, int]]] = {}
        per_group = []
        for group in self.partition(key):
            shape = self._shape(group)
            if shape not in decomposed:
                decomposed[shape] = group_rounds(self.algorithm, kind, group, size)
            per_group.append((np.asarray(group, dtype=np.int64), decomposed[shape]))
        return merge_rounds(per_group)

    def program(self) -> tuple[list[Node], dict[int, GroupKey]]:
        """Rank 0's nodes and each collective's group kind."""
        return self.source.program()

    def run(self) -> LockstepResult:
        program, group_of = self.program()
        timings: dict[tuple, CollectiveTiming] = {}
        calls: list[tuple[int, tuple]] = []
        for node in program:
            if isinstance(node, Collective):
                key = (node.kind, group_of[node.id], node.size_bytes)
                if key not in timings:
                    groups = self.partition(key[1])
                    timings[key] = CollectiveTiming(
                        node.kind, key[1], node.size_bytes, len(groups), len(node.group), 0, 0
                    )
                timings[key].calls += 1
                calls.append((node.id, key))
        for key in self.progress(list(timings)):
            timing = timings[key]
            rounds = self.rounds(*key)
            timing.rounds = sum(r.repeat for r in rounds)
            timing.flows = sum(len(r.flows) * r.repeat for r in rounds)
            timing.seconds = sum(self.timer.seconds(r.flows, r.repeat) * r.repeat for r in rounds)
        seconds = {node_id: timings[key].seconds for node_id, key in calls}
        steps = [
            _Step(
                node.id,
                node.deps,
                seconds[node.id] if isinstance(node, Collective) else node.duration_s,
                "comm" if isinstance(node, Collective) else "cpu" if node.cpu else "gpu",
            )
            for node in program
        ]
        compute = sum(n.duration_s for n in program if isinstance(n, Compute) and not n.cpu)
        return LockstepResult(
            completion_time_s=schedule(steps),
            compute_s=compute,
            n_ranks=self.n_ranks,
            collectives=list(timings.values()),
            rounds_simulated=self.timer.rounds_simulated,
            flows_simulated=self.timer.flows_simulated,
        )


def describe(result: LockstepResult) -> list[list[str]]:
    """Table rows, one per distinct collective: kind, group kind, bytes, groups x size, calls,
    rounds, flows per call (all groups), seconds per call."""
    rows = []
    for c in sorted(result.collectives, key=lambda c: -c.seconds * c.calls):
        if c.group[0] == "dag":
            name = f"#{c.group[1]}"
        else:
            name = (
                {"tp": "TP", "wg": "DP"}[c.group[0]] if c.group[1] is None else c.group[1].upper()
            )
        rows.append(
            [
                c.kind.value,
                name,
                f"{c.size_bytes:,}",
                f"{c.n_groups} x {c.group_size}",
                str(c.calls),
                str(c.rounds),
                f"{c.flows:,}",
                f"{c.seconds * 1e3:.3f}",
            ]
        )
    return rows


__all__ = [
    "CollectiveTiming",
    "LockstepProgram",
    "LockstepReplay",
    "LockstepResult",
    "Round",
    "RoundTimer",
    "SymmetricProgram",
    "describe",
    "group_rounds",
    "merge_rounds",
    "round_finish",
    "schedule",
    "symmetric_program",
    "transfer_levels",
]
