"""Replay as a plug point: how a scenario's workload is driven over its network, chosen by name.

* ``dag`` — every rank's DAG, collectives decomposed by the collective layer into flows on the
  backend (:class:`m4ray.sim.replay.Replay`); a per-flow table comes back;
* ``lockstep`` — one rank's program, each distinct collective step run once with every group's
  flows of that step (:mod:`m4ray.sim.lockstep`); no per-flow table;
* ``emulation`` — the backend runs the whole workload itself (real processes and bytes:
  :class:`m4ray.emulation.engine.EmulationConfig`).

The name comes from config, in one place (:func:`replay_of`): a backend config names the replay
it needs in its ``replay`` class attribute (:class:`~m4ray.sim.backend.BackendConfig`: ``dag``
unless it runs workloads itself), and a workload asks for lockstep with ``workload.lockstep``.
A combination no replay can run fails by name before anything is built.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from m4ray.errors import InputError
from m4ray.sim.failures import GrayFailure
from m4ray.sim.replay import FlowLog, Replay
from m4ray.sim.routing import Routing
from m4ray.sim.topology import Topology


@dataclass(kw_only=True, slots=True)
class Replayed:
    """What a replay returns: the result (completion time, exposed communication) and the flows
    it logged; a replay without a per-flow table (``flows`` None) says how many flows it stood
    for (``represented``)."""

    result: Any
    flows: FlowLog | None
    represented: int = 0


@dataclass(kw_only=True, slots=True)
class Setting:
    """One scenario's built parts, as every replay receives them."""

    scenario: Any
    base: Topology  # before the failure (a mid-run onset changes rates from it)
    topo: Topology
    routing: Routing
    algorithm: Any


def replay_of(scenario: Any) -> str:
    """The replay a scenario runs with (module docstring); conflicts are input errors."""
    backend = type(scenario.backend_config).replay
    lockstep = bool(scenario.workload.lockstep)
    if backend == "emulation" and lockstep:
        raise InputError("emulation replays every rank: no lockstep", field="workload.lockstep")
    if scenario.failure.onset_s > 0 and (lockstep or backend == "emulation"):
        raise InputError(
            f"a {'lockstep' if lockstep else 'emulated'} replay cannot start a failure mid-run",
            field="onset_s",
        )
    return "lockstep" if lockstep else backend


def replay_dag(s: Setting, keep: Callable[[Replay], None]) -> Replayed:
    """Every rank's DAG over the backend; ``keep`` receives the replay before it runs (so a
    failure mid-run still has the flows delivered before it)."""
    workload = s.scenario.workload.build(n_hosts=len(s.base.hosts))
    backend = s.scenario.backend_config.build(s.topo, s.routing)
    schedule_onset(backend, s.scenario.failure, s.base)
    replay = Replay(
        workload,
        backend,
        s.routing,
        s.algorithm,
        send_latency_s=s.scenario.send_latency_s,
        pair_keys=getattr(s.scenario.workload, "pair_keys", False),
    )
    keep(replay)
    result = replay.run()
    return Replayed(result=result, flows=result.flows)


def replay_lockstep(s: Setting, keep: Callable[[Replay], None]) -> Replayed:
    """One rank's program in lockstep (:class:`m4ray.sim.lockstep.LockstepReplay`)."""
    from m4ray.sim.lockstep import LockstepReplay

    result = LockstepReplay.of_spec(
        s.scenario.workload,
        s.topo,
        s.routing,
        s.scenario.backend_config,
        s.algorithm,
        send_latency_s=s.scenario.send_latency_s,
    ).run()
    return Replayed(result=result, flows=None, represented=result.flows_represented)


def replay_emulated(s: Setting, keep: Callable[[Replay], None]) -> Replayed:
    """The backend runs the workload itself (``run_workload``)."""
    workload = s.scenario.workload.build(n_hosts=len(s.base.hosts))
    result = s.scenario.backend_config.run_workload(s.topo, s.routing, workload, s.algorithm)
    return Replayed(result=result, flows=result.flows)


def schedule_onset(backend: Any, failure: GrayFailure, base: Topology) -> None:
    """Schedule a mid-run gray failure: link rates drop at ``failure.onset_s``."""
    changes = failure.onset_changes(base)
    if not changes:
        return
    if not hasattr(backend, "set_bandwidth"):
        raise InputError(
            f"{type(backend).__name__} cannot change link rates during a run",
            field="failure.onset_s",
        )

    def drop() -> None:
        for link, bandwidth in changes:
            backend.set_bandwidth(link, bandwidth)

    backend.schedule(failure.onset_s, drop)


REPLAYS: dict[str, Callable[[Setting, Callable[[Replay], None]], Replayed]] = {
    "dag": replay_dag,
    "lockstep": replay_lockstep,
    "emulation": replay_emulated,
}


__all__ = ["REPLAYS", "Replayed", "Setting", "replay_of", "schedule_onset"]
