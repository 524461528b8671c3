"""``python -m m4ray.sweeps +experiment=train_m3``: train m3 on a ``datagen_m3`` dataset with Ray
Train (DDP: gloo on CPU, NCCL on GPU) and MLflow, evaluate it on held-out lots against flowSim,
and export a checkpoint (``reference/flowsim_m3.md`` B.7).

One sample = one lot: its flowSim tokens, and its ns-3 foreground percentiles per output bucket.
Lots are split by scenario (seeded). Loss: m3's masked relative L1; AdamW (β 0.9/0.95, weight decay
on the transformer's matrices only), no schedule, as m3. m3 trains through the same pieces as m4:
its :class:`M3Task` runs in the generic worker loop (:func:`m4ray.train.loop.train_loop`: shards,
DDP, resume, MLflow, checkpoints), the run and export are :mod:`m4ray.train.job`'s, the checkpoint
directory format :mod:`m4ray.models.checkpoint`'s.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as pads
import torch

from m4ray.errors import InputError
from m4ray.m3.aggregate import bucket_counts
from m4ray.models.checkpoint import M3  # (where m3 cards say to find it)
from m4ray.models.m3 import M3Model, M3ModelConfig, loss_fn, mixture_loss
from m4ray.models.m3_features import N_BUCKETS_IN, N_BUCKETS_OUT, N_PCT, TOKEN_DIM
from m4ray.train.loop import RunSettings

PCTS = (50, 90, 99)
LOSSES = ("paths", "mixture")
MIXTURE_WEIGHTS = ("estimate", "flows")


@dataclass(kw_only=True, slots=True)
class M3TrainConfig(RunSettings):
    """The m3 training job."""

    dataset: str = "outputs/datagen_m3/dataset"
    val_fraction: float = 0.1
    test_fraction: float = 0.1
    model: M3ModelConfig = field(default_factory=M3ModelConfig)
    epochs: int = 60
    batch_size: int = 20
    weight_decay: float = 0.02
    experiment: str = "m3"
    # "paths": m3's relative L1 on every path's percentiles, in batches of batch_size paths;
    # "mixture": one batch per scenario (a network of +experiment=datagen_m3_net), the mixture
    # of its paths' percentiles against the same mixture of their ns-3 ones (m3.mixture_loss),
    # scenarios split whole into train / val / test
    loss: str = "paths"
    # the mixture loss's weight of a path in a bucket: "estimate", as the estimate mixes paths
    # (draws x its foreground flows in the bucket / its foreground flows: aggregate's weights);
    # "flows", its foreground flows in every bucket (m3-v2 to m3-v4)
    mixture_weight: str = "flows"
    init_checkpoint: str | None = None  # start from this m3 checkpoint's weights (same model)
    # a model soup: one member per seed (its own split and order) from init_checkpoint, and the
    # mean of their weights exported (sweeps.train_m3.soup); empty: one model, seed's
    soup: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if isinstance(self.model, dict):
            self.model = M3ModelConfig(**self.model)
        RunSettings.__post_init__(self)
        if not 0 <= self.val_fraction + self.test_fraction < 1:
            raise InputError("val + test fractions must be in [0, 1)", field="train.val_fraction")
        if self.mixture_weight not in MIXTURE_WEIGHTS:
            raise InputError(
                f"unknown mixture weight {self.mixture_weight!r} ({', '.join(MIXTURE_WEIGHTS)})",
                field="train.mixture_weight",
            )
        self.soup = [int(x) for x in self.soup]
        if self.soup and (len(set(self.soup)) != len(self.soup) or not self.init_checkpoint):
            raise InputError(
                "a soup needs distinct seeds and an init_checkpoint its members start from",
                field="train.soup",
            )
        if self.loss not in LOSSES:
            raise InputError(
                f"unknown loss {self.loss!r} ({', '.join(LOSSES)})", field="train.loss"
            )

    def weighs_as_estimate(self) -> bool:
        """Whether the loss weighs paths as the estimate does (it reads :attr:`Lots.weight`)."""
        return self.loss == "mixture" and self.mixture_weight == "estimate"

    def task(self, device) -> M3Task:
        return M3Task(self, device)

    def dataset_dir(self) -> str:
        return self.dataset

    def resolved(self) -> M3TrainConfig:
        """Paths made absolute (the Ray workers run elsewhere)."""
        init = self.init_checkpoint and str(Path(self.init_checkpoint).resolve())
        return dataclasses.replace(
            self, dataset=str(Path(self.dataset).resolve()), init_checkpoint=init
        )


@dataclass(kw_only=True, slots=True)
class Lots:
    """Samples as arrays: tokens ``(N, Lmax+1, TOKEN_DIM)`` (right-padded), empty flags, lengths
    (links), targets ``(N, 4, 100)``, masks ``(N, 4)`` and flowSim's foreground percentiles;
    ``weight`` ``(N, 4)``: each path's weight in each output bucket as the estimate mixes them
    (:func:`m4ray.m3.aggregate.aggregate`: draws x foreground flows there / foreground flows;
    None unless :func:`load_lots` was asked for it)."""

    scenario_id: np.ndarray
    n_foreground: np.ndarray
    weight: np.ndarray | None
    tokens: np.ndarray
    empty: np.ndarray
    n_links: np.ndarray
    target: np.ndarray
    mask: np.ndarray
    flowsim: np.ndarray

    def take(self, index) -> Lots:
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return Lots(**{k: None if v is None else v[index] for k, v in fields.items()})

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


def load_lots(dataset: str | Path, *, weights: bool = False) -> Lots:
    """Every ``lot_samples`` row of a datagen_m3 dataset's scenarios (those its
    ``scenarios.parquet`` lists as ok: a partition of another run left in the folder, as a
    copied or resumed dataset may hold, is not read), ordered by scenario id; ``weights``: with
    each sample's weights as the estimate mixes paths (:func:`bucket_weights`, which reads
    ``lot_flows``), else ``weight`` is None."""
    path = Path(dataset) / "lot_samples"
    if not path.exists():
        raise InputError(
            "no lot_samples table: make one with `python -m m4ray.sweeps +experiment=datagen_m3`",
            file=dataset,
        )
    part = _partitioned(dataset, "lot_samples")
    listed = Path(dataset) / "scenarios.parquet"
    if listed.exists():
        runs = pd.read_parquet(listed, columns=["scenario_id", "status"])
        ok = pa.array(runs.scenario_id[runs.status == "ok"].astype(str).tolist())
        part = part.filter(pads.field("scenario_id").isin(ok))
    table = part.to_table()
    # column by column from Arrow's buffers, the token lists dropped once read: no pandas copy
    # of them (which held ~3.5x the tokens' size at its peak: 11 GB for 250 networks)
    ids = table.column("scenario_id").to_numpy(zero_copy_only=False).astype(object)
    order = np.argsort(ids.astype(str), kind="stable")
    n_links = table.column("n_links").to_numpy()[order].astype(np.int64)
    n, lmax = len(n_links), int(n_links.max())
    tokens = _padded(
        table.column("tokens"), order, n_links, lmax, TOKEN_DIM, dtype=np.float32, fill=0
    )
    table = table.drop_columns(["tokens"])
    empty = _padded(
        table.column("empty"), order, n_links, lmax, N_BUCKETS_IN, dtype=bool, fill=True
    )
    shape = (n, N_BUCKETS_OUT, N_PCT)
    n_fg = table.column("n_foreground").to_numpy()[order]
    weight = None
    if weights:
        draws = None  # per sample; NaN where a partition written before draws lacks them
        if "draws" in table.column_names:
            draws = table.column("draws").to_numpy(zero_copy_only=False).astype(float)[order]
        weight = bucket_weights(dataset, ids[order], n_fg, draws)
    return Lots(
        scenario_id=ids[order],
        n_foreground=n_fg.astype(np.float32),
        weight=weight,
        tokens=tokens,
        empty=empty,
        n_links=n_links,
        target=_rows(table.column("target"), order, np.float32).reshape(shape),
        mask=_rows(table.column("mask"), order, bool).reshape(n, N_BUCKETS_OUT),
        flowsim=_rows(table.column("flowsim_target"), order, np.float32).reshape(shape),
    )


def bucket_weights(
    dataset: str | Path, ids: np.ndarray, n_fg: np.ndarray, draws: np.ndarray | None
) -> np.ndarray:
    """``(N, 4)`` each sample's weight per output bucket as the estimate mixes paths: its
    draws x its foreground flows in the bucket (``lot_flows``, sample after sample within a
    scenario) / its foreground flows. ``ids`` are the samples' scenarios, grouped, each
    scenario's samples in stored order; a dataset written before ``lot_samples`` had draws
    has them recovered (:func:`m4ray.m3.netpaths.recovered_draws`; a lot: 1)."""
    from m4ray.m3.netpaths import recovered_draws

    flows = _partitioned(dataset, "lot_flows")
    wanted = pa.array(sorted(set(ids.astype(str).tolist())))
    flows = (
        flows.to_table(
            columns=["scenario_id", "flow_id", "size_bytes"],
            filter=pads.field("foreground") & pads.field("scenario_id").isin(wanted),
        )
        .to_pandas()
        .groupby("scenario_id", sort=False)
    )
    params = {}
    if draws is None or np.isnan(draws).any():
        runs = pd.read_parquet(
            Path(dataset) / "scenarios.parquet", columns=["scenario_id", "seed", "params"]
        )
        params = {r.scenario_id: (json.loads(r.params), int(r.seed)) for r in runs.itertuples()}
    weight = np.zeros((len(ids), N_BUCKETS_OUT), dtype=np.float32)
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    for lo, hi in zip(starts, np.r_[starts[1:], len(ids)], strict=True):
        part = flows.get_group(str(ids[lo]))
        cut = np.cumsum(n_fg[lo:hi])[:-1]
        sizes = np.split(part.size_bytes.to_numpy(), cut)
        counts = np.stack([bucket_counts(x) for x in sizes])
        if draws is not None and not np.isnan(draws[lo:hi]).any():
            n = draws[lo:hi]
        elif params[str(ids[lo])][0].get("traffic") == "network":
            p, seed = params[str(ids[lo])]
            n = recovered_draws(p, seed, np.split(part.flow_id.to_numpy(), cut))
        else:
            n = np.ones(hi - lo)
        weight[lo:hi] = n[:, None] * counts / np.maximum(n_fg[lo:hi, None], 1)
    return weight


def _partitioned(dataset: str | Path, table: str):
    """A dataset table's Hive partitions (``scenario_id=<id>``) as one Arrow dataset."""
    by_id = pads.partitioning(pa.schema([("scenario_id", pa.string())]), flavor="hive")
    return pads.dataset(Path(dataset) / table, partitioning=by_id)


def _rows(column, order: np.ndarray, dtype) -> np.ndarray:
    """A list column of equal-length rows as a 2-d array, rows in ``order``."""
    flat = column.combine_chunks().flatten().to_numpy(zero_copy_only=False)
    return flat.astype(dtype, copy=False).reshape(len(column), -1)[order]


def _padded(column, order, n_links, lmax, width, *, dtype, fill) -> np.ndarray:
    """A list column of ``(L + 1) x width`` rows, right-padded to ``lmax + 1`` with ``fill``,
    rows in ``order`` (``n_links`` already in that order), read chunk by chunk from Arrow's own
    buffers (no combined copy of the column)."""
    out = np.full((len(order), lmax + 1, width), fill, dtype=dtype)
    at = np.empty(len(order), dtype=np.int64)  # each stored row's place in the output
    at[order] = np.arange(len(order))
    row = 0
    for chunk in column.chunks:
        values = chunk.values.to_numpy(zero_copy_only=False).reshape(-1, width)
        offsets = (chunk.offsets.to_numpy() // width).tolist()
        for j in range(len(chunk)):
            i = at[row + j]
            out[i, : n_links[i] + 1] = values[offsets[j] : offsets[j + 1]]
        row += len(chunk)
    return out


def split(lots: Lots, cfg: M3TrainConfig) -> dict[str, Lots]:
    """Train/val/test by scenario, shuffled by ``cfg.seed`` (every row of a scenario, with the
    mixture loss: a network's paths stay together)."""
    rng = np.random.default_rng(cfg.seed)
    unit = None  # rows; with the mixture loss, each row's scenario
    if cfg.loss == "mixture":
        _, unit = np.unique(lots.scenario_id, return_inverse=True)
    n = len(lots) if unit is None else int(unit.max()) + 1
    order = rng.permutation(n)
    n_val, n_test = round(cfg.val_fraction * n), round(cfg.test_fraction * n)
    parts = {
        "val": order[:n_val],
        "test": order[n_val : n_val + n_test],
        "train": order[n_val + n_test :],
    }
    if unit is None:
        return {k: lots.take(v) for k, v in parts.items()}
    return {k: lots.take(np.flatnonzero(np.isin(unit, v))) for k, v in parts.items()}


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


class M3Task:
    """m3's :class:`~m4ray.train.loop.Task` for :func:`~m4ray.train.loop.train_loop`: lots in
    batches of ``batch_size``, m3's masked relative L1, AdamW (:func:`optimizer`), no schedule;
    every rank scores the whole validation split."""

    def __init__(self, cfg: M3TrainConfig, device) -> None:
        self.cfg, self.device = cfg, device
        self.splits = split(load_lots(cfg.dataset, weights=cfg.weighs_as_estimate()), cfg)
        self.model = self.module = M3Model(cfg.model)
        if cfg.init_checkpoint:
            self.model.load_state_dict(initial_weights(cfg))
        self.ddp_kwargs = None
        self.n_sums = 2  # loss × lots, lots

    def optimizer(self, ddp: torch.nn.Module) -> torch.optim.Optimizer:
        return optimizer(self.model, self.cfg)

    def scheduler(self, optimizer: torch.optim.Optimizer) -> None:
        return None

    def batches(self, epoch: int) -> list:
        cfg = self.cfg
        if cfg.loss == "mixture":  # one scenario (network) a batch
            groups = scenario_groups(self.splits["train"])
            order = np.random.default_rng([cfg.seed, epoch]).permutation(len(groups))
            return [groups[k] for k in order]
        order = np.random.default_rng([cfg.seed, epoch]).permutation(len(self.splits["train"]))
        return [order[k : k + cfg.batch_size] for k in range(0, len(order), cfg.batch_size)]

    def step(self, ddp: torch.nn.Module, index) -> tuple[torch.Tensor, list[float]]:
        part = self.splits["train"].take(index)
        loss = self._loss(ddp, part)
        return loss, [float(loss) * len(index), len(index)]

    def _loss(self, module: torch.nn.Module, lots: Lots) -> torch.Tensor:
        target = torch.from_numpy(lots.target).to(self.device)
        mask = torch.from_numpy(lots.mask).to(self.device)
        pred = module(*lots.tensors(self.device))
        if self.cfg.loss == "mixture":
            by = lots.weight if self.cfg.mixture_weight == "estimate" else lots.n_foreground
            weight = torch.from_numpy(by).to(self.device)
            return mixture_loss(pred, target, mask, weight)
        return loss_fn(pred, target, mask)

    def validate(self, rank: int, world: int) -> list[float]:
        """The whole split's loss on every rank (counted once per rank: the mean is kept; with
        the mixture loss, the mean over its scenarios)."""
        val = self.splits["val"]
        if not len(val):
            return [float("nan"), 1.0]
        with torch.no_grad():
            if self.cfg.loss == "mixture":
                losses = [float(self._loss(self.model, val.take(g))) for g in scenario_groups(val)]
                return [float(np.mean(losses)), 1.0]
            return [float(self._loss(self.model, val)), 1.0]

    def metrics(self, epoch: int, train: list[float], val: list[float], epoch_s: float) -> dict:
        return {
            "epoch": epoch,
            "train_loss": float(train[0] / max(float(train[1]), 1)),
            "val_loss": val[0] / val[1],
            "epoch_s": epoch_s,
        }


def scenario_groups(lots: Lots) -> list[np.ndarray]:
    """Row indices of each scenario, in scenario order."""
    names, first = np.unique(lots.scenario_id, return_inverse=True)
    return [np.flatnonzero(first == k) for k in range(len(names))]


def initial_weights(cfg: M3TrainConfig) -> dict[str, torch.Tensor]:
    """``init_checkpoint``'s weights, for a model of the same configuration."""
    from m4ray.models import checkpoint

    model, _ = checkpoint.load(cfg.init_checkpoint, kind=M3)
    if model.cfg != cfg.model:
        raise InputError(
            f"{cfg.init_checkpoint} holds a model {model.cfg}, not the configured {cfg.model}",
            field="train.init_checkpoint",
        )
    return model.state_dict()


def error_text(table: dict[str, dict[str, float]], n_lots: int) -> str:
    lines = [f"foreground percentile error |est/ns-3 - 1| on {n_lots} held-out lots (per bucket)"]
    lines.append(f"{'model':<9}" + "".join(f"{k:>9}" for k in table["m3"]))
    for who, row in table.items():
        lines.append(f"{who:<9}" + "".join(f"{v:>9.3f}" for v in row.values()))
    return "\n".join(lines)


def _mixture_text(cfg: M3TrainConfig) -> str:
    weight = {
        "estimate": "draws x flows in the bucket / flows, as the estimate mixes them",
        "flows": "its foreground flows in every bucket",
    }[cfg.mixture_weight]
    return f"(the mixture of a network's paths, one network a batch; a path's weight: {weight})"


def _soup_text(meta: dict[str, Any]) -> str:
    if "soup" not in meta:
        return ""
    seeds = ", ".join(map(str, meta["soup"]))
    held = meta["lots"]["held_out"]
    on = f"; the table below is on the {held} samples no member trained on" if held else ""
    return f"""
- a model soup: the mean of the weights of {len(meta["soup"])} members (seeds {seeds}), each
  trained on its own split (the split above is seed {meta["soup"][0]}'s){on}"""


def model_card(meta: dict[str, Any], table: dict, cfg: M3TrainConfig) -> str:
    m = cfg.model
    rows = "\n".join(
        f"| {who} | " + " | ".join(f"{v:.3f}" for v in row.values()) + " |"
        for who, row in table.items()
    )
    lots = meta["lots"]
    held_text = f"""| model | {" | ".join(table["m3"])} |
|---|{"---|" * len(table["m3"])}
{rows}
"""
    if lots.get("held_out", 1) == 0:
        held_text = (
            "None: every network was in some member's training split. The soup's held-out\n"
            "numbers are the benches' (`bench/m3_card.py`: networks and workloads no member saw).\n"
        )
    return f"""# m3 checkpoint

m3 (SIGCOMM'24): a causal transformer (dim {m.dim}, {m.layers} layers, {m.heads} heads, SwiGLU
{m.ffn}) over a path's link tokens and an MLP ({m.mlp}) that corrects path flowSim's foreground
slowdown percentiles (4 size buckets × 100); trained by m4ray (`m4ray/m3/`). Load with
`m4ray.models.checkpoint.load(<dir>, kind=m4ray.m3.train.M3)`.

- dataset version: `{meta["dataset_version"]}` (datagen_m3: parking lots; datagen_m3_net: paths
  of whole networks), train/val/test samples: {lots["train"]}/{lots["val"]}/{lots["test"]} (split
  by scenario){_soup_text(meta)}
- congestion control it was trained on: {", ".join(meta["supported_cc"])} (m4ray's ns-3
  RDMA); other CCs are refused at estimation time
- path flowSim (tokens and the corrected baseline): {
        "with standing queues (`model.json` `path_flowsim_queues`; the estimate runs it so)"
        if meta.get("path_flowsim_queues")
        else "classic (no queues)"
    }{
        ", HPCC's first windows queued (`path_flowsim_first_windows`)"
        if meta.get("path_flowsim_first_windows")
        else ""
    }{
        ", first windows over the level up to the buffer (`path_flowsim_bursts`)"
        if meta.get("path_flowsim_bursts")
        else ""
    }{
        ", each flow at its network route's round trip (`path_flowsim_route_rtt`)"
        if meta.get("path_flowsim_route_rtt")
        else ""
    }{
        ", each flow at DCQCN's rate under DCQCN (`path_flowsim_rates`)"
        if meta.get("path_flowsim_rates")
        else ""
    }
- training: {meta["epochs"]} epochs, batch {cfg.batch_size}, AdamW lr {cfg.lr}, weight decay
  {cfg.weight_decay}; {meta["hardware"]}; {meta["train_wall_s"]} s wall; loss `{cfg.loss}`
  {_mixture_text(cfg) if cfg.loss == "mixture" else ""}
  {f"from `{cfg.init_checkpoint}`" if cfg.init_checkpoint else ""}
- command: `{meta["command"]}`; code: git `{meta["git_commit"]}`

## Held-out samples: foreground percentile error |est/ns-3 − 1| (mean over sample × size bucket)

{held_text}"""


__all__ = [
    "M3",  # the checkpoint kind (m4ray.models.checkpoint.M3), where m3 cards name it
    "Lots",
    "M3Task",
    "M3TrainConfig",
    "error_text",
    "initial_weights",
    "load_lots",
    "model_card",
    "optimizer",
    "percentile_errors",
    "predict",
    "split",
]
