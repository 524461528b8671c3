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


def blast_radius(table: pd.DataFrame, path: Path) -> Path:
    """Heat map failure × job → slowdown (%) due to the failure (and, first row, due to the
    neighbours), one panel per placement policy: ns-3's where it ran that policy, else the
    backend :func:`placement_effect` draws."""
    failures = [c for c in table.columns if c not in SLOWDOWN_KEYS]
    policies = list(dict.fromkeys(table.policy))
    backend = _panel_backend(table, policies)
    n_jobs = table.job.nunique()
    fig, axes = plt.subplots(
        1,
        len(policies),
        figsize=(2.5 + 1.2 * n_jobs * len(policies), 1.5 + 0.45 * len(failures)),
        squeeze=False,
        layout="constrained",
    )
    rows = ["neighbours", *failures]
    vmax = max(1.0, float(np.nanmax(table[rows].to_numpy(dtype=float)) * 100))
    for k, (ax, policy) in enumerate(zip(axes[0], policies, strict=True)):
        ran = set(table[table.policy == policy].backend)
        panel = "ns3" if "ns3" in ran else backend  # ns-3 wherever it ran that policy
        part = table[(table.backend == panel) & (table.policy == policy)]
        grid = part[rows].to_numpy(dtype=float).T * 100
        image = ax.imshow(grid, cmap="Reds", vmin=0, vmax=vmax, aspect="auto")
        ax.set_xticks(range(len(part)), part.job, rotation=30, ha="right")
        ax.set_yticks(range(len(rows)), ["neighbours (healthy)", *failures] if k == 0 else [])
        for (i, j), v in np.ndenumerate(grid):
            dark = v > 0.6 * vmax
            ax.text(j, i, f"{v:.0f}%", ha="center", va="center", fontsize=8, color="wk"[not dark])
        ax.set_title(f"{policy} placement ({panel})", fontsize=10)
    fig.colorbar(image, ax=axes[0].tolist(), label="iteration slowdown (%)")
    return _save(fig, path)


def placement_effect(table: pd.DataFrame, path: Path) -> Path:
    """Per job, bars by placement policy: slowdown due to neighbours and due to the worst
    failure (the reference backend's, as :func:`blast_radius`)."""
    failures = [c for c in table.columns if c not in SLOWDOWN_KEYS]
    policies = list(dict.fromkeys(table.policy))
    part = table[table.backend == _panel_backend(table, policies)]
    jobs = list(dict.fromkeys(part.job))
    fig, axes = plt.subplots(1, 2, figsize=(4 + 1.2 * len(jobs) * len(policies), 4), sharey=True)
    width = 0.8 / max(1, len(policies))
    for k, policy in enumerate(policies):
        rows = part[part.policy == policy].set_index("job").reindex(jobs)
        worst = rows[failures].max(axis=1) if failures else rows.neighbours * np.nan
        x = np.arange(len(jobs)) + k * width
        axes[0].bar(x, rows.neighbours * 100, width, label=policy)
        axes[1].bar(x, worst * 100, width, label=policy)
    for ax, title in zip(axes, ("due to neighbours", "due to the worst failure"), strict=True):
        ax.set_xticks(np.arange(len(jobs)) + width * (len(policies) - 1) / 2, jobs)
        ax.set_title(title)
        ax.grid(alpha=0.3, axis="y")
    axes[0].set_ylabel("iteration slowdown (%)")
    axes[1].legend(title="placement")
    fig.tight_layout()
    return _save(fig, path)


SLOWDOWN_KEYS = ("backend", "policy", "job", "alone_ms", "shared_ms", "neighbours")


def _panel_backend(table: pd.DataFrame, policies: list[str]) -> str:
    full = [
        b
        for b, part in table.groupby("backend", sort=False)
        if part.policy.nunique() == len(policies)
    ]
    return "ns3" if "ns3" in full else (full[0] if full else table.backend.iloc[0])


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
