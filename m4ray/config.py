"""Typed config schemas, registered in Hydra's ConfigStore in one place.

The YAML tree lives in the repository's top-level ``conf/``. Component schemas sit next to the
code that consumes them (``RayConfig`` in ``runtime/cluster.py``, ``FlowSimConfig`` in
``sim/flowsim.py`` …); this module holds the sweep's own (``GridConfig``: the grid the entry layer
expands), assembles the primary schemas and imports nothing but ``m4ray.runtime``. Component
nodes typed ``Any`` carry a ``_target_`` and are instantiated by the entry points.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from m4ray.runtime.cluster import RayConfig

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


@dataclass(kw_only=True, slots=True)
class GridConfig:
    """N degraded GPUs (or switch uplinks: ``target``) × reduction factors R × replicate seeds;
    every failure of the grid has the same packet-loss rate on its degraded links and the same
    onset time (0 = from the start)."""

    n: list[int] = field(default_factory=lambda: list(range(2, 17)))
    r: list[int] = field(default_factory=lambda: list(range(4, 11)))
    seeds: int = 1
    loss_rate: float = 0.0
    onset_s: float = 0.0
    target: str = "gpus"


SECTION = {"section": True}  # the metadata of a SweepConfig field that is an experiment's section


def sections() -> tuple[str, ...]:
    """The names of :class:`SweepConfig`'s experiment sections."""
    return tuple(f.name for f in fields(SweepConfig) if f.metadata.get("section"))


@dataclass(kw_only=True, slots=True)
class PathsConfig:
    """``output_dir``: root of all outputs; ``run_dir``: this run's directory (named by config)."""

    output_dir: str = "outputs"
    run_dir: str = MISSING


@dataclass(kw_only=True, slots=True)
class SweepConfig:
    """``python -m m4ray.sweeps``: an experiment (``job``) over a grid of scenarios."""

    name: str = MISSING
    job: str = MISSING
    seed: int = 0
    backends: list[str] = field(default_factory=lambda: ["flowsim"])
    reference_backend: str = "ns3"  # errors and speedups are reported against this backend
    backend_options: dict[str, Any] = field(default_factory=dict)
    topology: Any = MISSING
    workload: Any = MISSING
    collective: Any = MISSING
    wire: Any = MISSING
    send_latency_s: float = 3e-6
    grid: GridConfig = field(default_factory=GridConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    progress: bool = True
    # Experiment sections: each built from its ``_target_`` (its schema, which checks it) and
    # required by name and type by the experiment module's SECTIONS.
    datagen: Any = field(default=None, metadata=SECTION)  # m4ray.datagen.job.DatagenConfig
    # m4ray.train.loop.TrainConfig, m4ray.m3.train.M3TrainConfig
    train: Any = field(default=None, metadata=SECTION)
    tune: Any = field(default=None, metadata=SECTION)  # m4ray.train.tune.TuneSettings
    study: Any = field(default=None, metadata=SECTION)  # m4ray.workload.study.StudyConfig
    serve: Any = field(default=None, metadata=SECTION)  # m4ray.serve.job.ServeSettings
    ladder: Any = field(default=None, metadata=SECTION)  # m4ray.sweeps.scale.LadderConfig
    m3: Any = field(default=None, metadata=SECTION)  # m4ray.m3.estimate.M3Config
    tenants: Any = field(default=None, metadata=SECTION)  # m4ray.sweeps.multi_tenant.TenantsConfig


@dataclass(kw_only=True, slots=True)
class TraceFiles:
    """Inputs and output of the flow-trace mode (paths; output None = named by content)."""

    topology: str = MISSING
    flows: str = MISSING
    output: str | None = None


@dataclass(kw_only=True, slots=True)
class TraceConfig:
    """``python -m m4ray.sim``: replay a flow trace on one backend."""

    trace: TraceFiles = field(default_factory=TraceFiles)
    backend: Any = MISSING
    wire: Any = MISSING
    seed: int = 0
    paths: PathsConfig = field(default_factory=PathsConfig)


def register_configs() -> None:
    store = ConfigStore.instance()
    store.store(name="sweep_schema", node=SweepConfig)
    store.store(name="trace_schema", node=TraceConfig)
