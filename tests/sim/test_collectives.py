from __future__ import annotations

from collections import Counter

import pytest

from m4ray.errors import InputError
from m4ray.sim.collectives import Hierarchical, HierarchicalSpec, Ring
from m4ray.sim.topologies import rail_cluster
from m4ray.sim.workload import CollectiveKind as K

MiB = 1 << 20


def per_rank_sends(transfers):
    return Counter(t.src for t in transfers)


def test_ring_all_reduce_steps_and_sizes():
    transfers = Ring().decompose(K.ALL_REDUCE, range(8), MiB)
    assert per_rank_sends(transfers) == dict.fromkeys(range(8), 14)  # 2(n-1)
    assert {t.size_bytes for t in transfers} == {131_072}
    assert all((t.dst - t.src) % 8 == 1 for t in transfers)


def test_ring_dependencies_chain_each_step():
    transfers = Ring().decompose(K.ALL_REDUCE, [0, 1, 2, 3], 4000)
    n = 4
    assert all(t.deps == () for t in transfers[:n])
    for step in range(1, 6):
        for pos in range(n):
            deps = set(transfers[step * n + pos].deps)
            received = (step - 1) * n + (pos - 1) % n  # what this rank got last step
            own = (step - 1) * n + pos  # this rank's previous send
            assert deps == {received, own}
            assert transfers[received].dst == transfers[step * n + pos].src


@pytest.mark.parametrize(
    ("kind", "sends"), [(K.REDUCE_SCATTER, 5), (K.ALL_GATHER, 5), (K.ALL_TO_ALL, 5)]
)
def test_other_collectives(kind, sends):
    transfers = Ring().decompose(kind, range(6), 6000)
    assert per_rank_sends(transfers) == dict.fromkeys(range(6), sends)
    assert {t.size_bytes for t in transfers} == {1000}
    if kind is K.ALL_TO_ALL:
        assert {(t.src, t.dst) for t in transfers} == {
            (a, b) for a in range(6) for b in range(6) if a != b
        }


def test_odd_sizes_round_up_and_single_rank_groups_send_nothing():
    assert {t.size_bytes for t in Ring().decompose(K.ALL_REDUCE, range(3), 10)} == {4}
    assert Ring().decompose(K.ALL_REDUCE, [5], 1000) == []


def test_hierarchical_all_reduce_on_the_rail_cluster():
    algo = HierarchicalSpec().build(rail_cluster())
    transfers = algo.decompose(K.ALL_REDUCE, range(32), 256 * MiB)
    local = [t for t in transfers if t.src // 8 == t.dst // 8]
    cross = [t for t in transfers if t.src // 8 != t.dst // 8]
    assert len(local) == 2 * 4 * 8 * 7  # reduce-scatter + all-gather, 7 steps, 8 ranks, 4 servers
    assert {t.size_bytes for t in local} == {32 * MiB}
    assert len(cross) == 8 * 4 * 6  # 8 rail groups of 4, 2(4-1) steps
    assert {t.size_bytes for t in cross} == {8 * MiB}  # (D/8)/4
    assert all(t.src % 8 == t.dst % 8 for t in cross)  # same local index: one rail


def test_hierarchical_phases_wait_for_the_previous_phase():
    algo = Hierarchical(server_of=lambda r: r // 2)
    transfers = algo.decompose(K.ALL_REDUCE, range(4), 4000)
    first_cross = next(i for i, t in enumerate(transfers) if t.src // 2 != t.dst // 2)
    rank = transfers[first_cross].src
    deps = [transfers[d] for d in transfers[first_cross].deps]
    # waits for its rank's reduce-scatter: the last message it received and the last it sent
    assert sorted((t.src == rank, t.dst == rank) for t in deps) == [(False, True), (True, False)]


def test_hierarchical_needs_balanced_servers():
    algo = Hierarchical(server_of=lambda r: 0 if r < 3 else 1)
    with pytest.raises(InputError, match="same number"):
        algo.decompose(K.ALL_REDUCE, range(4), 4000)


def test_broadcast_pipelines_chunks_down_the_chain():
    transfers = Ring().decompose(K.BROADCAST, [3, 1, 2, 0], 4000)  # root 3
    received = Counter()
    for t in transfers:
        received[t.dst] += t.size_bytes
    assert received == {1: 4000, 2: 4000, 0: 4000}  # everyone but the root gets the buffer
    assert {(t.src, t.dst) for t in transfers} == {(3, 1), (1, 2), (2, 0)}
    hops = 3
    for index, t in enumerate(transfers):
        chunk, hop = divmod(index, hops)
        expected = set()
        if hop:  # forwarded only after it arrived
            expected.add(index - 1)
            assert transfers[index - 1].dst == t.src
        if chunk:  # after the previous chunk left on the same hop
            expected.add(index - hops)
        assert set(t.deps) == expected
    # the hierarchical algorithm broadcasts over the flat chain too
    hier = HierarchicalSpec().build(rail_cluster()).decompose(K.BROADCAST, [0, 8, 1, 9], 800)
    assert len(hier) == 4 * 3 and {t.size_bytes for t in hier} == {200}


def test_broadcast_replays_on_flowsim():
    from m4ray.sim.flowsim import FlowSimConfig
    from m4ray.sim.replay import Replay
    from m4ray.sim.routing import Routing
    from m4ray.sim.topology import Cable, Topology
    from m4ray.sim.workload import Collective, Workload

    star = Topology(
        n_nodes=5, switches=(4,), cables=tuple(Cable(h, 4, 100e9, 1e-6) for h in range(4))
    )
    routing = Routing(star)
    size = 4_000_000
    nodes = [
        Collective(id=r, rank=r, kind=K.BROADCAST, size_bytes=size, group=(0, 1, 2, 3))
        for r in range(4)
    ]
    result = Replay(
        Workload(n_ranks=4, nodes=nodes), FlowSimConfig().build(star, routing), routing, Ring()
    ).run()
    pipelined = (4 + 2) * routing.wire.wire_bytes(size // 4) * 8 / 100e9  # chunks + hops - 1
    assert pipelined < result.completion_time_s < pipelined * 1.2
