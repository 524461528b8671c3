"""Network topology: nodes, full-duplex cables and the directed links derived from them.

A :class:`Topology` is immutable. Hosts (GPUs) are endpoints and never forward traffic; switches
(including NVSwitches) do. Each :class:`Cable` is listed once, as in topology files, and yields two
directed links: link ``2*i`` is ``a -> b`` and ``2*i + 1`` is ``b -> a`` for cable ``i``. Units:
bandwidth in bits/s, latency in seconds.

Text formats (``read_topology`` detects which by the header):

* SimAI: ``<nodes> <gpus_per_server> <nvswitches> <switches> <links> <gpu_type>``, then a line with
  every switch id (NVSwitches first), then ``src dst <bw>Gbps <lat>ms <error_rate>`` per cable.
* ns-3 / m4: ``<nodes> <switches> <links>``, the switch ids, then ``a b <rate>bps <delay>ns <err>``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from m4ray.errors import InputError
from m4ray.sim.units import format_rate_gbps, format_time_ms, parse_rate, parse_time
from m4ray.textio import atomic_write_text, parse_int, read_rows, split_rows

GPU_TYPES = ("A100", "A800", "H100", "H800")


@dataclass(frozen=True, slots=True)
class Cable:
    """A full-duplex link between nodes ``a`` and ``b`` (bits/s, seconds, loss probability)."""

    a: int
    b: int
    bandwidth_bps: float
    latency_s: float
    error_rate: float = 0.0


@dataclass(frozen=True)
class Topology:
    """Nodes ``0 .. n_nodes-1``; every node not listed as a switch is a host.

    ``gpus_per_server`` groups consecutive hosts into servers (1 for plain data-centre hosts);
    ``nvswitches`` is the subset of switches that are intra-server NVSwitches (SimAI node type 2).
    """

    n_nodes: int
    switches: tuple[int, ...]
    cables: tuple[Cable, ...]
    nvswitches: tuple[int, ...] = ()
    gpus_per_server: int = 1
    gpu_type: str = "NONE"

    def __post_init__(self) -> None:
        switch_set = set(self.switches)
        if len(switch_set) != len(self.switches):
            raise InputError("switch ids are repeated", field="switches")
        for node in self.switches:
            if not 0 <= node < self.n_nodes:
                raise InputError(
                    f"switch id {node} outside 0..{self.n_nodes - 1}", field="switches"
                )
        if not set(self.nvswitches) <= switch_set:
            raise InputError("every NVSwitch must also be a switch", field="nvswitches")
        for index, cable in enumerate(self.cables):
            try:
                _check_cable(cable, self.n_nodes)
            except InputError as err:
                raise InputError(err.message, field=f"cables[{index}].{err.field}") from None

    # ----------------------------------------------------------------- structure
    @cached_property
    def hosts(self) -> tuple[int, ...]:
        switch_set = set(self.switches)
        return tuple(n for n in range(self.n_nodes) if n not in switch_set)

    @cached_property
    def is_switch(self) -> np.ndarray:
        mask = np.zeros(self.n_nodes, dtype=bool)
        mask[list(self.switches)] = True
        return mask

    @property
    def n_links(self) -> int:
        """Number of directed links (twice the number of cables)."""
        return 2 * len(self.cables)

    @cached_property
    def link_src(self) -> np.ndarray:
        return np.array([n for c in self.cables for n in (c.a, c.b)], dtype=np.int64)

    @cached_property
    def link_dst(self) -> np.ndarray:
        return np.array([n for c in self.cables for n in (c.b, c.a)], dtype=np.int64)

    @cached_property
    def bandwidth_bps(self) -> np.ndarray:
        """Per directed link, bits/s."""
        return np.repeat([c.bandwidth_bps for c in self.cables], 2).astype(np.float64)

    @cached_property
    def latency_s(self) -> np.ndarray:
        """Per directed link, seconds."""
        return np.repeat([c.latency_s for c in self.cables], 2).astype(np.float64)

    @cached_property
    def out_links(self) -> tuple[tuple[int, ...], ...]:
        """For every node, the ids of the directed links leaving it."""
        out: list[list[int]] = [[] for _ in range(self.n_nodes)]
        for link, src in enumerate(self.link_src.tolist()):
            out[src].append(link)
        return tuple(tuple(links) for links in out)

    def server_of(self, host: int) -> int:
        """Server index of a host: consecutive blocks of ``gpus_per_server`` hosts."""
        return self.hosts.index(host) // self.gpus_per_server

    def replace_cables(self, cables: tuple[Cable, ...]) -> Topology:
        """A copy with other cables (same nodes and roles)."""
        return dataclasses.replace(self, cables=cables)


def _check_cable(cable: Cable, n_nodes: int) -> None:
    """Raise :class:`InputError` whose ``field`` is src, dst, bandwidth, latency or error_rate."""
    for field, end in (("src", cable.a), ("dst", cable.b)):
        if not 0 <= end < n_nodes:
            raise InputError(f"unknown node id {end} (nodes are 0..{n_nodes - 1})", field=field)
    if cable.a == cable.b:
        raise InputError(f"link from node {cable.a} to itself", field="dst")
    if not cable.bandwidth_bps > 0:
        raise InputError(f"must be positive, got {cable.bandwidth_bps}", field="bandwidth")
    if cable.latency_s < 0:
        raise InputError(f"must be >= 0, got {cable.latency_s}", field="latency")
    if not 0 <= cable.error_rate < 1:
        raise InputError(f"must be in [0, 1), got {cable.error_rate}", field="error_rate")


# --------------------------------------------------------------------- reading
def read_topology(path: str | Path) -> Topology:
    """Read a SimAI or ns-3 topology text file; errors name the file, line and field."""
    path = Path(path)
    return _parse(read_rows(path, "topology"), path)


def parse_topology(text: str, source: str = "topology") -> Topology:
    """A topology from its text (as :func:`read_topology`); errors name ``source`` as the file."""
    return _parse(split_rows(text), Path(source))


def _parse(rows: list[tuple[int, list[str]]], path: Path) -> Topology:
    if len(rows) < 2:
        raise InputError("a topology needs a header line and a switch-id line", file=path)
    (header_no, header), (ids_no, id_fields) = rows[0], rows[1]
    simai = len(header) == 6
    if len(header) not in (3, 6):
        raise InputError(
            "header must be 'nodes gpus_per_server nvswitches switches links gpu_type' (SimAI) "
            f"or 'nodes switches links' (ns-3), got {len(header)} fields",
            file=path,
            line=header_no,
        )
    names = (
        ("nodes", "gpus_per_server", "nvswitches", "switches", "links")
        if simai
        else ("nodes", "switches", "links")
    )
    counts = {name: parse_int(header[i], path, header_no, name) for i, name in enumerate(names)}
    n_switch_ids = counts["switches"] + counts.get("nvswitches", 0)
    switch_ids = tuple(parse_int(f, path, ids_no, "switch id") for f in id_fields)
    if len(switch_ids) != n_switch_ids:
        raise InputError(
            f"expected {n_switch_ids} switch ids (from the header), found {len(switch_ids)}",
            file=path,
            line=ids_no,
            field="switch ids",
        )
    for node in switch_ids:
        if not 0 <= node < counts["nodes"]:
            raise InputError(f"unknown node id {node}", file=path, line=ids_no, field="switch ids")
    cables = tuple(_parse_cable(fields, path, no, counts["nodes"]) for no, fields in rows[2:])
    if len(cables) != counts["links"]:
        raise InputError(
            f"header announces {counts['links']} links, file has {len(cables)}",
            file=path,
            line=header_no,
            field="links",
        )
    gpus_per_server = counts.get("gpus_per_server", 1)
    if gpus_per_server < 1:
        raise InputError("must be >= 1", file=path, line=header_no, field="gpus_per_server")
    try:
        return Topology(
            n_nodes=counts["nodes"],
            switches=switch_ids,
            cables=cables,
            nvswitches=switch_ids[: counts.get("nvswitches", 0)],
            gpus_per_server=gpus_per_server,
            gpu_type=header[5] if simai else "NONE",
        )
    except InputError as err:
        raise InputError(err.message, file=path, field=err.field) from None


def _parse_cable(fields: list[str], path: Path, line: int, n_nodes: int) -> Cable:
    if len(fields) not in (4, 5):
        raise InputError(
            "a link line is 'src dst <bandwidth> <latency> [error_rate]', "
            f"got {len(fields)} fields",
            file=path,
            line=line,
        )
    a = parse_int(fields[0], path, line, "src")
    b = parse_int(fields[1], path, line, "dst")
    parsed: dict[str, float] = {}
    for name, text, parse in (
        ("bandwidth", fields[2], parse_rate),
        ("latency", fields[3], parse_time),
        ("error_rate", fields[4] if len(fields) == 5 else "0", float),
    ):
        try:
            parsed[name] = parse(text)
        except ValueError as err:
            raise InputError(str(err), file=path, line=line, field=name) from None
    cable = Cable(a, b, parsed["bandwidth"], parsed["latency"], parsed["error_rate"])
    try:
        _check_cable(cable, n_nodes)
    except InputError as err:
        raise InputError(err.message, file=path, line=line, field=err.field) from None
    return cable


# --------------------------------------------------------------------- writing
def format_topology(topo: Topology) -> str:
    """The SimAI text form of a topology (round-trips through :func:`read_topology`)."""
    others = [s for s in topo.switches if s not in set(topo.nvswitches)]
    lines = [
        f"{topo.n_nodes} {topo.gpus_per_server} {len(topo.nvswitches)} {len(others)} "
        f"{len(topo.cables)} {topo.gpu_type}",
        " ".join(str(s) for s in (*topo.nvswitches, *others)),
    ]
    lines += [
        f"{c.a} {c.b} {format_rate_gbps(c.bandwidth_bps)} {format_time_ms(c.latency_s)} "
        f"{c.error_rate:g}"
        for c in topo.cables
    ]
    return "\n".join(lines) + "\n"


def write_topology(topo: Topology, path: str | Path) -> Path:
    """Write the SimAI text form atomically (no partial file is ever visible at ``path``)."""
    return atomic_write_text(Path(path), format_topology(topo))
