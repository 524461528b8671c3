"""``python -m m4ray.sweeps +experiment=train_m3``: train m3 on a ``datagen_m3`` dataset with Ray
Train (DDP: gloo on CPU, NCCL on GPU) and MLflow, evaluate it on held-out lots against flowSim,
and export a checkpoint (``reference/flowsim_m3.md`` B.7).

One sample = one lot: its flowSim tokens, and its ns-3 foreground percentiles per output bucket.
Lots are split by scenario (seeded). Loss: m3's masked relative L1; AdamW (β 0.9/0.95, weight decay
on the transformer's matrices only), no schedule, as m3. The m4 training pieces are reused: the
Train fit and resume (:func:`m4ray.train.job.fit`), the per-epoch MLflow logger and checkpoint
report (:mod:`m4ray.train.loop`), the checkpoint directory format (:mod:`m4ray.models.checkpoint`).
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.dataset as pads
import torch

from m4ray.errors import InputError
from m4ray.models.checkpoint import Kind
from m4ray.models.m3 import M3Model, M3ModelConfig, loss_fn
from m4ray.models.m3_features import N_BUCKETS_IN, N_BUCKETS_OUT, N_PCT, TOKEN_DIM

M3 = Kind(format="m4ray-m3-v1", module="m4ray.models.m3", model="M3Model", config="M3ModelConfig")
PCTS = (50, 90, 99)


@dataclass(kw_only=True, slots=True)
class M3TrainConfig:
    """The m3 training job (plain data: it crosses the Ray boundary)."""

    dataset: str = "outputs/datagen_m3/dataset"
    val_fraction: float = 0.1
    test_fraction: float = 0.1
    model: M3ModelConfig = field(default_factory=M3ModelConfig)
    epochs: int = 60
    batch_size: int = 20
    lr: float = 1e-4
    weight_decay: float = 0.02
    num_workers: int = 2
    use_gpu: bool | None = None
    cpus_per_worker: float = 1.0
    threads_per_worker: int = 1
    seed: int = 0
    tracking_uri: str | None = None
    experiment: str = "m3"
    export_dir: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.model, dict):
            self.model = M3ModelConfig(**self.model)
        for name in ("epochs", "batch_size", "num_workers", "threads_per_worker"):
            if getattr(self, name) < 1:
                raise InputError(f"must be >= 1, got {getattr(self, name)}", field=f"train.{name}")
        if self.lr <= 0:
            raise InputError("must be > 0", field="train.lr")
        if not 0 <= self.val_fraction + self.test_fraction < 1:
            raise InputError("val + test fractions must be in [0, 1)", field="train.val_fraction")

    def loop(self):
        """The Ray Train per-worker function for this config."""
        return train_loop

    def dataset_dir(self) -> str:
        return self.dataset

    def resolved(self) -> M3TrainConfig:
        """The config with an absolute dataset path (workers run in other directories)."""
        return dataclasses.replace(self, dataset=str(Path(self.dataset).resolve()))


@dataclass(kw_only=True, slots=True)
class Lots:
    """Samples as arrays: tokens ``(N, Lmax+1, TOKEN_DIM)`` (right-padded), empty flags, lengths
    (links), targets ``(N, 4, 100)``, masks ``(N, 4)`` and flowSim's foreground percentiles."""

    scenario_id: np.ndarray
    tokens: np.ndarray
    empty: np.ndarray
    n_links: np.ndarray
    target: np.ndarray
    mask: np.ndarray
    flowsim: np.ndarray

    def take(self, index) -> Lots:
        return Lots(**{f.name: getattr(self, f.name)[index] for f in dataclasses.fields(self)})

    def __len__(self) -> int:
        return len(self.n_links)

    def tensors(self, device="cpu") -> tuple[torch.Tensor, ...]:
        """Model inputs ``(fg, fg_empty, links, links_empty, lengths, baseline)``."""
        tok = torch.from_numpy(self.tokens).to(device)
        empty = torch.from_numpy(self.empty).to(device)
        n = int(self.n_links.max())
        lengths = torch.from_numpy(self.n_links).to(device)
        baseline = torch.from_numpy(self.flowsim).to(device)
        return tok[:, 0], empty[:, 0], tok[:, 1 : n + 1], empty[:, 1 : n + 1], lengths, baseline


def load_lots(dataset: str | Path) -> Lots:
    """Every ``lot_samples`` row of a datagen_m3 dataset, ordered by scenario id."""
    path = Path(dataset) / "lot_samples"
    if not path.exists():
        raise InputError(
            "no lot_samples table: make one with `python -m m4ray.sweeps +experiment=datagen_m3`",
            file=dataset,
        )
    table = pads.dataset(path, partitioning="hive").to_table().to_pandas()
    table = table.sort_values("scenario_id", kind="stable").reset_index(drop=True)
    n = len(table)
    lmax = int(table.n_links.max())
    tokens = np.zeros((n, lmax + 1, TOKEN_DIM), dtype=np.float32)
    empty = np.ones((n, lmax + 1, N_BUCKETS_IN), dtype=bool)
    for i, row in enumerate(table.itertuples()):
        t = row.n_links + 1
        tokens[i, :t] = np.asarray(row.tokens, dtype=np.float32).reshape(t, TOKEN_DIM)
        empty[i, :t] = np.asarray(row.empty, dtype=bool).reshape(t, N_BUCKETS_IN)
    shape = (n, N_BUCKETS_OUT, N_PCT)
    return Lots(
        scenario_id=table.scenario_id.to_numpy(),
        tokens=tokens,
        empty=empty,
        n_links=table.n_links.to_numpy().astype(np.int64),
        target=np.stack(table.target.map(np.asarray)).astype(np.float32).reshape(shape),
        mask=np.stack(table["mask"].map(np.asarray)).astype(bool),
        flowsim=np.stack(table.flowsim_target.map(np.asarray)).astype(np.float32).reshape(shape),
    )


def split(lots: Lots, cfg: M3TrainConfig) -> dict[str, Lots]:
    """Train/val/test by scenario, shuffled by ``cfg.seed``."""
    order = np.random.default_rng(cfg.seed).permutation(len(lots))
    n_val, n_test = round(cfg.val_fraction * len(lots)), round(cfg.test_fraction * len(lots))
    return {
        "val": lots.take(order[:n_val]),
        "test": lots.take(order[n_val : n_val + n_test]),
        "train": lots.take(order[n_val + n_test :]),
    }


def optimizer(model: torch.nn.Module, cfg: M3TrainConfig) -> torch.optim.Optimizer:
    """AdamW with weight decay on the transformer's matrices only (m3)."""
    decay, plain = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 and not name.startswith("head") else plain).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": plain}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)


def predict(model: M3Model, lots: Lots, batch: int = 256) -> np.ndarray:
    """``(N, 4, 100)`` predicted percentiles."""
    out = []
    with torch.no_grad():
        for k in range(0, len(lots), batch):
            part = lots.take(slice(k, k + batch))
            out.append(model(*part.tensors()).numpy())
    return np.concatenate(out) if out else np.zeros((0, N_BUCKETS_OUT, N_PCT))


def percentile_errors(pred: np.ndarray, lots: Lots) -> dict[str, dict[str, float]]:
    """Mean |estimate / ns-3 − 1| of the p50/p90/p99 over every (lot, bucket) with flows, for the
    model and for flowSim."""
    table = {}
    for who, est in (("m3", pred), ("flowsim", lots.flowsim)):
        row = {}
        for p in PCTS:
            err = np.abs(est[..., p - 1] / lots.target[..., p - 1] - 1)[lots.mask]
            row[f"p{p}"] = float(err.mean()) if err.size else float("nan")
        table[who] = row
    return table


def train_loop(config: dict[str, Any]) -> None:
    """``train_loop_per_worker`` of the TorchTrainer."""
    import ray.train
    import ray.train.torch

    from m4ray.train.loop import mlflow_logger, report, shard

    cfg: M3TrainConfig = config["cfg"]
    torch.set_num_threads(cfg.threads_per_worker)
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()
    torch.manual_seed(cfg.seed)
    splits = split(load_lots(cfg.dataset), cfg)
    model = M3Model(cfg.model)
    ddp = ray.train.torch.prepare_model(model)
    opt = optimizer(model, cfg)
    start = 0
    ckpt = ray.train.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"), map_location=device, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = state["epoch"] + 1
    logger = mlflow_logger(config) if rank == 0 else None
    train = splits["train"]
    for epoch in range(start, cfg.epochs):
        ddp.train()
        began = time.perf_counter()
        order = np.random.default_rng([cfg.seed, epoch]).permutation(len(train))
        chunks = [order[k : k + cfg.batch_size] for k in range(0, len(order), cfg.batch_size)]
        total, count = 0.0, 0
        for index in shard(chunks, rank, world):
            part = train.take(index)
            target = torch.from_numpy(part.target).to(device)
            mask = torch.from_numpy(part.mask).to(device)
            loss = loss_fn(ddp(*part.tensors(device)), target, mask)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total, count = total + float(loss) * len(index), count + len(index)
        ddp.eval()
        sums = torch.tensor([total, count], dtype=torch.float64)
        if world > 1:
            torch.distributed.all_reduce(sums)
        val = splits["val"]
        with torch.no_grad():
            val_loss = (
                float(
                    loss_fn(
                        model(*val.tensors(device)),
                        torch.from_numpy(val.target).to(device),
                        torch.from_numpy(val.mask).to(device),
                    )
                )
                if len(val)
                else float("nan")
            )
        metrics = {
            "epoch": epoch,
            "train_loss": float(sums[0] / max(float(sums[1]), 1)),
            "val_loss": val_loss,
            "epoch_s": time.perf_counter() - began,
        }
        report(metrics, {"model": model, "optimizer": opt}, epoch=epoch, rank=rank, logger=logger)


def error_text(table: dict[str, dict[str, float]], n_lots: int) -> str:
    lines = [f"foreground percentile error |est/ns-3 - 1| on {n_lots} held-out lots (per bucket)"]
    lines.append(f"{'model':<9}" + "".join(f"{k:>9}" for k in table["m3"]))
    for who, row in table.items():
        lines.append(f"{who:<9}" + "".join(f"{v:>9.3f}" for v in row.values()))
    return "\n".join(lines)


def model_card(meta: dict[str, Any], table: dict, cfg: M3TrainConfig) -> str:
    m = cfg.model
    rows = "\n".join(
        f"| {who} | " + " | ".join(f"{v:.3f}" for v in row.values()) + " |"
        for who, row in table.items()
    )
    lots = meta["lots"]
    return f"""# m3 checkpoint

m3 (SIGCOMM'24): a causal transformer (dim {m.dim}, {m.layers} layers, {m.heads} heads, SwiGLU
{m.ffn}) over a path's link tokens and an MLP ({m.mlp}) that corrects path flowSim's foreground
slowdown percentiles (4 size buckets × 100); trained by m4ray (`m4ray/m3/`). Load with
`m4ray.models.checkpoint.load(<dir>, kind=m4ray.m3.train.M3)`.

- dataset version: `{meta["dataset_version"]}` (datagen_m3 parking lots), train/val/test lots:
  {lots["train"]}/{lots["val"]}/{lots["test"]} (split by lot)
- congestion control it was trained on: {", ".join(meta["supported_cc"])} (ns-3 RDMA-style
  DCTCP); other CCs are refused at estimation time
- training: {meta["epochs"]} epochs, batch {cfg.batch_size}, AdamW lr {cfg.lr}, weight decay
  {cfg.weight_decay}; {meta["hardware"]}; {meta["train_wall_s"]} s wall
- command: `{meta["command"]}`; code: git `{meta["git_commit"]}`

## Held-out lots: foreground percentile error |est/ns-3 − 1| (mean over lot × size bucket)

| model | {" | ".join(table["m3"])} |
|---|{"---|" * len(table["m3"])}
{rows}
"""
