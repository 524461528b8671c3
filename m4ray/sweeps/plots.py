"""PNG plots of a gray-failure sweep (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
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


def wall_time(frame: pd.DataFrame, path: Path, speedups: dict[str, float] | None = None) -> Path:
    """Wall-clock seconds per run, one box per backend (log scale), labelled with the median
    speedup over the reference backend when given."""
    ok = frame[frame.status == "ok"]
    backends = list(dict.fromkeys(ok.backend))
    speedups = speedups or {}
    labels = [f"{b}\n{speedups[b]:.3g}x faster" if b in speedups else b for b in backends]
    fig, ax = plt.subplots(figsize=(1.8 * max(2, len(backends)) + 2, 4))
    ax.boxplot([ok[ok.backend == b].wall_s.to_numpy() for b in backends], tick_labels=labels)
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


def error_cdf(errors: pd.DataFrame, reference: str, path: Path) -> Path:
    """CDF of |relative error| of the completion time, one line per backend."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for backend, group in errors.groupby("backend", sort=False):
        values = np.sort(group.abs_error.to_numpy() * 100)
        ax.step(values, np.arange(1, len(values) + 1) / len(values), where="post", label=backend)
    ax.set_xlabel(f"|completion time error| vs {reference} (%)")
    ax.set_ylabel("fraction of scenarios")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return _save(fig, path)


def error_by(errors: pd.DataFrame, column: str, reference: str, path: Path) -> Path:
    """Mean |relative error| against ``column`` (n_degraded or reduction), one line per backend."""
    label = {"n_degraded": "degraded GPUs N", "reduction": "reduction factor R"}.get(column, column)
    fig, ax = plt.subplots(figsize=(6, 4))
    for backend, group in errors.groupby("backend", sort=False):
        line = group.groupby(column).abs_error.mean() * 100
        ax.plot(line.index, line.to_numpy(), marker="o", label=backend)
    ax.set_xlabel(label)
    ax.set_ylabel(f"mean |error| vs {reference} (%)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return _save(fig, path)
