from __future__ import annotations

import pytest

from m4ray.errors import InputError
from m4ray.sim.topologies import fat_tree, rail_cluster
from m4ray.sim.topology import (
    Cable,
    Topology,
    format_topology,
    parse_topology,
    read_topology,
    write_topology,
)
from tests.conftest import write


def test_rail_cluster_matches_reference_layout():
    topo = rail_cluster()
    assert topo.n_nodes == 45 and len(topo.cables) == 72 and topo.n_links == 144
    assert topo.hosts == tuple(range(32))
    assert topo.nvswitches == (32, 33, 34, 35)
    assert format_topology(topo).splitlines()[:4] == [
        "45 8 4 9 72 A100",
        "32 33 34 35 36 37 38 39 40 41 42 43 44",
        "0 32 2400Gbps 0.000025ms 0",
        "0 36 400Gbps 0.0005ms 0",
    ]
    cables = {(c.a, c.b): c for c in topo.cables}
    # rail of GPU g = 36 + 4*((g%8)//4) + (g%4): GPU 13 -> rail 41, GPU 24 -> rail 36
    assert (13, 41) in cables and (24, 36) in cables and (13, 33) in cables
    assert cables[(36, 44)].bandwidth_bps == 400e9
    assert sum(1 for c in topo.cables if 44 in (c.a, c.b)) == 8


def test_round_trip_through_text(tmp_path):
    topo = rail_cluster()
    path = write_topology(topo, tmp_path / "topo.txt")
    again = read_topology(path)
    assert again == topo
    assert format_topology(again) == path.read_text()
    assert parse_topology(path.read_text()) == topo  # the same parser, from text


def test_reads_ns3_format(tmp_path):
    path = write(
        tmp_path / "t.txt",
        "4 2 3\n2 3\n0 2 10000000000bps 1000ns 0\n1 3 10Gbps 1us 0\n2 3 40Gbps 0.001ms 0.01\n",
    )
    topo = read_topology(path)
    assert topo.hosts == (0, 1) and topo.switches == (2, 3) and topo.gpus_per_server == 1
    assert topo.cables[0] == Cable(0, 2, 1e10, 1e-6, 0.0)
    assert topo.cables[2].latency_s == pytest.approx(1e-6) and topo.cables[2].error_rate == 0.01


def test_fat_tree_counts():
    topo = fat_tree(k=4)
    assert len(topo.hosts) == 16 and len(topo.switches) == 20
    assert len(topo.cables) == 16 + 16 + 16  # host-edge, edge-agg, agg-core
    degree = [len(links) for links in topo.out_links]
    assert all(d == 4 for d in degree[16:]) and all(d == 1 for d in degree[:16])


BAD_TOPOLOGIES = [
    ("45 8 4 9 A100\n0 1\n", 1, None, "header"),
    ("3 1 2\n1\n0 1 10Gbps 1us 0\n", 1, "links", "announces 2 links"),
    ("3 1 1\n1\n0 5 10Gbps 1us 0\n", 3, "dst", "unknown node id 5"),
    ("3 1 1\n1\n0 1 10Gbit 1us 0\n", 3, "bandwidth", "rate unit"),
    ("3 1 1\n1\n0 1 0Gbps 1us 0\n", 3, "bandwidth", "positive"),
    ("3 1 1\n1\n0 1 10Gbps 1 0\n", 3, "latency", "time unit"),
    ("3 1 1\n1\n0 1 10Gbps 1us 2\n", 3, "error_rate", "[0, 1)"),
    ("3 1 1\n1 2\n0 1 10Gbps 1us 0\n", 2, "switch ids", "expected 1 switch ids"),
    ("3 x 1\n1\n0 1 10Gbps 1us 0\n", 1, "switches", "integer"),
    ("3 1 1\n1\n0 1\n", 3, None, "a link line"),
]


@pytest.mark.parametrize(("text", "line", "field", "message"), BAD_TOPOLOGIES)
def test_bad_topology_names_file_line_field(tmp_path, text, line, field, message):
    path = write(tmp_path / "bad.txt", text)
    with pytest.raises(InputError) as info:
        read_topology(path)
    err = info.value
    assert err.file == str(path) and err.line == line and err.field == field
    assert message in str(err) and str(path) in str(err)
    with pytest.raises(InputError) as info:
        parse_topology(text, "request")
    assert (info.value.file, info.value.line, info.value.field) == ("request", line, field)


def test_missing_file_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="cannot read"):
        read_topology(tmp_path / "nope.txt")


def test_write_leaves_no_partial_file(tmp_path):
    path = tmp_path / "t.txt"
    write_topology(rail_cluster(), path)
    assert [p.name for p in tmp_path.iterdir()] == ["t.txt"]


def test_programmatic_cable_errors_name_the_cable():
    with pytest.raises(InputError, match=r"cables\[0\].dst"):
        Topology(n_nodes=2, switches=(1,), cables=(Cable(0, 7, 1e9, 0.0),))
