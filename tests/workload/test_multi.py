"""Several jobs on one cluster (m4ray.workload.multi): placement, the composed DAG, bad input
named by job and field, and the network answers the issue asks for — jobs that share no link
run as they do alone (flowSim and ns-3, exactly), jobs that share a rail uplink slow each other
as ns-3 says and a fault on that uplink slows both."""

from __future__ import annotations

import dataclasses
import json

import pytest

from m4ray.errors import InputError
from m4ray.sim.collectives import HierarchicalSpec
from m4ray.sim.failures import GrayFailure
from m4ray.sim.flowsim import FlowSimConfig
from m4ray.sim.nccl import SimAISpec
from m4ray.sim.ns3.backend import Ns3Config
from m4ray.sim.scenario import Scenario, simulate
from m4ray.sim.templates import ClusterTemplateSpec
from m4ray.sim.workload import Collective, Compute
from m4ray.workload.multi import JobEntry, MultiJobSpec
from m4ray.workload.synth import SyntheticWorkloadSpec

HEALTHY = GrayFailure(n_degraded=0, reduction=1)


def dp_job(name: str, gpus: int, placement="packed", *, tp: int = 1, **entry) -> JobEntry:
    """A small data-parallel (× tensor-parallel) GPT job of ``gpus`` GPUs."""
    workload = SyntheticWorkloadSpec(
        model={
            "num_layers": 1,
            "hidden_size": 512,
            "num_heads": 8,
            "sequence_len": 256,
            "vocab_size": 4096,
            "batch_size": 2 * (gpus // tp),
            "num_microbatches": 1,
        },
        parallel={"dp": gpus // tp, "tp": tp},
    )
    return JobEntry(name=name, workload=workload, gpus=gpus, placement=placement, **entry)


def test_placement_policies():
    spec = MultiJobSpec(
        jobs=[
            dp_job("fixed", 2, [5, 6]),
            dp_job("packed", 4),
            dp_job("spread", 4, "spread"),
            dp_job("random", 4, "random", seed=3),
        ],
        gpus_per_server=4,
    )
    placed = spec.placements(16)
    assert placed[0] == (5, 6)  # explicit lists are reserved first
    assert placed[1] == (0, 1, 2, 3)  # packed fills server 0
    assert placed[2] == (4, 8, 12, 7)  # one per server in turn, then around again
    assert len(set(placed[3])) == 4 and not set(placed[3]) & {0, 1, 2, 3, 4, 5, 6, 7, 8, 12}
    assert placed[3] == spec.placements(16)[3]  # the seed fixes the draw
    owner = spec.job_of_host(16)
    assert [int(owner[g]) for g in (5, 0, 4, 9)] == [0, 1, 2, -1 if 9 not in placed[3] else 3]


def test_random_servers_hands_out_whole_free_servers():
    spec = MultiJobSpec(
        jobs=[
            dp_job("fixed", 1, [5]),
            dp_job("a", 8, "random_servers", seed=1),
            dp_job("b", 6, "random_servers", seed=2),
        ],
        gpus_per_server=4,
    )
    fixed, a, b = spec.placements(24)
    servers_a, servers_b = {g // 4 for g in a}, {g // 4 for g in b}
    assert len(a) == 8 and len(servers_a) == 2 and 1 not in servers_a  # server 1 is not whole
    assert len(b) == 6 and len(servers_b) == 2 and not servers_a & servers_b and 1 not in servers_b
    assert spec.placements(24) == [fixed, a, b]  # the seeds fix the draw
    greedy = MultiJobSpec(
        jobs=[dp_job("x", 2, [0, 5]), dp_job("y", 12, "random_servers")], gpus_per_server=4
    )
    with pytest.raises(InputError, match="needs 3 whole servers; 2 are free") as err:
        greedy.placements(16)
    assert err.value.field == "workload.jobs[1].placement"


def test_the_dag_puts_each_job_on_its_gpus_with_offsets_and_iterations():
    spec = MultiJobSpec(
        jobs=[dp_job("a", 4), dp_job("b", 4, [8, 9, 12, 13], start_s=1e-3, iterations=2)],
        gpus_per_server=4,
    )
    one = dp_job("b", 4).workload.build(n_hosts=4)
    dag = spec.build(16)
    assert dag.n_ranks == 16 and len({n.id for n in dag.nodes}) == len(dag.nodes)
    b_nodes = [n for n in dag.nodes if n.rank in (8, 9, 12, 13)]
    starts = [n for n in b_nodes if isinstance(n, Compute) and n.name == "start"]
    assert len(starts) == 4 and all(n.duration_s == 1e-3 for n in starts)
    assert len(b_nodes) == 4 + 2 * len(one.nodes)  # start offsets + two iterations
    groups = {n.group for n in dag.nodes if isinstance(n, Collective)}
    assert (8, 9, 12, 13) in groups and (0, 1, 2, 3) in groups
    # on flowSim: b's iterations each take what one takes alone, after its offset
    topo = ClusterTemplateSpec(template="spectrum_x", gpus=16, gpus_per_server=4, spines=1)
    row, flows = simulate(Scenario(topology=topo, workload=spec, collective=HierarchicalSpec()))
    assert row["status"] == "ok", row["error"]
    times = json.loads(row["job_iteration_s"])
    alone = MultiJobSpec(jobs=[dp_job("b", 4, [8, 9, 12, 13])], gpus_per_server=4)
    single, _ = simulate(Scenario(topology=topo, workload=alone, collective=HierarchicalSpec()))
    single_s = json.loads(single["job_iteration_s"])["b"]
    assert times["b"] == pytest.approx(single_s, rel=0.02)
    assert set(flows.column("job").to_pylist()) == {"a", "b"}


@pytest.mark.parametrize(
    ("jobs", "field", "message"),
    [
        ([dp_job("a", 12), dp_job("b", 8)], "workload.jobs[1].gpus", "4 of them free"),
        ([dp_job("a", 2, [0, 1]), dp_job("b", 2, [1, 2])], "jobs[1].placement", "also placed"),
        ([dp_job("a", 2, [0, 16])], "jobs[0].placement", "outside the cluster"),
        ([dp_job("a", 2, "scattered")], "jobs[0].placement", "unknown placement policy"),
        ([dp_job("a", 2, [0, 1, 2])], "jobs[0].placement", "3 GPUs listed"),
        ([dp_job("a", 2), dp_job("a", 2)], "jobs[1].name", "used twice"),
        (
            [dataclasses.replace(dp_job("a", 4), workload=dp_job("x", 8).workload)],
            "jobs[0].gpus",
            "has 8 ranks, its placement 4 GPUs",
        ),
    ],
)
def test_bad_jobs_are_named(jobs, field, message):
    with pytest.raises(InputError, match=message) as err:
        MultiJobSpec(jobs=jobs, gpus_per_server=4).build(16)
    assert err.value.field.endswith(field)


def test_a_group_that_does_not_fit_its_placement_and_lockstep_are_refused():
    topo = ClusterTemplateSpec(template="spectrum_x", gpus=16, gpus_per_server=4, spines=1)
    algorithm = SimAISpec().build(topo.build())
    lopsided = MultiJobSpec(jobs=[dp_job("a", 4, [0, 1, 2, 4])], gpus_per_server=4)
    with pytest.raises(InputError, match=r"job 'a'.*does not fit its placement") as err:
        lopsided.check_groups(16, algorithm)
    assert err.value.field == "workload.jobs[0].placement"
    job = dp_job("a", 4)
    job.workload.lockstep = True
    with pytest.raises(InputError, match="not rank-symmetric") as err:
        MultiJobSpec(jobs=[job], gpus_per_server=4)
    assert err.value.field == "workload.jobs[0].workload.lockstep"


def _iterations(topo, spec, backend, config, failure=HEALTHY, *, collective=None):
    row, _ = simulate(
        Scenario(
            topology=topo,
            workload=spec,
            failure=failure,
            collective=collective or HierarchicalSpec(),
            backend=backend,
            backend_config=config,
        )
    )
    assert row["status"] == "ok", row["error"]
    return json.loads(row["job_iteration_s"])


@pytest.mark.parametrize("backend", ["flowsim", "ns3"])
def test_jobs_that_share_no_link_run_as_they_do_alone(backend):
    """Two TP 4 × DP 2 jobs on servers 0-1 and 2-3: rail-aligned traffic under each server's own
    NIC cables (the rail switches are shared, no cable is)."""
    config = FlowSimConfig() if backend == "flowsim" else Ns3Config()
    topo = ClusterTemplateSpec(template="spectrum_x", gpus=16, gpus_per_server=4, spines=1)
    spec = MultiJobSpec(jobs=[dp_job("a", 8, tp=4), dp_job("b", 8, tp=4)], gpus_per_server=4)
    together = _iterations(topo, spec, backend, config)
    for j, name in enumerate(("a", "b")):
        assert _iterations(topo, spec.alone(j, 16), backend, config)[name] == together[name]


def test_jobs_sharing_a_rail_uplink_slow_each_other_as_ns3_says():
    """Two 2-GPU DP jobs whose SimAI ring hops cross rails 0 -> 1 through the one spine: both
    use rail 0's and rail 1's uplinks. flowSim's and m4's neighbour slowdowns are within 5 % of
    ns-3's; a fault on rail 0's uplink slows both jobs on every backend."""
    from m4ray.sim.m4 import M4Config

    topo = ClusterTemplateSpec(template="spectrum_x", gpus=16, gpus_per_server=4, spines=1)
    spec = MultiJobSpec(jobs=[dp_job("a", 2, [0, 5]), dp_job("b", 2, [8, 13])], gpus_per_server=4)
    uplink = GrayFailure(n_degraded=1, reduction=4, target="asw_uplinks", at=(0,))
    simai = SimAISpec()
    factor = {}
    for backend, config in [("ns3", Ns3Config()), ("flowsim", FlowSimConfig()), ("m4", M4Config())]:
        shared = _iterations(topo, spec, backend, config, collective=simai)
        failed = _iterations(topo, spec, backend, config, uplink, collective=simai)
        for j, name in enumerate(("a", "b")):
            alone = _iterations(topo, spec.alone(j, 16), backend, config, collective=simai)[name]
            factor[backend, name] = shared[name] / alone
            assert failed[name] > 1.2 * shared[name], (backend, name)
    for name in ("a", "b"):
        assert factor["ns3", name] > 1.3  # they do contend
        for backend in ("flowsim", "m4"):
            assert factor[backend, name] == pytest.approx(factor["ns3", name], rel=0.05)


def test_jobs_of_every_kind_share_a_cluster(tmp_path):
    """A SimAI file (32 GPUs) beside a Chakra trace (8 GPUs, offset, two iterations) on flowSim
    through SimAI's collectives: both run, and each flow says whose it is."""
    from m4ray.workload import chakra
    from m4ray.workload.chakra import ChakraWorkloadSpec
    from m4ray.workload.simai import SimAIWorkloadSpec
    from m4ray.workload.synth import synthesize

    chakra.write(synthesize(dp_job("x", 8).workload.job()), tmp_path / "job")
    simai = SimAIWorkloadSpec(path="microAllReduce", scale=0.01)
    traced = ChakraWorkloadSpec(prefix=str(tmp_path / "job"))
    spec = MultiJobSpec(
        jobs=[
            JobEntry(name="simai", workload=simai, gpus=32),
            JobEntry(name="chakra", workload=traced, gpus=8, start_s=1e-4, iterations=2),
        ]
    )
    topo = ClusterTemplateSpec(template="spectrum_x", gpus=64, spines=2, gpu_type="A100")
    row, flows = simulate(Scenario(topology=topo, workload=spec, collective=SimAISpec()))
    assert row["status"] == "ok", row["error"]
    times = json.loads(row["job_iteration_s"])
    assert set(times) == {"simai", "chakra"} and all(t > 0 for t in times.values())
    jobs = flows.column("job").to_numpy(zero_copy_only=False)
    srcs = flows.column("src").to_numpy()
    assert set(jobs) == {"simai", "chakra"}
    assert (srcs[jobs == "simai"] < 32).all() and (srcs[jobs == "chakra"] >= 32).all()
