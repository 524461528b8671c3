"""m4 training throughput (busy periods per second) with 1 and 2 Ray Train workers, side by side,
and CPU inference cost per event.

    .venv/bin/python bench/train_speed.py [--dataset outputs/datagen/dataset] [--hidden 64]

Needs a datagen dataset (``make datagen``). Training: one ``+experiment=train`` run per worker
count (2 epochs; the second epoch's rate is reported, the first includes warm-up), read back
from its MLflow store. Inference: the exported model replays every test period event by event
in this process (one thread): seconds per event (arrival or completion) and per flow.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def train(dataset: str, workers: int, hidden: int, out: Path) -> dict[str, float]:
    import mlflow

    cmd = [
        sys.executable,
        "-m",
        "m4ray.sweeps",
        "+experiment=train",
        f"train.data.dataset={dataset}",
        "train.epochs=2",
        f"train.num_workers={workers}",
        f"train.model.hidden={hidden}",
        f"paths.output_dir={out}",
        f"name=bench-{workers}",
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    if proc.returncode:
        sys.exit(proc.stderr[-3000:])
    client = mlflow.tracking.MlflowClient(f"sqlite:///{out / f'bench-{workers}' / 'mlflow.db'}")
    run = client.search_runs([client.get_experiment_by_name("m4").experiment_id])[0]
    last = {
        k: client.get_metric_history(run.info.run_id, k)[-1].value
        for k in ("epoch_s", "periods_per_s")
    }
    return {**last, "export": str(out / f"bench-{workers}" / "export")}


def inference(export: str, dataset: str) -> tuple[float, float, int]:
    import torch

    from m4ray.models import checkpoint
    from m4ray.train.data import DataConfig, load_splits
    from m4ray.train.periods import period_losses

    torch.set_num_threads(1)
    model, _ = checkpoint.load(export)
    samples = load_splits(DataConfig(dataset=dataset))["test"]
    flows = sum(s.n_flows for s in samples)
    start = time.perf_counter()
    with torch.no_grad():
        for s in samples:
            period_losses(model, [s.period])
    wall = time.perf_counter() - start
    return wall / (2 * flows), wall / flows, flows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default=str(REPO / "outputs" / "datagen" / "dataset"))
    parser.add_argument("--hidden", type=int, default=64)
    args = parser.parse_args()
    dataset = str(Path(args.dataset).resolve())
    with tempfile.TemporaryDirectory() as tmp:
        rows = {w: train(dataset, w, args.hidden, Path(tmp)) for w in (1, 2)}
        per_event, per_flow, flows = inference(rows[1]["export"], dataset)
    print(f"m4 training on {dataset} (hidden {args.hidden}), CPU, gloo")
    print(f"{'workers':>8}{'epoch s':>10}{'periods/s':>11}{'speedup':>9}")
    for w, row in rows.items():
        speedup = row["periods_per_s"] / rows[1]["periods_per_s"]
        print(f"{w:>8}{row['epoch_s']:>10.1f}{row['periods_per_s']:>11.2f}{speedup:>9.2f}")
    print(
        f"\ninference (1 thread): {per_event * 1e3:.2f} ms per event, {per_flow * 1e3:.2f} ms per "
        f"flow over {flows} held-out flows"
    )


if __name__ == "__main__":
    main()
