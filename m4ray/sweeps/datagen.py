"""The datagen experiment: ns-3 scenarios of the configured families, recorded into one dataset."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd

from m4ray.datagen.job import (
    DatagenConfig,
    crashed,
    expand,
    finish,
    load_done,
    run_scenario,
    summary_text,
)
from m4ray.errors import InputError
from m4ray.runtime.fanout import run_many

SECTIONS = {"datagen": DatagenConfig}  # checked before run


def run(cfg, raw_config: dict[str, Any]) -> Path:
    """The datagen experiment (``cfg`` is the resolved sweep config with a ``datagen`` node)."""
    started = time.perf_counter()
    datagen: DatagenConfig = cfg.datagen
    scenarios = expand(datagen, cfg.seed)  # every bad range fails here, before any task
    kinds = {type(s) for s in scenarios}
    if len(kinds) > 1:
        raise InputError(
            "one dataset holds one kind of scenario; these families record different tables: "
            + ", ".join(sorted(k.__name__ for k in kinds)),
            field="datagen.families",
        )
    run_dir = Path(cfg.paths.run_dir).resolve()
    dataset = run_dir / "dataset"
    dataset.mkdir(parents=True, exist_ok=True)
    counts = datagen.counts()
    print(
        f"datagen: {len(scenarios)} ns-3 scenarios ("
        + ", ".join(f"{n} {name}" for name, n in counts.items())
        + f") into {dataset}"
    )
    rows = run_many(
        scenarios,
        run_dir,
        cfg.ray,
        progress=cfg.progress,
        task=run_scenario,
        load=load_done,
        crashed=crashed,
    )
    frame = pd.DataFrame(rows)
    finish(run_dir, frame, raw_config, kinds.pop())
    print()
    print(summary_text(frame))
    failed = frame[frame.status != "ok"]
    for _, row in failed.head(5).iterrows():
        first = str(row.error).strip().splitlines()
        print(
            f"  failed {row.scenario_id} ({row.family} #{row['index']}): "
            f"{first[-1] if first else ''}"
        )
    print(
        f"\ndataset version {(dataset / 'VERSION').read_text().strip()}: "
        f"{(frame.status == 'ok').sum()}/{len(frame)} scenarios in "
        f"{time.perf_counter() - started:.1f} s; outputs: {run_dir}"
    )
    if not (frame.status == "ok").any():
        sys.exit(1)
    return run_dir


__all__ = ["SECTIONS", "run"]
