"""Sweep outputs: the tidy results table, the manifest, and the printed summary.

``results.parquet`` has one row per scenario × backend. The manifest (written last) records the
resolved config, versions, git commit and per-run status; its presence marks a complete run.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

RESULT_COLUMNS = (
    "scenario_id",
    "run_id",
    "n_degraded",
    "reduction",
    "loss_rate",
    "onset_s",
    "seed",
    "backend",
    "status",
    "completion_time_s",
    "rank0_time_s",  # rank 0's own finish (SimAI's EndToEnd.csv is rank 0's)
    "exposed_comm_s",
    "wall_s",
    "shared_by",
    "n_flows",
    "mean_slowdown",
    "p99_slowdown",
    "error",
    "node_id",
    # multi-job runs (m4ray.sweeps.multi_tenant)
    "policy",
    "kind",
    "failure",
    "r",
    "job_iteration_s",
)


def results_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    frame = pd.DataFrame(rows)
    return frame[[c for c in RESULT_COLUMNS if c in frame.columns]]


def format_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    line = "  ".join(f"{{:>{w}}}" for w in widths)
    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line.format(*header), rule, *(line.format(*map(str, r)) for r in rows)])


def summary_text(frame: pd.DataFrame) -> str:
    """Per backend: runs ok/failed, completion time and wall time; then a failure list."""
    rows = []
    for backend, group in frame.groupby("backend", sort=False):
        ok = group[group.status == "ok"]
        ct = ok.completion_time_s.to_numpy() * 1e3
        rows.append(
            [
                backend,
                len(ok),
                len(group) - len(ok),
                _fmt(np.median(ct) if len(ct) else np.nan),
                _fmt(ct.min() if len(ct) else np.nan),
                _fmt(ct.max() if len(ct) else np.nan),
                _fmt(ok.wall_s.median()),
                _fmt(ok.wall_s.sum()),
            ]
        )
    text = format_table(
        [
            "backend",
            "ok",
            "failed",
            "median ms",
            "min ms",
            "max ms",
            "median wall s",
            "total wall s",
        ],
        rows,
    )
    failed = frame[frame.status != "ok"]
    if len(failed):
        lines = [
            f"  N={r.n_degraded} R={r.reduction} {r.backend}: {str(r.error).splitlines()[-1]}"
            for r in failed.head(10).itertuples()
        ]
        text += "\nfailed runs:\n" + "\n".join(lines)
    return text


def grid_text(frame: pd.DataFrame, backend: str) -> str:
    """Completion time (ms) of one backend as an N × R table."""
    ok = frame[(frame.backend == backend) & (frame.status == "ok")]
    if ok.empty:
        return ""
    table = (
        ok.pivot_table(
            index="n_degraded", columns="reduction", values="completion_time_s", aggfunc="mean"
        )
        * 1e3
    )
    header = ["N \\ R", *[str(c) for c in table.columns]]
    rows = [[str(n), *(_fmt(v) for v in table.loc[n])] for n in table.index]
    return f"{backend}: completion time (ms)\n" + format_table(header, rows)


def _fmt(value: float) -> str:
    if value is None or not np.isfinite(value):
        return "-"
    return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"


def errors_vs(frame: pd.DataFrame, reference: str) -> pd.DataFrame:
    """Per scenario and non-reference backend: signed relative error of the completion time
    ``(t - t_ref) / t_ref`` and the wall-time speedup ``wall_ref / wall``."""
    ok = frame[frame.status == "ok"]
    ref = ok[ok.backend == reference].set_index("scenario_id")[["completion_time_s", "wall_s"]]
    others = ok[ok.backend != reference].join(ref, on="scenario_id", rsuffix="_ref", how="inner")
    out = others[["scenario_id", "backend", "n_degraded", "reduction"]].copy()
    out["error"] = (others.completion_time_s - others.completion_time_s_ref) / (
        others.completion_time_s_ref
    )
    out["abs_error"] = out.error.abs()
    out["speedup"] = others.wall_s_ref / others.wall_s
    return out.reset_index(drop=True)


def error_text(errors: pd.DataFrame, reference: str) -> str:
    """Error statistics (percent) and median speedup per backend, against ``reference``."""
    rows = []
    for backend, group in errors.groupby("backend", sort=False):
        worst = group.error.iloc[group.abs_error.to_numpy().argmax()]
        rows.append(
            [
                backend,
                len(group),
                f"{group.error.mean():+.1%}",
                f"{group.error.median():+.1%}",
                f"{group.abs_error.mean():.1%}",
                f"{group.abs_error.median():.1%}",
                f"{worst:+.1%}",
                f"{group.speedup.median():.3g}x",
            ]
        )
    header = [
        "backend",
        "scenarios",
        "mean err",
        "median err",
        "mean |err|",
        "median |err|",
        "worst",
        f"median speedup vs {reference}",
    ]
    text = f"completion time vs {reference}: (t - t_{reference}) / t_{reference}\n"
    text += format_table(header, rows)
    if f"{reference}_again" in set(errors.backend):
        text += (
            f"\n{reference}_again: {reference} itself, every flow sent a little later "
            f"(backend_options.{reference}_again.send_delay_s); its error is {reference}'s own"
            "\nspread, the floor under any backend's error against one run"
        )
    return text
