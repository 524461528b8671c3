"""The replay engine: walks a workload DAG over a NetworkBackend (the "system layer").

Semantics follow ASTRA-sim's feeder (``reference/workloads.md`` §3.1, §3.6): a node is ready when
all its dependencies finished; per rank, ready nodes are issued in ascending id order, with at most
one GPU compute, one CPU op and one send-or-collective in flight (receives are unlimited). A
collective starts when every member has issued it and is decomposed by the configured algorithm;
each message is injected
``send_latency_s`` after it becomes ready (SimAI's ``AS_SEND_LAT``). A rank's part of a collective
ends when every message it sends or receives is delivered. Sends are eager and match receives FIFO
by ``(src, dst, tag)``; a send completes at delivery. A transfer with ``after`` also waits until
that transfer has started; an algorithm with ``ack_bytes`` set counts a transfer done when its
sender has the last ACK (delivery plus one ACK's trip back; SimAI's NCCL model, ``nccl.py``).

Outputs (seconds): workload completion time, per-rank finish/compute/exposed communication, one
row per flow and one per node.
"""

from __future__ import annotations

import itertools
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from m4ray.errors import InputError, SimulationError
from m4ray.sim.backend import NetworkBackend
from m4ray.sim.collectives import CollectiveAlgorithm, Transfer, TransferTable, decompose_table
from m4ray.sim.dagloop import CompiledFlows
from m4ray.sim.flows import Flow
from m4ray.sim.routing import Routing
from m4ray.sim.workload import Collective, Compute, Node, Send, Workload

_PLANNED = 1 << 20  # transfers of decomposed collectives a replay keeps for reuse


@dataclass(slots=True)
class FlowLog:
    """Column lists of the per-flow table (bytes, seconds)."""

    flow_id: list[int] = field(default_factory=list)
    node_id: list[int] = field(default_factory=list)
    src: list[int] = field(default_factory=list)
    dst: list[int] = field(default_factory=list)
    size_bytes: list[int] = field(default_factory=list)
    start_s: list[float] = field(default_factory=list)
    finish_s: list[float] = field(default_factory=list)
    ideal_fct_s: list[float] = field(default_factory=list)
    parent_id: list[int] = field(default_factory=list)  # flow whose delivery released it, or -1
    done_s: list[float] = field(default_factory=list)  # when the replay counted it done


@dataclass(slots=True)
class ReplayResult:
    completion_time_s: float
    rank_finish_s: list[float]
    rank_compute_s: list[float]
    flows: FlowLog
    node_start_s: dict[int, float]
    node_end_s: dict[int, float]

    @property
    def critical_rank(self) -> int:
        return max(range(len(self.rank_finish_s)), key=self.rank_finish_s.__getitem__)

    @property
    def exposed_comm_s(self) -> float:
        """Time the last-finishing rank spent not computing (waiting on communication)."""
        rank = self.critical_rank
        return self.rank_finish_s[rank] - self.rank_compute_s[rank]

    @property
    def rank0_time_s(self) -> float:
        """When rank 0 finished its own work: what SimAI's ``EndToEnd.csv`` reports (rank 0
        writes it), where :attr:`completion_time_s` is the last rank's."""
        return self.rank_finish_s[0] if self.rank_finish_s else 0.0


@dataclass(slots=True)
class _CollectiveRun:
    nodes: dict[int, Collective] = field(default_factory=dict)  # rank -> node
    transfers: list[Transfer] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)  # deps left per transfer
    children: list[list[int]] = field(default_factory=list)
    rank_left: dict[int, int] = field(default_factory=dict)
    flow_of: list[int] = field(default_factory=list)  # per transfer: its flow id once started
    blocked: dict[int, list[int]] = field(default_factory=dict)  # ready, waiting on ``after``


class Replay:
    """One simulation of ``workload`` on ``backend``; call :meth:`run` once."""

    def __init__(
        self,
        workload: Workload,
        backend: NetworkBackend,
        routing: Routing,
        algorithm: CollectiveAlgorithm,
        *,
        send_latency_s: float = 3e-6,
        pair_keys: bool = False,
        compiled: bool = True,
    ) -> None:
        hosts = routing.topo.hosts
        if workload.n_ranks > len(hosts):
            raise InputError(
                f"workload has {workload.n_ranks} ranks but the topology only {len(hosts)} hosts",
                field="n_ranks",
            )
        self.workload, self.backend, self.routing = workload, backend, routing
        self.algorithm, self.send_latency_s = algorithm, send_latency_s
        self.ack_bytes: int | None = getattr(algorithm, "ack_bytes", None)
        self._acks_itself = bool(getattr(backend, "done_at_ack", False))
        self.host_of = hosts[: workload.n_ranks]
        self.nodes = {node.id: node for node in workload.nodes}
        self.children: dict[int, list[int]] = defaultdict(list)
        self.pending = {node.id: len(node.deps) for node in workload.nodes}
        for node in workload.nodes:
            for dep in node.deps:
                self.children[dep].append(node.id)
        self.ready: list[list[int]] = [[] for _ in range(workload.n_ranks)]
        self.comp_busy = [False] * workload.n_ranks
        self.cpu_busy = [False] * workload.n_ranks
        self.comm_busy = [False] * workload.n_ranks
        self.start_s: dict[int, float] = {}
        self.end_s: dict[int, float] = {}
        self.flows = FlowLog()
        self._flow_ids = itertools.count()
        # pair_keys: a flow's ECMP key is (src, dst, its number among that pair's flows), not
        # its id, so it does not depend on flows elsewhere (several jobs: m4ray.workload.multi)
        self._pairs: dict[tuple[int, int], int] | None = {} if pair_keys else None
        self._coll_seq: dict[tuple[int, tuple[int, ...]], int] = defaultdict(int)
        self._colls: dict[tuple[tuple[int, ...], int], _CollectiveRun] = {}
        self._arrived: dict[tuple[int, int, int], deque[float]] = defaultdict(deque)
        self._posted: dict[tuple[int, int, int], deque[int]] = defaultdict(deque)
        self._plans: dict[tuple, list[Transfer] | TransferTable] = {}  # _plan's
        self._planned = 0
        # compiled: the flows in the backend's compiled loop where it has one (m4ray.sim.dagloop;
        # equal to the bit), else here
        self._compiled = CompiledFlows.of(self) if compiled else None

    # ------------------------------------------------------------------ driving
    def run(self) -> ReplayResult:
        for node in self.workload.nodes:
            if not node.deps:
                self.ready[node.rank].append(node.id)
        try:
            for rank in range(self.workload.n_ranks):
                self._issue(rank)
            self.backend.run()
        finally:  # a failure keeps the flows logged so far
            if self._compiled is not None:
                self.flows = self._compiled.flow_log()
        if len(self.end_s) != len(self.nodes):
            stuck = sorted(set(self.nodes) - set(self.end_s))
            raise SimulationError(
                f"workload deadlocked: {len(stuck)} of {len(self.nodes)} nodes never finished "
                f"(first: {stuck[:5]}); check collective groups and send/recv pairs"
            )
        return self._result()

    def _issue(self, rank: int) -> None:
        ready = self.ready[rank]
        ready.sort()
        for node_id in list(ready):
            if node_id not in ready:  # started by a nested issue (a collective that ended at once)
                continue
            node = self.nodes[node_id]
            if isinstance(node, Compute):
                busy = self.cpu_busy if node.cpu else self.comp_busy
                if busy[rank]:
                    continue
                busy[rank] = True
            elif isinstance(node, Send | Collective):
                if self.comm_busy[rank]:
                    continue
                self.comm_busy[rank] = True
            ready.remove(node_id)
            self.start_s[node_id] = self.backend.now()
            self._start(node)

    def _start(self, node: Node) -> None:
        if isinstance(node, Compute):
            self.backend.schedule(node.duration_s, lambda: self._finish(node))
        elif isinstance(node, Collective):
            self._join_collective(node)
        elif isinstance(node, Send):
            key = (node.rank, node.peer, node.tag)
            self._inject(
                node.rank,
                node.peer,
                node.size_bytes,
                node.id,
                lambda t: (self._finish(node), self._deliver(key, t)),
            )
        else:
            key = (node.peer, node.rank, node.tag)
            if self._arrived[key]:
                self._arrived[key].popleft()
                self.backend.schedule(0.0, lambda: self._finish(node))
            else:
                self._posted[key].append(node.id)

    def _finish(self, node: Node) -> None:
        self.end_s[node.id] = self.backend.now()
        if isinstance(node, Compute):
            (self.cpu_busy if node.cpu else self.comp_busy)[node.rank] = False
        elif isinstance(node, Send | Collective):
            self.comm_busy[node.rank] = False
        touched = {node.rank}
        for child in self.children[node.id]:
            self.pending[child] -= 1
            if self.pending[child] == 0:
                child_rank = self.nodes[child].rank
                self.ready[child_rank].append(child)
                touched.add(child_rank)
        for rank in sorted(touched):
            self._issue(rank)

    def _deliver(self, key: tuple[int, int, int], t: float) -> None:
        if self._posted[key]:
            self._finish(self.nodes[self._posted[key].popleft()])
        else:
            self._arrived[key].append(t)

    # ------------------------------------------------------------------ flows
    def _inject(
        self, src: int, dst: int, size: int, node_id: int, on_delivered: Callable[[float], None]
    ) -> None:
        self.backend.schedule(
            self.send_latency_s, lambda: self._start_flow(src, dst, size, node_id, on_delivered)
        )

    def _start_flow(
        self,
        src: int,
        dst: int,
        size: int,
        node_id: int,
        on_done: Callable[[float], None],
        *,
        parent: int = -1,
        ack: bool = False,
    ) -> int:
        """Start a flow now; ``on_done`` fires at delivery, or with ``ack`` at its last ACK."""
        if self._compiled is not None:
            return self._compiled.start_flow(
                src, dst, size, node_id=node_id, on_done=on_done, parent=parent, ack=ack
            )
        flow_id = next(self._flow_ids)
        flow = Flow(flow_id, self.host_of[src], self.host_of[dst], size, self.backend.now())
        log = self.flows
        row = len(log.flow_id)
        log.flow_id.append(flow_id)
        log.node_id.append(node_id)
        log.src.append(flow.src)
        log.dst.append(flow.dst)
        log.size_bytes.append(size)
        log.start_s.append(flow.start_s)
        log.finish_s.append(float("nan"))
        log.done_s.append(float("nan"))
        log.parent_id.append(parent)
        if self._pairs is not None:
            nth = self._pairs.get((src, dst), 0)
            self._pairs[src, dst] = nth + 1
            self.routing.set_key(flow_id, (nth << 40) | (src << 20) | dst)
        path = self.routing.path(flow.src, flow.dst, flow_id)
        log.ideal_fct_s.append(self.routing.ideal_fct(size, path))
        # a backend that reports flows at their last ACK (ns-3 with done_at_ack) has the trip
        ack_s = self._ack_delay(flow) if ack and not self._acks_itself else 0.0

        def done(_: int, t: float) -> None:
            log.finish_s[row] = t
            if ack_s:
                self.backend.schedule(ack_s, lambda: acked(t + ack_s))
            else:
                acked(t)

        def acked(t: float) -> None:
            log.done_s[row] = t
            on_done(t)

        self.backend.send(flow, done)
        return flow_id

    def _ack_delay(self, flow: Flow) -> float:
        """Seconds the ACK of a flow's last byte takes back to its sender on an idle path."""
        back = self.routing.path(flow.dst, flow.src, flow.id)
        return back.latency_s + self.ack_bytes * 8 * back.inverse_bw_sum

    # ------------------------------------------------------------------ collectives
    def _join_collective(self, node: Collective) -> None:
        seq_key = (node.rank, node.group)
        key = (node.group, self._coll_seq[seq_key])
        self._coll_seq[seq_key] += 1
        run = self._colls.setdefault(key, _CollectiveRun())
        run.nodes[node.rank] = node
        if len(run.nodes) == len(node.group):
            self._launch(key, run)

    def _launch(self, key, run: _CollectiveRun) -> None:
        first = next(iter(run.nodes.values()))
        for other in run.nodes.values():
            if (other.kind, other.size_bytes) != (first.kind, first.size_bytes):
                raise SimulationError(
                    f"collective #{key[1]} on group {list(key[0])} differs across ranks: node "
                    f"{first.id} is {first.kind} of {first.size_bytes} B, node {other.id} is "
                    f"{other.kind} of {other.size_bytes} B"
                )
        if self._compiled is not None:
            table = self._plan(first.kind, first.group, first.size_bytes, tabled=True)
            del self._colls[key]
            self._compiled.launch(run, table)
            return
        run.transfers = self._plan(first.kind, first.group, first.size_bytes)
        run.waiting = [len(t.deps) for t in run.transfers]
        run.children = [[] for _ in run.transfers]
        run.rank_left = dict.fromkeys(run.nodes, 0)
        run.flow_of = [-1] * len(run.transfers)
        for index, transfer in enumerate(run.transfers):
            for dep in transfer.deps:
                run.children[dep].append(index)
            run.rank_left[transfer.src] += 1
            run.rank_left[transfer.dst] += 1
        del self._colls[key]
        for rank, left in run.rank_left.items():
            if left == 0:
                self._finish(run.nodes[rank])
        for index, waiting in enumerate(run.waiting):
            if waiting == 0:
                self._send_transfer(run, index)

    def _plan(self, kind, group: tuple[int, ...], size: int, *, tabled: bool = False):
        """The algorithm's transfers for one collective (a list, or ``tabled`` a
        :class:`TransferTable`), kept for the next one like it (a job repeats its collectives
        every iteration); at most ``_PLANNED`` transfers are kept."""
        key = (kind, group, size, tabled)
        plan = self._plans.get(key)
        if plan is None:
            if tabled:
                plan = decompose_table(self.algorithm, kind, group, size)
            else:
                plan = self.algorithm.decompose(kind, group, size)
            self._planned += len(plan)
            if self._planned > _PLANNED:
                self._plans.clear()
                self._planned = len(plan)
            self._plans[key] = plan
        return plan

    def _send_transfer(self, run: _CollectiveRun, index: int) -> None:
        self.backend.schedule(self.send_latency_s, lambda: self._transfer_ready(run, index))

    def _transfer_ready(self, run: _CollectiveRun, index: int) -> None:
        after = run.transfers[index].after
        if after is not None and run.flow_of[after] < 0:
            run.blocked.setdefault(after, []).append(index)
            return
        transfer = run.transfers[index]
        deps = transfer.deps
        run.flow_of[index] = self._start_flow(
            transfer.src,
            transfer.dst,
            transfer.size_bytes,
            run.nodes[transfer.src].id,
            lambda t: self._transfer_done(run, index),
            parent=run.flow_of[deps[0]] if deps else -1,
            ack=self.ack_bytes is not None,
        )
        for waiting in run.blocked.pop(index, ()):
            self._transfer_ready(run, waiting)

    def _transfer_done(self, run: _CollectiveRun, index: int) -> None:
        transfer = run.transfers[index]
        for rank in (transfer.src, transfer.dst):
            run.rank_left[rank] -= 1
            if run.rank_left[rank] == 0:
                self._finish(run.nodes[rank])
        for child in run.children[index]:
            run.waiting[child] -= 1
            if run.waiting[child] == 0:
                self._send_transfer(run, child)

    # ------------------------------------------------------------------ results
    def _result(self) -> ReplayResult:
        n = self.workload.n_ranks
        finish = [0.0] * n
        compute = [0.0] * n
        for node_id, end in self.end_s.items():
            node = self.nodes[node_id]
            finish[node.rank] = max(finish[node.rank], end)
            if isinstance(node, Compute) and not node.cpu:
                compute[node.rank] += node.duration_s
        return ReplayResult(
            completion_time_s=max(finish, default=0.0),
            rank_finish_s=finish,
            rank_compute_s=compute,
            flows=self.flows,
            node_start_s=self.start_s,
            node_end_s=self.end_s,
        )
