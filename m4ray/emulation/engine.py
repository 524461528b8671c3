"""``backend=emulation``: one Ray actor per rank walks its part of the workload in wall-clock time.

Each rank (``reference/workloads.md`` §5) runs the replay engine's rules — ready nodes issued in
ascending id order, at most one GPU compute, one CPU op and one send-or-collective in flight,
receives unlimited — but compute *sleeps* (``duration × time_scale``) and communication moves
real bytes over :mod:`~m4ray.emulation.transport` (sizes × ``size_scale``). Collectives are
decomposed by the same algorithm objects as in simulation; a rank walks its transfers of a
collective in index order (sends and receives never deadlock: receiver threads drain sockets).
A send completes when the kernel has taken its bytes (no delivery acknowledgement).

Time: link rates are multiplied by ``rate_scale`` and sizes by ``size_scale``, so wire time
stretches by ``time_scale = size_scale / rate_scale``; compute sleeps and link latencies are
stretched by the same factor, and every measured time is divided by it on the way out.

Network: ``netns`` (default; one namespace per rank, host links shaped by ``tc``, see
:mod:`~m4ray.emulation.netns`) or ``loopback`` (unshaped; a warning says so). On a Ray cluster
``host`` uses the machines' real network (one rank per node, placement group SPREAD).
"""

from __future__ import annotations

import itertools
import os
import threading
import time
import uuid
import warnings
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ClassVar

from m4ray.errors import InputError, SimulationError
from m4ray.sim.replay import FlowLog, ReplayResult
from m4ray.sim.routing import Routing
from m4ray.sim.topology import Topology
from m4ray.sim.workload import Collective, Compute, Node, Recv, Send, Workload

P2P_TAG_BASE = 0
COLL_TAG_BASE = 1 << 40


@dataclass(kw_only=True, slots=True)
class EmulationConfig:
    """Settings of the emulation backend (``conf/backend/emulation.yaml``)."""

    replay: ClassVar[str] = "emulation"  # m4ray.sim.replays

    network: str = "netns"  # netns | loopback | host (a Ray cluster's real network)
    rate_scale: float = 1e-3  # 400 Gbps -> 400 Mbps
    size_scale: float = 1e-3  # bytes sent per byte of the workload
    port: int = 17100
    timeout_s: float = 600.0
    start_delay_s: float = 0.5  # ranks start together this long after the last one is ready

    def __post_init__(self) -> None:
        if self.network not in ("netns", "loopback", "host"):
            raise InputError(f"unknown network {self.network!r} (netns, loopback, host)",
                             field="emulation.network")  # fmt: skip
        for name in ("rate_scale", "size_scale", "timeout_s"):
            if getattr(self, name) <= 0:
                raise InputError("must be > 0", field=f"emulation.{name}")

    @property
    def time_scale(self) -> float:
        return self.size_scale / self.rate_scale

    def run_workload(
        self, topo: Topology, routing: Routing, workload: Workload, algorithm: Any
    ) -> ReplayResult:
        return emulate(workload, topo, routing, algorithm, self)


# ------------------------------------------------------------------------------ one rank
@dataclass(slots=True)
class RankPlan:
    """What one rank runs: its nodes, the transfers of its collectives, and tags."""

    rank: int
    nodes: list[Node]
    # collective node -> its transfers touching this rank: (index, src, dst, bytes, deps)
    transfers: dict[int, list[tuple[int, int, int, int, tuple[int, ...]]]]
    tags: dict[int, int]  # coll node -> tag base
    time_scale: float
    size_scale: float


def plan_ranks(workload: Workload, algorithm: Any, cfg: EmulationConfig) -> list[RankPlan]:
    """Split the workload per rank and decompose every collective (checks before any start)."""
    rank_of = {node.id: node.rank for node in workload.nodes}
    for node in workload.nodes:
        for dep in node.deps:
            if rank_of[dep] != node.rank:
                raise InputError(
                    f"node {node.id} (rank {node.rank}) depends on node {dep} of rank "
                    f"{rank_of[dep]}: emulated ranks only share messages",
                    field="deps",
                )
    plans = [RankPlan(r, [], {}, {}, cfg.time_scale, cfg.size_scale)
             for r in range(workload.n_ranks)]  # fmt: skip
    groups = sorted({n.group for n in workload.nodes if isinstance(n, Collective)})
    group_index = {g: i for i, g in enumerate(groups)}
    seq: dict[tuple[int, tuple[int, ...]], int] = defaultdict(int)
    for node in sorted(workload.nodes, key=lambda n: n.id):
        plan = plans[node.rank]
        plan.nodes.append(node)
        if isinstance(node, Collective):
            k = seq[(node.rank, node.group)]
            seq[(node.rank, node.group)] = k + 1
            size = max(1, round(node.size_bytes * cfg.size_scale))
            transfers = algorithm.decompose(node.kind, node.group, size)
            mine = []
            for index, t in enumerate(transfers):
                if node.rank in (t.src, t.dst):
                    for dep in t.deps if t.src == node.rank else ():
                        if node.rank not in (transfers[dep].src, transfers[dep].dst):
                            raise InputError(
                                f"collective node {node.id}: transfer {index} waits for transfer "
                                f"{dep} of other ranks; emulation needs algorithms whose ranks "
                                "wait only on their own messages (ring)",
                                field="collective",
                            )
                    mine.append((index, t.src, t.dst, t.size_bytes, t.deps))
            plan.transfers[node.id] = mine
            plan.tags[node.id] = COLL_TAG_BASE + (group_index[node.group] * 1_000_000 + k) * 4096
            if len(transfers) >= 4096:
                raise InputError(
                    f"collective node {node.id}: {len(transfers)} transfers (max 4095 per "
                    "collective in emulation)",
                    field="size_bytes",
                )
    return plans


class RankRunner:
    """Executes one :class:`RankPlan` on a transport; returns times and per-message records."""

    def __init__(self, plan: RankPlan, transport) -> None:
        self.plan, self.transport = plan, transport
        self.by_id = {n.id: n for n in plan.nodes}
        self.children: dict[int, list[int]] = defaultdict(list)
        self.pending = {n.id: len(n.deps) for n in plan.nodes}
        for n in plan.nodes:
            for dep in n.deps:
                self.children[dep].append(n.id)
        self.start: dict[int, float] = {}
        self.end: dict[int, float] = {}
        self.sent: list[tuple[int, int, int, int, float]] = []  # dst, tag, seq, bytes, t0
        self.received: list[tuple[int, int, int, float]] = []  # src, tag, seq, arrival
        self._seq: dict[tuple[int, int], int] = defaultdict(int)
        self._lock = threading.Lock()

    def _send(self, dst: int, tag: int, nbytes: int) -> None:
        with self._lock:
            seq = self._seq[(dst, tag)]
            self._seq[(dst, tag)] = seq + 1
        t0 = time.time()
        self.transport.send(dst, tag, nbytes)
        with self._lock:
            self.sent.append((dst, tag, seq, nbytes, t0))

    def _recv(self, src: int, tag: int, timeout: float) -> None:
        message = self.transport.recv(src, tag, timeout=timeout)
        with self._lock:
            self.received.append((src, tag, message.seq, message.arrived_s))

    def _execute(self, node: Node, timeout: float) -> None:
        p = self.plan
        if isinstance(node, Compute):
            time.sleep(node.duration_s * p.time_scale)
        elif isinstance(node, Send):
            self._send(
                node.peer, P2P_TAG_BASE + node.tag, max(1, round(node.size_bytes * p.size_scale))
            )
        elif isinstance(node, Recv):
            self._recv(node.peer, P2P_TAG_BASE + node.tag, timeout)
        else:
            self._collective(node, timeout)

    def _collective(self, node: Collective, timeout: float) -> None:
        """Receives all posted at once; sends in index order, each once its deps are done."""
        base, mine = self.plan.tags[node.id], self.plan.transfers[node.id]
        completed: set[int] = set()
        errors: list[BaseException] = []
        cond = threading.Condition()

        def receive(index: int, src: int) -> None:
            try:
                self._recv(src, base + index, timeout)
            except BaseException as err:  # re-raised below
                errors.append(err)
            with cond:
                completed.add(index)
                cond.notify_all()

        threads = [
            threading.Thread(target=receive, args=(index, src), daemon=True)
            for index, src, dst, _, _ in mine
            if dst == self.plan.rank
        ]
        for thread in threads:
            thread.start()
        for index, src, dst, nbytes, deps in mine:
            if src != self.plan.rank:
                continue
            with cond:
                if not cond.wait_for(lambda d=deps: completed.issuperset(d), timeout=timeout):
                    raise SimulationError(f"rank {self.plan.rank}: collective {node.id} stuck")
            if errors:
                raise errors[0]
            self._send(dst, base + index, nbytes)
            with cond:
                completed.add(index)
                cond.notify_all()
        for thread in threads:
            thread.join(timeout)
        if errors:
            raise errors[0]

    def run(self, start_at: float, timeout: float) -> dict[str, Any]:
        """Walk the rank's DAG from wall time ``start_at``; times are relative to it."""
        time.sleep(max(0.0, start_at - time.time()))
        done: list[tuple[int, BaseException | None]] = []
        cond = threading.Condition()
        busy = {"gpu": False, "cpu": False, "comm": False}
        ready = sorted(n.id for n in self.plan.nodes if not n.deps)

        def resource(node: Node) -> str | None:
            if isinstance(node, Compute):
                return "cpu" if node.cpu else "gpu"
            return None if isinstance(node, Recv) else "comm"

        def work(node: Node) -> None:
            err = None
            try:
                self._execute(node, timeout)
            except BaseException as e:  # reported to the driver
                err = e
            with cond:
                self.end[node.id] = time.time() - start_at
                done.append((node.id, err))
                cond.notify()

        pool = ThreadPoolExecutor(max_workers=max(4, len(self.plan.nodes)),
                                  thread_name_prefix=f"rank{self.plan.rank}")  # fmt: skip
        finished = 0
        try:
            while finished < len(self.plan.nodes):
                for node_id in list(ready):
                    node = self.by_id[node_id]
                    res = resource(node)
                    if res is not None and busy[res]:
                        continue
                    if res is not None:
                        busy[res] = True
                    ready.remove(node_id)
                    self.start[node_id] = time.time() - start_at
                    pool.submit(work, node)
                with cond:
                    while not done:
                        if not cond.wait(timeout=timeout):
                            raise SimulationError(f"rank {self.plan.rank}: nothing finished in "
                                                  f"{timeout} s")  # fmt: skip
                    batch, done[:] = list(done), []
                for node_id, err in batch:
                    if err is not None:
                        raise SimulationError(f"rank {self.plan.rank}, node {node_id}: {err}")
                    finished += 1
                    res = resource(self.by_id[node_id])
                    if res is not None:
                        busy[res] = False
                    for child in self.children[node_id]:
                        self.pending[child] -= 1
                        if self.pending[child] == 0:
                            ready.append(child)
                ready.sort()
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        compute = sum(n.duration_s for n in self.plan.nodes
                      if isinstance(n, Compute) and not n.cpu)  # fmt: skip
        return {"rank": self.plan.rank, "start": self.start, "end": self.end, "sent": self.sent,
                "received": self.received, "compute_s": compute, "start_at": start_at}  # fmt: skip


# ------------------------------------------------------------------------------ Ray actors
class RankActor:
    """One rank's process (a Ray actor): namespace, transport, runner."""

    def __init__(self, plan: RankPlan, namespace: str | None) -> None:
        self.plan, self.namespace = plan, namespace
        self.transport = None

    def address(self) -> str:
        import ray

        return ray.util.get_node_ip_address()

    def setup(self, addresses: list[tuple[str, int]]) -> int:
        from m4ray.emulation import netns
        from m4ray.emulation.transport import Transport

        if self.namespace:
            netns.enter(self.namespace)  # this thread and the threads it starts
        self.transport = Transport(self.plan.rank, addresses)
        return os.getpid()

    def run(self, start_at: float, timeout: float) -> dict[str, Any]:
        from m4ray.emulation import netns

        if self.namespace:
            netns.enter(self.namespace)
        try:
            return RankRunner(self.plan, self.transport).run(start_at, timeout)
        finally:
            self.transport.close()


def emulate(
    workload: Workload, topo: Topology, routing: Routing, algorithm: Any, cfg: EmulationConfig
) -> ReplayResult:
    """Run ``workload`` on real processes and sockets; the result reads like a simulation's."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from m4ray.emulation import netns

    n = workload.n_ranks
    hosts = topo.hosts
    if n > len(hosts):
        raise InputError(f"workload has {n} ranks but the topology only {len(hosts)} hosts")
    plans = plan_ranks(workload, algorithm, cfg)
    network = cfg.network
    if network == "netns":
        reason = netns.available()
        if reason is not None:
            warnings.warn(f"network namespaces unavailable ({reason}): emulating on loopback, "
                          "links are NOT shaped", stacklevel=2)  # fmt: skip
            network = "loopback"
    shaped = None
    if network == "netns":
        uplinks, downlinks = netns.plan(topo, routing, n, cfg.rate_scale, cfg.time_scale)
        shaped = netns.NamespaceNetwork(uuid.uuid4().hex[:6], uplinks, downlinks)
    if not ray.is_initialized():
        raise SimulationError("emulation needs a running Ray (the sweep starts one)")
    pg = placement_group([{"CPU": 0.01}] * n, strategy="SPREAD" if network == "host" else "PACK")
    actors = []
    try:
        if shaped is not None:
            shaped.__enter__()
        ray.get(pg.ready(), timeout=cfg.timeout_s)
        remote = ray.remote(RankActor)
        for r in range(n):
            strategy = PlacementGroupSchedulingStrategy(placement_group=pg,
                                                        placement_group_bundle_index=r)  # fmt: skip
            ns = shaped.namespace(r) if shaped is not None else None
            actors.append(remote.options(num_cpus=0.01, scheduling_strategy=strategy,
                                         max_concurrency=2).remote(plans[r], ns))  # fmt: skip
        if network == "netns":
            addresses = [(netns.address(r), cfg.port) for r in range(n)]
        elif network == "loopback":
            addresses = [("127.0.0.1", cfg.port + r) for r in range(n)]
        else:
            ips = ray.get([a.address.remote() for a in actors])
            addresses = [(ip, cfg.port + r) for r, ip in enumerate(ips)]
        ray.get([a.setup.remote(addresses) for a in actors], timeout=cfg.timeout_s)
        start_at = time.time() + cfg.start_delay_s
        outs = ray.get([a.run.remote(start_at, cfg.timeout_s) for a in actors],
                       timeout=cfg.timeout_s * 2)  # fmt: skip
    except ray.exceptions.RayTaskError as err:
        raise SimulationError(f"emulation failed: {err.cause if hasattr(err, 'cause') else err}"
                              ) from err  # fmt: skip
    finally:
        for actor in actors:
            ray.kill(actor)
        remove_placement_group(pg)
        if shaped is not None:
            shaped.close()
    return _result(workload, outs, cfg, hosts, routing)


def _result(workload, outs, cfg: EmulationConfig, hosts, routing: Routing) -> ReplayResult:
    k = cfg.time_scale
    node_start, node_end = {}, {}
    finish, compute = [0.0] * workload.n_ranks, [0.0] * workload.n_ranks
    arrivals = {}
    for out in outs:
        r = out["rank"]
        node_start.update({i: t / k for i, t in out["start"].items()})
        node_end.update({i: t / k for i, t in out["end"].items()})
        finish[r] = max(out["end"].values(), default=0.0) / k
        compute[r] = out["compute_s"]
        for src, tag, seq, t in out["received"]:
            arrivals[(src, r, tag, seq)] = (t - out["start_at"]) / k
    log = FlowLog()
    counter = itertools.count()
    for out in outs:
        r = out["rank"]
        for dst, tag, seq, nbytes, t0 in sorted(out["sent"], key=lambda s: s[4]):
            size = round(nbytes / cfg.size_scale)
            log.flow_id.append(next(counter))
            log.node_id.append(-1)
            log.src.append(hosts[r])
            log.dst.append(hosts[dst])
            log.size_bytes.append(size)
            log.start_s.append((t0 - out["start_at"]) / k)
            log.finish_s.append(arrivals.get((r, dst, tag, seq), float("nan")))
            log.ideal_fct_s.append(routing.ideal_fct(size, routing.path(hosts[r], hosts[dst])))
    return ReplayResult(
        completion_time_s=max(finish, default=0.0),
        rank_finish_s=finish,
        rank_compute_s=compute,
        flows=log,
        node_start_s=node_start,
        node_end_s=node_end,
    )


__all__ = ["EmulationConfig", "RankPlan", "RankRunner", "emulate", "plan_ranks"]
