"""PNG plots of m3 data and estimates: slowdown CDFs of ns-3 and flowSim per lot length, and the
network-wide CDFs of an estimate next to its comparisons."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pyarrow.parquet as pq


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def dataset_plots(run_dir: Path, frame: pd.DataFrame) -> list[Path]:
    """Foreground slowdown CDFs, ns-3 vs flowSim, one panel per path length."""
    from m4ray.datagen.job import partition

    ok = frame[frame.status == "ok"]
    if ok.empty:
        return []
    parts = []
    for row in ok.itertuples():
        path = partition(run_dir / "dataset", "lot_flows", row.scenario_id)
        part = pq.read_table(path, columns=["b", "foreground", "slowdown", "flowsim_slowdown"])
        parts.append(part.to_pandas())
    flows = pd.concat(parts, ignore_index=True)
    flows = flows[flows.foreground]
    lengths = sorted(flows.b.unique())
    fig, axes = plt.subplots(1, len(lengths), figsize=(4 * len(lengths), 3.2), squeeze=False)
    for ax, n in zip(axes[0], lengths, strict=True):
        sub = flows[flows.b == n]
        for column, label in (("slowdown", "ns-3"), ("flowsim_slowdown", "flowSim")):
            x = np.sort(sub[column].to_numpy())
            ax.plot(x, np.arange(1, len(x) + 1) / len(x), label=label)
        ax.set_xscale("log")
        ax.set_title(f"{n}-link lots: foreground ({len(sub)} flows)")
        ax.set_xlabel("slowdown")
        ax.legend()
    axes[0][0].set_ylabel("CDF")
    out = run_dir / "plots"
    out.mkdir(parents=True, exist_ok=True)
    return [_save(fig, out / "lot_slowdown_cdf.png")]


def estimate_cdf(curves: dict[str, tuple[np.ndarray, np.ndarray]], title: str, path: Path) -> Path:
    """CDF curves ``name -> (values, weights)`` on one log-x axis."""
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for name, (values, weights) in curves.items():
        order = np.argsort(values)
        ax.plot(values[order], np.cumsum(weights[order]) / weights.sum(), label=name)
    ax.set_xscale("log")
    ax.set_xlabel("FCT slowdown")
    ax.set_ylabel("CDF")
    ax.set_title(title)
    ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    return _save(fig, path)
