"""m4 in the compiled loop (``_dagloop.c``'s m4 mode: M4Backend's events, the engine's updates
and the replay's flows in C) against the same backend stepping in Python: flow for flow, to the
bit."""

from __future__ import annotations

import dataclasses

import pytest

from m4ray.errors import InputError, SimulationError
from m4ray.sim.collectives import HierarchicalSpec, Ring
from m4ray.sim.dagloop import library
from m4ray.sim.failures import GrayFailure
from m4ray.sim.flows import Flow
from m4ray.sim.m4 import M4Config
from m4ray.sim.m4 import engine as m4_engine
from m4ray.sim.nccl import SimAISpec
from m4ray.sim.ns3.backend import Ns3Config
from m4ray.sim.replay import Replay
from m4ray.sim.replays import schedule_onset
from m4ray.sim.routing import Routing
from m4ray.sim.topologies import rail_cluster
from m4ray.sim.topology import Cable, Topology
from m4ray.sim.workload import Collective, CollectiveKind, Workload

from .test_dagloop import deadlocking, sends_and_computes

pytestmark = pytest.mark.skipif(library() is None, reason="no C compiler: m4 runs in Python")


def _workload() -> Workload:
    """Sends started from Python (one received late), compute, and three collectives."""
    nodes = sends_and_computes()
    group = tuple(range(16))
    kinds = (CollectiveKind.ALL_REDUCE, CollectiveKind.ALL_GATHER, CollectiveKind.ALL_REDUCE)
    for k, (kind, size) in enumerate(zip(kinds, (4_000_000, 1_000_000, 300_000), strict=True)):
        nodes += [
            Collective(
                id=10 + 16 * k + r,
                rank=r,
                kind=kind,
                group=group,
                size_bytes=size,
                deps=(10 + 16 * (k - 1) + r,) if k else {0: (1,), 9: (2,)}.get(r, ()),
            )
            for r in group
        ]
    return Workload(n_ranks=16, nodes=nodes)


def both(config: M4Config, algorithm, failure: GrayFailure):
    """The replay with m4 stepping in Python and in the compiled loop: (result, backend) each."""
    base = rail_cluster(servers=2)
    out = []
    for compiled in (False, True):
        routing = Routing(base, seed=3)
        backend = config.build(base, routing)
        schedule_onset(backend, failure, base)  # link rates drop mid-run: a Python event
        replay = Replay(_workload(), backend, routing, algorithm.build(base), compiled=compiled)
        assert (backend._loop is not None) == compiled == (replay._compiled is not None)
        out.append((replay.run(), backend))
    return out


@pytest.mark.parametrize(
    ("checkpoint", "collective", "stepper_from", "precision"),
    [
        ("m4-v2", "simai", None, "float64"),  # the default: every update compiled
        ("m4-v2", "simai", 6, "float64"),  # updates of 6 flows and more back to Python's stepper
        ("m4-v2", "simai", 6, "float32"),  # the float32 pass, both ways
        ("m4-lite", "simai", None, "float32"),  # a quarter of the width: 16-wide tiles
        ("m4-small", "hierarchical", None, "float64"),  # no fluid anchor
    ],
)
def test_m4_in_the_compiled_loop_equals_m4_in_python_to_the_bit(
    monkeypatch, checkpoint, collective, stepper_from, precision
):
    """Every flow's ids, hosts, parent, start, finish, ideal FCT and done time, the ranks' and
    nodes' finish times, the event and update counts: the compiled loop's are Python's, in
    either float type."""
    monkeypatch.setattr(m4_engine, "STEPPER_FROM_FLOWS", stepper_from)
    algorithm = SimAISpec(channels=2) if collective == "simai" else HierarchicalSpec()
    failure = GrayFailure(n_degraded=4, reduction=8, onset_s=30e-6)
    network = Ns3Config(transport="tcp" if checkpoint == "m4-small" else "rdma")  # as learned
    config = M4Config(checkpoint=checkpoint, network=network, precision=precision)
    (a, ba), (b, bb) = both(config, algorithm, failure)
    assert dataclasses.asdict(b.flows) == dataclasses.asdict(a.flows)  # every column, exactly
    assert b.completion_time_s == a.completion_time_s
    assert b.rank_finish_s == a.rank_finish_s
    assert b.node_end_s == a.node_end_s
    assert bb.n_events == ba.n_events == 2 * len(a.flows.flow_id) > 500
    assert bb.engine.n_updates == ba.engine.n_updates
    assert bb.engine.n_stepped_flows == ba.engine.n_stepped_flows
    python_steps = bb.engine._stats[3]  # updates the loop handed back to the stepper
    assert (python_steps > 0) == (stepper_from is not None)
    assert bb.engine.n_updates > python_steps
    assert b.node_end_s[5] == 200e-6  # posted late: the message was there
    if collective == "simai":  # the loop followed parents: SimAI's flows wait on them
        assert max(b.flows.parent_id) >= 0


def test_what_keeps_m4_in_python_says_so():
    """Updates other than once per instant (window_us null or > 0) stay in Python, as does a
    backend that already sent a flow; in the loop, a flow from outside the replay is refused."""
    topo = rail_cluster(servers=2)
    for window_us in (None, 10.0):
        backend = M4Config(window_us=window_us).build(topo, Routing(topo))
        assert backend.dag_loop() is None
    backend = M4Config().build(topo, Routing(topo))
    backend.send(Flow(0, topo.hosts[0], topo.hosts[1], 1000, 0.0), lambda *_: None)
    assert backend.dag_loop() is None
    backend = M4Config().build(topo, Routing(topo))
    assert backend.dag_loop() is not None
    with pytest.raises(SimulationError, match="replay's flows only"):
        backend.send(Flow(0, topo.hosts[0], topo.hosts[1], 1000, 0.0), lambda *_: None)


def test_bad_hosts_and_deadlocks_fail_as_in_python_keeping_the_flows():
    """Ranks on hosts that cannot reach each other are named as Routing names them (m4 meets
    them when built, before any loop); a deadlock after some flows hands back those flows in
    the compiled loop as in Python."""
    cut = Topology(
        n_nodes=4, switches=(2, 3), cables=(Cable(0, 2, 100e9, 1e-6), Cable(1, 3, 100e9, 1e-6))
    )
    star, stuck = deadlocking()
    with pytest.raises(InputError, match="hosts 0 and 1 are not connected"):
        M4Config().build(cut, Routing(cut))  # m4 reads the network's paths here
    kept = []
    for compiled in (False, True):
        routing = Routing(star)
        backend = M4Config().build(star, routing)
        replay = Replay(stuck, backend, routing, Ring(), compiled=compiled)
        assert (backend._loop is not None) == compiled
        with pytest.raises(SimulationError, match="deadlocked"):
            replay.run()
        kept.append(dataclasses.asdict(replay.flows))
    assert kept[0] == kept[1]
    assert len(kept[1]["flow_id"]) == 1 and kept[1]["done_s"][0] > 0
