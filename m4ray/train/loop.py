"""The training loop that runs in every Ray Train worker, and the evaluation metrics.

Each worker loads the same splits, takes an equal shard of the (epoch-shuffled) training periods,
and steps DDP (gloo on CPU, NCCL on GPU) on batches of ``batch_size`` periods; validation is
sharded too and the sums are all-reduced. Rank 0 writes the checkpoint (model, optimizer,
scheduler, epoch) and logs the epoch's metrics to the MLflow run the driver created; every rank
calls ``ray.train.report``. A restarted run resumes from the latest checkpoint.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from m4ray.errors import InputError
from m4ray.models.m4 import M4Model, ModelConfig
from m4ray.train.data import DataConfig, Sample, load_splits
from m4ray.train.periods import PeriodLoss, period_losses

# loss -> (forward's key, the validation metric it is scored by)
LOSSES = {
    "flow": ("main_flows", "val_flow_l1"),
    "period": ("main", "val_period_l1"),
    "every": ("every_flows", "val_every_l1"),
}


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    """Everything the training job needs (plain data: it crosses the Ray boundary)."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    epochs: int = 15
    batch_size: int = 2
    lr: float = 1e-4
    # "flow": relative L1 over every flow; "period": per period, then mean (m4); "every": over
    # every flow of the slowdown read at each of its updates (what the online engine uses)
    loss: str = "flow"
    weight_remain: float = 0.005
    weight_queue: float = 0.005
    # L1 on the fluid model's correction at every update (shrinks it toward its anchor where the
    # data do not support moving it; 0 = off)
    correction_l1: float = 0.0
    plateau_factor: float = 0.2
    plateau_patience: int = 5
    min_lr: float = 1e-6
    num_workers: int = 2
    use_gpu: bool | None = None  # None: use GPUs when the cluster has them
    cpus_per_worker: float = 1.0
    threads_per_worker: int = 1
    seed: int = 0
    tracking_uri: str | None = None  # None: sqlite store in the run directory
    experiment: str = "m4"
    export_dir: str | None = None  # None: <run_dir>/export

    def __post_init__(self) -> None:
        if isinstance(self.data, dict):
            self.data = DataConfig(**self.data)
        if isinstance(self.model, dict):
            self.model = ModelConfig(**self.model)
        for name in ("epochs", "batch_size", "num_workers", "threads_per_worker"):
            if getattr(self, name) < 1:
                raise InputError(f"must be >= 1, got {getattr(self, name)}", field=f"train.{name}")
        if self.lr <= 0:
            raise InputError("must be > 0", field="train.lr")
        if self.correction_l1 < 0 or (self.correction_l1 > 0 and not self.model.fluid):
            raise InputError(
                "must be >= 0, and > 0 only for a fluid model", field="train.correction_l1"
            )
        if self.loss not in LOSSES:
            raise InputError(
                f"unknown loss {self.loss!r} ({', '.join(LOSSES)})", field="train.loss"
            )

    @property
    def reads_every(self) -> bool:
        """Whether the loss needs the every-update read-out (it costs: only then)."""
        return self.loss == "every" or self.correction_l1 > 0

    def loop(self):
        """The Ray Train per-worker function for this config."""
        return train_loop

    def dataset_dir(self) -> str:
        return self.data.dataset

    def resolved(self) -> TrainConfig:
        """The config with an absolute dataset path (workers run in other directories)."""
        data = dataclasses.replace(self.data, dataset=str(Path(self.data.dataset).resolve()))
        return dataclasses.replace(self, data=data)


def training_loss(out: dict[str, torch.Tensor], cfg: TrainConfig) -> torch.Tensor:
    """The loss a batch's losses (``period_losses(model, ..., every=cfg.reads_every)``) train
    on: the main loss, the auxiliary ones and the L1 on the fluid correction."""
    loss = out[LOSSES[cfg.loss][0]] + cfg.weight_remain * out["remain"]
    loss = loss + cfg.weight_queue * out["queue"]
    if cfg.correction_l1 > 0:
        loss = loss + cfg.correction_l1 * out["every_shift"]
    return loss


def shard(items: list, rank: int, world: int) -> list:
    """Rank ``rank``'s share, the same length on every rank (DDP steps in lockstep)."""
    if not items:
        return []
    per_rank = max(1, len(items) // world)
    padded = items * math.ceil(per_rank * world / len(items))
    return padded[rank * per_rank : (rank + 1) * per_rank]


def _all_reduce(values: list[float], world: int) -> list[float]:
    if world == 1:
        return values
    tensor = torch.tensor(values, dtype=torch.float64)
    torch.distributed.all_reduce(tensor)
    return tensor.tolist()


def batches(samples: list[Sample], size: int, rng: np.random.Generator | None = None) -> list:
    """Batches of periods of similar length (the lockstep replay runs as long as the longest):
    sorted by event count (with ±10 % noise when ``rng`` is given, so batches vary between
    epochs), cut into ``size``-period batches, in random order when ``rng`` is given."""
    length = np.array([len(s.period.dt_us) for s in samples], dtype=float)
    if rng is not None:
        length *= np.exp(rng.uniform(-0.1, 0.1, len(samples)))
    order = np.argsort(length, kind="stable")
    chunks = [[samples[i] for i in order[k : k + size]] for k in range(0, len(order), size)]
    if rng is not None:
        chunks = [chunks[i] for i in rng.permutation(len(chunks))]
    return chunks


def evaluate(model: M4Model, samples: list[Sample], device, batch_size: int = 8) -> list[float]:
    """Sums for validation: main/remain/queue loss per period, the period count, the per-flow
    relative L1 sum, the flow count and the every-update relative L1 sum."""
    sums = [0.0] * 7
    with torch.no_grad():
        for batch in batches(samples, batch_size):
            out = period_losses(model, [s.period.to(device) for s in batch], every=True)
            n_flows = sum(s.n_flows for s in batch)
            sums[0] += float(out["main_each"].sum())
            sums[1] += float(out["remain_each"].sum())
            sums[2] += float(out["queue_each"].sum())
            sums[3] += len(batch)
            sums[4] += float(out["main_flows"]) * n_flows
            sums[5] += n_flows
            sums[6] += float(out["every_flows"]) * n_flows
    return sums


def flow_errors(
    model: M4Model, samples: list[Sample], device="cpu", batch_size: int = 8
) -> dict[str, np.ndarray]:
    """Per-flow slowdown error ``|ŝ/s − 1|`` of the model (ŝ clamped at 1) and of flowSim;
    for a fluid-anchored model also of its anchor alone (``anchor``: the model with its
    correction zeroed, i.e. flowSim re-projected at the recorded events)."""
    models = {"m4": model}
    if model.cfg.fluid:
        anchor = copy.deepcopy(model)
        with torch.no_grad():
            anchor.head[-1].weight.zero_()
            anchor.head[-1].bias.zero_()
        models["anchor"] = anchor
    errors: dict[str, list] = {name: [] for name in [*models, "flowsim"]}
    with torch.no_grad():
        for batch in batches(samples, batch_size):
            true = torch.cat([s.period.slowdown for s in batch])
            for name, m in models.items():
                periods = [s.period.to(device) for s in batch]
                pred = period_losses(m, periods)["pred"].cpu().clamp(min=1.0)
                errors[name].append((pred / true - 1).abs().numpy())
            flowsim = torch.cat([s.flowsim_slowdown for s in batch])
            errors["flowsim"].append((flowsim / true - 1).abs().numpy())
    return {name: np.concatenate(e) if e else np.zeros(0) for name, e in errors.items()}


def train_loop(config: dict[str, Any]) -> None:
    """``train_loop_per_worker`` of the TorchTrainer."""
    import ray.train
    import ray.train.torch

    cfg: TrainConfig = config["cfg"]
    torch.set_num_threads(cfg.threads_per_worker)
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()
    torch.manual_seed(cfg.seed)
    splits = load_splits(cfg.data)
    model = M4Model(cfg.model)
    ddp = ray.train.torch.prepare_model(
        PeriodLoss(model), parallel_strategy_kwargs={"find_unused_parameters": True}
    )
    optimizer = torch.optim.Adam(ddp.parameters(), lr=cfg.lr)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
        optimizer,
        mode="min",
        factor=cfg.plateau_factor,
        patience=cfg.plateau_patience,
        min_lr=cfg.min_lr,
    )
    start_epoch = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"), map_location=device, weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        start_epoch = state["epoch"] + 1
    logger = mlflow_logger(config) if rank == 0 else None
    val_shard = shard(splits["val"], rank, world)
    for epoch in range(start_epoch, cfg.epochs):
        ddp.train()
        epoch_start = time.perf_counter()
        rng = np.random.default_rng([cfg.seed, epoch])
        mine = shard(batches(splits["train"], cfg.batch_size, rng), rank, world)
        sums = [0.0, 0.0, 0.0, 0.0]
        for chunk in mine:
            batch = [s.period.to(device) for s in chunk]
            out = ddp(batch, every=cfg.reads_every)
            main = out[LOSSES[cfg.loss][0]]
            loss = training_loss(out, cfg)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            n = len(batch)
            sums = [
                sums[0] + float(main) * n,
                sums[1] + float(out["remain"]) * n,
                sums[2] + float(out["queue"]) * n,
                sums[3] + n,
            ]
        ddp.eval()
        epoch_s = time.perf_counter() - epoch_start
        train_sums = _all_reduce(sums, world)
        val_sums = _all_reduce(evaluate(model, val_shard, device, cfg.batch_size), world)
        metrics = epoch_metrics(cfg, epoch, train_sums, val_sums, epoch_s)
        scheduler.step(metrics["val_loss"])
        metrics["lr"] = optimizer.param_groups[0]["lr"]
        state = {"model": model, "optimizer": optimizer, "scheduler": scheduler}
        report(metrics, state, epoch=epoch, rank=rank, logger=logger)


def epoch_metrics(cfg: TrainConfig, epoch, train_sums, val_sums, epoch_s) -> dict[str, float]:
    """An epoch's metrics from the all-reduced sums (:func:`evaluate`'s for validation)."""
    val = {
        "val_period_l1": val_sums[0] / max(val_sums[3], 1),
        "val_flow_l1": val_sums[4] / max(val_sums[5], 1),
        "val_every_l1": val_sums[6] / max(val_sums[5], 1),
    }
    return {
        "epoch": epoch,
        "train_loss": train_sums[0] / max(train_sums[3], 1),
        "train_remain": train_sums[1] / max(train_sums[3], 1),
        "train_queue": train_sums[2] / max(train_sums[3], 1),
        "val_loss": val[LOSSES[cfg.loss][1]],
        **val,
        "val_remain": val_sums[1] / max(val_sums[3], 1),
        "val_queue": val_sums[2] / max(val_sums[3], 1),
        "epoch_s": epoch_s,  # training part of the epoch, rank 0's wall clock
        "periods_per_s": train_sums[3] / epoch_s if epoch_s > 0 else float("nan"),
    }


def report(metrics, parts: dict[str, Any], *, epoch: int, rank: int, logger) -> None:
    """Every rank reports; rank 0 attaches the checkpoint (the ``state_dict`` of each of
    ``parts`` and the epoch, as ``state.pt``) and logs to MLflow."""
    import ray.train

    with tempfile.TemporaryDirectory() as d:
        ckpt = None
        if rank == 0:
            state = {name: part.state_dict() for name, part in parts.items()}
            state["epoch"] = epoch
            torch.save(state, os.path.join(d, "state.pt"))
            ckpt = ray.train.Checkpoint.from_directory(d)
            if logger is not None:
                logger(metrics, epoch)
        ray.train.report(metrics, checkpoint=ckpt)


def mlflow_logger(config: dict[str, Any]):
    """Per-epoch metrics into the driver's MLflow run (rank 0 only), one batch per epoch."""
    run_id = config.get("mlflow_run_id")
    if not run_id:
        return None
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=config["tracking_uri"])

    def log(metrics: dict[str, float], epoch: int) -> None:
        stamp = int(time.time() * 1000)  # MLflow metadata only; outputs never depend on it
        client.log_batch(
            run_id,
            metrics=[Metric(k, float(v), stamp, epoch) for k, v in metrics.items() if k != "epoch"],
        )

    return log


__all__ = [
    "TrainConfig",
    "batches",
    "evaluate",
    "flow_errors",
    "mlflow_logger",
    "report",
    "shard",
    "train_loop",
    "training_loss",
]
