"""Chakra ET files: our round trip, the mlc-chakra package's own reader and generator, bad files."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from chakra.schema.protobuf.et_def_pb2 import AttributeProto, GlobalMetadata, Node
from chakra.src.third_party.utils.protolib import decodeMessage, encodeMessage, openFileRd

from m4ray.errors import InputError
from m4ray.sim.workload import CollectiveKind, Compute
from m4ray.workload import chakra
from m4ray.workload.synth import synthesize
from m4ray.workload.wrappers import GpuSlowdown, NicSlowdown
from tests.workload.test_synth import job, replay, star

BIN = Path(sys.executable).parent


def moe_job():
    return job(
        model={"num_experts": 4, "top_k": 2, "batch_size": 16},
        parallel={"dp": 4, "ep": 2, "tp": 2, "pp": 2, "schedule": "1f1b"},
        iterations=2,
    )


def test_round_trip_gives_the_identical_dag(tmp_path):
    spec = moe_job()
    wrappers = [GpuSlowdown(ranks=[3], factor=0.2), NicSlowdown(ranks=[6], seconds=1.5e-6)]
    w = synthesize(spec, wrappers)
    paths = chakra.write(w, tmp_path / "et" / "moe", spec.gpu.flops_per_s)
    assert [p.name for p in paths] == [f"moe.{r}.et" for r in range(16)]
    back = chakra.read(tmp_path / "et" / "moe")
    assert back.n_ranks == w.n_ranks and back.nodes == w.nodes
    groups = json.loads((tmp_path / "et" / "moe.comm_groups.json").read_text())
    assert min(int(k) for k in groups) == 1  # ASTRA-sim reserves id 0
    topo = star(16, bandwidth_bps=100e9, latency_s=1e-6)
    assert replay(back, topo).completion_time_s == replay(w, topo).completion_time_s


def test_files_decode_with_the_mlc_chakra_reader_as_astra_sim_expects(tmp_path):
    spec = job(parallel={"dp": 2, "pp": 2}, model={"batch_size": 8})
    w = synthesize(spec)
    chakra.write(w, tmp_path / "t", spec.gpu.flops_per_s)
    handle = openFileRd(str(tmp_path / "t.2.et"))
    meta = GlobalMetadata()
    assert decodeMessage(handle, meta) and meta.version == "0.0.4"
    nodes = []
    node = Node()
    while decodeMessage(handle, node):
        nodes.append(node)
        node = Node()
    handle.close()
    assert len(nodes) == sum(1 for n in w.nodes if n.rank == 2)
    for n in nodes:
        attrs = {a.name: a for a in n.attr}
        if n.type == 4:  # COMP_NODE
            assert attrs["num_ops"].int64_val > 0 and attrs["tensor_size"].uint64_val > 0
        if n.type in (5, 6):  # SEND / RECV
            assert attrs["comm_tag"].WhichOneof("value") == "int32_val"
            assert attrs["comm_size"].int64_val > 0
        if n.type == 7:  # COLL
            assert int(attrs["pg_name"].string_val) >= 1
    # the package's CLI reads them too
    out = tmp_path / "t.json"
    cmd = [str(BIN / "chakra_jsonizer"), "--input_filename", str(tmp_path / "t.0.et"),
           "--output_filename", str(out)]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True)
    assert "COMM_SEND_NODE" in out.read_text() or "COMM_COLL_NODE" in out.read_text()


def test_traces_from_the_mlc_chakra_generator_replay(tmp_path):
    gen = shutil.which("chakra_generator", path=str(BIN))
    subprocess.run([gen, "--num_npus", "4", "--default_runtime", "7"], cwd=tmp_path, check=True)
    dependent = chakra.read(tmp_path / "two_comp_nodes_dependent")
    assert dependent.n_ranks == 4 and len(dependent.nodes) == 8
    assert replay(dependent).completion_time_s == pytest.approx(14e-6)
    for name, kind in (("ALL_REDUCE", CollectiveKind.ALL_REDUCE),
                       ("ALL_TO_ALL", CollectiveKind.ALL_TO_ALL)):  # fmt: skip
        w = chakra.read(tmp_path / name)
        assert {n.kind for n in w.nodes} == {kind}
        assert all(n.group == (0, 1, 2, 3) and n.size_bytes == 65536 for n in w.nodes)
        result = replay(w)
        assert len(result.flows.flow_id) == (24 if kind == CollectiveKind.ALL_REDUCE else 12)
    with pytest.raises(InputError, match=r"BARRIER is not supported.*comm_type|comm_type.*BARRIER"):
        chakra.read(tmp_path / "BARRIER")
    with pytest.raises(InputError, match=r"one_comm_send_node\.0\.et.*comm_dst"):
        chakra.read(tmp_path / "one_comm_send_node")


def _write(path: Path, nodes: list[Node]) -> None:
    with open(path, "wb") as f:
        encodeMessage(f, GlobalMetadata(version="0.0.4"))
        for node in nodes:
            encodeMessage(f, node)


def test_bad_files_name_the_file_node_and_field(tmp_path):
    with pytest.raises(InputError, match="no Chakra files"):
        chakra.read(tmp_path / "none")
    good = Node(id=1, name="c", type=4, duration_micros=3)
    _write(tmp_path / "gap.0.et", [good])
    _write(tmp_path / "gap.2.et", [good])
    with pytest.raises(InputError, match=r"missing for ranks \[1\]"):
        chakra.read(tmp_path / "gap")
    _write(tmp_path / "dep.0.et", [Node(id=1, name="c", type=4, data_deps=[9])])
    with pytest.raises(InputError, match=r"dep\.0\.et.*node #0 \(id 1, 'c'\).*unknown node 9"):
        chakra.read(tmp_path / "dep")
    coll = Node(id=1, name="ar", type=7)
    coll.attr.extend([AttributeProto(name="comm_type", int64_val=0),
                      AttributeProto(name="comm_size", int64_val=64),
                      AttributeProto(name="pg_name", string_val="7")])  # fmt: skip
    _write(tmp_path / "pg.0.et", [coll])
    with pytest.raises(InputError, match=r"field 'pg_name'.*unknown process group '7'"):
        chakra.read(tmp_path / "pg")
    (tmp_path / "junk.0.et").write_bytes(b"\x05hello world, not protobuf")
    with pytest.raises(InputError, match=r"junk\.0\.et"):
        chakra.read(tmp_path / "junk")
    cycle = [
        Node(id=1, name="a", type=4, data_deps=[2]),
        Node(id=2, name="b", type=4, data_deps=[1]),
    ]
    _write(tmp_path / "cyc.0.et", cycle)
    with pytest.raises(InputError, match="dependency cycle"):
        chakra.read(tmp_path / "cyc")


def test_cpu_ops_and_durations_survive(tmp_path):
    w = synthesize(job(), [GpuSlowdown(ranks=[0], layers=[0], seconds=1.234567891e-3)])
    chakra.write(w, tmp_path / "d")
    back = {n.id: n for n in chakra.read(tmp_path / "d").nodes}
    slow = [n for n in w.nodes if n.name.endswith("slowdown")]
    assert all(isinstance(back[n.id], Compute) and back[n.id].duration_s == n.duration_s
               for n in slow)  # fmt: skip
