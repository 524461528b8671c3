"""The train_m3 experiment: m3 on a datagen_m3 dataset with Ray Train, tracked in MLflow,
exported with its card (``m4ray.train.job``: the training run all model kinds share)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from m4ray.errors import InputError
from m4ray.fingerprint import fingerprint
from m4ray.m3.lot import PATH_MODES
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
    # fails here, not in a worker, on a bad dataset (or draws that cannot be recovered); kept
    # for the held-out table after training
    lots = load_lots(cfg.dataset, weights=cfg.weighs_as_estimate())
    n_lots = len(lots)
    if cfg.init_checkpoint:
        initial_weights(cfg)  # so does a checkpoint of another model
    what = f"train_m3: {n_lots} lots, dataset {version}"
    # the workers load it each: not held here meanwhile (90,000 paths are ~3.5 GB a copy)
    if not cfg.soup:
        trained = train(
            sweep, raw_config, cfg, train_loop, M3Model, version=version, run_dir=run_dir, what=what
        )
        members = [cfg]
    else:
        trained, members = soup(sweep, raw_config, cfg, version=version, run_dir=run_dir, what=what)
    held = held_out(lots, members)
    table = percentile_errors(predict(trained.model, held), held)
    # a soup whose members saw every network has no held-out numbers (NaN is no metric)
    metrics = {f"test_{w}_{k}": v for w, row in table.items() for k, v in row.items()}
    metrics = metrics if len(held) else {}
    meta = trained.meta(
        version,
        cfg,
        metrics,
        lots={k: len(v) for k, v in split(lots, members[0]).items()} | {"held_out": len(held)},
        supported_cc=dataset_ccs(cfg.dataset),
        **path_modes_meta(cfg.dataset),
        **({"soup": list(cfg.soup)} if cfg.soup else {}),
    )
    export_dir = Path(cfg.export_dir or run_dir / "export")
    publish(trained, export_dir, meta, model_card(meta, table, cfg), kind=M3)
    print()
    print(error_text(table, len(held)))
    print(f"\ntrained {meta['epochs']} epochs in {trained.wall_s:.1f} s; checkpoint {export_dir}")
    return run_dir


def soup(sweep, raw_config: dict, cfg: M3TrainConfig, *, version: str, run_dir: Path, what: str):
    """``train.soup``: one member per seed (its own split and order, trained in
    ``run_dir/member-<seed>``, so a re-run resumes each), and the model whose weights are their
    mean (a model soup: the members start from one checkpoint, ``init_checkpoint``). Returns the
    soup as a :class:`~m4ray.train.job.Trained` under its own MLflow run, and the members'
    configurations."""
    from m4ray.train.job import mlflow_run, tracking_uri

    members, runs = [], []
    for seed in cfg.soup:
        member = dataclasses.replace(cfg, seed=seed, soup=[], export_dir=None)
        raw = {**raw_config, "train": {**raw_config.get("train", {}), "seed": seed, "soup": []}}
        runs.append(
            train(sweep, raw, member, train_loop, M3Model, version=version,
                  run_dir=run_dir / f"member-{seed}", what=f"{what}; soup member seed {seed}")
        )  # fmt: skip
        members.append(member)
    model = M3Model(cfg.model)
    model.load_state_dict(mean_state([r.model.state_dict() for r in runs]))
    uri = tracking_uri(cfg, run_dir)
    name = f"{sweep.name}-soup-{fingerprint([raw_config.get('train'), version], 8)}"
    run_id = mlflow_run(uri, cfg.experiment, name, raw_config, version)
    trained = dataclasses.replace(
        runs[0], model=model.eval(), run_id=run_id, uri=uri, wall_s=sum(r.wall_s for r in runs)
    )
    return trained, members


def mean_state(states: list[dict]) -> dict:
    """The element-wise mean of models' weights (same architecture); integer buffers are the
    first model's."""
    import torch

    return {
        k: torch.stack([st[k] for st in states]).mean(0) if v.is_floating_point() else v
        for k, v in states[0].items()
    }


def held_out(lots, members: list[M3TrainConfig]):
    """The samples no member trained on (one model: its test split)."""
    if len(members) == 1:
        return split(lots, members[0])["test"]
    trained = np.zeros(len(lots), dtype=bool)
    for member in members:
        ids = set(split(lots, member)["train"].scenario_id.tolist())
        trained |= np.isin(lots.scenario_id, list(ids))
    return lots.take(np.flatnonzero(~trained))


# path flowSim's modes a dataset's lots ran (their ``params``), as a checkpoint records them
# (``model.json``) for the estimate to run path flowSim so (:class:`~m4ray.m3.lot.PathQueues`):
# (model.json key, params key, what, field, the same only within each CC)
_MODES = (
    ("path_flowsim_queues", "path_queues", "path flowSim's standing queues", "queues", False),
    (
        PATH_MODES["first_windows"],
        "path_first_windows",
        "path flowSim's first windows",
        "first_windows",
        True,
    ),
    (PATH_MODES["bursts"], "path_bursts", "path flowSim's first-window bursts", "bursts", False),
    (
        PATH_MODES["route_rtt"],
        "path_route_rtt",
        "path flowSim's route round trips",
        "route_rtt",
        False,
    ),
    (PATH_MODES["rates"], "path_rates", "path flowSim's DCQCN rates", "rates", True),
)


def path_flowsim_modes(dataset: str, only: str | None = None) -> dict[str, bool]:
    """Whether the dataset's lots ran each of path flowSim's modes (``model.json`` key: set),
    read once; lots that differ in one are an error naming it (first windows: only lots under
    one CC must agree, as only HPCC's queue through them). ``only``: that mode alone."""
    table = pd.read_parquet(Path(dataset) / "scenarios.parquet", columns=["params", "status"])
    params = [json.loads(p) for p, ok in zip(table.params, table.status, strict=True) if ok == "ok"]
    return {
        meta: _flag(params, dataset, tuple(spec))
        for meta, *spec in _MODES
        if only is None or meta == only
    }


def path_modes_meta(dataset: str) -> dict[str, bool]:
    """The dataset's path flowSim modes as ``model.json`` records them: queues and first
    windows always, later modes only where set (earlier checkpoints' files stay as they were)."""
    modes = path_flowsim_modes(dataset)
    always = ("path_flowsim_queues", PATH_MODES["first_windows"])
    return {key: on for key, on in modes.items() if on or key in always}


def path_queues(dataset: str) -> bool:
    """Whether the dataset's lots ran path flowSim with standing queues (their ``params``'
    ``path_queues``): the estimate must then run it so too. A mix is an error."""
    return path_flowsim_modes(dataset, "path_flowsim_queues")["path_flowsim_queues"]


def path_first_windows(dataset: str) -> bool:
    """Whether the dataset's lots under a CC that queues only its first windows (HPCC) ran path
    flowSim with those (their ``params``' ``path_first_windows``,
    :class:`~m4ray.m3.lot.PathQueues`); a CC whose lots differ is an error."""
    key = PATH_MODES["first_windows"]
    return path_flowsim_modes(dataset, key)[key]


def _flag(params: list[dict], dataset: str, spec: tuple[str, str, str, bool]) -> bool:
    """``params[key]`` of the dataset's ok scenarios, the same within the dataset (``by_cc``:
    within each congestion control): whether it is set; lots that differ are an error naming
    ``what`` (and the CCs); ``spec``: (key, what, field, by_cc), as :data:`_MODES` has them."""
    key, what, field, by_cc = spec
    flags: dict[str, set[bool]] = {}
    for values in params:
        group = values.get("cc", "dctcp") if by_cc else ""
        flags.setdefault(group, set()).add(bool(values.get(key, False)))
    mixed = sorted(group for group, seen in flags.items() if len(seen) > 1)
    if mixed:
        which = f"{', '.join(mixed)} " if by_cc else ""
        raise InputError(
            f"{which}lots with and without {what} in one dataset", file=dataset, field=field
        )
    return any(True in seen for seen in flags.values())


__all__ = [
    "SECTIONS",
    "held_out",
    "mean_state",
    "path_first_windows",
    "path_flowsim_modes",
    "path_modes_meta",
    "path_queues",
    "run",
    "soup",
]
