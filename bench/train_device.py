"""m4 training step throughput on CPU and on a GPU, side by side, at m4-v2's size and the paper's,
and whether the GPU computes what the CPU does.

Two steps, since a GPU machine may have neither the dataset nor Ray (the training step is plain
torch: the loop :func:`m4ray.train.loop.train_loop` runs per worker):

    # here: balanced-sample periods of a dataset and precompute their anchor schedules (numpy)
    .venv/bin/python bench/train_device.py export --dataset outputs/datagen_v2/dataset \\
        --checkpoint checkpoints/m4-v2 --n 192 64 --out .devcarry/periods.pt
    # anywhere with torch (a GPU machine: python3 bench/train_device.py run ...)
    python bench/train_device.py run --samples .devcarry/periods.pt --hidden 64 200 --batch 2 8

``train`` trains m4 for ``--minutes`` on one device from a ``--compact`` export (no anchor
schedules: the 2,400/300/600 periods of train_m4_v2 fit the 64 MiB a GPU machine takes, gzipped;
the schedules are computed there in ``--workers`` processes), keeps the best epoch by validation
every-update L1, scores it on the test periods (m4 / anchor / flowSim, as the training job's
card does) and writes a checkpoint directory:

    .venv/bin/python bench/train_device.py export --dataset outputs/datagen_v2_ackp/dataset \
        --n 2400 300 600 --compact --out .devcarry/gpu/full.pt && gzip .devcarry/gpu/full.pt
    python3 bench/train_device.py train --samples full.pt --hidden 200 --batch 16 --out ck

On the device tool (``run`` with ``carry=[".devcarry/gpu"]``), write logs and the checkpoint's
``model.pt``/``model.json`` under ``$OUT`` as the run goes (a command stopped at its limit
returns only what is there), and leave the command's limit room for the test table:

    gunzip -c .devcarry/gpu/full.pt.gz > /tmp/full.pt && python3 bench/train_device.py train \
        --samples /tmp/full.pt --minutes 6 --workers 12 --out $OUT/h200 2>&1 | tee $OUT/log

Several trainings on one machine share one schedule pass (``schedule`` writes the export again
with every split's anchor schedules); ``--model key=value`` (export or train) overrides the
model config, e.g. ``flow_prior=true``. The export records its dataset's congestion controls,
transport and params13 span, which the checkpoint's ``model.json`` then carries (as the training
job's does). ``train`` writes its best epoch to ``--out`` as it goes (``interim`` in its
``model.json``, no test scores), so a run stopped at a limit still returns one: size a limit
with a minute or so before training (loading, the anchor's own score) and after it (the test
periods' scores):

    python3 bench/train_device.py schedule --samples /tmp/cc.pt --out /tmp/ccs.pt --workers 14
    python3 bench/train_device.py train --samples /tmp/ccs.pt --workers 1 --minutes 4 \
        --hidden 200 --correction-l1 0 --model flow_prior=true --out $OUT/prior

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

from m4ray.models.config import ModelConfig  # noqa: E402
from m4ray.models.m4 import M4Model  # noqa: E402
from m4ray.train.loop import (  # noqa: E402
    TrainConfig,
    batches,
    evaluate,
    fluid_anchor,
    training_loss,
)
from m4ray.train.periods import engine_schedule, period_losses  # noqa: E402


def _overrides(pairs: list[str]) -> dict:
    """``key=value`` pairs, each value read as JSON where it parses (``true``, ``0.1``)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--model takes key=value, got {pair!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def export(args) -> None:
    from m4ray.train.data import DataConfig, dataset_version, load_splits
    from m4ray.train.job import dataset_meta

    info = json.loads((Path(args.checkpoint) / "model.json").read_text())
    info["model"] = {**info["model"], **_overrides(args.model)}
    cfg = ModelConfig(**info["model"])
    # what the trained checkpoint's model.json should say of its data (as the training job does;
    # over several datasets: their transports, congestion controls and params13 rows together)
    versions = [dataset_version(d) for d in args.dataset]
    version = versions[0] if len(versions) == 1 else "+".join(versions)
    info.pop("transport", None)
    info.update(dataset_meta(args.dataset, version))
    n = [*args.n, 0][:3]
    data = _overrides(args.data)
    splits: dict[str, list] = {"train": [], "val": [], "test": []}
    for dataset in args.dataset:  # each split by scenario within its dataset, n from each
        one = load_splits(DataConfig(dataset=dataset, n_samples=n, **data), cfg.anchor)
        for name in splits:
            splits[name] += one[name]
    if args.compact:  # components were cut with the anchor's schedule: the trainer redoes it
        for samples in splits.values():
            for s in samples:
                s.period.schedules.clear()
    else:  # the anchor's schedule is numpy work done once per sample
        for name in ("train", "val"):
            for s in splits[name]:
                engine_schedule(s.period, cfg.anchor)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            **{name: splits[name] for name in ("train", "val", "test")},
            "checkpoint": info,
            "dataset": {"path": args.dataset, "version": version, "n": n, "data": data},
        },
        args.out,
    )
    flows = sum(s.n_flows for s in splits["train"])
    print(
        f"wrote {args.out} ({Path(args.out).stat().st_size / 2**20:.1f} MiB): "
        + " / ".join(f"{len(splits[k])} {k}" for k in ("train", "val", "test"))
        + f" periods, {flows} train flows, anchor {cfg.anchor}"
        + (" (schedules left to the machine that trains)" if args.compact else "")
    )


def _periods(items) -> list:
    """Periods of an export's split (older exports hold periods, newer ones samples)."""
    return [getattr(x, "period", x) for x in items]


_TODO: list = []  # the periods a schedule_all pool works on (its forked workers inherit them)


def _one_schedule(job: tuple[int, object]):
    index, anchor = job
    period = _TODO[index]
    engine_schedule(period, anchor)
    return period.schedules[anchor]


def schedule_all(periods, anchor, workers: int) -> float:
    """Each period's anchor schedule (numpy), in ``workers`` forked processes; returns the
    seconds. Workers get indices into the periods they inherit, and send back numpy arrays
    only: a period's tensors pickled through a pool travel as shared-memory file handles, one
    per tensor, which runs out of open files over thousands of periods."""
    import multiprocessing as mp

    start = time.perf_counter()
    _TODO[:] = [p for p in periods if anchor not in p.schedules]
    if _TODO:
        with mp.get_context("fork").Pool(workers) as pool:
            jobs = [(i, anchor) for i in range(len(_TODO))]
            done = pool.map(_one_schedule, jobs, chunksize=16)
        for p, schedule in zip(_TODO, done, strict=True):
            p.schedules[anchor] = schedule
    _TODO.clear()
    return time.perf_counter() - start


class _Held:
    """What :func:`m4ray.train.loop.batches` groups: something with a ``period``."""

    __slots__ = ("period",)

    def __init__(self, period) -> None:
        self.period = period


def schedule(args) -> None:
    """Every split's anchor schedules computed once (``--workers`` processes) and the export
    saved again with them, so several trainings on one machine share the work."""
    data = torch.load(args.samples, weights_only=False)
    anchor = ModelConfig(**data["checkpoint"]["model"]).anchor
    periods = [p for name in ("train", "val", "test") for p in _periods(data[name])]
    took = schedule_all(periods, anchor, args.workers)
    torch.save(data, args.out)
    print(f"anchor schedules of {len(periods)} periods: {took:.1f} s in {args.workers} processes")


def _batches(periods, size: int, rng=None) -> list[list]:
    return [[h.period for h in chunk] for chunk in batches([_Held(p) for p in periods], size, rng)]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def train_rate(cfg: TrainConfig, periods, device, batch: int, *, seconds: float):
    """Training periods/s over up to ``seconds`` (one warm-up batch first) and the step count."""
    torch.manual_seed(0)
    model = M4Model(cfg.model).to(device).train()
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    moved = [p.to(device) for p in periods]
    chunks = _batches(moved, batch, np.random.default_rng(0))

    def step(chunk) -> None:
        _step(model, opt, chunk, cfg)

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
        period_losses(model, [moved[0]])
        _sync(device)
        start = time.perf_counter()
        for chunk in _batches(moved, batch):
            preds.append(period_losses(model, chunk)["pred"].cpu())
        _sync(device)
    return len(periods) / (time.perf_counter() - start), torch.cat(preds)


def run(args) -> None:
    data = torch.load(args.samples, weights_only=False)
    info = data["checkpoint"]
    base = ModelConfig(**info["model"])
    devices = [torch.device(d) for d in args.devices if d == "cpu" or torch.cuda.is_available()]
    torch.set_num_threads(args.cpu_threads)
    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    print(f"torch {torch.__version__}; GPU: {name}; CPU rows: {args.cpu_threads} thread(s)")
    print(f"{len(data['train'])} train / {len(data['val'])} val periods, anchor {base.anchor}")
    took = schedule_all(_periods(data["train"]) + _periods(data["val"]), base.anchor, args.workers)
    print(f"anchor schedules: {took:.1f} s in {args.workers} processes")
    rows = []
    for hidden in args.hidden:
        cfg = _train_config(
            args, dataclasses.replace(base, hidden=hidden, gnn_hidden=args.gnn_ratio * hidden // 2)
        )
        for batch in args.batch:
            row = {"hidden": hidden, "gnn": cfg.model.gnn_hidden, "batch": batch}
            for device in devices:
                rate, steps = train_rate(
                    cfg, _periods(data["train"]), device, batch, seconds=args.seconds
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
    from m4ray.models import checkpoint

    ckpt = REPO / "checkpoints" / info.get("name", "m4-v2")
    preds = {}
    print()
    for device in devices:
        model, _ = checkpoint.load(ckpt, device)
        rate, preds[device.type] = infer(model, _periods(data["val"]), device, args.batch[-1])
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


def _train_config(args, model: ModelConfig, **settings) -> TrainConfig:
    """The training job's config for the command's loss settings (and ``settings``)."""
    return TrainConfig(
        model=model,
        loss=args.loss,
        error=args.error,
        correction_l1=args.correction_l1,
        **settings,
    )


def _step(model, opt, chunk, cfg: TrainConfig) -> None:
    """One optimiser step on a batch, with the training job's loss."""
    loss = training_loss(period_losses(model, chunk, every=cfg.reads_every, error=cfg.error), cfg)
    opt.zero_grad()
    loss.backward()
    opt.step()


def _every_l1(model, samples, device) -> float:
    """The training job's every-update relative L1 over ``samples``."""
    sums = evaluate(model, samples, device, 16)
    return sums[6] / max(sums[5], 1)


def _fit(
    model, cfg: TrainConfig, moved_train, val, *, minutes: float, tag: str, probe=(), on_best=None
) -> tuple:
    """Epochs until ``minutes`` are spent (the last may stop part-way); the best epoch's state
    by validation every-update L1 (the training job's ``val_every_l1``), its value, the
    history and the wall time. ``probe``: training samples whose every-update L1 is printed
    beside validation's each epoch (whether the model fits what it trains on). ``on_best(model,
    history)`` is called at each new best epoch (a run stopped at a limit keeps that one)."""
    device = next(model.parameters()).device
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(
        opt, factor=cfg.plateau_factor, patience=cfg.plateau_patience, min_lr=cfg.min_lr
    )
    best, best_state, history = float("inf"), None, []
    start = time.perf_counter()
    deadline = start + 60 * minutes
    epoch = 0
    while time.perf_counter() < deadline:
        model.train()
        done = 0
        rng = np.random.default_rng([cfg.seed, epoch])
        chunks = _batches(moved_train, cfg.batch_size, rng)
        for chunk in chunks:
            _step(model, opt, chunk, cfg)
            done += len(chunk)
            if time.perf_counter() > deadline:
                break
        model.eval()
        val_l1 = _every_l1(model, val, device)
        train_l1 = _every_l1(model, probe, device) if probe else float("nan")
        plateau.step(val_l1)
        wall = time.perf_counter() - start
        history.append(
            {
                "epoch": epoch,
                "periods": done,
                "val_every_l1": val_l1,
                "train_every_l1": train_l1,
                "wall_s": wall,
            }
        )
        print(
            f"{tag} epoch {epoch}: {done}/{len(moved_train)} periods, val every-L1 "
            f"{val_l1:.4f}, train (probe) {train_l1:.4f}, {wall:.0f} s",
            flush=True,
        )
        if val_l1 < best:
            best = val_l1
            best_state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
            if on_best is not None:
                on_best(model, history)
        epoch += 1
    return best, best_state, history, time.perf_counter() - start


def train(args) -> None:
    """Train m4 on one device for ``--minutes`` (the train_m4_v2 loss, Adam, the training job's
    plateau schedule), keep the epoch with the lowest validation every-update L1, score it on
    the export's test periods (m4, its anchor, flowSim) and write a checkpoint to ``--out``."""
    from m4ray.models import checkpoint
    from m4ray.runtime.provenance import git_commit
    from m4ray.train.job import error_table, model_card
    from m4ray.train.loop import flow_errors

    data = torch.load(args.samples, weights_only=False)
    base = ModelConfig(**data["checkpoint"]["model"])
    hidden = {"hidden": args.hidden, "gnn_hidden": args.gnn_ratio * args.hidden // 2}
    cfg = _train_config(
        args,
        dataclasses.replace(base, **{**_overrides(args.model), **hidden}),
        batch_size=args.batch,
        lr=args.lr,
        seed=args.seed,
    )
    device = torch.device(args.device if torch.cuda.is_available() else "cpu")
    gpu = torch.cuda.get_device_name(0) if device.type == "cuda" else "CPU"
    torch.set_num_threads(args.cpu_threads)
    train_p = _periods(data["train"])
    took = schedule_all(
        train_p + _periods(data["val"]) + _periods(data["test"]), cfg.model.anchor, args.workers
    )
    tag = (
        f"[hidden {args.hidden}/{cfg.model.gnn_hidden} batch {args.batch} lr {args.lr} "
        f"l1 {args.correction_l1} {cfg.error}{' prior' if cfg.model.flow_prior else ''}]"
    )
    print(
        f"{tag} {gpu}; {len(train_p)} train / {len(data['val'])} val periods; "
        f"schedules {took:.0f} s"
    )
    torch.manual_seed(args.seed)
    model = M4Model(cfg.model).to(device)
    probe = data["train"][: args.probe]
    if model.cfg.fluid:  # the anchor's own every-update L1 (the correction zeroed): the floor
        anchor = fluid_anchor(model).eval()
        print(
            f"{tag} anchor every-L1: val {_every_l1(anchor, data['val'], device):.4f}, "
            f"train (probe) {_every_l1(anchor, probe, device):.4f}",
            flush=True,
        )
    gpu_meta = {
        "dataset_version": data["dataset"]["version"],
        "git_commit": git_commit(),
        "train_periods": len(train_p),
        "val_periods": len(data["val"]),
        "test_periods": len(data["test"]),
        "hardware": f"1 x {gpu} (bench/train_device.py, {args.minutes} min budget)",
        "command": "python bench/train_device.py " + " ".join(sys.argv[1:]),
    }
    for key in ("transport", "supported_cc", "params_range"):  # the data's (export says them)
        if key in data["checkpoint"]:
            gpu_meta[key] = data["checkpoint"][key]

    def interim(model, history) -> None:
        """The best epoch so far, written at once (no test scores yet; the card says so)."""
        last = history[-1]
        meta = {**gpu_meta, "epochs": len(history), "history": history, "interim": True}
        card = (
            f"# m4 (interim, {tag})\n\nBest epoch so far: {last['epoch']}, validation "
            f"every-update L1 {last['val_every_l1']:.4f} after {last['wall_s']:.0f} s. "
            "The run had not finished: no test scores.\n"
        )
        checkpoint.export(model, args.out, meta, card)

    best, best_state, history, train_wall = _fit(
        model,
        cfg,
        [p.to(device) for p in train_p],
        data["val"],
        minutes=args.minutes,
        tag=tag,
        probe=probe,
        on_best=interim,
    )
    model.load_state_dict(best_state)
    model.eval()
    errors = flow_errors(model, data["test"], device)
    table = error_table(errors)
    for who, row in table.items():
        print(f"{tag} test {who}: " + " ".join(f"{k} {v:.4f}" for k, v in row.items()))
    meta = {
        **gpu_meta,
        "epochs": len(history),
        "test_flows": len(errors["m4"]),
        "train_wall_s": round(train_wall, 1),
        "history": history,
        "best_val_every_l1": best,
        "metrics": {f"test_{w}_{k}": v for w, row in table.items() for k, v in row.items()},
    }
    checkpoint.export(model, args.out, meta, model_card(meta, table, cfg))
    print(f"{tag} wrote {args.out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("export")
    ex.add_argument(
        "--dataset",
        nargs="+",
        default=[str(REPO / "outputs" / "datagen_v2" / "dataset")],
        help="one or more datasets; each is split by scenario and gives --n periods",
    )
    ex.add_argument(
        "--data",
        nargs="*",
        default=[],
        help="DataConfig overrides, key=value (components=true max_flows=1000 ...)",
    )
    ex.add_argument("--checkpoint", default=str(REPO / "checkpoints" / "m4-v2"))
    ex.add_argument(
        "--n", type=int, nargs="+", default=[192, 64], help="train, val (and test) periods"
    )
    ex.add_argument(
        "--compact", action="store_true", help="leave the anchor schedules to the training side"
    )
    ex.add_argument("--out", default=str(REPO / ".devcarry" / "periods.pt"))
    sc = sub.add_parser("schedule")
    sc.add_argument("--samples", required=True)
    sc.add_argument("--out", required=True)
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
    tr = sub.add_parser("train")
    tr.add_argument("--samples", default=str(REPO / ".devcarry" / "periods.pt"))
    tr.add_argument("--hidden", type=int, default=200)
    tr.add_argument("--gnn-ratio", type=int, default=3, help="gnn_hidden = ratio * hidden / 2")
    tr.add_argument("--batch", type=int, default=16)
    tr.add_argument("--lr", type=float, default=1e-3)
    tr.add_argument("--minutes", type=float, default=6.0, help="training time budget")
    tr.add_argument("--device", default="cuda")
    tr.add_argument("--cpu-threads", type=int, default=1)
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--loss", default="every")
    tr.add_argument("--correction-l1", type=float, default=0.3)
    tr.add_argument("--out", required=True, help="checkpoint directory to write")
    tr.add_argument("--probe", type=int, default=300, help="training periods scored each epoch")
    for sp in (ex, tr):
        sp.add_argument("--model", nargs="*", default=[], help="model config overrides, key=value")
    for sp in (rn, tr):
        sp.add_argument(
            "--error", default="relative", help="the loss's error measure: relative, log"
        )
    for sp in (rn, tr, sc):
        sp.add_argument("--workers", type=int, default=8, help="processes for anchor schedules")
    args = parser.parse_args()
    {"export": export, "run": run, "schedule": schedule, "train": train}[args.cmd](args)


if __name__ == "__main__":
    main()
