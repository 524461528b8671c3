"""m4 training step throughput on CPU and on a GPU, side by side, at m4-v2's size and the paper's,
and whether the GPU computes what the CPU does.

Two steps, since a GPU machine may have neither the dataset nor Ray (the training step is plain
torch: the loop :func:`m4ray.train.loop.train_loop` runs per worker):

    # here: balanced-sample periods of a dataset and precompute their anchor schedules (numpy)
    .venv/bin/python bench/train_device.py export --dataset outputs/datagen_v2/dataset \\
        --checkpoint checkpoints/m4-v2 --n 192 64 --out .devcarry/periods.pt
    # anywhere with torch (a GPU machine: python3 bench/train_device.py run ...)
    python bench/train_device.py run --samples .devcarry/periods.pt --hidden 64 200 --batch 2 8

``run`` prints, per device × hidden size × batch size, training periods/s (forward, loss as the
train_m4_v2 experiment sets it, backward, Adam step; after warm-up) and held-out inference
periods/s, and the largest relative difference of the checkpoint's predictions between CPU and
GPU. CPU rows use ``--cpu-threads`` threads (1: what a Ray Train CPU worker gets).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from m4ray.train.config import ModelConfig  # noqa: E402
from m4ray.train.loop import LOSSES, batches  # noqa: E402
from m4ray.train.model import M4Model, engine_schedule  # noqa: E402


def export(args) -> None:
    from m4ray.train.data import DataConfig, load_splits

    info = json.loads((Path(args.checkpoint) / "model.json").read_text())
    cfg = ModelConfig(**info["model"])
    splits = load_splits(DataConfig(dataset=args.dataset, n_samples=[args.n[0], args.n[1], 0]))
    out = {}
    for name in ("train", "val"):
        periods = [s.period for s in splits[name]]
        for p in periods:  # the anchor's schedule is numpy work done once per sample
            engine_schedule(p, cfg.anchor)
        out[name] = periods
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    torch.save({"train": out["train"], "val": out["val"], "checkpoint": info}, args.out)
    flows = sum(len(p.size_bytes) for p in out["train"])
    print(
        f"wrote {args.out}: {len(out['train'])} train / {len(out['val'])} val periods, "
        f"{flows} train flows, anchor {cfg.anchor}"
    )


class _Held:
    """What :func:`m4ray.train.loop.batches` groups: something with a ``period``."""

    __slots__ = ("period",)

    def __init__(self, period) -> None:
        self.period = period


def _batches(periods, size: int, rng=None) -> list[list]:
    return [[h.period for h in chunk] for chunk in batches([_Held(p) for p in periods], size, rng)]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def train_rate(cfg: ModelConfig, periods, device, batch: int, *, train: dict, seconds: float):
    """Training periods/s over up to ``seconds`` (one warm-up batch first) and the step count."""
    torch.manual_seed(0)
    model = M4Model(cfg).to(device).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    moved = [p.to(device) for p in periods]
    chunks = _batches(moved, batch, np.random.default_rng(0))
    every = train["loss"] == "every" or train["correction_l1"] > 0

    def step(chunk) -> None:
        out = model(chunk, every=every)
        loss = out[LOSSES[train["loss"]][0]] + 0.005 * out["remain"] + 0.005 * out["queue"]
        if train["correction_l1"] > 0:
            loss = loss + train["correction_l1"] * out["every_shift"]
        opt.zero_grad()
        loss.backward()
        opt.step()

    step(chunks[0])
    _sync(device)
    done, start = 0, time.perf_counter()
    for chunk in chunks[1:]:
        step(chunk)
        done += len(chunk)
        if time.perf_counter() - start > seconds:
            break
    _sync(device)
    return done / (time.perf_counter() - start), done


def infer(model, periods, device, batch: int) -> tuple[float, torch.Tensor]:
    moved = [p.to(device) for p in periods]
    preds = []
    with torch.no_grad():
        model([moved[0]])
        _sync(device)
        start = time.perf_counter()
        for chunk in _batches(moved, batch):
            preds.append(model(chunk)["pred"].cpu())
        _sync(device)
    return len(periods) / (time.perf_counter() - start), torch.cat(preds)


def run(args) -> None:
    data = torch.load(args.samples, weights_only=False)
    info = data["checkpoint"]
    base = ModelConfig(**info["model"])
    train = {"loss": args.loss, "correction_l1": args.correction_l1}
    devices = [torch.device(d) for d in args.devices if d == "cpu" or torch.cuda.is_available()]
    torch.set_num_threads(args.cpu_threads)
    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    print(f"torch {torch.__version__}; GPU: {name}; CPU rows: {args.cpu_threads} thread(s)")
    print(f"{len(data['train'])} train / {len(data['val'])} val periods, anchor {base.anchor}")
    rows = []
    for hidden in args.hidden:
        cfg = dataclasses.replace(base, hidden=hidden, gnn_hidden=args.gnn_ratio * hidden // 2)
        for batch in args.batch:
            row = {"hidden": hidden, "gnn": cfg.gnn_hidden, "batch": batch}
            for device in devices:
                rate, steps = train_rate(
                    cfg, data["train"], device, batch, train=train, seconds=args.seconds
                )
                row[f"train_{device.type}"] = rate
                print(
                    f"  hidden {hidden} batch {batch} {device.type}: {rate:.2f} periods/s "
                    f"({steps} periods)",
                    flush=True,
                )
            rows.append(row)
    print(
        f"\n{'hidden':>7}{'gnn':>6}{'batch':>7}"
        + "".join(f"{'train/s ' + d.type:>16}" for d in devices)
        + (f"{'GPU/CPU':>9}" if len(devices) > 1 else "")
    )
    for row in rows:
        rates = [row[f"train_{d.type}"] for d in devices]
        line = f"{row['hidden']:>7}{row['gnn']:>6}{row['batch']:>7}" + "".join(
            f"{r:>16.2f}" for r in rates
        )
        if len(rates) > 1:
            line += f"{rates[1] / rates[0]:>9.2f}"
        print(line)
    # the shipped weights (the checkpoint travels in the repo) on each device
    from m4ray.train import checkpoint

    ckpt = REPO / "checkpoints" / info.get("name", "m4-v2")
    preds = {}
    print()
    for device in devices:
        model, _ = checkpoint.load(ckpt, device)
        rate, preds[device.type] = infer(model, data["val"], device, args.batch[-1])
        print(
            f"inference {ckpt.name} on {device.type}: {rate:.2f} val periods/s "
            f"(batch {args.batch[-1]})"
        )
    if "cuda" in preds:
        rel = ((preds["cuda"] - preds["cpu"]).abs() / preds["cpu"].abs()).max().item()
        print(
            f"largest relative difference of {ckpt.name}'s predictions, GPU vs CPU, over "
            f"{len(preds['cpu'])} flows: {rel:.2e}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("export")
    ex.add_argument("--dataset", default=str(REPO / "outputs" / "datagen_v2" / "dataset"))
    ex.add_argument("--checkpoint", default=str(REPO / "checkpoints" / "m4-v2"))
    ex.add_argument("--n", type=int, nargs=2, default=[192, 64], help="train and val periods")
    ex.add_argument("--out", default=str(REPO / ".devcarry" / "periods.pt"))
    rn = sub.add_parser("run")
    rn.add_argument("--samples", default=str(REPO / ".devcarry" / "periods.pt"))
    rn.add_argument("--hidden", type=int, nargs="+", default=[64, 200])
    rn.add_argument("--gnn-ratio", type=int, default=3, help="gnn_hidden = ratio * hidden / 2")
    rn.add_argument("--batch", type=int, nargs="+", default=[2, 8])
    rn.add_argument("--devices", nargs="+", default=["cpu", "cuda"])
    rn.add_argument("--cpu-threads", type=int, default=1)
    rn.add_argument("--seconds", type=float, default=20.0, help="timed training per row")
    rn.add_argument("--loss", default="every")
    rn.add_argument("--correction-l1", type=float, default=0.3)
    args = parser.parse_args()
    export(args) if args.cmd == "export" else run(args)


if __name__ == "__main__":
    main()
