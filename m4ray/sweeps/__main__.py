"""``python -m m4ray.sweeps +experiment=<name> [overrides]``: compose, resolve, run one experiment.

Every experiment has one shape: a module of this package (the config's ``job``) with ``SECTIONS``
(the config sections it reads, each with its schema, checked here before anything runs) and
``run(sweep, raw_config)``, which expands its records, runs them through the runtime
(``m4ray.runtime``: fan-out, results file, manifest) and reports."""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

import hydra
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from m4ray.cli import stops_cleanly, user_errors
from m4ray.config import CONF_DIR, SweepConfig, register_configs, sections
from m4ray.errors import InputError

register_configs()


def resolve(cfg: DictConfig) -> SweepConfig:
    """Typed config with every ``_target_`` component instantiated."""
    if OmegaConf.is_missing(cfg, "job"):
        names = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))
        raise InputError(
            f"choose an experiment with +experiment=<name>; available: {', '.join(names)}"
        )
    sweep: SweepConfig = OmegaConf.to_object(cfg)
    options = {  # plain values: they cross Ray boundaries inside Scenarios
        name: instantiate(node, _convert_="all") for name, node in cfg.backend_options.items()
    }
    if "ns3_again" in options and "ns3" in options:  # ns3's settings, its own send delay
        delay = options["ns3_again"].send_delay_s
        options["ns3_again"] = dataclasses.replace(options["ns3"], send_delay_s=delay)
    return dataclasses.replace(
        sweep,
        topology=instantiate(cfg.topology),
        workload=instantiate(cfg.workload),
        collective=instantiate(cfg.collective),
        wire=instantiate(cfg.wire),
        backend_options=options,
        **{
            name: None if cfg[name] is None else instantiate(cfg[name], _convert_="all")
            for name in sections()
        },
    )


def load_experiment(sweep: SweepConfig):
    """The experiment module the config names, its sections checked against their schemas."""
    try:
        experiment = importlib.import_module(sweep.job)
    except ModuleNotFoundError:
        names = sorted(p.stem for p in Path(__file__).parent.glob("*.py") if p.stem[0] != "_")
        raise InputError(
            f"no experiment module '{sweep.job}' (m4ray.sweeps has: {', '.join(names)})",
            field="job",
        ) from None
    for name, schema in experiment.SECTIONS.items():
        if not isinstance(getattr(sweep, name), schema):
            raise InputError(
                f"this experiment needs a '{name}' section ({schema.__module__}.{schema.__name__})",
                field=name,
            )
    return experiment


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="sweep")
def main(cfg: DictConfig) -> None:
    with user_errors(), stops_cleanly(cfg.paths.run_dir):
        sweep = resolve(cfg)
        experiment = load_experiment(sweep)
        experiment.run(sweep, OmegaConf.to_container(cfg, resolve=True))


if __name__ == "__main__":
    main()
