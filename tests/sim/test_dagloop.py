"""The compiled flowSim loop and replay flows (``m4ray.sim.dagloop``, ``_dagloop.c``) against the
Python replay they twin: flow for flow, to the bit."""

from __future__ import annotations

import dataclasses

import pytest

from m4ray.errors import InputError, SimulationError
from m4ray.sim import flowsim
from m4ray.sim.collectives import HierarchicalSpec, Ring, Transfer
from m4ray.sim.failures import GrayFailure
from m4ray.sim.flowsim import FlowSimConfig
from m4ray.sim.nccl import SimAISpec
from m4ray.sim.replay import FlowLog, Replay
from m4ray.sim.replays import schedule_onset
from m4ray.sim.routing import Routing
from m4ray.sim.topologies import rail_cluster
from m4ray.sim.topology import Cable, Topology
from m4ray.sim.workload import Collective, CollectiveKind, Compute, Recv, Send, Workload
from m4ray.workload.simai import SimAIWorkloadSpec

pytestmark = pytest.mark.skipif(
    not flowsim.native_fluid(), reason="no C compiler: flowSim runs in Python"
)


def both(
    monkeypatch, workload, topo, algorithm, *, settings=None, failure=None, base=None, pairs=False
):
    """The replay run all in Python (numpy fluid state, Python event queue) and compiled:
    (python, compiled) results, replays and backends."""
    out = []
    for compiled in (False, True):
        monkeypatch.setattr(flowsim, "native_fluid", lambda c=compiled: c)
        routing = Routing(topo, seed=3)
        backend = FlowSimConfig(**(settings or {})).build(topo, routing)
        if failure is not None:
            schedule_onset(backend, failure, base)
        replay = Replay(workload, backend, routing, algorithm, compiled=compiled, pair_keys=pairs)
        assert (replay._compiled is not None) == compiled
        out.append((replay.run(), replay, backend))
    return out


def assert_same(python, compiled):
    (a, _, ba), (b, _, bb) = python, compiled
    assert dataclasses.asdict(b.flows) == dataclasses.asdict(a.flows)  # every column, exactly
    assert b.completion_time_s == a.completion_time_s
    assert b.rank_finish_s == a.rank_finish_s
    assert b.node_end_s == a.node_end_s
    assert bb.n_events == ba.n_events
    assert len(a.flows.flow_id) > 0


@pytest.mark.parametrize(
    ("collective", "settings", "failure"),
    [
        ("simai", {}, GrayFailure(n_degraded=3, reduction=4)),
        ("simai", {"ack_load": True}, GrayFailure(n_degraded=8, reduction=10)),
        ("simai-noack", {"rate_cap_bps": 150e9}, GrayFailure(n_degraded=5, reduction=2)),
        ("hierarchical", {}, GrayFailure(n_degraded=4, reduction=4)),
        ("ring", {"ack_load": True}, GrayFailure(n_degraded=2, reduction=5)),
        ("simai", {"service": "fifo"}, GrayFailure(n_degraded=6, reduction=4)),
        (
            "simai",
            {"service": "fifo", "fifo_bytes": 200_000},
            GrayFailure(n_degraded=8, reduction=8),
        ),
    ],
)
def test_compiled_replay_equals_the_python_replay_to_the_bit(
    monkeypatch, collective, settings, failure
):
    """Two all-reduces and an all-gather over 16 GPUs on a degraded rail cluster (SimAI's
    collective with two channels, and the others): every flow's ids, hosts, parent, start,
    finish, ideal FCT and done time, the ranks' finish times and flowSim's event count are the
    Python replay's exactly."""
    base = rail_cluster(servers=2)
    topo = failure.apply(base)
    algorithm = {
        "simai": SimAISpec(channels=2),
        "simai-noack": SimAISpec(channels=2, ack_bytes=None),
        "hierarchical": HierarchicalSpec(),
    }.get(collective)
    algorithm = Ring() if algorithm is None else algorithm.build(topo)
    group = tuple(range(16))
    kinds = (CollectiveKind.ALL_REDUCE, CollectiveKind.ALL_GATHER, CollectiveKind.ALL_REDUCE)
    sizes = (6_000_000, 1_000_000, 300_000)
    nodes = [
        Collective(
            id=16 * k + r,
            rank=r,
            kind=kind,
            group=group,
            size_bytes=size,
            deps=(16 * (k - 1) + r,) if k else (),
        )
        for k, (kind, size) in enumerate(zip(kinds, sizes, strict=True))
        for r in group
    ]
    workload = Workload(n_ranks=16, nodes=nodes)
    python, compiled = both(monkeypatch, workload, topo, algorithm, settings=settings)
    assert_same(python, compiled)
    if collective.startswith("simai"):  # the loop followed parents: SimAI's flows wait on them
        assert max(compiled[0].flows.parent_id) >= 0


def sends_and_computes() -> list:
    """Nodes 0-5: point-to-point sends (rank 2 posts its receive late, after compute)."""
    return [
        Compute(id=0, rank=0, duration_s=5e-6),
        Send(id=1, rank=0, peer=9, size_bytes=3_000_000, tag=1, deps=(0,)),
        Recv(id=2, rank=9, peer=0, size_bytes=3_000_000, tag=1),
        Send(id=3, rank=1, peer=2, size_bytes=700_000, tag=2),
        Compute(id=4, rank=2, duration_s=200e-6),
        Recv(id=5, rank=2, peer=1, size_bytes=700_000, tag=2, deps=(4,)),
    ]


def test_sends_computes_and_a_failure_mid_run_match_too(monkeypatch):
    """Point-to-point sends (started from Python into the loop, some received late), compute,
    a collective, and link rates dropping mid-run (a Python event in the loop's queue)."""
    base = rail_cluster(servers=2)
    failure = GrayFailure(n_degraded=4, reduction=8, onset_s=30e-6)
    nodes = sends_and_computes()
    group = tuple(range(16))
    nodes += [
        Collective(
            id=10 + r,
            rank=r,
            kind=CollectiveKind.ALL_REDUCE,
            group=group,
            size_bytes=4_000_000,
            deps={0: (1,), 9: (2,)}.get(r, ()),
        )
        for r in group
    ]
    workload = Workload(n_ranks=16, nodes=nodes)
    algorithm = SimAISpec().build(base)
    python, compiled = both(monkeypatch, workload, base, algorithm, failure=failure, base=base)
    assert_same(python, compiled)
    assert compiled[0].node_end_s[5] == 200e-6  # posted late: the message was there


class Scripted:
    """A collective whose transfers are given: ``after`` that blocks (a transfer ready before
    the one it must follow has started), a chain of them, and ranks with nothing to move."""

    def decompose(self, kind, group, size):
        return [
            Transfer(0, 8, 4_000_000),  # 0: long
            Transfer(1, 2, 10_000),  # 1: short
            Transfer(2, 9, 50_000, deps=(1,), after=3),  # ready early, blocked on 3
            Transfer(8, 3, 20_000, deps=(0,)),  # 3: after the long one
            Transfer(2, 10, 30_000, deps=(1,), after=2),  # blocked on 2, so on 3
            Transfer(3, 11, 30_000, deps=(1,), after=2),  # blocked on 2 as well
            Transfer(9, 0, 5_000, deps=(2, 4)),
        ]


def test_blocked_transfers_start_with_what_they_follow(monkeypatch):
    """Transfers held by ``after`` start, depth first in order, the moment the one they follow
    starts: the compiled loop as the Python replay, flow for flow."""
    topo = rail_cluster(servers=2)
    group = tuple(range(16))
    nodes = [
        Collective(id=r, rank=r, kind=CollectiveKind.ALL_REDUCE, group=group, size_bytes=1)
        for r in group
    ]
    python, compiled = both(monkeypatch, Workload(n_ranks=16, nodes=nodes), topo, Scripted())
    assert_same(python, compiled)
    flows = compiled[0].flows
    start = dict(zip(flows.flow_id, flows.start_s, strict=True))
    order = flows.flow_id  # flow ids in start order
    by_size = {size: fid for fid, size in zip(flows.flow_id, flows.size_bytes, strict=True)}
    follows = by_size[20_000]
    assert start[by_size[50_000]] == start[follows] > start[by_size[10_000]] + 10e-6
    assert order.index(by_size[50_000]) == order.index(follows) + 1  # then its own blocked
    assert compiled[0].node_end_s[5] == 0.0  # rank 5 moves nothing: done at once


def test_several_jobs_keyed_per_rank_pair_match(monkeypatch):
    """Two jobs on one cluster (``pair_keys``: a flow's ECMP key is its number among its rank
    pair's flows, so a job's paths do not depend on its neighbour): compiled as in Python."""
    from m4ray.sim.templates import ClusterTemplateSpec
    from m4ray.workload.multi import JobEntry, MultiJobSpec
    from m4ray.workload.synth import SyntheticWorkloadSpec

    model = {
        "num_layers": 1,
        "hidden_size": 512,
        "num_heads": 8,
        "sequence_len": 256,
        "vocab_size": 4096,
        "batch_size": 2,
        "num_microbatches": 1,
    }
    job = SyntheticWorkloadSpec(model=model, parallel={"dp": 2})
    spec = MultiJobSpec(  # each job's ring crosses rails, so through the spines: ECMP choices
        jobs=[
            JobEntry(name="a", workload=job, gpus=2, placement=[0, 5]),
            JobEntry(name="b", workload=job, gpus=2, placement=[8, 13]),
        ],
        gpus_per_server=4,
    )
    topo = ClusterTemplateSpec(template="spectrum_x", gpus=16, gpus_per_server=4, spines=2)
    topo = topo.build()
    workload = spec.build(n_hosts=len(topo.hosts))
    python, compiled = both(monkeypatch, workload, topo, SimAISpec().build(topo), pairs=True)
    assert_same(python, compiled)


def test_what_stays_in_python_says_so(monkeypatch):
    """A sender window (not compiled) keeps the replay in Python; so do per-pair keys beyond
    2,048 ranks (a counter per pair)."""
    topo = rail_cluster(servers=4)
    workload = SimAIWorkloadSpec(path="microAllReduce", scale=0.005).build(n_hosts=32)
    routing = Routing(topo)
    windowed = FlowSimConfig(window_bytes=30_000).build(topo, routing)
    assert windowed.dag_loop() is None
    assert Replay(workload, windowed, routing, Ring())._compiled is None
    plain = FlowSimConfig().build(topo, routing)
    assert Replay(workload, plain, routing, Ring(), pair_keys=True)._compiled is not None
    assert Replay(workload, plain, routing, Ring())._compiled is not None
    monkeypatch.setattr("m4ray.sim.dagloop._PAIR_RANKS", 16)
    plain = FlowSimConfig().build(topo, routing)
    assert Replay(workload, plain, routing, Ring(), pair_keys=True)._compiled is None


def deadlocking() -> tuple[Topology, Workload]:
    """Two hosts on a switch and a job whose second receive never matches: one flow, then a
    deadlock."""
    star = Topology(
        n_nodes=3, switches=(2,), cables=(Cable(0, 2, 100e9, 1e-6), Cable(1, 2, 100e9, 1e-6))
    )
    stuck = Workload(
        n_ranks=2,
        nodes=[
            Send(id=0, rank=0, peer=1, size_bytes=50_000, tag=0),
            Recv(id=1, rank=1, peer=0, size_bytes=50_000, tag=0),
            Recv(id=2, rank=1, peer=0, size_bytes=50_000, tag=9, deps=(1,)),
        ],
    )
    return star, stuck


def test_bad_hosts_and_deadlocks_fail_as_in_python_keeping_the_flows():
    """Ranks on hosts that cannot reach each other are named as Routing names them; a
    deadlock after some flows still hands back the flows delivered before it."""
    cut = Topology(
        n_nodes=4,
        switches=(2, 3),
        cables=(Cable(0, 2, 100e9, 1e-6), Cable(1, 3, 100e9, 1e-6)),
    )
    lonely = Workload(n_ranks=2, nodes=[Send(id=0, rank=0, peer=1, size_bytes=1000, tag=0)])
    for compiled in (False, True):
        routing = Routing(cut)
        backend = FlowSimConfig().build(cut, routing)
        with pytest.raises(InputError, match="hosts 0 and 1 are not connected"):
            Replay(lonely, backend, routing, Ring(), compiled=compiled).run()

    star, stuck = deadlocking()
    kept = []
    for compiled in (False, True):
        routing = Routing(star)
        replay = Replay(
            stuck, FlowSimConfig().build(star, routing), routing, Ring(), compiled=compiled
        )
        with pytest.raises(SimulationError, match="deadlocked"):
            replay.run()
        assert isinstance(replay.flows, FlowLog)
        kept.append(dataclasses.asdict(replay.flows))
    assert kept[0] == kept[1]
    assert len(kept[1]["flow_id"]) == 1 and kept[1]["done_s"][0] > 0
