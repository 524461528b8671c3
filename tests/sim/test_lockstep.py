from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest

from m4ray.errors import InputError, SimulationError
from m4ray.sim.collectives import HierarchicalSpec, RingSpec
from m4ray.sim.failures import GrayFailure
from m4ray.sim.flows import Flow
from m4ray.sim.flowsim import FlowSimConfig
from m4ray.sim.lockstep import LockstepReplay, _Step, library, round_finish, schedule
from m4ray.sim.replay import Replay
from m4ray.sim.routing import Routing, WireFormat
from m4ray.sim.templates import ClusterTemplateSpec
from m4ray.sim.workload import Collective, CollectiveKind
from m4ray.workload.simai import SimAIProgram, SimAIWorkloadSpec, parse_simai, rank_program
from tests.conftest import write

# 32 GPUs: tp 2 x pp 2 stages of 16, ep 4 over each stage's DP of 8: every group kind and suffix
MOE = (
    "HYBRID_TRANSFORMER_FWD_IN_BCKWD model_parallel_NPU_group: 2 ep: 4 pp: 2 vpp: 1 ga: 1 "
    "all_gpus: 32 checkpoints: 0 checkpoint_initiates: 0 pp_comm 4096\n"
    "4\n"
    "embed -1 2000 BROADCAST 65536 2000 NONE 0 1000 ALLREDUCE 1048576 100\n"
    "attn -1 3000 ALLREDUCE 262144 3000 ALLREDUCE 262144 2000 REDUCESCATTER 2097152 100\n"
    "moe -1 4000 ALLTOALL_EP 524288 4000 ALLTOALL_EP 524288 3000 ALLGATHER_DP_EP 786432 100\n"
    "mlp -1 1500 ALLGATHER_EP 131072 1500 REDUCESCATTER 131072 500 ALLREDUCE_DP_EP 393216 100\n"
)


def _program(path, topo) -> SimAIProgram:
    return SimAIProgram(parse_simai(path), n_hosts=len(topo.hosts), source=path)


def _setup(n_degraded=0, reduction=1, algorithm=None):
    algorithm = algorithm or HierarchicalSpec()
    topo = ClusterTemplateSpec(template="spectrum_x", gpus=32).build()
    topo = GrayFailure(n_degraded=n_degraded, reduction=reduction).apply(topo)
    routing = Routing(topo, wire=WireFormat(mtu_bytes=8948, header_bytes=54))
    return topo, routing, algorithm.build(topo)


@pytest.mark.parametrize("spec", [HierarchicalSpec(), RingSpec()])
def test_rounds_are_every_groups_transfers_step_by_step(tmp_path, spec):
    """Each collective's rounds, repeats expanded, hold exactly the flows the full replay's
    algorithm makes for all the groups of that kind (src, dst, bytes as a multiset)."""
    path = write(tmp_path / "moe.txt", MOE)
    topo, routing, algorithm = _setup(algorithm=spec)
    lock = LockstepReplay(_program(path, topo), topo, routing, FlowSimConfig(), algorithm)
    workload = SimAIWorkloadSpec(path=str(path)).build()
    seen = set()
    for node in workload.nodes:
        if not isinstance(node, Collective) or (node.kind, node.group, node.size_bytes) in seen:
            continue
        seen.add((node.kind, node.group, node.size_bytes))
    nodes, kinds = rank_program(lock.source.groups, lock.source.model.layers)
    distinct = {(n.kind, n.size_bytes, kinds[n.id]) for n in nodes if isinstance(n, Collective)}
    # fwd: broadcast, all-reduce, EP all-to-all, EP all-gather; ig adds a TP reduce-scatter (its
    # all-reduce and all-to-all repeat fwd's); wg: DP all-reduce, reduce-scatter, DP_EP two
    assert len(distinct) == 9
    for kind, size, key in distinct:
        expected = Counter()
        for group in lock.partition(key):
            assert (kind, group, size) in seen  # the full DAG has this collective on this group
            for t in algorithm.decompose(kind, group, size):
                expected[(t.src, t.dst, t.size_bytes)] += 1
        got = Counter()
        for r in lock.rounds(kind, key, size):
            for src, dst, nbytes in r.flows.tolist():
                got[(src, dst, nbytes)] += r.repeat
        assert got == expected


@pytest.mark.parametrize("failure", [(0, 1), (3, 4)])
def test_lockstep_equals_the_full_replay_on_a_symmetric_job(tmp_path, failure):
    """Every group kind, pipeline stages, a gray failure: the iteration time of the lockstep
    replay is the full replay's (flowSim both), with a fraction of the flows simulated."""
    path = write(tmp_path / "moe.txt", MOE)
    topo, routing, algorithm = _setup(*failure)
    lock = LockstepReplay(_program(path, topo), topo, routing, FlowSimConfig(), algorithm).run()
    workload = SimAIWorkloadSpec(path=str(path)).build()
    full = Replay(workload, FlowSimConfig().build(topo, routing), routing, algorithm).run()
    assert lock.completion_time_s == pytest.approx(full.completion_time_s, rel=1e-6)
    assert lock.flows_represented == len(full.flows.flow_id)
    assert lock.flows_simulated < len(full.flows.flow_id)
    assert lock.compute_s == pytest.approx(full.rank_compute_s[0])


@pytest.mark.skipif(library() is None, reason="no C compiler")
def test_compiled_rounds_are_flowsim_flow_by_flow(tmp_path):
    """A round of many flows with a gray failure (the EP all-to-all of every group): the
    compiled round flowSim delivers each flow when FlowSim does, to rounding; the lockstep
    replay gives the same iteration either way."""
    path = write(tmp_path / "moe.txt", MOE)
    topo, routing, algorithm = _setup(5, 4)
    lock = LockstepReplay(_program(path, topo), topo, routing, FlowSimConfig(), algorithm)
    (step,) = lock.rounds(CollectiveKind.ALL_TO_ALL, ("tp", "ep"), 524288)
    hosts = topo.hosts
    flows = [Flow(i, hosts[s], hosts[d], b) for i, (s, d, b) in enumerate(step.flows.tolist())]
    assert len(flows) == 96  # 8 groups of 4, 12 flows each
    backend = FlowSimConfig().build(topo, routing)
    reference = np.full(len(flows), np.nan)
    for flow in flows:
        backend.send(flow, reference.__setitem__)
    backend.run()
    compiled = round_finish(routing, topo.bandwidth_bps, flows)
    np.testing.assert_allclose(compiled, reference, rtol=1e-12)
    assert len(np.unique(reference.round(12))) > 3  # the failure spreads the finish times
    results = [
        LockstepReplay(
            _program(path, topo), topo, routing, FlowSimConfig(), algorithm, compiled=c
        ).run()
        for c in (True, False)
    ]
    assert results[0].completion_time_s == pytest.approx(results[1].completion_time_s, rel=1e-12)


def test_failure_slows_lockstep_and_ranks_must_fit(tmp_path):
    path = write(tmp_path / "moe.txt", MOE)
    topo, routing, algorithm = _setup()
    healthy = LockstepReplay(_program(path, topo), topo, routing, FlowSimConfig(), algorithm).run()
    topo, routing, algorithm = _setup(4, 10)
    hurt = LockstepReplay(_program(path, topo), topo, routing, FlowSimConfig(), algorithm).run()
    assert hurt.completion_time_s > healthy.completion_time_s * 1.05
    big = write(tmp_path / "big.txt", MOE.replace("all_gpus: 32", "all_gpus: 64"))
    with pytest.raises(SimulationError, match="64 ranks but the topology only 32"):
        LockstepReplay(_program(big, topo), topo, routing, FlowSimConfig(), algorithm)


def test_schedule_issues_in_id_order_one_compute_one_cpu_op_and_one_collective_at_a_time():
    # 0 compute 1 s -> 1 collective 2 s (non-blocking) ; 0 -> 2 compute 1 s -> 3 collective 1 s
    steps = [
        _Step(0, (), 1.0, "gpu"),
        _Step(1, (0,), 2.0, "comm"),
        _Step(2, (0,), 1.0, "gpu"),
        _Step(3, (2,), 1.0, "comm"),  # waits for the comm slot: 1 ends at 3
    ]
    assert schedule(steps) == pytest.approx(4.0)
    # a CPU op runs beside GPU compute; two GPU computes queue
    assert schedule([_Step(0, (), 2.0, "gpu"), _Step(1, (), 2.0, "cpu")]) == pytest.approx(2.0)
    assert schedule([_Step(0, (), 2.0, "gpu"), _Step(1, (), 2.0, "gpu")]) == pytest.approx(4.0)
    with pytest.raises(SimulationError, match="deadlocked"):
        schedule([_Step(0, (1,), 1.0, "gpu"), _Step(1, (0,), 1.0, "gpu")])


def test_a_scenario_replays_in_lockstep_on_any_backend():
    """``workload.lockstep``: the same iteration as the full replay on flowSim (a gray failure
    on the default 32-GPU cluster), a row without flows, its own scenario id (the default's is
    unchanged); m4 replays the rounds too, close to its full replay, and a mid-run failure is
    refused by name."""
    from m4ray.sim.m4 import M4Config
    from m4ray.sim.scenario import Scenario, simulate

    failure = GrayFailure(n_degraded=6, reduction=5)
    full = Scenario(failure=failure, workload=SimAIWorkloadSpec(path="microAllReduce", scale=0.1))
    lock = Scenario(
        failure=failure,
        workload=SimAIWorkloadSpec(path="microAllReduce", scale=0.1, lockstep=True),
    )
    assert lock.scenario_id != full.scenario_id
    assert Scenario(
        workload=SimAIWorkloadSpec(path="microAllReduce", lockstep=False)
    ).scenario_id == (Scenario(workload=SimAIWorkloadSpec(path="microAllReduce")).scenario_id)
    (row_full, flows), (row_lock, no_flows) = simulate(full), simulate(lock)
    assert row_lock["status"] == "ok", row_lock["error"]
    assert no_flows is None and row_lock["n_flows"] == flows.num_rows
    assert row_lock["completion_time_s"] == pytest.approx(row_full["completion_time_s"], rel=1e-9)
    m4_lock, m4_full = (
        simulate(dataclasses.replace(s, backend="m4", backend_config=M4Config()))[0]
        for s in (lock, full)
    )
    assert m4_lock["status"] == m4_full["status"] == "ok", m4_lock["error"] + m4_full["error"]
    # m4 is not bit-identical in lockstep (its updates see one step's flows at a time): 0.04 %
    assert m4_lock["completion_time_s"] == pytest.approx(m4_full["completion_time_s"], rel=2e-3)
    late = dataclasses.replace(lock, failure=dataclasses.replace(failure, onset_s=1e-3))
    row_late, _ = simulate(late)
    assert row_late["status"] == "failed" and "onset_s" in row_late["error"]


def test_a_sweep_names_a_lockstep_job_from_its_header_without_unrolling_it(tmp_path):
    """The gray-failure sweep checks the workload before any task: a 9,216-GPU job in lockstep
    is sized from its header (unrolling it would take ~10^7 nodes), bad headers still fail."""
    from m4ray.errors import InputError
    from m4ray.sweeps.gray_failure import describe_workload

    big = MOE.replace("all_gpus: 32", "all_gpus: 9216")
    spec = SimAIWorkloadSpec(path=str(write(tmp_path / "big.txt", big)), lockstep=True)
    assert describe_workload(spec, 9216) == "'big' in lockstep (4 layers, 9216 ranks)"
    bad = write(tmp_path / "bad.txt", big.replace("ep: 4", "ep: 5"))
    with pytest.raises(InputError, match="ep"):
        describe_workload(SimAIWorkloadSpec(path=str(bad), lockstep=True), 9216)
    assert "in lockstep (" in describe_workload(_synthetic(lockstep=True), 32)
    slow = dataclasses.replace(
        _synthetic(lockstep=True), wrappers=[{"kind": "gpu", "ranks": [5], "seconds": 0.001}]
    )
    with pytest.raises(InputError, match="rank 5's program differs"):
        describe_workload(slow, 32)


@pytest.mark.skipif(library() is None, reason="no C compiler")
def test_a_repeated_step_is_the_mean_of_several_ecmp_draws(tmp_path):
    """A ring's 2(n-1) identical steps are new flows each in the full replay, hashed anew over
    the spines: lockstep runs the step under up to ``ecmp_draws`` id ranges and takes the mean."""
    path = write(tmp_path / "moe.txt", MOE)
    topo, routing, algorithm = _setup(algorithm=RingSpec())
    lock = LockstepReplay(_program(path, topo), topo, routing, FlowSimConfig(), algorithm)
    rounds = lock.rounds(CollectiveKind.ALL_REDUCE, ("wg", None), 1048576)
    step = next(r for r in rounds if r.repeat > 4)
    hosts = topo.hosts
    draws = []
    for draw in range(4):
        first = draw * len(step.flows)
        flows = [
            Flow(first + i, hosts[s], hosts[d], b)
            for i, (s, d, b) in enumerate(step.flows.tolist())
        ]
        draws.append(3e-6 + round_finish(routing, topo.bandwidth_bps, flows).max())
    assert lock.timer.seconds(step.flows, step.repeat) == pytest.approx(np.mean(draws), rel=1e-12)
    assert lock.timer.rounds_simulated == 4
    assert lock.timer.seconds(step.flows, 1) == pytest.approx(draws[0], rel=1e-12)
    with pytest.raises(InputError, match="ecmp_draws"):
        LockstepReplay(
            _program(path, topo), topo, routing, FlowSimConfig(), algorithm, ecmp_draws=0
        )


def _synthetic(lockstep=False, layers=1, **parallel):
    from m4ray.workload.synth import SyntheticWorkloadSpec

    model = {"name": "moe", "num_layers": layers, "hidden_size": 1024, "num_heads": 16}
    model |= {"sequence_len": 512, "vocab_size": 32000, "num_microbatches": 1}
    model |= {"num_experts": 8, "top_k": 2, "batch_size": 8}
    layout = {"tp": 4, "pp": 1, "ep": 8, "dp": 8} | parallel
    return SyntheticWorkloadSpec(model=model, parallel=layout, scale=0.1, lockstep=lockstep)


@pytest.mark.parametrize("failure", [(0, 1), (8, 4)])
def test_a_symmetric_dag_replays_in_lockstep_as_in_full(failure):
    """A synthetic MoE job (TP 4, EP 8 over DP 8): every rank runs the same program, so its DAG
    replays in lockstep with the full replay's iteration time, groups read off the DAG."""
    from m4ray.sim.lockstep import symmetric_program

    workload = _synthetic().build()
    program, kinds, partitions = symmetric_program(workload)
    assert set(kinds) == {n.id for n in program if isinstance(n, Collective)}
    assert len(program) == len(workload.nodes) // 32 and len(partitions) >= 2  # TP, EP, DP
    assert all(sum(map(len, groups)) == 32 for groups in partitions.values())
    topo, routing, algorithm = _setup(*failure)
    lock = LockstepReplay(workload, topo, routing, FlowSimConfig(), algorithm).run()
    full = Replay(workload, FlowSimConfig().build(topo, routing), routing, algorithm).run()
    assert lock.completion_time_s == pytest.approx(full.completion_time_s, rel=1e-9)
    assert lock.flows_represented == len(full.flows.flow_id) and lock.n_ranks == 32


def test_an_asymmetric_dag_is_refused_by_name():
    """A straggler or pipeline stages break the symmetry: a clear error, before any round."""
    from m4ray.sim.lockstep import symmetric_program
    from m4ray.sim.scenario import Scenario, simulate

    slow = dataclasses.replace(
        _synthetic(), wrappers=[{"kind": "gpu", "ranks": [3], "seconds": 0.001}]
    )
    with pytest.raises(InputError, match="rank 3's program differs from rank 0's"):
        symmetric_program(slow.build())
    with pytest.raises(InputError, match="pipeline stages are not replayed in lockstep"):
        symmetric_program(_synthetic(layers=2, pp=2, dp=4, ep=4).build())
    row, _ = simulate(Scenario(workload=_synthetic(lockstep=True)))
    assert row["status"] == "ok", row["error"]
    staged = _synthetic(lockstep=True, layers=2, pp=2, dp=4, ep=4)
    row, _ = simulate(Scenario(workload=staged))
    assert row["status"] == "failed" and "point to point" in row["error"]
