"""The workload experiment end to end, as a user runs it: real Ray tasks, flowSim, Chakra files."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from m4ray.workload import chakra
from tests.conftest import PYTHON, REPO

SMALL = [
    "+experiment=workload",
    "study.model.num_layers=4",
    "study.model.hidden_size=1024",
    "study.model.sequence_len=1024",
    "study.bubble_pp=[1,4]",
    "study.bubble_microbatches=[2,8]",
    "study.straggler_gpus=[4,8]",
    "study.scaling_hidden=[512]",
    "study.write_traces=true",
    "ray.num_cpus=2",
    "progress=false",
]


def run(out, *overrides) -> subprocess.CompletedProcess:
    cmd = [PYTHON, "-m", "m4ray.sweeps", *SMALL, *overrides, f"paths.output_dir={out}"]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=600, check=False)


def test_bubble_and_straggler_findings_with_plots_traces_and_resume(tmp_path):
    proc = run(tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "workload"
    frame = pd.read_parquet(run_dir / "results.parquet")
    assert len(frame) == 12 and (frame.status == "ok").all()
    assert set(frame[frame.study == "scaling"].layout) == {
        "dp32",
        "dp8tp4",
        "dp4tp8",
        "dp8pp4-1f1b",
    }
    bubble = frame[frame.study == "bubble"].set_index(["pp", "microbatches"]).efficiency
    # efficiency falls with the pipeline, and faster for small batches
    assert bubble[(4, 2)] < bubble[(4, 8)] < bubble[(1, 8)]
    assert bubble[(1, 2)] - bubble[(4, 2)] > bubble[(1, 8)] - bubble[(4, 8)]
    strag = frame[frame.study == "straggler"]
    for n, group in strag.groupby("n_gpus"):
        slow = group[group.delayed.astype(bool)].iloc[0]
        base = group[~group.delayed.astype(bool)].iloc[0]
        assert slow.iteration_s - base.iteration_s == pytest.approx(5e-3, rel=1e-6)
        assert slow.idle_gpu_s - base.idle_gpu_s == pytest.approx(5e-3 * (n - 1), rel=1e-3)
    assert "Δiter ms" in proc.stdout and "pp \\ m" in proc.stdout
    for name in ("pipeline_bubble.png", "straggler.png", "scaling.png"):
        assert (run_dir / "plots" / name).stat().st_size > 10_000
    traces = sorted((run_dir / "traces").iterdir())
    assert len(traces) == 12
    workload = chakra.read(traces[0] / "rank")
    assert workload.n_ranks in (4, 8, 32)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["rows"] == 12
    # a second run finds every row done and recomputes nothing
    stamps = {p.name: p.stat().st_mtime_ns for p in (run_dir / "runs").iterdir()}
    again = run(tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert {p.name: p.stat().st_mtime_ns for p in (run_dir / "runs").iterdir()} == stamps


def test_an_impossible_grid_fails_before_any_task(tmp_path):
    proc = run(tmp_path, "study.straggler_gpus=[64]")
    assert proc.returncode == 2
    assert "64 GPUs but the topology has 32" in proc.stderr + proc.stdout
    proc = run(tmp_path, "study.bubble_pp=[3]")
    assert proc.returncode == 2
    assert "pp=3 does not divide num_layers=4" in proc.stderr + proc.stdout
    assert not (tmp_path / "workload" / "runs").exists()


def test_chakra_and_synthetic_workloads_replay_on_ns3_and_flowsim_in_the_sweep(tmp_path):
    gen = [str(Path(PYTHON).parent / "chakra_generator"), "--num_npus", "8"]
    subprocess.run(gen, cwd=tmp_path, check=True, capture_output=True)
    base = ["+experiment=gray_failure", "grid=smoke", "grid.n=[2]", "grid.r=[4]",
            "ray.num_cpus=2", "progress=false", f"paths.output_dir={tmp_path}"]  # fmt: skip
    runs = {
        "chakra": ["workload=chakra", f"workload.prefix={tmp_path}/ALL_REDUCE",
                   "backends=[ns3,flowsim]"],
        "synthetic": ["workload=synthetic", "workload.parallel.dp=8",
                      "workload.model.batch_size=16", "workload.model.num_layers=2",
                      "workload.scale=0.01", "backends=[flowsim]"],
    }  # fmt: skip
    for name, overrides in runs.items():
        cmd = [PYTHON, "-m", "m4ray.sweeps", *base, *overrides, f"name={name}"]
        proc = subprocess.run(
            cmd, capture_output=True, text=True, cwd=REPO, timeout=600, check=False
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        frame = pd.read_parquet(tmp_path / name / "results.parquet")
        assert (frame.status == "ok").all() and (frame.completion_time_s > 0).all()
    chakra_runs = pd.read_parquet(tmp_path / "chakra" / "results.parquet")
    assert set(chakra_runs.backend) == {"ns3", "flowsim"}
