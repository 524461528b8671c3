"""``python -m m4ray.sweeps +experiment=datagen``: ns-3 training data for m4 as one Ray fan-out.

Scenarios are drawn per family from seeds derived from the root seed *and a datagen tag*, so they
never coincide with the gray-failure evaluation sweep's seeds (``child_seeds(root_seed, k)``).
Each Ray task runs one scenario in ns-3 with recording on and writes its tables under
``dataset/<table>/scenario_id=<id>/part-0.parquet``, then its row under ``runs/`` (last,
atomically): a re-run skips finished scenarios, and a failed one is recorded and retried next time.
At the end: ``dataset/scenarios.parquet``, ``SCHEMA.md``, ``manifest.json`` and ``VERSION``
(a content hash over every scenario's files that names the dataset version), plots and a summary.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
import traceback
import zlib
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from m4ray.datagen.families import DatagenScenario
from m4ray.datagen.schema import SCENARIOS, SCHEMA_VERSION, render
from m4ray.errors import InputError, M4rayError
from m4ray.runtime.fanout import crash_reason, read_row, store_row
from m4ray.runtime.rundir import write_manifest
from m4ray.textio import atomic_write_text

DATAGEN_TAG = 0x6D34_6461  # "m4da": keeps datagen seed streams apart from evaluation seeds


@dataclass(kw_only=True, slots=True)
class DatagenConfig:
    """How many scenarios, how they split over the families, and the per-run wall-clock guard."""

    scenarios: int = 16
    families: dict[str, Any] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)
    wall_limit_s: float = 600.0
    # busy periods over ACK-coupled links (DatagenScenario.ack_periods), for RDMA scenarios
    ack_periods: bool = False
    # earlier datasets whose ns-3 answers a scenario may reuse where only what is computed from
    # them changed (m3's path flowSim mode: NetworkPathsScenario.reuse)
    reuse_truth: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.scenarios < 1:
            raise InputError(f"must be >= 1, got {self.scenarios}", field="datagen.scenarios")
        if not self.families:
            raise InputError("no scenario family selected", field="datagen.families")
        unknown = set(self.weights) - set(self.families)
        if unknown:
            raise InputError(
                f"weights for unknown families {sorted(unknown)}; families: "
                f"{', '.join(sorted(self.families))}",
                field="datagen.weights",
            )
        if any(w < 0 for w in self.weights.values()) or sum(self.weights.values()) <= 0:
            raise InputError("weights must be >= 0 with a positive sum", field="datagen.weights")
        if self.wall_limit_s <= 0:
            raise InputError("must be > 0", field="datagen.wall_limit_s")

    def counts(self) -> dict[str, int]:
        """Scenarios per family: weights × total, rounded by largest remainder."""
        names = sorted(self.families)
        weights = np.array([self.weights.get(n, 0.0) for n in names], dtype=float)
        exact = weights / weights.sum() * self.scenarios
        counts = np.floor(exact).astype(int)
        for i in np.argsort(-(exact - counts), kind="stable")[: self.scenarios - counts.sum()]:
            counts[i] += 1
        return dict(zip(names, counts.tolist(), strict=True))


def family_seeds(root_seed: int, family: str, count: int) -> list[int]:
    """``count`` seeds of one family: stable prefixes (more scenarios extend a dataset)."""
    key = zlib.crc32(family.encode())
    sequence = np.random.SeedSequence([root_seed, DATAGEN_TAG, key])
    return [int(s.generate_state(1)[0]) for s in sequence.spawn(count)]


def expand(cfg: DatagenConfig, root_seed: int) -> list[DatagenScenario]:
    """Every scenario of the dataset, family by family (pure; samples in the driver)."""
    scenarios = []
    for name, count in cfg.counts().items():
        family = cfg.families[name]
        for index, seed in enumerate(family_seeds(root_seed, name, count)):
            scenario = family.sample(name, index, seed, cfg.wall_limit_s)
            if cfg.ack_periods:
                if not hasattr(scenario, "ack_periods"):
                    raise InputError(
                        f"family {name}'s scenarios have no busy periods to couple",
                        field="datagen.ack_periods",
                    )
                scenario = dataclasses.replace(scenario, ack_periods=True)
            if cfg.reuse_truth:
                if not hasattr(scenario, "reuse"):
                    raise InputError(
                        f"family {name}'s scenarios cannot reuse another dataset's ns-3 runs",
                        field="datagen.reuse_truth",
                    )
                missing = [d for d in cfg.reuse_truth if not Path(d, "lot_flows").is_dir()]
                if missing:
                    raise InputError(
                        f"not a dataset with recorded flows: {', '.join(missing)}",
                        field="datagen.reuse_truth",
                    )
                reuse = tuple(str(Path(d).resolve()) for d in cfg.reuse_truth)
                scenario = dataclasses.replace(scenario, reuse=reuse)
            scenarios.append(scenario)
    return scenarios


# ------------------------------------------------------------------ per scenario (Ray task)
def partition(dataset: Path, table: str, scenario_id: str) -> Path:
    return dataset / table / f"scenario_id={scenario_id}" / "part-0.parquet"


def run_scenario(scenario: DatagenScenario, run_dir: str) -> dict[str, Any]:
    """Record one scenario, write its partitions, then its row (inside a Ray worker)."""
    run_dir_path = Path(run_dir)
    row = scenario_row(scenario)
    start = time.perf_counter()
    try:
        tables = scenario.record()
    except Exception as err:
        reason = (
            f"{type(err).__name__}: {err}"
            if isinstance(err, M4rayError)
            else "".join(traceback.format_exception(err))
        )
        row.update(status="failed", error=reason, wall_s=time.perf_counter() - start)
        store_row(run_dir_path, scenario, row)
        return row
    digest = hashlib.sha256()
    for name, table in tables.items():
        path = partition(run_dir_path / "dataset", name, scenario.scenario_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        pq.write_table(table, tmp)
        tmp.replace(path)
        digest.update(name.encode() + path.read_bytes())
    row.update(
        status="ok",
        wall_s=time.perf_counter() - start,
        sha256=digest.hexdigest(),
        **scenario.stats(tables),
    )
    store_row(run_dir_path, scenario, row)
    return row


def scenario_row(scenario: DatagenScenario) -> dict[str, Any]:
    return {
        **scenario.describe(),
        "status": "failed",
        "error": "",
        "wall_s": float("nan"),
        "n_flows": 0,
        "n_events": 0,
        "n_periods": 0,
        "sha256": "",
        "median_slowdown": float("nan"),
        "n_below_ideal": 0,
        "params13": scenario.params13(),
        "params": json.dumps(scenario.params(), sort_keys=True),
    }


def load_done(run_dir: Path, scenario: DatagenScenario) -> dict[str, Any] | None:
    row = read_row(run_dir, scenario)
    if row is None or row.get("status") != "ok":
        return None
    dataset = run_dir / "dataset"
    complete = all(
        partition(dataset, t, scenario.scenario_id).exists() for t in type(scenario).TABLES
    )
    return row if complete else None


def crashed(scenario: DatagenScenario, err: BaseException) -> dict[str, Any]:
    row = scenario_row(scenario)
    row["error"] = crash_reason(err)
    return row


# ------------------------------------------------------------------ the job


def finish(
    run_dir: Path, frame: pd.DataFrame, raw_config: dict[str, Any], kind=DatagenScenario
) -> list[Path]:
    """Scenario table, schema document, plots, content hash and the manifest (last); ``kind``:
    the scenario class (its ``TABLES`` and ``write_plots``)."""
    dataset = run_dir / "dataset"
    table = pa.Table.from_pandas(frame[[f.name for f in SCENARIOS]], preserve_index=False)
    table = table.cast(SCENARIOS)
    pq.write_table(table, dataset / "scenarios.parquet")
    atomic_write_text(dataset / "SCHEMA.md", render(kind.TABLES))
    ok = frame[frame.status == "ok"].sort_values("scenario_id")
    digest = hashlib.sha256(f"m4ray-dataset-v{SCHEMA_VERSION}".encode())
    for scenario_id, sha in zip(ok.scenario_id, ok.sha256, strict=True):
        digest.update(f"{scenario_id}:{sha}\n".encode())
    dataset_version = digest.hexdigest()[:16]
    atomic_write_text(dataset / "VERSION", dataset_version + "\n")
    files = kind.write_plots(run_dir, frame)
    extra = {
        "dataset_version": dataset_version,
        "schema_version": SCHEMA_VERSION,
        "ns3_version": version("ns3"),
        "m4ray_version": version("m4ray"),
    }
    columns = ("scenario_id", "family", "index", "seed", "status", "error", "wall_s", "n_flows")
    write_manifest(
        run_dir,
        raw_config,
        files,
        frame=frame,
        run_columns=(*columns, "n_periods"),
        runs_key="scenarios",
        extra=extra,
    )
    return files


def summary_text(frame: pd.DataFrame) -> str:
    """Per family: scenarios ok/failed, flows, events, periods, slowdown, flows whose raw slowdown
    is below 1 (clamped to 1 as training targets), wall time."""
    lines = [
        f"{'family':<14}{'ok':>5}{'failed':>8}{'flows':>9}{'events':>9}{'periods':>9}"
        f"{'med sldn':>10}{'sldn<1':>8}{'wall s/scen':>13}"
    ]
    for family, group in frame.groupby("family", sort=True):
        ok = group[group.status == "ok"]
        lines.append(
            f"{family:<14}{len(ok):>5}{len(group) - len(ok):>8}{int(ok.n_flows.sum()):>9}"
            f"{int(ok.n_events.sum()):>9}{int(ok.n_periods.sum()):>9}"
            f"{ok.median_slowdown.median():>10.2f}"
            f"{int(ok.get('n_below_ideal', pd.Series(dtype=float)).fillna(0).sum()):>8}"
            f"{ok.wall_s.median():>13.1f}"
        )
    return "\n".join(lines)


__all__ = ["DatagenConfig", "expand", "family_seeds", "run_scenario"]
