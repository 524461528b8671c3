"""Shared fixtures: Ray environment before import, one session-scoped local Ray, tiny topologies."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from m4ray.runtime.cluster import RAY_ENV_DEFAULTS

for key, value in RAY_ENV_DEFAULTS.items():
    os.environ.setdefault(key, value)

import pytest

from m4ray.sim.topology import Cable, Topology

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


@pytest.fixture(scope="session")
def ray_local():
    import ray

    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=200 * 1024**2,
        log_to_driver=False,
    )
    yield ray
    ray.shutdown()


TINY_DATAGEN = [
    "+experiment=datagen",
    "datagen.scenarios=4",
    "datagen.families.m4_fabric.n_flows=[40,80]",
    "datagen.families.rail.size_bytes=[65536,262144]",
    "datagen.families.rail.phases=[1,2]",
    "ray.num_cpus=2",
]


def run_datagen(output_dir, *overrides) -> subprocess.CompletedProcess:
    """The datagen experiment at test size, as a user runs it."""
    return subprocess.run(
        [PYTHON, "-m", "m4ray.sweeps", *TINY_DATAGEN, *overrides, f"paths.output_dir={output_dir}"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
        check=False,
    )


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory):
    """A 4-scenario real-ns-3 dataset (run directory, completed process), made once per session."""
    out = tmp_path_factory.mktemp("datagen")
    proc = run_datagen(out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / "datagen", proc


def parking_lot(capacities_gbps: list[float], latency_s: float = 0.0) -> Topology:
    """m3's path topology: switches s_0..s_{n-1} in a chain with the given capacities; host h_i
    hangs off s_i on a link so fast it never limits. Hosts are 0..n-1, switches n..2n-1."""
    n = len(capacities_gbps) + 1
    cables = [Cable(i, n + i, 1e18, 0.0) for i in range(n)]
    cables += [Cable(n + i, n + i + 1, c * 1e9, latency_s) for i, c in enumerate(capacities_gbps)]
    return Topology(n_nodes=2 * n, switches=tuple(range(n, 2 * n)), cables=tuple(cables))


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path
