"""SimAI's cluster templates: node/switch/link counts equal the generator's (reference/scale.md
§1, derived by running gen_Topo_Template.py), the 32-GPU rail cluster is Spectrum-X, SimAI text
round trips, and impossible sizes are refused."""

from __future__ import annotations

import pytest

from m4ray.errors import InputError
from m4ray.sim.routing import Routing
from m4ray.sim.templates import ClusterTemplateSpec
from m4ray.sim.topologies import rail_cluster
from m4ray.sim.topology import format_topology, parse_topology


@pytest.mark.parametrize(
    ("spec", "nodes", "nvswitches", "other_switches", "cables"),
    [
        ({"template": "spectrum_x", "gpus": 32, "spines": 1, "nvlink_bps": 2400e9}, 45, 4, 9, 72),
        ({"template": "spectrum_x", "gpus": 128, "spines": 16}, 168, 16, 24, 384),
        ({"template": "spectrum_x", "gpus": 128, "spines": 4}, 156, 16, 12, 288),
        ({"template": "spectrum_x", "gpus": 512}, 648, 64, 72, 1536),
        ({"template": "spectrum_x", "gpus": 1024}, 1232, 128, 80, 3072),
        ({"template": "alibaba_hpn", "gpus": 1024}, 1288, 128, 136, 4992),
        ({"template": "alibaba_hpn", "gpus": 1024, "dual_plane": True}, 1288, 128, 136, 4032),
        ({"template": "dcn_plus", "gpus": 512}, 592, 64, 16, 1088),
        ({"template": "dcn_plus", "gpus": 512, "dual_tor": True}, 592, 64, 16, 1600),
    ],
)
def test_counts_equal_simais_generator(spec, nodes, nvswitches, other_switches, cables):
    topo = ClusterTemplateSpec(**spec).build()
    assert topo.n_nodes == nodes and len(topo.cables) == cables
    assert len(topo.nvswitches) == nvswitches
    assert len(topo.switches) - len(topo.nvswitches) == other_switches
    assert len(topo.hosts) == spec["gpus"]


def test_1024_gpu_spectrum_x_ids_follow_the_generator():
    topo = ClusterTemplateSpec(template="spectrum_x", gpus=1024).build()
    assert topo.nvswitches == tuple(range(1024, 1152))
    neighbours = {c.b for c in topo.cables if c.a == 512}
    assert neighbours == {1024 + 64, 1160}  # its NVSwitch and ASW 1160 (segment 2, rail 0)
    spines = {c.b for c in topo.cables if c.a == 1152}
    assert spines == set(range(1168, 1232))


def test_the_default_rail_cluster_is_spectrum_x_with_32_gpus():
    spec = ClusterTemplateSpec(
        template="spectrum_x", gpus=32, spines=1, nvlink_bps=2400e9, gpu_type="A100"
    )
    assert spec.build() == rail_cluster()


def test_dual_plane_and_dual_tor_wiring():
    hpn = ClusterTemplateSpec(template="alibaba_hpn", gpus=1024, dual_plane=True).build()
    first_asw, first_psw = 1024 + 128, 1024 + 128 + 16
    set1 = {c.b for c in hpn.cables if c.a == first_asw}
    set2 = {c.b for c in hpn.cables if c.a == first_asw + 8}
    assert set1 == set(range(first_psw, first_psw + 60))
    assert set2 == set(range(first_psw + 60, first_psw + 120))
    nics = [c for c in hpn.cables if c.a == 3 and c.b >= first_asw]
    assert [c.b for c in nics] == [first_asw + 3, first_asw + 8 + 3]
    assert {c.bandwidth_bps for c in nics} == {200e9}
    dcn = ClusterTemplateSpec(template="dcn_plus", gpus=512, dual_tor=True).build()
    assert [c.b for c in dcn.cables if c.a == 200 and c.b >= 512 + 64] == [577, 581]
    # GPUs on different servers of one DCN+ ToR meet through it; across ToRs through a spine
    routing = Routing(dcn)
    assert len(routing.path(0, 8).links) == 2 and len(routing.path(0, 300).links) == 4


def test_simai_text_round_trip():
    topo = ClusterTemplateSpec(template="alibaba_hpn", gpus=1024).build()
    again = parse_topology(format_topology(topo))
    assert again.cables == topo.cables and again.switches == topo.switches
    assert again.nvswitches == topo.nvswitches and again.gpus_per_server == 8


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"template": "spectrum_x", "gpus": 8192}, "topology.gpus"),
        ({"template": "dcn_plus", "gpus": 1024}, "topology.gpus"),
        ({"template": "alibaba_hpn", "gpus": 16384, "dual_plane": True}, "topology.gpus"),
        ({"template": "spectrum_x", "gpus": 30}, "topology.gpus"),
        ({"template": "spectrum_x", "spines": 0}, "topology.spines"),
        ({"template": "spectrum_x", "dual_plane": True}, "topology.dual_plane"),
        ({"template": "spectrum_x", "nic_bps": -1.0}, "topology.nic_bps"),
    ],
)
def test_bad_sizes_name_the_field(spec, field):
    with pytest.raises(InputError) as err:
        ClusterTemplateSpec(**spec)
    assert err.value.field == field


def test_unknown_template_lists_the_choices():
    with pytest.raises(InputError, match="alibaba_hpn, dcn_plus, spectrum_x"):
        ClusterTemplateSpec(template="clos")
