"""Synthetic workloads against the analytic formulas of reference/workloads.md §2.3 and §6."""

from __future__ import annotations

import pytest

from m4ray.errors import InputError
from m4ray.sim.collectives import Ring
from m4ray.sim.flowsim import FlowSimConfig
from m4ray.sim.replay import Replay
from m4ray.sim.routing import Routing
from m4ray.sim.topology import Cable, Topology
from m4ray.sim.workload import Collective, CollectiveKind, Compute, Recv, Send
from m4ray.workload.spec import JobSpec
from m4ray.workload.synth import compute_seconds, schedule, synthesize
from m4ray.workload.wrappers import GpuSlowdown, NicSlowdown


def star(n: int, bandwidth_bps: float = 1e18, latency_s: float = 0.0) -> Topology:
    """n hosts on one switch; the defaults make communication free (≈ 1e-14 s per message)."""
    cables = tuple(Cable(i, n, bandwidth_bps, latency_s) for i in range(n))
    return Topology(n_nodes=n + 1, switches=(n,), cables=cables)


def replay(workload, topo=None):
    topo = topo or star(workload.n_ranks)
    routing = Routing(topo)
    backend = FlowSimConfig().build(topo, routing)
    return Replay(workload, backend, routing, Ring(), send_latency_s=0.0).run()


def job(model=None, parallel=None, **kw) -> JobSpec:
    base = {
        "num_layers": 4,
        "hidden_size": 256,
        "num_heads": 8,
        "sequence_len": 128,
        "vocab_size": 1000,
        "batch_size": 8,
        "num_microbatches": 2,
    }
    return JobSpec(model={**base, **(model or {})}, parallel=parallel or {}, gpu={}, **kw)


def test_layer_flops_match_the_megatron_formulas_and_the_worked_example():
    # reference §2.3 worked example: nb = 4, S = d = 1024 (dp = tp = 1 so nb = B/m as MLSynth)
    spec = job(
        model={"hidden_size": 1024, "num_heads": 16, "sequence_len": 1024, "batch_size": 8},
        parallel={},
    )
    nodes = {n.name: n for n in synthesize(spec).nodes if n.rank == 0 and isinstance(n, Compute)}
    assert nodes["L0.attn.fwd"].num_ops == 51_539_607_552
    assert nodes["L0.mlp.fwd"].num_ops == 68_719_476_736
    assert nodes["L0.attn.bwd"].num_ops == 103_079_215_104
    assert nodes["L0.mlp.bwd"].num_ops == 137_438_953_472
    assert nodes["L0.attn.fwd"].duration_s == pytest.approx(51_539_607_552 / 156e12, abs=1e-9)
    # per rank the work is divided by tp and the microbatch by dp (MLSynth's bug 2, fixed)
    split = job(
        model={"hidden_size": 1024, "num_heads": 16, "sequence_len": 1024, "batch_size": 16},
        parallel={"dp": 2, "tp": 2},
    )
    ops = [n.num_ops for n in synthesize(split).nodes if n.name == "L0.attn.fwd" and n.rank == 3]
    assert ops == [51_539_607_552 // 2] * 2  # nb = 16/(2·2) = 4, then / tp


def test_tensor_parallel_all_reduces_are_sized_by_the_hidden_dim():
    w = synthesize(job(parallel={"tp": 4}))
    ars = [n for n in w.nodes if isinstance(n, Collective) and n.rank == 0]
    # layers × passes × 2 per layer × microbatches, plus the embedding's per microbatch
    assert len(ars) == 4 * 2 * 2 * 2 + 2
    layer = [n for n in ars if n.name.startswith("L")]
    assert {n.size_bytes for n in layer} == {2 * 4 * 128 * 256}  # b · nb · S · d
    assert all(n.group == (0, 1, 2, 3) and n.kind == CollectiveKind.ALL_REDUCE for n in ars)


@pytest.mark.parametrize(("p", "m"), [(4, 8), (4, 4), (2, 8), (4, 16)])
def test_gpipe_time_and_bubble_with_free_communication(p, m):
    spec = job(
        model={"num_layers": 8, "batch_size": m, "num_microbatches": m, "embedding": False},
        parallel={"pp": p},
    )
    w = synthesize(spec)
    per_stage = compute_seconds(w)
    assert len(set(per_stage.values())) == 1  # equal stages
    t_fb = per_stage[0] / m
    result = replay(w)
    assert result.completion_time_s == pytest.approx((m + p - 1) * t_fb, rel=1e-6)
    bubble = result.completion_time_s / (m * t_fb) - 1
    assert bubble == pytest.approx((p - 1) / m, rel=1e-5)


def test_one_f_one_b_equals_gpipe_when_communication_is_free():
    times = {}
    for kind in ("gpipe", "1f1b"):
        spec = job(
            model={"num_layers": 8, "batch_size": 8, "num_microbatches": 8, "embedding": False},
            parallel={"pp": 4, "schedule": kind},
        )
        times[kind] = replay(synthesize(spec)).completion_time_s
    assert times["1f1b"] == pytest.approx(times["gpipe"], rel=1e-6)


def test_one_f_one_b_order_per_stage():
    assert schedule("1f1b", 0, 4, 6) == [
        ("fwd", 0), ("fwd", 1), ("fwd", 2), ("fwd", 3), ("bwd", 0), ("fwd", 4), ("bwd", 1),
        ("fwd", 5), ("bwd", 2), ("bwd", 3), ("bwd", 4), ("bwd", 5),
    ]  # fmt: skip
    last = schedule("1f1b", 3, 4, 3)
    assert last == [("fwd", 0), ("bwd", 0), ("fwd", 1), ("bwd", 1), ("fwd", 2), ("bwd", 2)]


def test_pipeline_messages_pair_up_with_distinct_tags():
    w = synthesize(
        job(parallel={"pp": 2}, model={"num_microbatches": 2}),
    )
    sends = [(n.rank, n.peer, n.tag, n.size_bytes) for n in w.nodes if isinstance(n, Send)]
    recvs = [(n.peer, n.rank, n.tag, n.size_bytes) for n in w.nodes if isinstance(n, Recv)]
    assert sorted(sends) == sorted(recvs) and len(sends) == 4
    assert len({tag for _, _, tag, _ in sends}) == 4
    assert {size for *_, size in sends} == {2 * 4 * 128 * 256}


def test_ring_all_reduce_of_the_gradients_steps_and_sizes():
    spec = job(parallel={"dp": 4}, model={"batch_size": 8})
    w = synthesize(spec)
    grads = [n for n in w.nodes if isinstance(n, Collective) and n.name == "grad.dp_ar"]
    assert len(grads) == 4 and all(n.group == (0, 1, 2, 3) for n in grads)
    params = 4 * (12 * 256**2 + 13 * 256) + (1000 + 128) * 256
    assert grads[0].size_bytes == 2 * params
    result = replay(w)
    ids = {n.id for n in grads}
    flows = zip(result.flows.size_bytes, result.flows.node_id, strict=True)
    sizes = [size for size, node in flows if node in ids]
    assert len(sizes) == 4 * 2 * (4 - 1)  # 2(n−1) ring steps per rank
    assert set(sizes) == {-(-2 * params // 4)}  # D/n each


def test_a_straggler_adds_exactly_its_delay_in_data_parallel():
    topo = star(8, bandwidth_bps=100e9, latency_s=1e-6)
    spec = job(parallel={"dp": 8}, model={"batch_size": 16})
    base = replay(synthesize(spec), topo)
    delta = 3e-3
    slow = GpuSlowdown(ranks=[5], layers=[2], microbatches=[1], passes=["bwd"], seconds=delta)
    w = synthesize(spec, [slow])
    added = [n for n in w.nodes if n.name.endswith(".slowdown")]
    assert len(added) == 1 and added[0].rank == 5 and added[0].num_ops > 0  # once per layer call
    assert added[0].duration_s == pytest.approx(delta)
    slowed = replay(w, topo)
    assert slowed.completion_time_s - base.completion_time_s == pytest.approx(delta, rel=1e-6)
    # every other rank idles that much longer: wasted GPU time grows with the cluster
    idle = [f - c for f, c in zip(slowed.rank_finish_s, slowed.rank_compute_s, strict=True)]
    idle0 = [f - c for f, c in zip(base.rank_finish_s, base.rank_compute_s, strict=True)]
    assert sum(idle) - sum(idle0) == pytest.approx(7 * delta, rel=1e-3)


def test_relative_slowdown_scales_the_flops_and_probability_is_seeded():
    spec = job()
    w = synthesize(spec, [GpuSlowdown(ranks=[0], layers=[1], passes=["fwd"], factor=0.1)])
    by_name = {n.name: n for n in w.nodes if isinstance(n, Compute)}
    assert by_name["L1.attn.fwd.slowdown"].num_ops == round(0.1 * by_name["L1.attn.fwd"].num_ops)

    def picks(seed):
        wrapped = synthesize(spec, [GpuSlowdown(factor=0.5, probability=0.3, seed=seed)])
        return [n.deps for n in wrapped.nodes if n.name.endswith(".slowdown")]

    assert picks(1) == picks(1) and picks(1) != picks(2)
    assert 0 < len(picks(1)) < len([n for n in synthesize(spec).nodes if isinstance(n, Compute)])


def test_nic_slowdown_delays_the_send_not_the_compute():
    topo = star(2, bandwidth_bps=100e9, latency_s=1e-6)
    spec = job(parallel={"dp": 2}, model={"batch_size": 4})
    base = replay(synthesize(spec), topo)
    w = synthesize(spec, [NicSlowdown(ranks=[1], seconds=2e-3)])
    waits = [n for n in w.nodes if n.name.endswith("nic_wait")]
    assert len(waits) == 1 and waits[0].cpu and waits[0].rank == 1
    slowed = replay(w, topo)
    assert slowed.completion_time_s - base.completion_time_s == pytest.approx(2e-3, rel=1e-6)
    assert slowed.rank_compute_s == base.rank_compute_s


def test_moe_all_to_alls_run_in_expert_groups():
    spec = job(
        model={"num_experts": 8, "top_k": 2, "batch_size": 16},
        parallel={"dp": 4, "ep": 2, "tp": 2},
    )
    w = synthesize(spec)
    a2a = [n for n in w.nodes if isinstance(n, Collective) and n.kind == CollectiveKind.ALL_TO_ALL]
    groups = {n.group for n in a2a}
    assert groups == {(0, 2), (1, 3), (4, 6), (5, 7)}
    assert {n.size_bytes for n in a2a} == {round(1.25 * 2 * 2 * 128 * 256 * 2)}
    edp = [n for n in w.nodes if n.name == "grad.edp_ar"]
    assert {n.group for n in edp} == {(0, 4), (1, 5), (2, 6), (3, 7)}
    assert replay(w).completion_time_s > 0


@pytest.mark.parametrize(
    ("model", "parallel", "n_gpus", "needle"),
    [
        ({"num_heads": 2}, {"tp": 4}, None, "tp=4 does not divide num_heads=2"),
        ({"num_heads": 8, "hidden_size": 260}, {}, None, "not divisible by num_heads"),
        ({}, {"pp": 8}, None, "pp=8 is larger than num_layers=4"),
        ({}, {"pp": 3}, None, "pp=3 does not divide num_layers=4"),
        ({}, {"dp": 2, "tp": 2}, 8, "does not equal the 8 GPUs"),
        ({"batch_size": 6}, {"dp": 4}, None, "not divisible by dp × num_microbatches"),
        ({"num_experts": 6}, {"dp": 4, "ep": 4}, None, "ep=4 does not divide num_experts=6"),
        ({"num_experts": 8}, {"dp": 2, "ep": 4}, None, "ep=4 does not divide dp=2"),
        ({}, {"ep": 2, "dp": 2}, None, "needs an MoE model"),
        ({}, {"schedule": "zigzag"}, None, "unknown schedule"),
    ],
)
def test_bad_parameters_name_the_broken_constraint(model, parallel, n_gpus, needle):
    with pytest.raises(InputError, match=needle):
        job(model=model, parallel=parallel, n_gpus=n_gpus)
