"""One training scenario: run it in ns-3 with recording on and turn the records into tables.

Open-loop traffic goes through the trace path (flows started at their arrival times); collective
traffic through the replay engine, so flows start when their predecessors are delivered, exactly
as in the gray-failure sweep. The same flows, with the arrival times ns-3 gave them, are then run
through flowSim for the baseline column. Runs in a worker process (ns-3 keeps global state and an
assertion kills its process).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa

from m4ray.datagen.families import ALGORITHMS, DatagenScenario
from m4ray.datagen.periods import ack_coupled as coupled_links
from m4ray.datagen.periods import busy_periods
from m4ray.datagen.schema import TABLES
from m4ray.datagen.traffic import IncastTraffic, OpenLoopTraffic
from m4ray.errors import SimulationError
from m4ray.models.fairshare import network_ack_fraction
from m4ray.sim.flows import Flow
from m4ray.sim.flowsim import FlowSimConfig
from m4ray.sim.replay import Replay
from m4ray.sim.routing import Routing
from m4ray.sim.topology import Topology
from m4ray.sim.trace import run_trace


def record(scenario: DatagenScenario) -> dict[str, pa.Table]:
    """The dataset tables of one scenario (see ``schema.TABLES``)."""
    topo, routing, backend, flows = deliver(scenario, record=True)
    coupled = scenario.ack_periods and network_ack_fraction(scenario.ns3, scenario.wire) > 0
    return tables(topo, routing, flows, backend.recording(), ack_coupled=coupled)


def deliver(scenario: DatagenScenario, *, record: bool = False, jitter_s: float = 0.0, config=None):
    """Run a scenario's traffic in ns-3 (or on ``config``'s backend: the closed-loop replay of
    :mod:`m4ray.datagen.closed_loop`): the topology, routing, backend and each flow with its
    finish time. ``jitter_s`` starts each flow later by its own uniform draw below it (open
    loop: each arrival; collectives: each send's latency; seeded by the scenario), which
    ``bench/ns3_noise.py`` uses to measure how far ns-3's answers move under nanosecond shifts
    no model can see."""
    jitter = np.random.default_rng([scenario.seed, 1]) if jitter_s > 0 else None
    topo = scenario.build_topology()
    routing = Routing(topo, seed=scenario.seed, wire=scenario.wire)
    backend = (scenario.ns3 if config is None else config).build(topo, routing)
    if record:
        backend.record()
    traffic = scenario.traffic
    if isinstance(traffic, OpenLoopTraffic | IncastTraffic):  # explicit flows, open loop
        flows = traffic.flows(routing, scenario.seed)
        if jitter is not None:
            flows = [
                dataclasses.replace(f, start_s=f.start_s + jitter.uniform(0, jitter_s))
                for f in flows
            ]
        return topo, routing, backend, _run_open_loop(backend, flows)
    workload = traffic.workload(len(topo.hosts))
    algorithm = ALGORITHMS[traffic.algorithm]().build(topo)
    args = (workload, backend, routing, algorithm)
    replay = (
        Replay(*args, send_latency_s=traffic.send_latency_s)
        if jitter is None
        else _Jittered(*args, send_latency_s=traffic.send_latency_s, rng=jitter, bound=jitter_s)
    )
    log = replay.run().flows
    flows = [
        (Flow(i, s, d, b, t0), t1)
        for i, s, d, b, t0, t1 in zip(
            log.flow_id,
            log.src,
            log.dst,
            log.size_bytes,
            log.start_s,
            log.finish_s,
            strict=True,
        )
    ]
    return topo, routing, backend, flows


class _Jittered(Replay):
    """A replay whose every send waits its latency plus its own uniform draw below ``bound``
    (in Python: the compiled loop takes one send latency)."""

    def __init__(self, *args, rng: np.random.Generator, bound: float, **kwargs) -> None:
        self._rng, self._bound = rng, bound
        super().__init__(*args, compiled=False, **kwargs)

    @property
    def send_latency_s(self) -> float:
        return self._latency + self._rng.uniform(0, self._bound)

    @send_latency_s.setter
    def send_latency_s(self, value: float) -> None:
        self._latency = value


def _run_open_loop(backend, flows: list[Flow]) -> list[tuple[Flow, float]]:
    finish: dict[int, float] = {}

    def done(flow_id: int, t: float) -> None:
        finish[flow_id] = t

    for flow in flows:
        backend.schedule(flow.start_s, lambda f=flow: backend.send(f, done))
    backend.run()
    if len(finish) != len(flows):
        raise SimulationError(f"{len(flows) - len(finish)} of {len(flows)} flows never completed")
    return [(flow, finish[flow.id]) for flow in flows]


def tables(
    topo: Topology,
    routing: Routing,
    done: list[tuple[Flow, float]],
    rec,
    *,
    ack_coupled: bool = False,
) -> dict:
    """Assemble the tables from the delivered flows and the C++ recording; with
    ``ack_coupled``, busy periods join flows that share a link or use each other's reverse
    links (where one's ACKs travel: :func:`~m4ray.models.fairshare.reverse_links`), so a period
    holds every flow whose data or ACKs load its links, as the m4 engine's anchor sees them."""
    done = sorted(done, key=lambda item: item[0].id)
    ids = np.array([f.id for f, _ in done], dtype=np.int64)
    if not np.array_equal(ids, np.arange(len(done))):
        raise SimulationError("flow ids must be 0..n-1 in a training scenario")
    flows = [f for f, _ in done]
    start = np.array([f.start_s for f in flows])
    fct = np.array([t for _, t in done]) - start
    paths = [routing.path(f.src, f.dst, f.id) for f in flows]
    ideal = np.array(
        [routing.ideal_fct(f.size_bytes, p) for f, p in zip(flows, paths, strict=True)]
    )
    size = np.array([f.size_bytes for f in flows], dtype=np.int64)
    links = [p.links for p in paths]
    keys = coupled_links(links) if ack_coupled else links
    periods = busy_periods(rec.event_flow, rec.event_kind, keys)
    flowsim = run_trace(topo, flows, FlowSimConfig(), routing).column("fct_s").to_numpy()

    event_period = periods.period_of_flow[rec.event_flow]
    same = periods.period_of_flow[rec.rx_flow] == event_period[rec.rx_event]
    remaining = size[rec.rx_flow] - rec.rx_bytes
    out = {
        "flows": {
            "flow_id": ids,
            "src": [f.src for f in flows],
            "dst": [f.dst for f in flows],
            "size_bytes": size,
            "start_s": start,
            "fct_s": fct,
            "ideal_fct_s": ideal,
            "slowdown": fct / ideal,
            "flowsim_fct_s": flowsim,
            "n_links": [len(p) for p in links],
            "path": [list(p) for p in links],
            "period_id": periods.period_of_flow,
        },
        "events": {
            "event": np.arange(len(rec.event_flow)),
            "time_s": rec.event_time_s,
            "flow_id": rec.event_flow,
            "kind": rec.event_kind,
            "period_id": event_period,
        },
        "remaining": {
            "event": rec.rx_event[same],
            "flow_id": rec.rx_flow[same],
            "remaining_bytes": remaining[same],
            "period_id": event_period[rec.rx_event[same]],
        },
        "queues": {
            "flow_id": rec.queue_flow,
            "hop": rec.queue_hop,
            "link": rec.queue_link,
            "queue_bytes": rec.queue_bytes,
        },
        "periods": {
            "period_id": np.arange(len(periods.n_flows)),
            "n_flows": periods.n_flows,
            "max_active": periods.max_active,
            "first_event": periods.first_event,
            "last_event": periods.last_event,
            "start_s": rec.event_time_s[periods.first_event],
            "end_s": rec.event_time_s[periods.last_event],
        },
        "links": {
            "link": np.arange(topo.n_links),
            "src": topo.link_src,
            "dst": topo.link_dst,
            "bandwidth_bps": topo.bandwidth_bps,
            "latency_s": topo.latency_s,
        },
    }
    return {name: pa.table(cols, schema=TABLES[name]) for name, cols in out.items()}


__all__ = ["record", "tables"]
