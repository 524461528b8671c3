"""SimAI's NCCL-style collectives (collective=simai): flows, dependencies, replay timing."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from m4ray.errors import InputError
from m4ray.sim.collectives import TransferTable
from m4ray.sim.flowsim import FlowSimConfig
from m4ray.sim.nccl import SimAICollective, SimAISpec
from m4ray.sim.replay import Replay
from m4ray.sim.routing import Routing
from m4ray.sim.scenario import Scenario, flow_table, simulate
from m4ray.sim.topologies import rail_cluster
from m4ray.sim.workload import Collective, Workload
from m4ray.sim.workload import CollectiveKind as K
from m4ray.workload.simai import SimAIWorkloadSpec

MiB = 1 << 20


@pytest.fixture(scope="module")
def algo() -> SimAICollective:
    return SimAISpec().build(rail_cluster())


def test_the_shared_simai_runs_group_gives_its_flows(algo):
    """A TP-16 all-reduce of 16 MiB on two 8-GPU servers: SimAI's run has 3,840 flows of
    131,072 B per group, 210 to the in-server successor and 30 across servers per GPU (420 and
    60 over its two all-reduces)."""
    transfers = algo.decompose(K.ALL_REDUCE, range(16), 16 * MiB)
    assert len(transfers) == 8 * 16 * 30
    assert {t.size_bytes for t in transfers} == {131_072}
    pairs = Counter((t.src, t.dst) for t in transfers)
    assert pairs[0, 1] == 210 and pairs[0, 9] == 30 and pairs[7, 0] == 210 and pairs[7, 8] == 30
    assert len(pairs) == 32
    cross = [t for t in transfers if t.src // 8 != t.dst // 8]
    assert cross and all(t.src % 8 != t.dst % 8 for t in cross)  # every server hop cross-rail
    assert len({t.src for t in cross}) == 16  # each NIC sends in exactly one channel


def test_a_flow_waits_for_what_its_sender_received_and_follows_its_own_send(algo):
    transfers = algo.decompose(K.ALL_REDUCE, range(16), 16 * MiB)
    for t in transfers:
        if not t.deps:
            assert t.after is None
            continue
        (parent,) = t.deps  # no barrier: one parent
        assert transfers[parent].dst == t.src
        assert transfers[t.after].src == t.src
        assert transfers[t.after].dst == t.dst  # the same channel's previous step


def test_channels_follow_members_per_server(algo):
    dp = algo.decompose(K.ALL_REDUCE, [0, 8, 16, 24], 4 * MiB)  # one GPU per server: 1 channel
    assert len(dp) == 4 * 6 and all(t.src % 8 == t.dst % 8 for t in dp)
    assert {t.size_bytes for t in dp} == {MiB}
    tp = algo.decompose(K.ALL_GATHER, range(4), 4 * MiB)  # inside a server: n channels
    assert len(tp) == 4 * 4 * 3
    assert {t.size_bytes for t in tp} == {MiB // 4}
    assert SimAISpec(channels=2).build(rail_cluster()).decompose(K.REDUCE_SCATTER, range(4), 800)
    with pytest.raises(InputError, match="does not divide into servers") as err:
        algo.decompose(K.ALL_REDUCE, [0, 1, 8], MiB)
    assert err.value.field == "group"


def test_all_to_all_is_direct_and_broadcast_a_chain(algo):
    a2a = algo.decompose(K.ALL_TO_ALL, range(16), 16 * MiB)
    assert len(a2a) == 16 * 15 and {t.size_bytes for t in a2a} == {MiB}
    assert all(not t.deps for t in a2a)
    assert len(algo.decompose(K.ALL_TO_ALL, [0, 1, 8], 3000)) == 6  # no rings: any layout
    bcast = algo.decompose(K.BROADCAST, range(8), 8 * MiB)
    assert len(bcast) == 8 * 8 * 7  # channels x chunks x hops
    assert {t.dst for t in bcast} == set(range(1, 8))  # the root only sends


def test_pxn_sends_rail_aligned_after_an_nvlink_hop():
    pxn = SimAISpec(pxn=True).build(rail_cluster())
    transfers = pxn.decompose(K.ALL_REDUCE, range(16), 16 * MiB)
    cross = [t for t in transfers if t.src // 8 != t.dst // 8]
    assert cross and all(t.src % 8 == t.dst % 8 for t in cross)
    for t in cross:
        (hop,) = t.deps
        assert transfers[hop].dst == t.src and transfers[hop].src // 8 == t.src // 8


def test_bad_settings_are_named():
    with pytest.raises(InputError, match="unknown GPU type 'B300'") as err:
        SimAISpec(gpu_type="B300").build(rail_cluster())
    assert err.value.field == "collective.gpu_type"
    with pytest.raises(InputError) as err:
        SimAISpec(channels=0).build(rail_cluster())
    assert err.value.field == "collective.channels"


def _replay(algo, size=2 * MiB):
    topo = rail_cluster(servers=2)
    routing = Routing(topo)
    nodes = [
        Collective(id=r, rank=r, kind=K.ALL_REDUCE, size_bytes=size, group=tuple(range(16)))
        for r in range(16)
    ]
    backend = FlowSimConfig().build(topo, routing)
    replay = Replay(Workload(n_ranks=16, nodes=nodes), backend, routing, algo, send_latency_s=3e-6)
    return replay.run(), routing


def test_replay_starts_a_flow_at_its_parents_ack_or_its_own_previous_start():
    algo = SimAISpec().build(rail_cluster(servers=2))
    result, _ = _replay(algo)
    table = flow_table(result.flows).to_pandas().set_index("flow_id")
    assert len(table) == 8 * 16 * 30
    child = table[table.parent_id >= 0]
    parent_done = table.done_s.loc[child.parent_id].to_numpy()
    gap = child.start_s.to_numpy() - parent_done
    assert gap.min() >= 3e-6 - 1e-12
    # the ACK makes done later than delivery by the reverse path's latency and serialisation
    assert (table.done_s - table.finish_s).between(25e-9 * 2, 5e-6).all()
    # a flow never starts before its sender's own previous flow of the channel (same src, dst)
    for _, flows in table.groupby(["src", "dst"]):
        assert np.all(np.diff(flows.sort_values("start_s").start_s) >= 0)


def test_ack_bytes_null_ends_flows_at_delivery():
    algo = SimAISpec(ack_bytes=None).build(rail_cluster(servers=2))
    result, _ = _replay(algo)
    table = flow_table(result.flows)
    assert np.array_equal(table.column("done_s").to_numpy(), table.column("finish_s").to_numpy())
    with_ack, _ = _replay(SimAISpec().build(rail_cluster(servers=2)))
    assert with_ack.completion_time_s > result.completion_time_s


def test_the_study_scenario_on_flowsim_and_lockstep_refuses_it():
    spec = SimAIWorkloadSpec(path="microAllReduce", scale=0.05)
    row, flows = simulate(Scenario(workload=spec, collective=SimAISpec()))
    assert row["status"] == "ok", row["error"]
    assert flows.num_rows == 8 * 32 * 62 * 2  # 8 channels x 32 ranks x 2(n-1) steps, 2 layers
    spec = SimAIWorkloadSpec(path="microAllReduce", scale=0.05, lockstep=True)
    row, _ = simulate(Scenario(workload=spec, collective=SimAISpec()))
    assert row["status"] == "failed" and "lockstep cannot replay collective=simai" in row["error"]


@pytest.mark.parametrize("spec", [SimAISpec(), SimAISpec(channels=3), SimAISpec(pxn=True)])
def test_the_table_of_a_decomposition_is_the_decomposition(spec):
    """``decompose_table`` (numpy rings, the compiled replay's way in) equals the transfers
    ``decompose`` makes, column for column, for every kind and group layout; bad groups fail
    the same way."""
    topo = rail_cluster(servers=4)
    algo = spec.build(topo)
    groups = [tuple(range(32)), tuple(range(0, 32, 8)), tuple(range(8)), (0, 1, 8, 9, 16, 17)]
    for kind in K:
        for group in [*groups, (3,)]:
            listed = algo.decompose(kind, group, 7_000_000)
            table = algo.decompose_table(kind, group, 7_000_000)
            want = TransferTable.of(listed)
            for column in ("src", "dst", "size", "after", "dep_off", "deps"):
                assert np.array_equal(getattr(table, column), getattr(want, column)), column
    with pytest.raises(InputError, match="does not divide into servers"):
        algo.decompose_table(K.ALL_REDUCE, (0, 1, 8), 1_000_000)
