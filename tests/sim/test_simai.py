from __future__ import annotations

import pytest

from m4ray.errors import InputError
from m4ray.sim.simai import SimAIWorkloadSpec, parse_simai
from m4ray.sim.workload import Collective, CollectiveKind, Compute
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
        (CollectiveKind.ALL_REDUCE, 16 * 2**20),
        (CollectiveKind.ALL_REDUCE, 256 * 2**20),
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
    (
        HEADER.format(tp=2, n=2) + "2\nl -1 1 NONE 0 1 NONE 0 1 NONE 0 1\n",
        2,
        "layers",
        "announces 2",
    ),
    (HEADER.format(tp=2, n=2) + "1\nl -1 1 NONE 0 1 NONE 0 1 NONE\n", 3, None, "12 columns"),
    (
        HEADER.format(tp=2, n=2) + "1\nl -1 1 BROADCAST 8 1 NONE 0 1 NONE 0 1\n",
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
        HEADER.format(tp=2, n=2) + "1\nl -1 1 ALLREDUCE 0 1 NONE 0 1 NONE 0 1\n",
        3,
        "fwd_comm_size",
        "0 bytes",
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
        HEADER.format(tp=2, n=4).replace("pp: 1", "pp: 2")
        + "1\nl -1 1 NONE 0 1 NONE 0 1 NONE 0 1\n",
        1,
        "pp",
        "pp: 1",
    ),
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
