from __future__ import annotations

import pytest

from m4ray.errors import InputError, SimulationError
from m4ray.sim.collectives import HierarchicalSpec, Ring
from m4ray.sim.failures import GrayFailure
from m4ray.sim.flowsim import FlowSimConfig
from m4ray.sim.nccl import SimAISpec
from m4ray.sim.replay import Replay
from m4ray.sim.routing import Routing
from m4ray.sim.topologies import rail_cluster
from m4ray.sim.topology import Cable, Topology
from m4ray.sim.workload import Collective, CollectiveKind, Compute, Recv, Send, Workload
from m4ray.workload.simai import SimAIWorkloadSpec
from tests.conftest import write

# two hosts on one switch, 100 Gbps, 1 us per link: no contention in a 2-rank ring
STAR = Topology(
    n_nodes=3, switches=(2,), cables=(Cable(0, 2, 100e9, 1e-6), Cable(1, 2, 100e9, 1e-6))
)


def replay(workload, topo=STAR, algorithm=None, send_latency_s=3e-6):
    routing = Routing(topo)
    backend = FlowSimConfig().build(topo, routing)
    return Replay(
        workload, backend, routing, algorithm or Ring(), send_latency_s=send_latency_s
    ).run()


def test_two_layer_simai_workload_by_hand(tmp_path):
    path = write(
        tmp_path / "two.txt",
        "HYBRID_TRANSFORMER_FWD_IN_BCKWD model_parallel_NPU_group: 2 ep: 1 pp: 1 vpp: 1 "
        "ga: 1 all_gpus: 2 checkpoints: 0 checkpoint_initiates: 0\n2\n"
        "a -1 10000 ALLREDUCE 1000000 1 NONE 0 1 NONE 0 1\n"
        "b -1 5000 ALLREDUCE 2000000 1 NONE 0 1 NONE 0 1\n",
    )
    result = replay(SimAIWorkloadSpec(path=str(path)).build())
    # ring all-reduce over 2 ranks = 2 steps of D/2; each step: 3 us send latency + FCT, where
    # FCT(m) = one way 2 us + one more store-and-forward of the first 1048-B packet (0.08384 us)
    # + (m + ceil(m/1000)*48)*8/100 Gbps
    fct_half_mb = 2.08384 + 524_000 * 8 / 100e3  # 44.00384 us
    fct_one_mb = 2.08384 + 1_048_000 * 8 / 100e3  # 85.92384 us
    expected_us = 10 + 2 * (3 + fct_half_mb) + 5 + 2 * (3 + fct_one_mb) + 4 * 0.001
    assert result.completion_time_s == pytest.approx(expected_us * 1e-6, rel=1e-12)
    assert result.exposed_comm_s == pytest.approx((expected_us - 15.004) * 1e-6, rel=1e-12)
    assert len(result.flows.flow_id) == 8
    assert result.flows.size_bytes == [500_000] * 4 + [1_000_000] * 4


def test_send_recv_matching_and_late_posting():
    delivery_us = 3 + 2.08384 + 1_048_000 * 8 / 100e3  # 88.92384 us
    for recv_after_us, expected_recv_us in ((100.0, 100.0), (50.0, delivery_us)):
        workload = Workload(
            n_ranks=2,
            nodes=[
                Send(id=0, rank=0, peer=1, size_bytes=1_000_000, tag=7),
                Compute(id=1, rank=1, duration_s=recv_after_us * 1e-6),
                Recv(id=2, rank=1, peer=0, size_bytes=1_000_000, tag=7, deps=(1,)),
            ],
        )
        result = replay(workload)
        assert result.node_end_s[0] == pytest.approx(delivery_us * 1e-6, rel=1e-12)
        assert result.node_end_s[2] == pytest.approx(expected_recv_us * 1e-6, rel=1e-12)


def test_one_compute_at_a_time_per_rank():
    workload = Workload(
        n_ranks=1,
        nodes=[Compute(id=0, rank=0, duration_s=5e-6), Compute(id=1, rank=0, duration_s=5e-6)],
    )
    result = replay(workload)
    assert (result.node_end_s[0], result.node_end_s[1]) == (5e-6, 10e-6)


def test_unmatched_receive_is_a_deadlock():
    workload = Workload(n_ranks=2, nodes=[Recv(id=0, rank=1, peer=0, size_bytes=10)])
    with pytest.raises(SimulationError, match="deadlocked"):
        replay(workload)


def test_mismatched_collective_is_reported():
    group = (0, 1)
    workload = Workload(
        n_ranks=2,
        nodes=[
            Collective(id=0, rank=0, kind=CollectiveKind.ALL_REDUCE, size_bytes=100, group=group),
            Collective(id=1, rank=1, kind=CollectiveKind.ALL_REDUCE, size_bytes=200, group=group),
        ],
    )
    with pytest.raises(SimulationError, match="differs across ranks"):
        replay(workload)


def test_bad_dags_are_input_errors():
    with pytest.raises(InputError, match="cycle"):
        Workload(
            n_ranks=1,
            nodes=[
                Compute(id=0, rank=0, duration_s=1, deps=(1,)),
                Compute(id=1, rank=0, duration_s=1, deps=(0,)),
            ],
        )
    with pytest.raises(InputError, match="unknown node"):
        Workload(n_ranks=1, nodes=[Compute(id=0, rank=0, duration_s=1, deps=(9,))])
    with pytest.raises(InputError, match="size"):
        Workload(n_ranks=2, nodes=[Send(id=0, rank=0, peer=1, size_bytes=0)])
    with pytest.raises(InputError, match="ranks"):
        replay(Workload(n_ranks=3, nodes=[Compute(id=0, rank=2, duration_s=1)]))


def test_gray_failures_slow_down_micro_allreduce():
    workload = SimAIWorkloadSpec(path="microAllReduce").build()
    times = {}
    for n, r in ((0, 1), (8, 4), (8, 10)):
        topo = GrayFailure(n_degraded=n, reduction=r).apply(rail_cluster())
        times[n, r] = replay(workload, topo, HierarchicalSpec().build(topo)).completion_time_s
    assert times[0, 1] < times[8, 4] < times[8, 10]
    assert times[0, 1] > 1112e-6  # compute alone


def test_rank0_time_is_rank_zeros_own_finish():
    """``rank0_time_s`` (what SimAI's EndToEnd.csv reports: rank 0 writes it) is rank 0's own
    end, before the job's when another rank works longer; a scenario row carries both."""
    from m4ray.sim.scenario import Scenario, simulate

    workload = Workload(
        n_ranks=2,
        nodes=[
            Send(id=0, rank=0, peer=1, size_bytes=1_000_000, tag=1),
            Recv(id=1, rank=1, peer=0, size_bytes=1_000_000, tag=1),
            Compute(id=2, rank=1, duration_s=50e-6, deps=(1,)),
        ],
    )
    result = replay(workload)
    delivery_s = (3 + 2.08384 + 1_048_000 * 8 / 100e3) * 1e-6
    assert result.rank_finish_s[0] < result.completion_time_s
    assert result.rank0_time_s == result.rank_finish_s[0]
    assert result.completion_time_s == pytest.approx(result.rank_finish_s[1])
    assert result.completion_time_s - result.rank0_time_s == pytest.approx(50e-6, rel=0.05)
    assert result.rank0_time_s >= delivery_s
    # SimAI's study at N8R10 on flowSim: two TP-16 groups, rank 0 ends before the last rank
    scenario = Scenario(
        failure=GrayFailure(n_degraded=8, reduction=10),
        collective=SimAISpec(),
        workload=SimAIWorkloadSpec(path="microAllReduce_tp16", scale=0.02),
    )
    row, _ = simulate(scenario)
    assert row["status"] == "ok", row["error"]
    assert 0 < row["rank0_time_s"] < row["completion_time_s"]
