"""The train_m3 experiment: m3 on a datagen_m3 dataset with Ray Train, exported with its card."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from m4ray.fingerprint import fingerprint
from m4ray.m3.train import (
    M3,
    M3TrainConfig,
    error_text,
    load_lots,
    model_card,
    percentile_errors,
    predict,
    split,
    train_loop,
)
from m4ray.models import checkpoint
from m4ray.models.m3 import M3Model

SECTIONS = {"train": M3TrainConfig}  # checked before run


def run(sweep, raw_config: dict[str, Any]) -> Path:
    """The train_m3 experiment (``sweep.train`` is an :class:`M3TrainConfig`)."""
    from m4ray.runtime.provenance import git_commit
    from m4ray.train.data import dataset_version
    from m4ray.train.job import fit, mlflow_run, tracking_uri

    cfg: M3TrainConfig = sweep.train
    run_dir = Path(sweep.paths.run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    version = dataset_version(cfg.dataset)
    cfg = cfg.resolved()
    lots = load_lots(cfg.dataset)  # fails here, not in a worker, on a bad dataset
    uri = tracking_uri(cfg, run_dir)
    name = f"{sweep.name}-{fingerprint([raw_config.get('train'), version], 8)}"
    run_id = mlflow_run(uri, cfg.experiment, name, raw_config, version)
    print(f"train_m3: {len(lots)} lots, dataset {version}; MLflow {uri} run {name}")
    result, use_gpu, wall = fit(
        train_loop,
        {"cfg": cfg, "mlflow_run_id": run_id, "tracking_uri": uri},
        cfg,
        sweep.ray,
        name=name,
        run_dir=run_dir,
    )
    with result.checkpoint.as_directory() as d:
        state = torch.load(Path(d) / "state.pt", map_location="cpu", weights_only=False)
    model = M3Model(cfg.model)
    model.load_state_dict(state["model"])
    model.eval()
    splits = split(lots, cfg)
    table = percentile_errors(predict(model, splits["test"]), splits["test"])
    meta = {
        "dataset_version": version,
        "git_commit": git_commit(),
        "epochs": state["epoch"] + 1,
        "lots": {k: len(v) for k, v in splits.items()},
        "train_wall_s": round(wall, 1),
        "hardware": f"{cfg.num_workers} x {'GPU' if use_gpu else 'CPU'} worker(s)",
        "supported_cc": ["dctcp"],
        "metrics": {f"test_{w}_{k}": v for w, row in table.items() for k, v in row.items()},
        "command": "python -m m4ray.sweeps " + " ".join(sys.argv[1:]),
    }
    export_dir = Path(cfg.export_dir or run_dir / "export")
    checkpoint.export(model, export_dir, meta, model_card(meta, table, cfg), kind=M3)
    import mlflow

    with mlflow.start_run(run_id=run_id):
        mlflow.log_metrics(meta["metrics"])
        mlflow.log_artifacts(str(export_dir), artifact_path="checkpoint")
    print()
    print(error_text(table, len(splits["test"])))
    print(f"\ntrained {meta['epochs']} epochs in {wall:.1f} s; checkpoint {export_dir}")
    return run_dir


__all__ = ["SECTIONS", "run"]
