"""A run's directory: the results file and the one manifest writer every experiment uses.

``manifest.json`` (or a named one) is written last, atomically, so a directory with a manifest
is a finished run. It records the resolved config, the code (git commit, Python and package
versions), the Ray nodes seen, the rows' statuses (``rows``, ``failed``, ``counts``), one entry per
run with the columns that identify it, runs per node, the files written (relative to the run
directory) and whatever the experiment adds (``extra``, e.g. a dataset's version).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from m4ray.runtime.cluster import cluster_nodes
from m4ray.runtime.provenance import git_commit, versions
from m4ray.textio import atomic_write_text

RUN_COLUMNS = ("run_id", "scenario_id", "backend", "status", "wall_s")


def write_results(frame: pd.DataFrame, run_dir: Path, name: str = "results.parquet") -> Path:
    """One row per run, as Parquet, replaced atomically."""
    path = Path(run_dir) / name
    tmp = path.with_name(f".{name}.tmp")
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), tmp)
    tmp.replace(path)
    return path


def write_manifest(
    run_dir: Path,
    config: dict[str, Any],
    files: Iterable[Path],
    *,
    frame: pd.DataFrame | None = None,
    run_columns: Iterable[str] = RUN_COLUMNS,
    runs_key: str = "runs",
    extra: dict[str, Any] | None = None,
    name: str = "manifest.json",
) -> Path:
    """Write the run's manifest (module docstring); ``frame``: its rows, of which the present
    ``run_columns`` are listed under ``runs_key`` (NaN as null)."""
    run_dir = Path(run_dir)
    found = versions()
    manifest: dict[str, Any] = {
        **(extra or {}),
        "config": config,
        "git_commit": git_commit(),
        "python": found.pop("python"),
        "versions": found,
        "ray_nodes": cluster_nodes(),  # as Ray knows them at the end (dead nodes may be gone)
    }
    if frame is not None:
        status = frame["status"] if "status" in frame else pd.Series(dtype=str)
        columns = [c for c in run_columns if c in frame]
        manifest |= {
            "rows": len(frame),
            "failed": int((status != "ok").sum()),
            "counts": status.value_counts().to_dict(),
            runs_key: [
                {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in r.items()}
                for r in frame[columns].to_dict("records")
            ],
            "runs_per_node": frame["node_id"].value_counts().to_dict()
            if "node_id" in frame
            else {},
        }
    manifest["files"] = [
        str(Path(p).relative_to(run_dir) if Path(p).is_absolute() else p) for p in files
    ]
    return atomic_write_text(run_dir / name, json.dumps(manifest, indent=1, default=str))


__all__ = ["RUN_COLUMNS", "write_manifest", "write_results"]
