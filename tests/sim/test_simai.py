from __future__ import annotations

import pytest

from m4ray.errors import InputError
from m4ray.sim.workload import Collective, CollectiveKind, Compute
from m4ray.workload.simai import Comm, SimAIWorkloadSpec, parse_simai
from tests.conftest import write

HEADER = (
    "HYBRID_TRANSFORMER_FWD_IN_BCKWD model_parallel_NPU_group: {tp} ep: 1 pp: 1 vpp: 1 ga: 1 "
    "all_gpus: {n} checkpoints: 0 checkpoint_initiates: 0\n"
)


def test_micro_allreduce_is_shipped_and_parses():
    spec = SimAIWorkloadSpec(path="microAllReduce")
    model = parse_simai(spec.resolve())
    assert model.params["model_parallel_NPU_group"] == 32 and len(model.layers) == 2
    assert [layer.comm[0] for layer in model.layers] == [
        Comm(CollectiveKind.ALL_REDUCE, 16 * 2**20),
        Comm(CollectiveKind.ALL_REDUCE, 256 * 2**20),
    ]
    workload = spec.build()
    assert workload.n_ranks == 32 and len(workload.nodes) == 32 * 8
    colls = [n for n in workload.nodes if isinstance(n, Collective)]
    assert len(colls) == 64 and {c.group for c in colls} == {tuple(range(32))}
    compute = sum(n.duration_s for n in workload.nodes if isinstance(n, Compute) and n.rank == 0)
    assert compute == pytest.approx(1112e-6 + 4e-9)


def test_scale_multiplies_messages_and_compute():
    workload = SimAIWorkloadSpec(path="microAllReduce", scale=0.01, compute_scale=0.5).build()
    sizes = sorted({n.size_bytes for n in workload.nodes if isinstance(n, Collective)})
    assert sizes == [167_773, 2_684_355]  # ceil(0.01 * size)
    fwd = [n.duration_s for n in workload.nodes if isinstance(n, Compute) and "fwd" in n.name]
    assert fwd == pytest.approx([278e-6] * len(fwd))


def test_data_parallel_groups_from_tp(tmp_path):
    path = write(
        tmp_path / "w.txt",
        HEADER.format(tp=2, n=4) + "1\nl -1 10 ALLREDUCE 100 10 NONE 0 10 ALLREDUCE 4096 1\n",
    )
    workload = SimAIWorkloadSpec(path=str(path)).build()
    groups = {(n.name.split(".")[1], n.group) for n in workload.nodes if isinstance(n, Collective)}
    assert groups == {
        ("fwd_comm", (0, 1)),
        ("fwd_comm", (2, 3)),
        ("wg_comm", (0, 2)),
        ("wg_comm", (1, 3)),
    }
    fwd = [n for n in workload.nodes if isinstance(n, Collective) and "fwd" in n.name]
    assert {n.size_bytes for n in fwd} == {4096}  # SimAI raises small forward messages


BAD = [
    ("FOO model_parallel_NPU_group: 2 all_gpus: 2\n1\n", 1, "policy", "unknown parallelism"),
    (HEADER.format(tp=2, n=2) + "2\n", 2, "layers", "no layer lines"),
    (HEADER.format(tp=2, n=2) + "1\nl -1 1 NONE 0 1 NONE 0 1 NONE\n", 3, None, "12 columns"),
    (
        HEADER.format(tp=2, n=2) + "1\nl -1 1 GATHER 8 1 NONE 0 1 NONE 0 1\n",
        3,
        "fwd_comm_type",
        "unsupported",
    ),
    (
        HEADER.format(tp=2, n=2) + "1\nl -1 1 ALLREDUCE -8 1 NONE 0 1 NONE 0 1\n",
        3,
        "fwd_comm_size",
        ">= 0",
    ),
    (
        HEADER.format(tp=2, n=2) + "1\nl -1 1 ALLREDUCE_TP 8 1 NONE 0 1 NONE 0 1\n",
        3,
        "fwd_comm_type",
        "unsupported",
    ),
    (
        HEADER.format(tp=2, n=2) + "1\nl -1 x NONE 0 1 NONE 0 1 NONE 0 1\n",
        3,
        "fwd_compute",
        "integer",
    ),
    (
        HEADER.format(tp=3, n=4) + "1\nl -1 1 NONE 0 1 NONE 0 1 NONE 0 1\n",
        1,
        "all_gpus",
        "multiple",
    ),
    (
        HEADER.format(tp=2, n=4).replace("pp: 1", "pp: 4")
        + "1\nl -1 1 NONE 0 1 NONE 0 1 NONE 0 1\n",
        1,
        "all_gpus",
        "pp (4)",
    ),
    (
        HEADER.format(tp=2, n=8).replace("ep: 1", "ep: 3")
        + "1\nl -1 1 NONE 0 1 NONE 0 1 NONE 0 1\n",
        1,
        "ep",
        "must divide",
    ),
    ("MICRO\n1\nl -1 1 NONE 0 1 NONE 0 1 ALLREDUCE 8 1\n", 1, "all_gpus", "no all_gpus"),
]


@pytest.mark.parametrize(("text", "line", "field", "message"), BAD)
def test_bad_workloads_name_file_line_field(tmp_path, text, line, field, message):
    path = write(tmp_path / "bad.txt", text)
    with pytest.raises(InputError) as info:
        SimAIWorkloadSpec(path=str(path)).build()
    assert info.value.line == line and info.value.field == field
    assert message in str(info.value) and str(path) in str(info.value)


def test_missing_workload_file():
    with pytest.raises(InputError, match="cannot read"):
        SimAIWorkloadSpec(path="/no/such/workload.txt").build()


def _groups(workload, phase):
    """(rank, kind, group) of every collective of a column."""
    return {
        (n.rank, n.kind, n.group)
        for n in workload.nodes
        if isinstance(n, Collective) and f".{phase}_comm." in n.name
    }


def test_group_suffixes_follow_simai(tmp_path):
    """tp 2, ep 2, 8 GPUs: DP of rank 0 = 0 2 4 6; EP = blocks of 2 DP members (0 2 | 4 6);
    DP_EP = DP members at the same position modulo ep (0 4 | 2 6)."""
    header = HEADER.format(tp=2, n=8).replace("ep: 1", "ep: 2")
    path = write(
        tmp_path / "moe.txt",
        header
        + "3\n"
        + "moe -1 1 ALLTOALL_EP 4096 1 NONE 0 1 REDUCESCATTER_DP_EP 800 1\n"
        + "attn -1 1 ALLREDUCE 4096 1 ALLGATHER_EP 64 1 ALLGATHER 800 1\n"
        + "norm -1 1 BROADCAST 4096 1 NONE 0 1 ALLREDUCE_DP_EP 8 1\n",
    )
    workload = SimAIWorkloadSpec(path=str(path)).build()
    fwd = {(r, k, g) for r, k, g in _groups(workload, "fwd") if r in (0, 2)}
    assert fwd == {
        (0, CollectiveKind.ALL_TO_ALL, (0, 2)),
        (2, CollectiveKind.ALL_TO_ALL, (0, 2)),
        (0, CollectiveKind.ALL_REDUCE, (0, 1)),
        (2, CollectiveKind.ALL_REDUCE, (2, 3)),
        (0, CollectiveKind.BROADCAST, (0, 1)),
        (2, CollectiveKind.BROADCAST, (2, 3)),
    }
    assert {g for r, _, g in _groups(workload, "ig") if r == 4} == {(4, 6)}  # EP
    wg = {(k, g) for r, k, g in _groups(workload, "wg") if r == 2}
    assert wg == {
        (CollectiveKind.REDUCE_SCATTER, (2, 6)),  # DP_EP
        (CollectiveKind.ALL_GATHER, (0, 2, 4, 6)),  # DP
        (CollectiveKind.ALL_REDUCE, (2, 6)),
    }


def test_old_aicb_header_spans_the_topology_with_a_warning(tmp_path, caplog):
    path = write(
        tmp_path / "old.txt",
        "HYBRID_TRANSFORMER_FWD_IN_BCKWD\tmodel_parallel_NPU_group: 4 checkpoints: 0 "
        "checkpoint_initiates: 0\n839\n"
        "norm\t-1\t0\tBROADCAST\t16384\t1\tNONE\t0\t1\tNONE\t0\t100\n"
        "mlp\t-1\t5\tALLREDUCE\t1024\t5\tREDUCESCATTER\t0\t5\tALLGATHER\t2048\t100\n",
    )
    with caplog.at_level("WARNING"):
        workload = SimAIWorkloadSpec(path=str(path)).build(n_hosts=8)
    assert workload.n_ranks == 8
    assert "announces 839 layers, the file has 2" in caplog.text
    assert "spans the topology's 8 GPUs" in caplog.text
    assert {g for _, _, g in _groups(workload, "wg")} == {(0, 4), (1, 5), (2, 6), (3, 7)}
    assert not _groups(workload, "ig")  # a 0-byte collective moves nothing


def test_micro_runs_over_all_ranks_and_pipelines_replay_one_stage_each(tmp_path, caplog):
    micro = write(tmp_path / "micro.txt", "MICRO\n1\nt -1 1 NONE 0 1 NONE 0 1 ALLREDUCE 4096 1\n")
    workload = SimAIWorkloadSpec(path=str(micro)).build(n_hosts=4)
    assert {g for _, _, g in _groups(workload, "wg")} == {(0, 1, 2, 3)}
    header = HEADER.format(tp=2, n=8).replace("pp: 1", "pp: 2").rstrip() + " pp_comm 4096\n"
    staged = write(
        tmp_path / "pp.txt", header + "1\nl -1 1 ALLREDUCE 64 1 NONE 0 1 ALLGATHER 8 1\n"
    )
    with caplog.at_level("WARNING"):
        model = parse_simai(staged)
        workload = SimAIWorkloadSpec(path=str(staged)).build()
    assert model.params["pp_comm"] == 4096 and model.params["pp"] == 2
    assert "pipeline sends and the bubble are not simulated" in caplog.text
    assert {g for r, _, g in _groups(workload, "fwd") if r == 5} == {(4, 5)}
    assert {g for _, _, g in _groups(workload, "wg")} == {(0, 2), (1, 3), (4, 6), (5, 7)}
