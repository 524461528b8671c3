"""Training a model of any kind (m4, m3) with Ray Train, tracked in MLflow and exported: what the
``train`` and ``train_m3`` experiments (``m4ray.sweeps.train``, ``m4ray.sweeps.train_m3``) share.

The driver creates the MLflow run (params: the flattened config, dataset version, git commit) in
the tracking store — by default ``sqlite:///<run_dir>/mlflow.db`` — then fits a ``TorchTrainer``
whose rank-0 worker logs per-epoch metrics into that run. Ray Train keeps its checkpoints under
``<run_dir>/ray`` with the run named by config, so re-running the same command resumes from the
last finished epoch; a run that finished every epoch is not fitted again (its ``finished.json``
names the checkpoint), only evaluated and exported. At the end: per-flow slowdown error on the
test scenarios for m4 and flowSim side by side (table, CDF plot, MLflow metrics) and the
exported checkpoint (also an artifact).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from m4ray.fingerprint import fingerprint
from m4ray.models import checkpoint
from m4ray.runtime.cluster import start_ray
from m4ray.runtime.provenance import git_commit
from m4ray.train.loop import TrainConfig

QUANTILES = (0.5, 0.9, 0.99)


def tracking_uri(cfg: TrainConfig, run_dir: Path) -> str:
    return cfg.tracking_uri or f"sqlite:///{(run_dir / 'mlflow.db').resolve()}"


def _flatten(prefix: str, value: Any, out: dict[str, str]) -> dict[str, str]:
    if isinstance(value, dict):
        for key, item in value.items():
            _flatten(f"{prefix}.{key}" if prefix else str(key), item, out)
    else:
        out[prefix] = str(value)[:500]
    return out


def mlflow_run(uri: str, experiment: str, name: str, raw_config: dict, version: str) -> str:
    """The id of this training run's MLflow run (created with its params, or found again)."""
    import mlflow

    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(experiment)
    existing = mlflow.search_runs(
        filter_string=f"tags.mlflow.runName = '{name}'", output_format="list"
    )
    if existing:
        return existing[0].info.run_id
    with mlflow.start_run(run_name=name) as run:
        params = _flatten("", raw_config.get("train", {}), {})
        params.update(dataset_version=version, git_commit=git_commit())
        items = list(params.items())
        for chunk in range(0, len(items), 90):
            mlflow.log_params(dict(items[chunk : chunk + 90]))
        return run.info.run_id


FINISHED = "finished.json"


def finished_fit(cfg, trial_dir: Path):
    """A fit of ``cfg.epochs`` epochs that already finished in ``trial_dir`` (its
    :data:`FINISHED` record): its last checkpoint, whether GPUs ran and its wall time; None
    when there is none (never run, stopped early, or run for fewer epochs than asked now)."""
    try:
        done = json.loads((trial_dir / FINISHED).read_text())
    except (OSError, ValueError):
        return None
    path = trial_dir / str(done.get("checkpoint", ""))
    if done.get("epochs") != cfg.epochs or not (path / "state.pt").is_file():
        return None
    from ray.train import Checkpoint

    return Checkpoint.from_directory(str(path)), bool(done["use_gpu"]), float(done["wall_s"])


def fit(loop, loop_config: dict, cfg, ray_cfg, *, name: str, run_dir: Path):
    """Fit a ``TorchTrainer`` running ``loop`` on ``cfg.num_workers`` workers (GPUs when
    ``cfg.use_gpu``, or when the cluster has them if None), checkpoints under ``<run_dir>/ray``
    named ``name`` (a re-run resumes; a finished one is not fitted again). Returns the last
    checkpoint, whether GPUs ran, and the wall time (the first fit's, for a finished run)."""
    trial_dir = run_dir / "ray" / name
    if (done := finished_fit(cfg, trial_dir)) is not None:
        print(f"training: all {cfg.epochs} epochs already done ({trial_dir}), not fitted again")
        return done
    ray = start_ray(ray_cfg)
    use_gpu = cfg.use_gpu
    if use_gpu is None:
        use_gpu = ray.cluster_resources().get("GPU", 0) > 0
    print(
        f"training: {cfg.num_workers} worker(s) on {'GPU (nccl)' if use_gpu else 'CPU (gloo)'}, "
        f"{cfg.epochs} epochs"
    )
    from ray.train import CheckpointConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    resources = {"CPU": cfg.cpus_per_worker, **({"GPU": 1} if use_gpu else {})}
    trainer = TorchTrainer(
        loop,
        train_loop_config=loop_config,
        scaling_config=ScalingConfig(
            num_workers=cfg.num_workers, use_gpu=use_gpu, resources_per_worker=resources
        ),
        run_config=RunConfig(
            name=name,
            storage_path=str(run_dir / "ray"),
            checkpoint_config=CheckpointConfig(num_to_keep=2),
        ),
    )
    started = time.perf_counter()
    result = trainer.fit()
    wall = time.perf_counter() - started
    if result.error is not None:
        raise result.error
    last = Path(result.checkpoint.path)
    if last.parent == trial_dir:  # kept on this machine (not in a cluster's remote storage)
        record = {"epochs": cfg.epochs, "use_gpu": use_gpu, "wall_s": wall, "checkpoint": last.name}
        (trial_dir / FINISHED).write_text(json.dumps(record))
    return result.checkpoint, use_gpu, wall


@dataclass(kw_only=True, slots=True)
class Trained:
    """A finished training run: the model (eval mode) from its last checkpoint, that
    checkpoint's state, the MLflow run and store, whether GPUs ran, the wall time and the commit
    the run began at (a long run may export after later commits)."""

    model: Any
    state: dict
    run_id: str
    uri: str
    use_gpu: bool
    wall_s: float
    began_commit: str

    def meta(self, version: str, cfg, metrics: dict[str, float], **more: Any) -> dict[str, Any]:
        """The checkpoint's ``model.json`` entries every kind records, and ``more``."""
        meta = {
            "dataset_version": version,
            "git_commit": self.began_commit,
            "epochs": self.state["epoch"] + 1,
            **more,
            "train_wall_s": round(self.wall_s, 1),
            "hardware": f"{cfg.num_workers} x {'GPU' if self.use_gpu else 'CPU'} worker(s)",
            "metrics": metrics,
            "command": "python -m m4ray.sweeps " + " ".join(sys.argv[1:]),
        }
        if (now := git_commit()) != self.began_commit:
            meta["exported_at"] = now
        return meta


def train(sweep, raw_config: dict, cfg, loop, build, *, version: str, run_dir: Path, what: str):
    """Create (or find again) the MLflow run, fit ``loop`` with Ray Train (a re-run resumes from
    the last epoch) and load the model ``build(cfg.model)`` from the last checkpoint. ``what``
    starts the progress line (the experiment and its data)."""
    import mlflow
    import torch

    uri = tracking_uri(cfg, run_dir)
    name = f"{sweep.name}-{fingerprint([raw_config.get('train'), version], 8)}"
    run_id = mlflow_run(uri, cfg.experiment, name, raw_config, version)
    print(f"{what}; MLflow {uri} run {name}")
    last, use_gpu, wall = fit(
        loop,
        {"cfg": cfg, "mlflow_run_id": run_id, "tracking_uri": uri},
        cfg,
        sweep.ray,
        name=name,
        run_dir=run_dir,
    )
    with last.as_directory() as d:
        state = torch.load(Path(d) / "state.pt", map_location="cpu", weights_only=False)
    model = build(cfg.model)
    model.load_state_dict(state["model"])
    mlflow.set_tracking_uri(uri)
    began = mlflow.get_run(run_id).data.params.get("git_commit") or git_commit()
    return Trained(
        model=model.eval(),
        state=state,
        run_id=run_id,
        uri=uri,
        use_gpu=use_gpu,
        wall_s=wall,
        began_commit=began,
    )


def publish(
    trained: Trained, export_dir: Path, meta: dict, card: str, *, kind, plot: Path | None = None
) -> Path:
    """Export the checkpoint with its card and log it, its metrics (and ``plot``) to the run."""
    import mlflow

    checkpoint.export(trained.model, export_dir, meta, card, kind=kind)
    mlflow.set_tracking_uri(trained.uri)
    with mlflow.start_run(run_id=trained.run_id):
        mlflow.log_metrics(meta["metrics"])
        mlflow.log_artifacts(str(export_dir), artifact_path="checkpoint")
        if plot is not None:
            mlflow.log_artifact(str(plot))
    return export_dir


def _scenario_params(datasets: list[str], columns: list[str]) -> list[dict]:
    """Rows of the datasets' ``scenarios.parquet`` (``columns``; ``params`` read from JSON)."""
    import json

    import pyarrow.parquet as pq

    rows = []
    for dataset in datasets:
        table = pq.read_table(Path(dataset) / "scenarios.parquet", columns=columns).to_pylist()
        rows += [{**r, "params": json.loads(r["params"])} if "params" in r else r for r in table]
    return rows


def dataset_ccs(dataset: str) -> list[str]:
    """The congestion controls of a dataset's RDMA scenarios (DCTCP where none is recorded)."""
    rows = _scenario_params([dataset], ["params"])
    return sorted({r["params"].get("cc", "dctcp") for r in rows})


def dataset_meta(datasets: str | list[str], version: str) -> dict[str, Any]:
    """What an m4 checkpoint's ``model.json`` says of the data it learned, from one dataset or
    several together: the ns-3 transport (where one; the m4 backend describes it to the model),
    the congestion controls it accepts and the params13 span it reads others at the edge of."""
    from m4ray.models.config import ParamsRange

    paths = [datasets] if isinstance(datasets, str | Path) else list(datasets)
    rows = _scenario_params(paths, ["status", "params", "params13"])
    meta: dict[str, Any] = {}
    transports = {r["params"].get("transport", "tcp") for r in rows}
    if len(transports) == 1:  # what the m4 backend should describe to it (check_transport)
        meta["transport"] = transports.pop()
    meta["supported_cc"] = sorted({r["params"].get("cc", "dctcp") for r in rows})
    # the network parameters it learned a response to (the backend reads others at the edge)
    ok = [r["params13"] for r in rows if r["status"] == "ok"]
    source = f"dataset {version}, {len(ok)} scenarios"
    meta["params_range"] = ParamsRange.spanning(ok, source).to_json()
    return meta


def error_table(errors: dict[str, np.ndarray]) -> dict[str, dict[str, float]]:
    table = {}
    for who, err in errors.items():
        row = {"mean": float(err.mean()) if len(err) else float("nan")}
        for q in QUANTILES:
            row[f"p{round(q * 100)}"] = float(np.quantile(err, q)) if len(err) else float("nan")
        table[who] = row
    return table


def error_text(table: dict[str, dict[str, float]], n_flows: int) -> str:
    lines = [f"per-flow slowdown error |s_hat/s - 1| on {n_flows} held-out flows"]
    lines.append(f"{'model':<9}" + "".join(f"{k:>9}" for k in table["m4"]))
    for who, row in table.items():
        lines.append(f"{who:<9}" + "".join(f"{v:>9.3f}" for v in row.values()))
    m4, flowsim = table["m4"], table["flowsim"]
    if flowsim["mean"] > 0 and flowsim["p90"] > 0:
        lines.append(
            f"m4 vs flowSim: mean {m4['mean'] / flowsim['mean'] - 1:+.1%}, "
            f"p90 {m4['p90'] / flowsim['p90'] - 1:+.1%} (m4 paper: -45.3 %, -53.0 %)"
        )
    return "\n".join(lines)


def error_cdf(errors: dict[str, np.ndarray], path: Path) -> Path | None:
    if not len(errors["m4"]):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for who, err in errors.items():
        x = np.sort(err)
        ax.plot(x, np.arange(1, len(x) + 1) / len(x), label=who)
    ax.set_xscale("symlog", linthresh=0.01)
    ax.set_xlabel("per-flow slowdown error |ŝ/s − 1|")
    ax.set_ylabel("CDF of held-out flows")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def model_card(meta: dict[str, Any], table: dict[str, dict[str, float]], cfg: TrainConfig) -> str:
    m = cfg.model
    rows = "\n".join(
        f"| {who} | " + " | ".join(f"{v:.3f}" for v in row.values()) + " |"
        for who, row in table.items()
    )
    anchor = (
        "; fluid anchor on: slowdown = flowSim's projection at the flow's last update x "
        "(1 + learned correction) (`m4ray/models/fluid.py`)"
        if m.fluid
        else ""
    )
    exported = f" (exported at `{meta['exported_at']}`)" if "exported_at" in meta else ""
    return f"""# m4 checkpoint

m4 (arXiv 2503.01770): GRU time/rate cells over flow and link states, {m.gnn_layers} GraphSAGE
layers ({m.hidden}→{m.gnn_hidden}→…→{m.hidden}) over the flow–link graph, an MLP head predicting FCT
slowdown; trained by m4ray (`m4ray/train/`). Load with `m4ray.models.checkpoint.load(<dir>)`.

- dataset version: `{meta["dataset_version"]}` (datagen), train/val/test periods:
  {meta["train_periods"]}/{meta["val_periods"]}/{meta["test_periods"]} (split by scenario)
- training: {meta["epochs"]} epochs, batch {cfg.batch_size} periods, Adam lr {cfg.lr}, aux weights
  {cfg.weight_remain}/{cfg.weight_queue}; {meta["hardware"]}; {meta["train_wall_s"]} s wall
- command: `{meta["command"]}`
- code: git `{meta["git_commit"]}`{exported}
- ground truth: ns-3 {meta.get("transport", "(mixed transports)")}{anchor}

## Held-out per-flow slowdown error |ŝ/s − 1| ({meta["test_flows"]} flows)

| model | {" | ".join(table["m4"])} |
|---|{"---|" * len(table["m4"])}
{rows}
"""


__all__ = [
    "Trained",
    "dataset_ccs",
    "dataset_meta",
    "error_table",
    "error_text",
    "fit",
    "mlflow_run",
    "publish",
    "tracking_uri",
    "train",
]
