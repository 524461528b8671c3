"""The training loop every model kind runs in its Ray Train workers, m4's part of it, and the
evaluation metrics.

:func:`train_loop` is generic over the model kind: a config (:class:`RunSettings`) builds its
:class:`Task` — the data, the model, its optimizer, a training step and the validation sums —
and the loop does the rest the same for m4 and m3: each worker loads the same splits, takes an
equal shard of the (epoch-shuffled) training batches and steps DDP (gloo on CPU, NCCL on GPU);
the sums are all-reduced; rank 0 writes the checkpoint (the task's parts and the epoch) and logs
the epoch's metrics to the MLflow run the driver created; every rank calls
``ray.train.report``. A restarted run resumes from the latest checkpoint.
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
from typing import Any, Protocol

import numpy as np
import torch

from m4ray.errors import InputError
from m4ray.fingerprint import added_field
from m4ray.models.m4 import M4Model, ModelConfig
from m4ray.train.data import DataConfig, Sample, load_splits
from m4ray.train.periods import ERRORS, PeriodLoss, period_losses


class Task(Protocol):
    """What a model kind brings to :func:`train_loop` (built per worker by its config's
    ``task(device)``): ``model`` (what is saved and exported), ``module`` (what DDP wraps, with
    ``ddp_kwargs``), how many sums a training step adds up (``n_sums``), and the methods."""

    model: torch.nn.Module
    module: torch.nn.Module
    ddp_kwargs: dict[str, Any] | None
    n_sums: int

    def optimizer(self, ddp: torch.nn.Module) -> torch.optim.Optimizer:
        """The optimizer, over the wrapped module's parameters."""

    def scheduler(self, optimizer: torch.optim.Optimizer) -> Any | None:
        """A learning-rate schedule stepped on each epoch's ``val_loss``, or None."""

    def batches(self, epoch: int) -> list:
        """The epoch's training batches, shuffled by (seed, epoch); the loop shards them."""

    def step(self, ddp: torch.nn.Module, batch) -> tuple[torch.Tensor, list[float]]:
        """A batch's loss (to back-propagate) and the sums its epoch metrics add up."""

    def validate(self, rank: int, world: int) -> list[float]:
        """This rank's validation sums (all-reduced by the loop)."""

    def metrics(self, epoch: int, train: list[float], val: list[float], epoch_s: float) -> dict:
        """The epoch's metrics from the all-reduced sums (``val_loss`` among them)."""


@dataclass(kw_only=True, slots=True)
class RunSettings:
    """The settings every training job has (plain data: they cross the Ray boundary). A kind's
    config adds its data and model and builds its :class:`Task`."""

    epochs: int = 15
    batch_size: int = 2
    lr: float = 1e-4
    num_workers: int = 2
    use_gpu: bool | None = None  # None: use GPUs when the cluster has them
    cpus_per_worker: float = 1.0
    threads_per_worker: int = 1
    seed: int = 0
    tracking_uri: str | None = None  # None: sqlite store in the run directory
    experiment: str = "m4"
    export_dir: str | None = None  # None: <run_dir>/export

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "num_workers", "threads_per_worker"):
            if getattr(self, name) < 1:
                raise InputError(f"must be >= 1, got {getattr(self, name)}", field=f"train.{name}")
        if self.lr <= 0:
            raise InputError("must be > 0", field="train.lr")

    def task(self, device) -> Task:
        raise NotImplementedError

    def dataset_dir(self) -> str:
        raise NotImplementedError

    def resolved(self) -> RunSettings:
        """The config with an absolute dataset path (workers run in other directories)."""
        raise NotImplementedError


# loss -> (forward's key, the validation metric it is scored by)
LOSSES = {
    "flow": ("main_flows", "val_flow_l1"),
    "period": ("main", "val_period_l1"),
    "every": ("every_flows", "val_every_l1"),
}


@dataclass(kw_only=True, slots=True)
class TrainConfig(RunSettings):
    """m4's training job."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    # "flow": relative L1 over every flow; "period": per period, then mean (m4); "every": over
    # every flow of the slowdown read at each of its updates (what the online engine uses)
    loss: str = "flow"
    # how a flow's error is measured in the loss (m4ray.train.periods.ERRORS): "relative"
    # |ŝ/s − 1| as m4 trains, or "log" |log(ŝ/s)|; validation reads relative L1 either way
    error: str = added_field("relative", "the loss's error measure (2026-11-30)")
    weight_remain: float = 0.005
    weight_queue: float = 0.005
    # L1 on the fluid model's correction at every update (shrinks it toward its anchor where the
    # data do not support moving it; 0 = off)
    correction_l1: float = 0.0
    plateau_factor: float = 0.2
    plateau_patience: int = 5
    min_lr: float = 1e-6
    # held-out collective scenarios the trained model also replays in closed loop against the
    # ns-3 runs the dataset recorded (m4ray.datagen.closed_loop; 0: none), beside flowSim
    closed_loop_scenarios: int = added_field(8, "closed-loop evaluation (2026-11-29)")

    def __post_init__(self) -> None:
        if isinstance(self.data, dict):
            self.data = DataConfig(**self.data)
        if isinstance(self.model, dict):
            self.model = ModelConfig(**self.model)
        RunSettings.__post_init__(self)
        if self.closed_loop_scenarios < 0:
            raise InputError(
                f"must be >= 0, got {self.closed_loop_scenarios}",
                field="train.closed_loop_scenarios",
            )
        if self.correction_l1 < 0 or (self.correction_l1 > 0 and not self.model.fluid):
            raise InputError(
                "must be >= 0, and > 0 only for a fluid model", field="train.correction_l1"
            )
        if self.error not in ERRORS:
            raise InputError(
                f"unknown error {self.error!r} ({', '.join(ERRORS)})", field="train.error"
            )
        if self.loss not in LOSSES:
            raise InputError(
                f"unknown loss {self.loss!r} ({', '.join(LOSSES)})", field="train.loss"
            )

    @property
    def reads_every(self) -> bool:
        """Whether the loss needs the every-update read-out (it costs: only then)."""
        return self.loss == "every" or self.correction_l1 > 0

    def task(self, device) -> M4Task:
        return M4Task(self, device)

    def dataset_dir(self) -> str:
        return self.data.dataset

    def resolved(self) -> TrainConfig:
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


def fluid_anchor(model: M4Model) -> M4Model:
    """A fluid-anchored model's anchor alone: a copy with its correction zeroed (the head's
    last layer), so it answers flowSim re-projected at each update."""
    anchor = copy.deepcopy(model)
    with torch.no_grad():
        anchor.head[-1].weight.zero_()
        anchor.head[-1].bias.zero_()
    return anchor


def flow_errors(
    model: M4Model, samples: list[Sample], device="cpu", batch_size: int = 8
) -> dict[str, np.ndarray]:
    """Per-flow slowdown error ``|ŝ/s − 1|`` of the model (ŝ clamped at 1) and of flowSim;
    for a fluid-anchored model also of its anchor alone (``anchor``: the model with its
    correction zeroed, i.e. flowSim re-projected at the recorded events)."""
    models = {"m4": model}
    if model.cfg.fluid:
        models["anchor"] = fluid_anchor(model)
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


class M4Task:
    """m4's :class:`Task`: busy periods replayed in lockstep through :class:`PeriodLoss`, Adam
    with a plateau schedule, validation sharded over the ranks."""

    def __init__(self, cfg: TrainConfig, device) -> None:
        self.cfg, self.device = cfg, device
        self.splits = load_splits(cfg.data, cfg.model.anchor)
        self.model = M4Model(cfg.model)
        self.module = PeriodLoss(self.model)
        self.ddp_kwargs = {"find_unused_parameters": True}
        self.n_sums = 4  # main, remain and queue loss × periods, periods

    def optimizer(self, ddp: torch.nn.Module) -> torch.optim.Optimizer:
        return torch.optim.Adam(ddp.parameters(), lr=self.cfg.lr)

    def scheduler(self, optimizer: torch.optim.Optimizer):
        cfg = self.cfg
        return torch.optim.lr_scheduler.ReduceLROnPlateau(
            optimizer,
            mode="min",
            factor=cfg.plateau_factor,
            patience=cfg.plateau_patience,
            min_lr=cfg.min_lr,
        )

    def batches(self, epoch: int) -> list:
        rng = np.random.default_rng([self.cfg.seed, epoch])
        return batches(self.splits["train"], self.cfg.batch_size, rng)

    def step(self, ddp: torch.nn.Module, chunk: list[Sample]) -> tuple[torch.Tensor, list[float]]:
        batch = [s.period.to(self.device) for s in chunk]
        out = ddp(batch, every=self.cfg.reads_every, error=self.cfg.error)
        n = len(batch)
        main = out[LOSSES[self.cfg.loss][0]]
        sums = [float(main) * n, float(out["remain"]) * n, float(out["queue"]) * n, n]
        return training_loss(out, self.cfg), sums

    def validate(self, rank: int, world: int) -> list[float]:
        mine = shard(self.splits["val"], rank, world)
        return evaluate(self.model, mine, self.device, self.cfg.batch_size)

    def metrics(self, epoch: int, train: list[float], val: list[float], epoch_s: float) -> dict:
        return epoch_metrics(self.cfg, epoch, train, val, epoch_s)


def train_loop(config: dict[str, Any]) -> None:
    """``train_loop_per_worker`` of the TorchTrainer, for a config of any kind
    (``config["cfg"]``, a :class:`RunSettings`)."""
    import ray.train
    import ray.train.torch

    cfg: RunSettings = config["cfg"]
    torch.set_num_threads(cfg.threads_per_worker)
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()
    torch.manual_seed(cfg.seed)
    task = cfg.task(device)
    ddp = ray.train.torch.prepare_model(task.module, parallel_strategy_kwargs=task.ddp_kwargs)
    optimizer = task.optimizer(ddp)
    scheduler = task.scheduler(optimizer)
    parts = {"model": task.model, "optimizer": optimizer}
    if scheduler is not None:
        parts["scheduler"] = scheduler
    start_epoch = resume(parts, device)
    logger = mlflow_logger(config) if rank == 0 else None
    for epoch in range(start_epoch, cfg.epochs):
        ddp.train()
        epoch_start = time.perf_counter()
        sums = [0.0] * task.n_sums
        for batch in shard(task.batches(epoch), rank, world):
            loss, more = task.step(ddp, batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            sums = [a + b for a, b in zip(sums, more, strict=True)]
        ddp.eval()
        epoch_s = time.perf_counter() - epoch_start
        train_sums = _all_reduce(sums, world)
        val_sums = _all_reduce(task.validate(rank, world), world)
        metrics = task.metrics(epoch, train_sums, val_sums, epoch_s)
        if scheduler is not None:
            scheduler.step(metrics["val_loss"])
            metrics["lr"] = optimizer.param_groups[0]["lr"]
        report(metrics, parts, epoch=epoch, rank=rank, logger=logger)


def resume(parts: dict[str, Any], device) -> int:
    """Load ``parts`` from Ray Train's latest checkpoint, if any; the epoch to start at."""
    import ray.train

    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        return 0
    with checkpoint.as_directory() as d:
        state = torch.load(os.path.join(d, "state.pt"), map_location=device, weights_only=False)
    for name, part in parts.items():
        part.load_state_dict(state[name])
    return state["epoch"] + 1


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
    "M4Task",
    "RunSettings",
    "Task",
    "TrainConfig",
    "batches",
    "evaluate",
    "flow_errors",
    "mlflow_logger",
    "report",
    "resume",
    "shard",
    "train_loop",
    "training_loss",
]
