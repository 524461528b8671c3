"""A dataset's collective scenarios replayed in closed loop on other backends, against the ns-3
run the dataset recorded.

Training and the per-flow benches score a backend on ns-3's own arrivals (each flow meets what
it met in ns-3). In closed loop nothing of ns-3's run is given, as in a sweep: each flow starts
when its parents end in the backend's own run, so small per-flow errors change what later flows
meet, and on SimAI's rings they compound (docs/gray_failure_study.md, "The study's gap is made
in closed loop").
Scenarios are drawn again from the datagen run's ``manifest.json`` config (the same seeds and
ids), so nothing but the dataset's folder is needed. Open-loop families have fixed arrivals:
there is nothing to close, and they are skipped.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from m4ray.errors import InputError

# a backend config made for a scenario's ns-3 network (so a learned backend imitates it)
Factory = Callable[[object], object]


def drawn_scenarios(run_dir: str | Path) -> dict:
    """The scenarios a datagen run's ``manifest.json`` config draws, by scenario id."""
    from hydra.utils import instantiate

    from m4ray.datagen.job import expand

    path = Path(run_dir) / "manifest.json"
    if not path.is_file():
        raise InputError("no manifest.json: not a datagen run directory", file=path)
    config = json.loads(path.read_text())["config"]
    datagen = instantiate(config["datagen"], _convert_="all")
    return {s.scenario_id: s for s in expand(datagen, config["seed"])}


def completion(scenario, config) -> float:
    """The scenario's DAG replayed on ``config``'s backend, each flow starting when its parents
    end there (as datagen replays it in ns-3): the last flow's end (s)."""
    from m4ray.datagen.record import deliver

    return max(end for _, end in deliver(scenario, config=config)[3])


def backends(names: Iterable[str], checkpoint: str | None = None) -> dict[str, Factory]:
    """Backends by name, each made for a scenario's ns-3 network: ``flowsim`` (classic),
    ``flowsim_acks`` (ACKs load the reverse links), ``flowsim_dcqcn`` (DCQCN's rates; DCQCN
    networks only), ``flowsim_fifo`` (links serve window-sized flows in order of arrival),
    ``flowsim_bursts`` and ``flowsim_fifo_bursts`` (those with the network's standing queues
    and first windows over them, ``StandingQueues.of(..., bursts=True)``),
    ``fluid_dctcp`` (:mod:`m4ray.sim.fluidcc`: the rates and queues of the network's RDMA
    congestion control, time-stepped), ``m4`` (``checkpoint``, the m4 backend's default if
    None, told the network it
    imitates), ``m4_fifo`` (that on a FIFO anchor: ``M4Config.anchor``) and
    ``m4=<checkpoint>`` (another checkpoint, so several models replay side by side)."""
    from m4ray.sim.flowsim import DcqcnRates, FlowSimConfig
    from m4ray.sim.fluidcc import FluidDctcpConfig
    from m4ray.sim.m4 import M4Config

    checkpoint = checkpoint or M4Config().checkpoint
    made: dict[str, Factory] = {
        "flowsim": lambda network: FlowSimConfig(),
        "flowsim_acks": lambda network: FlowSimConfig(ack_load=True),
        "flowsim_dcqcn": lambda network: FlowSimConfig(rate_control=DcqcnRates.of(network)),
        "flowsim_fifo": lambda network: FlowSimConfig(service="fifo", fifo_bytes=_window(network)),
        "flowsim_bursts": lambda network: _Bursts(network, FlowSimConfig()),
        "flowsim_fifo_bursts": lambda network: _Bursts(
            network, FlowSimConfig(service="fifo", fifo_bytes=_window(network))
        ),
        "fluid_dctcp": lambda network: FluidDctcpConfig(network=network),
        "m4": lambda network: M4Config(checkpoint=checkpoint, network=network),
        "m4_fifo": lambda network: M4Config(checkpoint=checkpoint, network=network, anchor="fifo"),
    }
    names = list(names)
    for name in names:
        kind, sep, other = name.partition("=")
        if kind == "m4" and sep and other:
            made[name] = lambda network, other=other: M4Config(checkpoint=other, network=network)
    unknown = sorted(set(names) - set(made))
    if unknown:
        raise InputError(f"unknown backend(s) {unknown}; choose from {sorted(made)}")
    return {name: made[name] for name in names}


@dataclass(frozen=True, slots=True)
class _Bursts:
    """flowSim ``config`` with the standing queues and bursts of ``network`` on the routing it
    is built on (:meth:`~m4ray.sim.flowsim.StandingQueues.of` needs the routing)."""

    network: Any
    config: Any

    def build(self, topology, routing):
        from m4ray.sim.flowsim import StandingQueues

        queues = StandingQueues.of(self.network, routing, bursts=True)
        return dataclasses.replace(self.config, queues=queues).build(topology, routing)


def _window(network) -> int | str:
    """The sender window of an ns-3 network config, as flowSim's ``fifo_bytes`` takes it: its
    RDMA window where one is set, else RDMA's default rule (``"window"``: also for no window,
    where serving every flow in order would let long flows block the rest)."""
    rdma = network.rdma if network.transport == "rdma" else None
    if rdma is not None and rdma.window_bytes and rdma.window_rule != "simai":
        return int(rdma.window_bytes)
    return "window"


@dataclass(slots=True)
class ClosedLoop:
    """Per scenario: its row (id, family, CC, degraded GPUs, R, ns-3's completion) and each
    backend's completion / ns-3's, or why it refused the scenario."""

    rows: list[dict] = field(default_factory=list)

    def errors(self, name: str) -> np.ndarray:
        """A backend's completion errors (``t / t_ns3 - 1``) over the scenarios it ran."""
        return np.array([r[name] - 1 for r in self.rows if isinstance(r.get(name), float)])


def closed_loop(
    run_dir: str | Path,
    backends: dict[str, Factory],
    *,
    scenario_ids: Iterable[str] | None = None,
    family: str | None = None,
    limit: int | None = None,
) -> ClosedLoop:
    """Each recorded collective scenario of the datagen run (``scenario_ids`` of them, or all;
    ``family``'s only; the first ``limit``) on each backend in closed loop."""
    run_dir = Path(run_dir)
    drawn = drawn_scenarios(run_dir)
    dataset = run_dir / "dataset"
    table = pq.read_table(dataset / "scenarios.parquet").to_pandas()
    table = table[table.status == "ok"]
    if scenario_ids is not None:
        table = table[table.scenario_id.isin(set(scenario_ids))]
    if family is not None:
        table = table[table.family == family]
    out = ClosedLoop()
    for sid, params in zip(table.scenario_id, table.params, strict=True):
        if limit is not None and len(out.rows) >= limit:
            break
        scenario = drawn.get(sid)
        if scenario is None:
            raise InputError(
                f"scenario {sid} is not drawn by this run's config (made by other code?)",
                file=run_dir / "manifest.json",
            )
        if not hasattr(scenario.traffic, "workload"):
            continue  # open loop
        flows = ds.dataset(dataset / "flows" / f"scenario_id={sid}").to_table().to_pandas()
        ns3 = float((flows.start_s + flows.fct_s).max())
        drawn_params = json.loads(params)
        row: dict = {
            "scenario": sid,
            "family": scenario.family,
            "cc": drawn_params.get("cc", "dctcp"),
            "degraded": drawn_params.get("n_degraded", ""),
            "R": drawn_params.get("reduction", ""),
            "ns3_s": ns3,
        }
        for name, make in backends.items():
            try:
                row[name] = completion(scenario, make(scenario.ns3)) / ns3
            except InputError as err:  # e.g. a CC the checkpoint never learned: said, not scored
                row[name] = f"refused ({err.field})"
        out.rows.append(row)
    return out


__all__ = ["ClosedLoop", "backends", "closed_loop", "completion", "drawn_scenarios"]
