"""The main job end to end, as a user runs it (subprocesses, each on its own embedded local Ray:
not the tests' shared head)."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pandas as pd
import pytest

from m4ray.config import CONF_DIR
from tests.conftest import PYTHON, REPO, without_ray_address


def sweep(tmp_path, *overrides):
    return subprocess.run(
        [
            PYTHON,
            "-m",
            "m4ray.sweeps",
            *overrides,
            f"paths.output_dir={tmp_path}",
            "ray.num_cpus=2",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=without_ray_address(),
        timeout=600,
        check=False,
    )


def test_gray_failure_sweep_end_to_end_and_resume(tmp_path):
    # the default experiment: real ns-3, flowSim (classic and FIFO), the fluid DCTCP and m4,
    # scaled down further for the test
    proc = sweep(tmp_path, "+experiment=gray_failure", "grid=smoke", "workload.scale=0.005")
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "gray_failure"
    results = pd.read_parquet(run_dir / "results.parquet")
    assert len(results) == 24 and (results.status == "ok").all()
    assert sorted(results.backend.unique()) == [
        "flowsim",
        "flowsim_fifo",
        "fluid_dctcp",
        "m4",
        "ns3",
        "ns3_again",
    ]
    for column in (
        "scenario_id",
        "n_degraded",
        "reduction",
        "backend",
        "completion_time_s",
        "wall_s",
        "n_flows",
        "status",
    ):
        assert column in results.columns
    assert len(list((run_dir / "flows").glob("*.parquet"))) == 24
    assert (run_dir / "plots" / "completion_vs_r.png").stat().st_size > 10_000
    for plot in ("wall_time", "error_cdf", "error_by_n", "error_by_r"):
        assert (run_dir / "plots" / f"{plot}.png").exists()
    assert "completion time vs ns3" in proc.stdout and "median speedup vs ns3" in proc.stdout
    assert "ns3_again: ns3 itself" in proc.stdout  # ns-3's own spread, said as such
    assert (run_dir / "topologies" / "gray_topo_N8_R10.txt").read_text().startswith("45 8 4 9 72")
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["counts"] == {"ok": 24} and manifest["config"]["grid"]["n"] == [2, 8]
    assert "flowsim: completion time (ms)" in proc.stdout and str(run_dir) in proc.stdout
    assert "Started a local Ray" in proc.stderr

    again = sweep(tmp_path, "+experiment=gray_failure", "grid=smoke", "workload.scale=0.005")
    assert again.returncode == 0
    assert "Started a local Ray" not in again.stderr  # everything was done: no task ran
    assert pd.read_parquet(run_dir / "results.parquet").equals(results)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            [],
            "choose an experiment with +experiment=<name>; available: "
            + ", ".join(sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))),
        ),
        (["+experiment=gray_failure", "backends=[nope]"], "unknown backend 'nope'; valid choices"),
        (["+experiment=gray_failure", "workload.path=/no/such.txt"], "/no/such.txt"),
        (
            ["+experiment=gray_failure", "topology=file", "topology.path=/no/topo.txt"],
            "/no/topo.txt",
        ),
        (["+experiment=gray_failure", "grid.n=[40]"], "n_degraded"),
        (
            ["+experiment=gray_failure", "backend_options.ns3.rdma.pfc_threshold_bytes=900000000"],
            "field 'ns3.rdma.pfc_threshold_bytes'",
        ),
        (
            ["+experiment=gray_failure", "backend_options.ns3.rdma.window_bytes=-5"],
            "field 'ns3.rdma.window_bytes'",
        ),
        (["+experiment=gray_failure", "backend_options.ns3.transport=roce"], "rdma, tcp"),
    ],
)
def test_user_mistakes_exit_2_without_traceback(tmp_path, overrides, message):
    proc = sweep(tmp_path, *overrides)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert not list(tmp_path.rglob("results.parquet"))


def test_unknown_experiment_lists_choices(tmp_path):
    proc = sweep(tmp_path, "+experiment=nope")
    assert proc.returncode != 0 and "gray_failure" in proc.stderr


@pytest.mark.slow  # ~30 s (its own Ray + Serve); the app itself is tested in tests/serve/
def test_serve_experiment_starts_checks_and_stops(tmp_path):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = sweep(tmp_path, "+experiment=serve", "serve.hold=false", f"serve.port={port}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    url = f"http://127.0.0.1:{port}/m4"
    assert f"m4 backend serving at {url}" in proc.stdout and f"{url}/docs" in proc.stdout
    assert "self-check: 2 flows -> predicted finish (us): 0: " in proc.stdout


@pytest.mark.parametrize(
    ("signum", "status", "line"),
    [
        (signal.SIGINT, 130, "interrupted (Ctrl-C): stopped"),
        pytest.param(signal.SIGTERM, 143, "terminated (SIGTERM): stopped", marks=pytest.mark.slow),
    ],
)
def test_a_stopped_sweep_says_so_in_one_line_and_resumes(tmp_path, signum, status, line):
    args = [
        PYTHON,
        "-m",
        "m4ray.sweeps",
        "+experiment=gray_failure",
        "backends=[flowsim]",
        "collective=hierarchical",  # 1/15 of SimAI's flows: the stop, not the network, is tested
        f"paths.output_dir={tmp_path}",
        "ray.num_cpus=2",
        "progress=false",
    ]
    # a shell that runs the tests in the background starts them with SIGINT ignored, and a child
    # inherits that (a user's terminal does not): the sweep gets Python's Ctrl-C handler back
    restore = (
        "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "sys.argv = ['m4ray.sweeps', *sys.argv[1:]]; runpy.run_module('m4ray.sweeps', "
        "run_name='__main__', alter_sys=True)"
    )
    proc = subprocess.Popen(
        [PYTHON, "-c", restore, *args[3:]],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    runs = tmp_path / "gray_failure" / "runs"
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        if runs.exists() and len(list(runs.glob("*.json"))) >= 10:
            break
        time.sleep(0.1)
    assert proc.poll() is None, "the sweep finished before it could be stopped"
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    lines = [line for line in err.splitlines() if ".venv/lib" not in line and "[0x" not in line]
    assert proc.returncode == status, "\n".join(lines[-40:])
    assert line in err and "Traceback" not in err
    assert 10 <= len(list(runs.glob("*.json"))) < 105  # finished runs are kept
    again = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert again.returncode == 0, again.stderr[-2000:]
    frame = pd.read_parquet(tmp_path / "gray_failure" / "results.parquet")
    assert len(frame) == 105 and frame.run_id.is_unique and (frame.status == "ok").all()
