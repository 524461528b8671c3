"""``python -m m4ray.sweeps +experiment=<name> [overrides]``: compose, resolve, run one job."""

from __future__ import annotations

import dataclasses

import hydra
from hydra.utils import get_method, instantiate
from omegaconf import DictConfig, OmegaConf

from m4ray.cli import stops_cleanly, user_errors
from m4ray.config import CONF_DIR, SweepConfig, register_configs
from m4ray.errors import InputError

register_configs()

# experiment sections (SweepConfig fields) built from their ``_target_`` when present
SECTIONS = ("datagen", "train", "tune", "study", "serve", "ladder", "m3")


def resolve(cfg: DictConfig) -> SweepConfig:
    """Typed config with every ``_target_`` component instantiated."""
    if OmegaConf.is_missing(cfg, "job"):
        names = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))
        raise InputError(
            f"choose an experiment with +experiment=<name>; available: {', '.join(names)}"
        )
    sweep: SweepConfig = OmegaConf.to_object(cfg)
    return dataclasses.replace(
        sweep,
        topology=instantiate(cfg.topology),
        workload=instantiate(cfg.workload),
        collective=instantiate(cfg.collective),
        wire=instantiate(cfg.wire),
        backend_options={  # plain values: they cross Ray boundaries inside Scenarios
            name: instantiate(node, _convert_="all") for name, node in cfg.backend_options.items()
        },
        **{
            name: None if cfg[name] is None else instantiate(cfg[name], _convert_="all")
            for name in SECTIONS
        },
    )


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="sweep")
def main(cfg: DictConfig) -> None:
    with user_errors(), stops_cleanly(cfg.paths.run_dir):
        sweep = resolve(cfg)
        get_method(sweep.job)(sweep, OmegaConf.to_container(cfg, resolve=True))


if __name__ == "__main__":
    main()
