"""PNG plots of a gray-failure sweep (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd


def completion_vs_r(frame: pd.DataFrame, path: Path) -> Path:
    """Completion time vs R, one line per N, one panel per backend."""
    ok = frame[frame.status == "ok"]
    backends = list(dict.fromkeys(ok.backend))
    fig, axes = plt.subplots(
        1,
        max(1, len(backends)),
        figsize=(6 * max(1, len(backends)), 4.5),
        squeeze=False,
        sharey=True,
    )
    cmap = plt.get_cmap("viridis")
    ns = sorted(ok.n_degraded.unique())
    for ax, backend in zip(axes[0], backends, strict=False):
        data = ok[ok.backend == backend]
        for i, n in enumerate(ns):
            line = data[data.n_degraded == n].groupby("reduction").completion_time_s.mean()
            ax.plot(
                line.index,
                line.to_numpy() * 1e3,
                marker="o",
                ms=3,
                color=cmap(i / max(1, len(ns) - 1)),
                label=f"N={n}",
            )
        ax.set_title(backend)
        ax.set_xlabel("reduction factor R (link at 1/R)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("workload completion time (ms)")
    axes[0][-1].legend(fontsize=7, ncol=2, title="degraded GPUs")
    fig.tight_layout()
    return _save(fig, path)


def wall_time(frame: pd.DataFrame, path: Path) -> Path:
    """Wall-clock seconds per run, one box per backend (log scale)."""
    ok = frame[frame.status == "ok"]
    backends = list(dict.fromkeys(ok.backend))
    fig, ax = plt.subplots(figsize=(1.8 * max(2, len(backends)) + 2, 4))
    ax.boxplot([ok[ok.backend == b].wall_s.to_numpy() for b in backends], tick_labels=backends)
    ax.set_yscale("log")
    ax.set_ylabel("wall time per scenario (s)")
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)
    return path
