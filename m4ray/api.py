"""m4ray's public surface: what a user's script or another simulator imports, named in one place.
Everything else in the package is internal by convention and may move between releases.

    from m4ray.api import Scenario, simulate, GrayFailure, RailClusterSpec, SimAIWorkloadSpec
    row, flows = simulate(Scenario(topology=RailClusterSpec(), failure=GrayFailure(n_degraded=4,
                                   reduction=4), workload=SimAIWorkloadSpec(path="simai_study")))

* one simulation: :class:`Scenario` (topology, failure, workload, collective layer, backend and
  its settings, wire, seed) and :func:`simulate` (its result row and per-flow table);
  :func:`run_trace` replays a plain flow list (no DAG);
* topologies: :class:`Topology` (:func:`read_topology` / :func:`write_topology`, SimAI's text
  format), :class:`RailClusterSpec`, :class:`FatTreeSpec`, :class:`ClusterTemplateSpec` (SimAI's
  templates), :class:`TopologyFileSpec`; failures: :class:`GrayFailure`;
* workloads: :class:`SimAIWorkloadSpec`, :class:`ChakraWorkloadSpec`,
  :class:`SyntheticWorkloadSpec`; collective layers: :class:`SimAISpec` (SimAI's NCCL flows),
  :class:`HierarchicalSpec`, :class:`RingSpec`;
* backends (their configs): :class:`FlowSimConfig`, :class:`Ns3Config`, :class:`M4Config`,
  :class:`M4ServedConfig` (a Serve deployment over HTTP), :class:`EmulationConfig`;
  :class:`SessionClient` is the Serve session API's client for another simulator;
* models: :func:`load_checkpoint` (``checkpoints/<name>`` or a directory; torch);
* flows and paths: :class:`Flow`, :class:`Routing`, :class:`WireFormat`.

Names load on first use, so ``import m4ray.api`` stays cheap (no torch, ns-3 or Ray).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_HOMES = {
    "Scenario": "m4ray.sim.scenario",
    "simulate": "m4ray.sim.scenario",
    "run_trace": "m4ray.sim.trace",
    "Topology": "m4ray.sim.topology",
    "read_topology": "m4ray.sim.topology",
    "write_topology": "m4ray.sim.topology",
    "RailClusterSpec": "m4ray.sim.topologies",
    "FatTreeSpec": "m4ray.sim.topologies",
    "TopologyFileSpec": "m4ray.sim.topologies",
    "ClusterTemplateSpec": "m4ray.sim.templates",
    "GrayFailure": "m4ray.sim.failures",
    "SimAIWorkloadSpec": "m4ray.workload.simai",
    "ChakraWorkloadSpec": "m4ray.workload.chakra",
    "SyntheticWorkloadSpec": "m4ray.workload.synth",
    "SimAISpec": "m4ray.sim.nccl",
    "HierarchicalSpec": "m4ray.sim.collectives",
    "RingSpec": "m4ray.sim.collectives",
    "FlowSimConfig": "m4ray.sim.flowsim",
    "Ns3Config": "m4ray.sim.ns3.backend",
    "M4Config": "m4ray.sim.m4.backend",
    "M4ServedConfig": "m4ray.serve.client",
    "SessionClient": "m4ray.serve.client",
    "EmulationConfig": "m4ray.emulation.engine",
    "load_checkpoint": "m4ray.models.checkpoint",
    "Flow": "m4ray.sim.flows",
    "Routing": "m4ray.sim.routing",
    "WireFormat": "m4ray.models.wire",
}
_RENAMED = {"load_checkpoint": "load"}

if TYPE_CHECKING:  # the same names, for type checkers and the layering test
    from m4ray.emulation.engine import EmulationConfig
    from m4ray.models.checkpoint import load as load_checkpoint
    from m4ray.models.wire import WireFormat
    from m4ray.serve.client import M4ServedConfig, SessionClient
    from m4ray.sim.collectives import HierarchicalSpec, RingSpec
    from m4ray.sim.failures import GrayFailure
    from m4ray.sim.flows import Flow
    from m4ray.sim.flowsim import FlowSimConfig
    from m4ray.sim.m4.backend import M4Config
    from m4ray.sim.nccl import SimAISpec
    from m4ray.sim.ns3.backend import Ns3Config
    from m4ray.sim.routing import Routing
    from m4ray.sim.scenario import Scenario, simulate
    from m4ray.sim.templates import ClusterTemplateSpec
    from m4ray.sim.topologies import FatTreeSpec, RailClusterSpec, TopologyFileSpec
    from m4ray.sim.topology import Topology, read_topology, write_topology
    from m4ray.sim.trace import run_trace
    from m4ray.workload.chakra import ChakraWorkloadSpec
    from m4ray.workload.simai import SimAIWorkloadSpec
    from m4ray.workload.synth import SyntheticWorkloadSpec


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"m4ray.api has no {name!r} (its names: {', '.join(__all__)})")
    return getattr(importlib.import_module(_HOMES[name]), _RENAMED.get(name, name))


__all__ = [
    "ChakraWorkloadSpec",
    "ClusterTemplateSpec",
    "EmulationConfig",
    "FatTreeSpec",
    "Flow",
    "FlowSimConfig",
    "GrayFailure",
    "HierarchicalSpec",
    "M4Config",
    "M4ServedConfig",
    "Ns3Config",
    "RailClusterSpec",
    "RingSpec",
    "Routing",
    "Scenario",
    "SessionClient",
    "SimAISpec",
    "SimAIWorkloadSpec",
    "SyntheticWorkloadSpec",
    "Topology",
    "TopologyFileSpec",
    "WireFormat",
    "load_checkpoint",
    "read_topology",
    "run_trace",
    "simulate",
    "write_topology",
]
