"""The workload experiment: synthetic jobs (MLSynth-style) replayed on flowSim, a row per point."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd

from m4ray.runtime.rundir import write_manifest, write_results
from m4ray.workload.study import StudyConfig, crashed_point, plot, points, run_point, summary_text

SECTIONS = {"study": StudyConfig}  # checked before run


def run(cfg, raw_config: dict[str, Any]) -> Path:
    """The workload experiment (``cfg`` is the resolved sweep config with a ``study`` node)."""
    from m4ray.runtime.fanout import read_ok_row, run_many

    started = time.perf_counter()
    study: StudyConfig = cfg.study
    todo = points(study, cfg.topology, cfg.collective, cfg.send_latency_s)
    run_dir = Path(cfg.paths.run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    print(f"workload studies: {len(todo)} synthetic jobs on flowSim into {run_dir}")
    rows = run_many(todo, run_dir, cfg.ray, progress=cfg.progress, task=run_point, load=read_ok_row,
                    crashed=crashed_point)  # fmt: skip
    frame = pd.DataFrame(rows)
    files = [write_results(frame, run_dir), *plot(frame, run_dir)]
    write_manifest(run_dir, raw_config, files, frame=frame)
    print()
    print(summary_text(frame, study))
    for _, row in frame[frame.status != "ok"].head(5).iterrows():
        print(f"  failed {row.run_id}: {row.error}")
    print(f"\n{(frame.status == 'ok').sum()}/{len(frame)} ok in "
          f"{time.perf_counter() - started:.1f} s; outputs: {run_dir}")  # fmt: skip
    if not (frame.status == "ok").any():
        sys.exit(1)
    return run_dir


__all__ = ["SECTIONS", "run"]
