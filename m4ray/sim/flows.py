"""Flows and the m4 ``flows.txt`` trace format.

A :class:`Flow` is ``(id, src, dst, size_bytes, start_s)``. ``flows.txt`` (m4 / HPCC): the first
line is the number of flows, then one line per flow ``flow_id src dst priority dport size_bytes
start_seconds``; priority and dport are accepted and ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from m4ray.errors import InputError
from m4ray.textio import read_rows


@dataclass(frozen=True, slots=True)
class Flow:
    """A point-to-point transfer between hosts (bytes, seconds)."""

    id: int
    src: int
    dst: int
    size_bytes: int
    start_s: float = 0.0


_FIELDS = ("flow_id", "src", "dst", "priority", "dport", "size_bytes", "start_seconds")


def read_flows(path: str | Path, hosts: frozenset[int] | set[int] | None = None) -> list[Flow]:
    """Read ``flows.txt``; ``hosts`` (if given) are the valid endpoint ids."""
    path = Path(path)
    rows = read_rows(path, "flow")
    if not rows:
        raise InputError("empty flow file; the first line must be the number of flows", file=path)
    count_no, count_fields = rows[0]
    if len(count_fields) != 1 or not count_fields[0].isdigit():
        raise InputError(
            "the first line must be the number of flows", file=path, line=count_no, field="count"
        )
    if int(count_fields[0]) != len(rows) - 1:
        raise InputError(
            f"announces {count_fields[0]} flows, file has {len(rows) - 1}",
            file=path,
            line=count_no,
            field="count",
        )
    flows, seen = [], set()
    for no, fields in rows[1:]:
        flow = _parse_flow(fields, path, no, hosts)
        if flow.id in seen:
            raise InputError(f"duplicate flow id {flow.id}", file=path, line=no, field="flow_id")
        seen.add(flow.id)
        flows.append(flow)
    return flows


def _parse_flow(fields: list[str], path: Path, line: int, hosts) -> Flow:
    if len(fields) != len(_FIELDS):
        raise InputError(
            f"expected {len(_FIELDS)} fields ({' '.join(_FIELDS)}), got {len(fields)}",
            file=path,
            line=line,
        )
    values: dict[str, float] = {}
    for name, text in zip(_FIELDS, fields, strict=True):
        try:
            values[name] = float(text) if name == "start_seconds" else int(text)
        except ValueError:
            kind = "a number" if name == "start_seconds" else "an integer"
            raise InputError(
                f"expected {kind}, got '{text}'", file=path, line=line, field=name
            ) from None
    if values["size_bytes"] <= 0:
        raise InputError(
            f"must be > 0, got {values['size_bytes']}", file=path, line=line, field="size_bytes"
        )
    if values["start_seconds"] < 0:
        raise InputError("must be >= 0", file=path, line=line, field="start_seconds")
    for name in ("src", "dst"):
        if hosts is not None and values[name] not in hosts:
            raise InputError(f"unknown host id {values[name]}", file=path, line=line, field=name)
    if values["src"] == values["dst"]:
        raise InputError("src and dst are the same host", file=path, line=line, field="dst")
    return Flow(
        int(values["flow_id"]),
        int(values["src"]),
        int(values["dst"]),
        int(values["size_bytes"]),
        values["start_seconds"],
    )


def format_flows(flows: list[Flow]) -> str:
    """The ``flows.txt`` text for ``flows`` (priority 3, dport 100 as m4 writes them)."""
    lines = [str(len(flows))]
    lines += [f"{f.id} {f.src} {f.dst} 3 100 {f.size_bytes} {f.start_s:.9f}" for f in flows]
    return "\n".join(lines) + "\n"
