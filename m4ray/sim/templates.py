"""SimAI's cluster templates (``gen_Topo_Template.py``): Spectrum-X, AlibabaHPN and DCN+ at scale.

The same node numbering, cables and defaults as SimAI's generator (``reference/scale.md`` §1), so
a topology built here equals the generator's file (node and link counts are tested against it):
GPUs ``0..G-1``, then one NVSwitch per server, then the ToR switches (ASWs: ToR set 1, then set 2
for dual ToR), then the spines (PSWs: plane 1, then plane 2). Every GPU has an NVLink to its
server's NVSwitch and one NIC port per ToR it attaches to; every ASW links to every PSW of its
plane. Only one pod is generated, as in SimAI.

=================  ========================================  =====================================
template           ToR attachment of GPU ``i``               defaults (besides the shared ones)
=================  ========================================  =====================================
``spectrum_x``     rail-optimised: ASW ``seg·gps + i mod gps``  bw 400G, npa 64, psn 64, app 64
                   (seg = ``i // (gps·npa)``), one ToR
``alibaba_hpn``    rail-optimised, two ToRs (sets 1 and 2),  bw 200G, npa 128, psn 120, app 240
                   ``dual_plane``: set 1 → PSW 0..psn/2-1,   (dual plane: app 120)
                   set 2 → the rest
``dcn_plus``       the server's GPUs share ToR ``i // npa``;  psn 8, app 8; ``dual_tor``: bw 200G,
                   ``dual_tor``: one in each of two sets     npa 128
=================  ========================================  =====================================

Shared defaults: 8 GPUs per server, H100, NVLink 2880 Gbit/s at 25 ns, NIC and ASW–PSW links
500 ns, ASW→PSW 400 Gbit/s. The 32-GPU rail cluster (``topology=rail32``) is
``spectrum_x`` with 32 GPUs, one spine and 2400 Gbit/s NVLink. Units: bits/s, seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from m4ray.errors import InputError, choice_error
from m4ray.sim.topology import Cable, Topology

TEMPLATES = ("spectrum_x", "alibaba_hpn", "dcn_plus")
# per template: NIC bandwidth, NICs per ASW, PSWs, ASWs per PSW (pod capacity), max GPUs
_DEFAULTS = {
    "spectrum_x": {"nic_bps": 400e9, "nics_per_asw": 64, "spines": 64, "asws_per_spine": 64},
    "alibaba_hpn": {"nic_bps": 200e9, "nics_per_asw": 128, "spines": 120, "asws_per_spine": 240},
    "dcn_plus": {"nic_bps": 400e9, "nics_per_asw": 64, "spines": 8, "asws_per_spine": 8},
}
_MAX_GPUS = {"spectrum_x": 4096, "alibaba_hpn": 30720, "alibaba_hpn_dual": 15360, "dcn_plus": 512}


@dataclass(kw_only=True, slots=True)
class ClusterTemplateSpec:
    """One of SimAI's templates sized by ``gpus``; unset knobs take the template's defaults."""

    template: str = "spectrum_x"
    gpus: int = 32
    gpus_per_server: int = 8
    gpu_type: str = "H100"
    nvlink_bps: float = 2880e9
    nvlink_latency_s: float = 25e-9
    nic_bps: float | None = None
    nic_latency_s: float = 500e-9
    nics_per_asw: int | None = None
    spines: int | None = None
    spine_bps: float = 400e9
    dual_plane: bool = False  # alibaba_hpn: two planes of spines
    dual_tor: bool = False  # dcn_plus: every GPU on two ToRs

    def __post_init__(self) -> None:
        if self.template not in TEMPLATES:
            raise choice_error("topology template", self.template, TEMPLATES)
        key = "alibaba_hpn_dual" if self.template == "alibaba_hpn" and self.dual_plane else None
        limit = _MAX_GPUS[key or self.template]
        checks = [
            (self.gpus_per_server >= 1, "gpus_per_server", ">= 1"),
            (
                self.gpus >= 1 and self.gpus % self.gpus_per_server == 0,
                "gpus",
                f"a positive multiple of gpus_per_server ({self.gpus_per_server})",
            ),
            (self.gpus <= limit, "gpus", f"<= {limit} (one pod of {self.template}, as in SimAI)"),
            (self.spines is None or self.spines >= 1, "spines", ">= 1"),
            (self.nics_per_asw is None or self.nics_per_asw >= 1, "nics_per_asw", ">= 1"),
            (
                not self.dual_plane or self.template == "alibaba_hpn",
                "dual_plane",
                "only for alibaba_hpn",
            ),
            (not self.dual_tor or self.template == "dcn_plus", "dual_tor", "only for dcn_plus"),
        ]
        for ok, name, rule in checks:
            if not ok:
                raise InputError(f"must be {rule}", field=f"topology.{name}")
        for name in ("nvlink_bps", "spine_bps", "nic_bps"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise InputError("must be > 0", field=f"topology.{name}")

    def build(self) -> Topology:
        return build_template(self)


def build_template(spec: ClusterTemplateSpec) -> Topology:
    """The topology of a template (see the module docstring)."""
    defaults = dict(_DEFAULTS[spec.template])
    if spec.template == "dcn_plus" and spec.dual_tor:
        defaults.update(nic_bps=200e9, nics_per_asw=128)
    nic_bps = spec.nic_bps or defaults["nic_bps"]
    npa = spec.nics_per_asw or defaults["nics_per_asw"]
    n_psw = spec.spines or defaults["spines"]
    g, gps = spec.gpus, spec.gpus_per_server
    servers = g // gps
    tor_sets = 2 if spec.template == "alibaba_hpn" or spec.dual_tor else 1
    if spec.template == "dcn_plus":
        asws_per_set = math.ceil(g / npa)
    else:  # rail-optimised: one ASW per rail per segment of gps * npa GPUs
        asws_per_set = gps * math.ceil(g / (gps * npa))
    first_nvs, first_asw = g, g + servers
    first_psw = first_asw + tor_sets * asws_per_set
    n_nodes = first_psw + n_psw

    def asw_of(gpu: int, tor_set: int) -> int:
        local = gpu // npa if spec.template == "dcn_plus" else gpu // (gps * npa) * gps + gpu % gps
        return first_asw + tor_set * asws_per_set + local

    cables = []
    for gpu in range(g):
        cables.append(Cable(gpu, first_nvs + gpu // gps, spec.nvlink_bps, spec.nvlink_latency_s))
        cables += [Cable(gpu, asw_of(gpu, s), nic_bps, spec.nic_latency_s) for s in range(tor_sets)]
    for tor_set in range(tor_sets):
        if spec.dual_plane:  # ToR set 1 -> the first half of the spines, set 2 -> the second
            half = n_psw // 2
            planes = range(tor_set * half, (tor_set + 1) * half if tor_set == 0 else n_psw)
        else:
            planes = range(n_psw)
        for local in range(asws_per_set):
            asw = first_asw + tor_set * asws_per_set + local
            cables += [
                Cable(asw, first_psw + p, spec.spine_bps, spec.nic_latency_s) for p in planes
            ]
    return Topology(
        n_nodes=n_nodes,
        switches=tuple(range(first_nvs, n_nodes)),
        nvswitches=tuple(range(first_nvs, first_asw)),
        cables=tuple(cables),
        gpus_per_server=gps,
        gpu_type=spec.gpu_type,
    )
