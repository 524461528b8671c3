"""The training dataset's tables: Arrow schemas with a description of every column.

``SCHEMA.md`` in each dataset is rendered from these definitions, and every table is cast to
its schema before it is written, so the document and the files cannot drift apart.
Units: bytes, seconds, bits per second. Flow ids are 0-based within a scenario.
"""

from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = 1


def _schema(doc: str, *columns: tuple[str, pa.DataType, str]) -> pa.Schema:
    fields = [pa.field(name, dtype, metadata={"doc": text}) for name, dtype, text in columns]
    return pa.schema(fields, metadata={"doc": doc})


TABLES: dict[str, pa.Schema] = {
    "flows": _schema(
        "One row per flow, in flow-id order.",
        ("flow_id", pa.int64(), "flow id within the scenario (0-based)"),
        ("src", pa.int32(), "source host (node id)"),
        ("dst", pa.int32(), "destination host (node id)"),
        ("size_bytes", pa.int64(), "payload bytes"),
        ("start_s", pa.float64(), "arrival time in ns-3 (s)"),
        ("fct_s", pa.float64(), "ns-3 flow completion time: last payload byte at the sink (s)"),
        (
            "ideal_fct_s",
            pa.float64(),
            "alone on an idle path, one way (m4ray.sim.routing) (s)",
        ),
        ("slowdown", pa.float64(), "fct_s / ideal_fct_s, raw (m4ray.sim.routing convention)"),
        ("flowsim_fct_s", pa.float64(), "flowSim FCT of the same flows with the same starts (s)"),
        ("n_links", pa.int32(), "directed links on the path"),
        ("path", pa.list_(pa.int32()), "directed link ids from src to dst (see `links`)"),
        ("period_id", pa.int64(), "busy period the flow belongs to (see `periods`)"),
    ),
    "events": _schema(
        "Arrivals and completions in simulated order (two per flow).",
        ("event", pa.int64(), "event index in the scenario (0-based, time order)"),
        ("time_s", pa.float64(), "simulated time (s)"),
        ("flow_id", pa.int64(), "the flow arriving or completing"),
        ("kind", pa.int8(), "0 = arrival, 1 = completion"),
        ("period_id", pa.int64(), "busy period of the flow"),
    ),
    "remaining": _schema(
        "Dense supervision: at every event, the bytes still to deliver of every flow active in "
        "the event's busy period (the event's own flow included: its size at arrival, 0 at "
        "completion).",
        ("event", pa.int64(), "event index (see `events`)"),
        ("flow_id", pa.int64(), "an active flow of the same busy period"),
        ("remaining_bytes", pa.int64(), "size_bytes minus bytes received so far by the sink"),
        ("period_id", pa.int64(), "busy period"),
    ),
    "queues": _schema(
        "Dense supervision: at each flow's arrival, the backlog of every hop of its path.",
        ("flow_id", pa.int64(), "the arriving flow"),
        ("hop", pa.int32(), "position on the path (0 = the source host's port)"),
        ("link", pa.int32(), "directed link id"),
        ("queue_bytes", pa.int64(), "bytes queued at the link's output port (queue disc + NIC)"),
    ),
    "periods": _schema(
        "Busy periods (connected components in time), numbered by first arrival.",
        ("period_id", pa.int64(), "period id within the scenario"),
        ("n_flows", pa.int64(), "flows in the period (the balanced-sampling key)"),
        ("max_active", pa.int64(), "most flows active at once"),
        ("first_event", pa.int64(), "first event index"),
        ("last_event", pa.int64(), "last event index"),
        ("start_s", pa.float64(), "first arrival (s)"),
        ("end_s", pa.float64(), "last completion (s)"),
    ),
    "links": _schema(
        "Directed links of the scenario's topology, degradations applied.",
        ("link", pa.int32(), "directed link id"),
        ("src", pa.int32(), "sending node"),
        ("dst", pa.int32(), "receiving node"),
        ("bandwidth_bps", pa.float64(), "rate (bit/s)"),
        ("latency_s", pa.float64(), "propagation delay (s)"),
    ),
}

SCENARIOS = _schema(
    "One row per scenario (`scenarios.parquet`): status, cost and every sampled parameter.",
    ("scenario_id", pa.string(), "content id of the scenario record (partition key)"),
    ("family", pa.string(), "scenario family (config group `family`)"),
    ("index", pa.int64(), "index within the family"),
    ("seed", pa.int64(), "the scenario's seed"),
    ("status", pa.string(), "ok or failed"),
    ("error", pa.string(), "reason when failed"),
    ("wall_s", pa.float64(), "wall time of the task (s)"),
    ("n_flows", pa.int64(), "flows recorded"),
    ("n_events", pa.int64(), "events recorded"),
    ("n_periods", pa.int64(), "busy periods"),
    (
        "params13",
        pa.list_(pa.float32()),
        "network/CC vector: m4's params13 (reference/m4.md §3.1); m3 lots: models.m3_features."
        "CONFIG_FIELDS",
    ),
    ("params", pa.string(), "every sampled parameter as JSON"),
)


def render(tables: dict[str, pa.Schema] | None = None) -> str:
    """The ``SCHEMA.md`` text of a dataset with ``tables`` (default: m4's)."""
    tables = TABLES if tables is None else tables
    lines = [
        f"# m4ray training dataset (schema version {SCHEMA_VERSION})",
        "",
        "Layout: `<table>/scenario_id=<id>/part-0.parquet` (Hive partitioning: "
        "`pyarrow.dataset.dataset(path, partitioning='hive')` adds `scenario_id`), plus "
        "`scenarios.parquet`, `manifest.json` and `VERSION` (the dataset's content hash). "
        "Units: bytes, seconds, bit/s.",
        "",
    ]
    for name, schema in [*tables.items(), ("scenarios", SCENARIOS)]:
        lines += [f"## {name}", "", schema.metadata[b"doc"].decode(), ""]
        lines += ["| column | type | meaning |", "|---|---|---|"]
        for f in schema:
            lines.append(f"| `{f.name}` | {f.type} | {f.metadata[b'doc'].decode()} |")
        lines.append("")
    return "\n".join(lines)


__all__ = ["SCENARIOS", "SCHEMA_VERSION", "TABLES", "render"]
