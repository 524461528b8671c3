"""PNG plots of a training dataset: slowdown CDFs (ns-3 vs flowSim) and busy-period sizes."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from m4ray.datagen.job import partition


def _read(run_dir: Path, frame: pd.DataFrame, table: str, columns: list[str]) -> pd.DataFrame:
    parts = []
    for row in frame[frame.status == "ok"].itertuples():
        part = pq.read_table(
            partition(run_dir / "dataset", table, row.scenario_id), columns=columns
        )
        parts.append(part.to_pandas().assign(family=row.family))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=columns)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_all(run_dir: Path, frame: pd.DataFrame) -> list[Path]:
    if not (frame.status == "ok").any():
        return []
    plot_dir = run_dir / "plots"
    plot_dir.mkdir(parents=True, exist_ok=True)
    flows = _read(run_dir, frame, "flows", ["slowdown", "fct_s", "ideal_fct_s", "flowsim_fct_s"])
    periods = _read(run_dir, frame, "periods", ["n_flows"])
    return [
        slowdown_cdf(flows, plot_dir / "slowdown_cdf.png"),
        period_sizes(periods, plot_dir / "period_sizes.png"),
    ]


def slowdown_cdf(flows: pd.DataFrame, path: Path) -> Path:
    """Per family: CDF of the ns-3 slowdown and of flowSim's for the same flows."""
    families = sorted(flows.family.unique())
    fig, axes = plt.subplots(1, len(families), figsize=(5.5 * len(families), 4), squeeze=False)
    for ax, family in zip(axes[0], families, strict=True):
        data = flows[flows.family == family]
        for label, values in (
            ("ns-3", data.slowdown.to_numpy()),
            ("flowSim", np.maximum(data.flowsim_fct_s / data.ideal_fct_s, 1.0).to_numpy()),
        ):
            x = np.sort(values)
            ax.plot(x, np.arange(1, len(x) + 1) / len(x), label=label)
        ax.set_xscale("log")
        ax.set_xlabel("FCT slowdown (FCT / ideal FCT)")
        ax.set_ylabel("CDF of flows")
        ax.set_title(f"{family}: {len(data)} flows")
        ax.grid(alpha=0.3)
        ax.legend()
    return _save(fig, path)


def period_sizes(periods: pd.DataFrame, path: Path) -> Path:
    """Histogram of busy-period sizes (flows per period) per family, log-spaced bins."""
    fig, ax = plt.subplots(figsize=(6.5, 4))
    top = max(2, int(periods.n_flows.max()))
    bins = np.unique(np.geomspace(1, top + 1, 30).astype(int))
    for family, data in periods.groupby("family", sort=True):
        ax.hist(data.n_flows, bins=bins, histtype="step", label=f"{family} ({len(data)})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("flows per busy period")
    ax.set_ylabel("busy periods")
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)
