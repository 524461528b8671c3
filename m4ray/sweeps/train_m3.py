"""The train_m3 experiment: m3 on a datagen_m3 dataset with Ray Train, tracked in MLflow,
exported with its card (``m4ray.train.job``: the training run all model kinds share)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from m4ray.errors import InputError
from m4ray.m3.train import (
    M3,
    M3TrainConfig,
    error_text,
    initial_weights,
    load_lots,
    model_card,
    percentile_errors,
    predict,
    split,
)
from m4ray.models.m3 import M3Model
from m4ray.train.data import dataset_version
from m4ray.train.job import dataset_ccs, publish, train
from m4ray.train.loop import train_loop

SECTIONS = {"train": M3TrainConfig}  # checked before run


def run(sweep, raw_config: dict[str, Any]) -> Path:
    cfg: M3TrainConfig = sweep.train
    run_dir = Path(sweep.paths.run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    version = dataset_version(cfg.dataset)
    cfg = cfg.resolved()
    n_lots = len(load_lots(cfg.dataset))  # fails here, not in a worker, on a bad dataset
    if cfg.init_checkpoint:
        initial_weights(cfg)  # so does a checkpoint of another model
    what = f"train_m3: {n_lots} lots, dataset {version}"
    # the workers load it each: not held here meanwhile (90,000 paths are ~3.5 GB a copy)
    trained = train(
        sweep, raw_config, cfg, train_loop, M3Model, version=version, run_dir=run_dir, what=what
    )
    splits = split(load_lots(cfg.dataset), cfg)
    table = percentile_errors(predict(trained.model, splits["test"]), splits["test"])
    metrics = {f"test_{w}_{k}": v for w, row in table.items() for k, v in row.items()}
    meta = trained.meta(
        version,
        cfg,
        metrics,
        lots={k: len(v) for k, v in splits.items()},
        supported_cc=dataset_ccs(cfg.dataset),
        path_flowsim_queues=path_queues(cfg.dataset),
        path_flowsim_first_windows=path_first_windows(cfg.dataset),
    )
    export_dir = Path(cfg.export_dir or run_dir / "export")
    publish(trained, export_dir, meta, model_card(meta, table, cfg), kind=M3)
    print()
    print(error_text(table, len(splits["test"])))
    print(f"\ntrained {meta['epochs']} epochs in {trained.wall_s:.1f} s; checkpoint {export_dir}")
    return run_dir


def path_queues(dataset: str) -> bool:
    """Whether the dataset's lots ran path flowSim with standing queues (their ``params``'
    ``path_queues``): the estimate must then run it so too. A mix is an error."""
    return _dataset_flag(dataset, "path_queues", "path flowSim's standing queues", "queues")


def path_first_windows(dataset: str) -> bool:
    """Whether the dataset's lots under a CC that queues only its first windows (HPCC) ran path
    flowSim with those (their ``params``' ``path_first_windows``,
    :class:`~m4ray.m3.lot.PathQueues`); a CC whose lots differ is an error."""
    return _dataset_flag(
        dataset, "path_first_windows", "path flowSim's first windows", "first_windows", by_cc=True
    )


def _dataset_flag(dataset: str, key: str, what: str, field: str, *, by_cc: bool = False) -> bool:
    """``params[key]`` of the dataset's ok scenarios, the same within the dataset (``by_cc``:
    within each congestion control): whether it is set; lots that differ are an error naming
    ``what`` (and the CCs)."""
    params = pd.read_parquet(Path(dataset) / "scenarios.parquet", columns=["params", "status"])
    flags: dict[str, set[bool]] = {}
    for p, ok in zip(params.params, params.status, strict=True):
        if ok == "ok":
            values = json.loads(p)
            group = values.get("cc", "dctcp") if by_cc else ""
            flags.setdefault(group, set()).add(bool(values.get(key, False)))
    mixed = sorted(group for group, seen in flags.items() if len(seen) > 1)
    if mixed:
        which = f"{', '.join(mixed)} " if by_cc else ""
        raise InputError(
            f"{which}lots with and without {what} in one dataset", file=dataset, field=field
        )
    return any(True in seen for seen in flags.values())


__all__ = ["SECTIONS", "path_first_windows", "path_queues", "run"]
