"""``python -m m4ray.sweeps +experiment=tune``: Ray Tune (ASHA) around the training driver.

Each trial is a function trainable that builds and fits the same ``TorchTrainer`` as
``+experiment=train`` (or ``train_m3``: ``+experiment=tune_m3``) with its sampled settings (dotted
keys into the train config: ``lr``, ``model.hidden``, ``weight_remain``, ``batch_size`` …); the
train config names its training loop and dataset (``loop()``, ``dataset_dir()``,
``resolved()``); ``TuneReportCallback`` forwards rank 0's per-epoch metrics, so ASHA stops weak
trials early on ``val_loss``. Every trial has its own MLflow
run in the experiment ``<train.experiment>-tune``. The end prints every trial, the best config and
the best trial's checkpoint directory.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from m4ray.errors import InputError
from m4ray.fingerprint import fingerprint
from m4ray.train.job import mlflow_run
from m4ray.train.loop import TrainConfig, train_loop

DISTRIBUTIONS = ("loguniform", "uniform", "choice")


@dataclass(kw_only=True, slots=True)
class TuneSettings:
    """Search space (``{dotted.key: {loguniform|uniform: [lo, hi]} | {choice: [...]}}``), ASHA
    settings and the CPU share of each trial's driver and workers."""

    space: dict[str, Any] = field(default_factory=dict)
    num_samples: int = 2
    max_concurrent_trials: int = 2
    grace_period: int = 1
    reduction_factor: int = 2
    trial_cpus: float = 0.1  # the trial's driver function
    worker_cpus: float = 0.45  # each Ray Train worker of a trial

    def __post_init__(self) -> None:
        if not self.space:
            raise InputError("empty search space", field="tune.space")
        for key, spec in self.space.items():
            if (
                not isinstance(spec, dict)
                or len(spec) != 1
                or next(iter(spec)) not in DISTRIBUTIONS
            ):
                raise InputError(
                    f"expected one of {DISTRIBUTIONS} with its values, got {spec!r}",
                    field=f"tune.space.{key}",
                )
        if self.num_samples < 1:
            raise InputError("must be >= 1", field="tune.num_samples")

    def param_space(self):
        from ray import tune

        out = {}
        for key, spec in self.space.items():
            kind, values = next(iter(spec.items()))
            out[key] = (
                tune.choice(list(values)) if kind == "choice" else getattr(tune, kind)(*values)
            )
        return out


def check_key(cfg: TrainConfig, key: str) -> None:
    """A dotted key must name a training setting (``lr``, ``model.hidden`` …)."""
    head, _, rest = key.partition(".")
    if not hasattr(cfg, head):
        raise InputError(f"unknown training setting '{head}'", field=f"tune.space.{key}")
    if rest and not hasattr(getattr(cfg, head), rest):
        raise InputError(f"unknown setting '{rest}' of {head}", field=f"tune.space.{key}")


def with_values(cfg: TrainConfig, values: dict[str, Any]) -> TrainConfig:
    """``cfg`` with dotted keys replaced (``model.hidden`` → ``cfg.model.hidden``)."""
    for key, value in values.items():
        check_key(cfg, key)
        head, _, rest = key.partition(".")
        new = dataclasses.replace(getattr(cfg, head), **{rest: value}) if rest else value
        cfg = dataclasses.replace(cfg, **{head: new})
    return cfg


def trial(config: dict[str, Any]) -> None:
    """One Tune trial: fit a TorchTrainer with the sampled settings."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    base: TrainConfig = config["base"]
    values = {k: v for k, v in config.items() if k not in ("base", "meta")}
    cfg = with_values(base, values)
    meta = config["meta"]
    name = f"trial-{fingerprint(values, 8)}"
    run_id = mlflow_run(meta["uri"], meta["experiment"], name, {"train": values}, meta["version"])
    TorchTrainer(
        train_loop,
        train_loop_config={"cfg": cfg, "mlflow_run_id": run_id, "tracking_uri": meta["uri"]},
        scaling_config=ScalingConfig(
            num_workers=cfg.num_workers, resources_per_worker={"CPU": meta["worker_cpus"]}
        ),
        run_config=RunConfig(
            name=name, storage_path=meta["storage"], callbacks=[TuneReportCallback()]
        ),
    ).fit()


__all__ = ["TuneSettings", "trial", "with_values"]
