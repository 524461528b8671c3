"""A real two-node Ray cluster on this machine: a sweep with ray=cluster survives losing its worker
node mid-sweep (Ray retries the lost tasks on the head), ends with every scenario ok exactly once,
and its manifest lists both nodes; and ``jobs/submit.sh`` runs a sweep on it as a Ray Job.
jobs/README.md says how to reproduce both by hand."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import (
    PYTHON,
    REPO,
    free_port,
    ray_node,
    stop_nodes,
    wait_for_port,
    without_ray_address,
)


@contextlib.contextmanager
def _two_nodes(dashboard_port: int | None = None):
    """Head (1 CPU; with the dashboard and its job server when given a port) and a worker node
    (1 CPU, resource 'worker_node')."""
    port = free_port()
    env = {
        **without_ray_address(),  # drivers here name this cluster: the shared head is not it
        "RAY_health_check_period_ms": "500",
        "RAY_health_check_failure_threshold": "4",
    }
    address = f"127.0.0.1:{port}"
    dashboard = (
        ["--include-dashboard=true", f"--dashboard-port={dashboard_port}"]
        if dashboard_port
        else ["--include-dashboard=false"]
    )
    head = ray_node(["--head", f"--port={port}", "--num-cpus=1", *dashboard], env)
    nodes = [head]
    try:
        wait_for_port(port)
        worker = ray_node(
            [f"--address={address}", "--num-cpus=1", '--resources={"worker_node": 1}'], env
        )
        nodes.append(worker)
        yield address, worker, env
    finally:
        stop_nodes(nodes)


@pytest.fixture
def two_nodes():
    with _two_nodes() as cluster:
        yield cluster


def _rows(run_dir: Path) -> int:
    return len(list((run_dir / "runs").glob("*.json"))) if (run_dir / "runs").exists() else 0


def _nodes(run_dir: Path) -> set[str]:
    """Nodes that have written rows so far (a row being written may not parse yet)."""
    found = set()
    for path in (run_dir / "runs").glob("*.json") if (run_dir / "runs").exists() else []:
        try:
            found.add(json.loads(path.read_text())["node_id"])
        except (ValueError, KeyError):
            continue
    return found


@pytest.mark.slow  # two Ray nodes start and one is killed: ~1-2 min
def test_a_sweep_survives_losing_its_worker_node(two_nodes, tmp_path):
    address, worker, env = two_nodes
    sweep = subprocess.Popen(
        [
            PYTHON,
            "-m",
            "m4ray.sweeps",
            "+experiment=gray_failure",
            "backends=[flowsim]",
            "ray=cluster",
            f"ray.address={address}",
            "workload.scale=0.3",
            f"paths.output_dir={tmp_path}",
            "progress=false",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    run_dir = tmp_path / "gray_failure"
    deadline = time.monotonic() + 300
    # kill the worker node once it has done some of the work, mid-sweep
    while len(_nodes(run_dir)) < 2 and sweep.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert sweep.poll() is None, "the sweep ended before the worker node could be killed"
    os.killpg(worker.pid, signal.SIGKILL)  # the worker node and its running tasks die
    _, err = sweep.communicate(timeout=600)
    assert sweep.returncode == 0, err[-3000:]
    frame = pd.read_parquet(run_dir / "results.parquet")
    assert len(frame) == 105 and frame.run_id.is_unique and (frame.status == "ok").all()
    assert _rows(run_dir) == 105
    manifest = json.loads((run_dir / "manifest.json").read_text())
    per_node = manifest["runs_per_node"]
    assert len(per_node) == 2 and sum(per_node.values()) == 105  # both nodes ran scenarios
    # both nodes are listed (whether Ray has marked the lost one dead yet is a race)
    assert {n["node_id"] for n in manifest["ray_nodes"]} == set(per_node)


@pytest.mark.slow  # a head with the dashboard's job server and a worker node: ~1-2 min
def test_submit_sh_runs_a_sweep_as_a_ray_job(tmp_path, monkeypatch):
    # the head's virtualenv named as a remote head's is, by a variable that only the cluster's
    # environment expands (the default for a remote address is ${HOME}/m4ray/.venv)
    monkeypatch.setenv("M4RAY_HEAD_VENV", str(REPO / ".venv"))
    dashboard_port = free_port()
    with _two_nodes(dashboard_port) as (_, _, cluster_env):
        env = {**cluster_env, "M4RAY_VENV": "${M4RAY_HEAD_VENV}"}
        del env["M4RAY_HEAD_VENV"]  # the submitting side does not know it
        wait_for_port(dashboard_port)
        out = tmp_path / "outputs"
        job = subprocess.run(
            [
                str(REPO / "jobs" / "submit.sh"),
                f"http://127.0.0.1:{dashboard_port}",
                "+experiment=gray_failure",
                "backends=[flowsim]",
                "workload.scale=0.3",
                f"paths.output_dir={out}",
                "progress=false",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
        assert "succeeded" in job.stdout
        frame = pd.read_parquet(out / "gray_failure" / "results.parquet")
        assert len(frame) == 105 and frame.run_id.is_unique and (frame.status == "ok").all()
        manifest = json.loads((out / "gray_failure" / "manifest.json").read_text())
        assert len(manifest["ray_nodes"]) == 2  # the job's driver joined the two-node cluster
