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
from pathlib import Path
from typing import Any

from m4ray.errors import InputError
from m4ray.fingerprint import fingerprint
from m4ray.runtime.cluster import start_ray
from m4ray.train.job import mlflow_run, tracking_uri
from m4ray.train.loop import TrainConfig

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
        cfg.loop(),
        train_loop_config={"cfg": cfg, "mlflow_run_id": run_id, "tracking_uri": meta["uri"]},
        scaling_config=ScalingConfig(
            num_workers=cfg.num_workers, resources_per_worker={"CPU": meta["worker_cpus"]}
        ),
        run_config=RunConfig(
            name=name, storage_path=meta["storage"], callbacks=[TuneReportCallback()]
        ),
    ).fit()


def run(sweep, raw_config: dict[str, Any]) -> Path:
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    from m4ray.train.data import dataset_version

    cfg: TrainConfig = sweep.train
    settings: TuneSettings = sweep.tune
    if not isinstance(settings, TuneSettings):
        raise InputError("this experiment needs a 'tune' section", field="tune")
    for key in settings.space:  # unknown keys fail before any trial starts
        check_key(cfg, key)
    run_dir = Path(sweep.paths.run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    version = dataset_version(cfg.dataset_dir())
    cfg = cfg.resolved()  # trials run in other directories
    uri = tracking_uri(cfg, run_dir)
    start_ray(sweep.ray)
    meta = {
        "uri": uri,
        "experiment": f"{cfg.experiment}-tune",
        "version": version,
        "storage": str(run_dir / "trials"),
        "worker_cpus": settings.worker_cpus,
    }
    import mlflow

    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(meta["experiment"])  # created once here, before trials race for it
    print(
        f"tune: {settings.num_samples} trials x {cfg.num_workers} workers, ASHA on val_loss, "
        f"dataset {version}; MLflow {uri} experiment {meta['experiment']}"
    )
    tuner = tune.Tuner(
        tune.with_resources(trial, {"cpu": settings.trial_cpus}),
        param_space={**settings.param_space(), "base": cfg, "meta": meta},
        tune_config=tune.TuneConfig(
            metric="val_loss",
            mode="min",
            num_samples=settings.num_samples,
            max_concurrent_trials=settings.max_concurrent_trials,
            scheduler=ASHAScheduler(
                max_t=cfg.epochs,
                grace_period=settings.grace_period,
                reduction_factor=settings.reduction_factor,
            ),
        ),
        run_config=tune.RunConfig(name="asha", storage_path=str(run_dir / "tune"), verbose=0),
    )
    grid = tuner.fit()
    frame = grid.get_dataframe()
    columns = [c for c in frame.columns if c.startswith("config/") and c[7:] in settings.space]
    show = frame[[*columns, "val_loss", "training_iteration"]].sort_values("val_loss")
    print()
    print(show.rename(columns=lambda c: c.removeprefix("config/")).to_string(index=False))
    best = grid.get_best_result()
    best_values = {k: best.config[k] for k in settings.space}
    name = f"trial-{fingerprint(best_values, 8)}"
    print(f"\nbest: {best_values} val_loss {best.metrics['val_loss']:.4f}")
    print(f"best checkpoint: {Path(meta['storage']) / name}")
    return run_dir


__all__ = ["TuneSettings", "run", "trial", "with_values"]
