"""The train experiment: m4 on a datagen dataset with Ray Train, tracked in MLflow, exported with
its card."""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

import torch

from m4ray.fingerprint import fingerprint
from m4ray.models import checkpoint
from m4ray.models.m4 import M4Model
from m4ray.runtime.provenance import git_commit
from m4ray.train.data import dataset_version, load_splits
from m4ray.train.job import (
    dataset_transports,
    error_cdf,
    error_table,
    error_text,
    fit,
    mlflow_run,
    model_card,
    tracking_uri,
)
from m4ray.train.loop import TrainConfig, flow_errors, train_loop

SECTIONS = {"train": TrainConfig}  # checked before run


def run(sweep, raw_config: dict[str, Any]) -> Path:
    cfg: TrainConfig = sweep.train
    started = time.perf_counter()
    run_dir = Path(sweep.paths.run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    version = dataset_version(cfg.data.dataset)  # fails early on a missing dataset
    # workers run in other directories: hand them absolute paths
    data = dataclasses.replace(cfg.data, dataset=str(Path(cfg.data.dataset).resolve()))
    cfg = dataclasses.replace(cfg, data=data)
    uri = tracking_uri(cfg, run_dir)
    name = f"{sweep.name}-{fingerprint([raw_config.get('train'), version], 8)}"
    run_id = mlflow_run(uri, cfg.experiment, name, raw_config, version)

    print(f"train: dataset {version}; MLflow {uri} run {name}")
    result, use_gpu, train_wall = fit(
        train_loop,
        {"cfg": cfg, "mlflow_run_id": run_id, "tracking_uri": uri},
        cfg,
        sweep.ray,
        name=name,
        run_dir=run_dir,
    )
    with result.checkpoint.as_directory() as d:
        state = torch.load(Path(d) / "state.pt", map_location="cpu", weights_only=False)
    model = M4Model(cfg.model)
    model.load_state_dict(state["model"])
    model.eval()

    splits = load_splits(cfg.data)
    errors = flow_errors(model, splits["test"])
    table = error_table(errors)
    metrics = {
        f"test_{who}_{stat}": value for who, row in table.items() for stat, value in row.items()
    }
    plot = error_cdf(errors, run_dir / "plots" / "slowdown_error_cdf.png")
    import mlflow

    mlflow.set_tracking_uri(uri)
    # the code that trained: the commit the MLflow run recorded when it began (a long run may
    # export after later commits)
    began = mlflow.get_run(run_id).data.params.get("git_commit") or git_commit()
    meta = {
        "dataset_version": version,
        "git_commit": began,
        "epochs": state["epoch"] + 1,
        "train_periods": len(splits["train"]),
        "val_periods": len(splits["val"]),
        "test_periods": len(splits["test"]),
        "test_flows": len(errors["m4"]),
        "train_wall_s": round(train_wall, 1),
        "hardware": f"{cfg.num_workers} x {'GPU' if use_gpu else 'CPU'} worker(s)",
        "metrics": metrics,
        "command": "python -m m4ray.sweeps " + " ".join(sys.argv[1:]),
    }
    transports = dataset_transports(cfg.data.dataset)
    if len(transports) == 1:  # what the m4 backend should describe to it (check_transport)
        meta["transport"] = transports[0]
    if (now := git_commit()) != began:
        meta["exported_at"] = now
    export_dir = Path(cfg.export_dir or run_dir / "export")
    checkpoint.export(model, export_dir, meta, model_card(meta, table, cfg))
    with mlflow.start_run(run_id=run_id):
        mlflow.log_metrics(metrics)
        mlflow.log_artifacts(str(export_dir), artifact_path="checkpoint")
        if plot is not None:
            mlflow.log_artifact(str(plot))
    print()
    print(error_text(table, len(errors["m4"])))
    print(
        f"\ntrained {state['epoch'] + 1} epochs in {train_wall:.1f} s; checkpoint {export_dir}; "
        f"total {time.perf_counter() - started:.1f} s"
    )
    print(f"MLflow UI: .venv/bin/mlflow ui --backend-store-uri {uri}")
    return run_dir


__all__ = ["SECTIONS", "run"]
