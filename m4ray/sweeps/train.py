"""The train experiment: m4 on a datagen dataset with Ray Train, tracked in MLflow, evaluated on
held-out scenarios against flowSim, exported with its card (``m4ray.train.job``: the training
run all model kinds share)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from m4ray.models.checkpoint import M4
from m4ray.models.m4 import M4Model
from m4ray.train.data import dataset_version, load_splits
from m4ray.train.job import (
    dataset_meta,
    error_cdf,
    error_table,
    error_text,
    model_card,
    publish,
    train,
)
from m4ray.train.loop import TrainConfig, flow_errors, train_loop

SECTIONS = {"train": TrainConfig}  # checked before run


def closed_loop_metrics(cfg: TrainConfig, splits, model, meta: dict) -> dict[str, float]:
    """The trained model and classic flowSim in closed loop on up to
    ``cfg.closed_loop_scenarios`` of the test split's collective scenarios, against the ns-3
    runs the dataset recorded (:mod:`m4ray.datagen.closed_loop`: the gap per-flow scores miss):
    each one's mean |completion error| and how many scenarios ran. Needs the datagen run's
    ``manifest.json`` beside the dataset (none: no closed-loop metrics)."""
    import tempfile

    import numpy as np

    from m4ray.datagen.closed_loop import backends, closed_loop
    from m4ray.models import checkpoint

    run = Path(cfg.data.dataset).parent
    if cfg.closed_loop_scenarios == 0 or not (run / "manifest.json").is_file():
        return {}
    ids = sorted({s.scenario_id for s in splits["test"]})
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint.export(model, tmp, meta, "")  # the m4 backend loads a checkpoint directory
        made = backends(["m4", "flowsim"], checkpoint=tmp)
        result = closed_loop(run, made, scenario_ids=ids, limit=cfg.closed_loop_scenarios)
    out = {"test_closed_loop_scenarios": float(len(result.rows))}
    for name in made:
        if len(errors := result.errors(name)):
            out[f"test_closed_loop_{name}_mean"] = float(np.mean(np.abs(errors)))
    return out


def run(sweep, raw_config: dict[str, Any]) -> Path:
    cfg: TrainConfig = sweep.train
    started = time.perf_counter()
    run_dir = Path(sweep.paths.run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    version = dataset_version(cfg.data.dataset)  # fails early on a missing dataset
    cfg = cfg.resolved()  # workers run in other directories: hand them absolute paths
    trained = train(
        sweep, raw_config, cfg, train_loop, M4Model,
        version=version, run_dir=run_dir, what=f"train: dataset {version}",
    )  # fmt: skip
    splits = load_splits(cfg.data, cfg.model.anchor)
    errors = flow_errors(trained.model, splits["test"])
    table = error_table(errors)
    metrics = {
        f"test_{who}_{stat}": value for who, row in table.items() for stat, value in row.items()
    }
    plot = error_cdf(errors, run_dir / "plots" / "slowdown_error_cdf.png")
    meta = trained.meta(
        version,
        cfg,
        metrics,
        train_periods=len(splits["train"]),
        val_periods=len(splits["val"]),
        test_periods=len(splits["test"]),
        test_flows=len(errors["m4"]),
    )
    meta.update(dataset_meta(cfg.data.dataset, version))
    meta["metrics"].update(closed_loop_metrics(cfg, splits, trained.model, meta))
    export_dir = Path(cfg.export_dir or run_dir / "export")
    publish(trained, export_dir, meta, model_card(meta, table, cfg), kind=M4, plot=plot)
    print()
    print(error_text(table, len(errors["m4"])))
    if n := int(meta["metrics"].get("test_closed_loop_scenarios", 0)):
        shown = ", ".join(
            f"{who} {100 * meta['metrics'][f'test_closed_loop_{who}_mean']:.1f} %"
            for who in ("m4", "flowsim")
            if f"test_closed_loop_{who}_mean" in meta["metrics"]
        )
        print(f"closed loop, {n} held-out collective scenarios, mean |completion error|: {shown}")
    print(
        f"\ntrained {meta['epochs']} epochs in {trained.wall_s:.1f} s; checkpoint {export_dir}; "
        f"total {time.perf_counter() - started:.1f} s"
    )
    print(f"MLflow UI: .venv/bin/mlflow ui --backend-store-uri {trained.uri}")
    return run_dir


__all__ = ["SECTIONS", "run"]
