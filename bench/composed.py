"""The sweep configuration as ``python -m m4ray.sweeps`` composes it, for benches that run its
parts in process: their wire formats, workloads and backend presets come from ``conf/`` (one
source of truth), not from copies of its values."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def composed(*overrides: str):
    """The sweep config for ``overrides`` (e.g. ``+experiment=scale``), as Hydra composes it."""
    from hydra import compose, initialize_config_dir

    from m4ray.config import CONF_DIR
    from m4ray.sweeps import __main__  # noqa: F401  (registers the config schema)

    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
        return compose("sweep", overrides=list(overrides))


def resolved(*overrides: str):
    """:func:`composed` with every component built, as a sweep runs it."""
    from m4ray.sweeps.__main__ import resolve

    return resolve(composed(*overrides))


def wire(name: str):
    """``conf/wire/<name>.yaml`` as a :class:`~m4ray.sim.routing.WireFormat`."""
    return resolved("+experiment=gray_failure", f"wire={name}").wire


def ladder_workload(name: str) -> dict:
    """The scale ladder's synthetic job ``name`` (``conf/experiment/scale.yaml``)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(composed("+experiment=scale").ladder.workloads[name])
