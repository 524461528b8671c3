"""The tune experiment: Ray Tune (ASHA) over the train experiment's settings, one MLflow run per
trial."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from m4ray.fingerprint import fingerprint
from m4ray.runtime.cluster import start_ray
from m4ray.train.job import tracking_uri
from m4ray.train.loop import TrainConfig
from m4ray.train.tune import TuneSettings, check_key, trial

SECTIONS = {"tune": TuneSettings}  # checked before run (train: m4's or m3's settings)


def run(sweep, raw_config: dict[str, Any]) -> Path:
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    from m4ray.train.data import dataset_version

    cfg: TrainConfig = sweep.train
    settings: TuneSettings = sweep.tune
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


__all__ = ["SECTIONS", "run"]
