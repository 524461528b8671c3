"""Shared fixtures: Ray environment before import, one session-scoped local Ray in this process,
one Ray head that the sweeps tests start in subprocesses join, tiny topologies."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from m4ray.runtime.cluster import RAY_ENV_DEFAULTS

for key, value in RAY_ENV_DEFAULTS.items():
    os.environ.setdefault(key, value)

import pytest

from m4ray.sim.topology import Cable, Topology

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
RAY = str(Path(PYTHON).parent / "ray")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def without_ray_address(env: dict | None = None) -> dict:
    """``env`` (default: this process's) without ``RAY_ADDRESS``: a subprocess that starts its
    own Ray, as a user's first run does, instead of joining the shared head."""
    return {k: v for k, v in (os.environ if env is None else env).items() if k != "RAY_ADDRESS"}


def ray_node(args: list[str], env: dict) -> subprocess.Popen:
    """A blocking ``ray start`` in its own process group: killing the group kills that node only
    (never ``ray stop``, which would stop every Ray on the machine, the test session's too).
    Its agents get ports of their own: a killed node's agents may still hold the defaults."""
    agents = [
        f"--{name}={free_port()}"
        for name in (
            "dashboard-agent-listen-port",
            "dashboard-agent-grpc-port",
            "metrics-export-port",
            "runtime-env-agent-port",
        )
    ]
    return subprocess.Popen(
        [RAY, "start", *args, *agents, "--disable-usage-stats", "--block"],
        env=without_ray_address(env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def wait_for_port(port: int, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"no Ray head on port {port}")


def stop_nodes(nodes: list[subprocess.Popen]) -> None:
    for node in nodes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.pid, signal.SIGKILL)
        node.wait(timeout=60)


@pytest.fixture(scope="session", autouse=True)
def shared_ray_head():
    """One Ray head (2 CPUs) that every sweep a test runs in a subprocess joins: they inherit
    ``RAY_ADDRESS``, which m4ray's ``start_ray`` reads as Ray's own tools do. Joining costs ~2 s
    a subprocess where starting a local Ray (GCS, raylet, agents, monitor: six processes on two
    cores) costs ~7 s. ``tests/test_cli.py`` runs the main job as a user's first run does, on
    an embedded local Ray (:func:`without_ray_address`); this process's own tests use
    :func:`ray_local`. Killed at the end of the session (its process group)."""
    port = free_port()
    head = ray_node(
        ["--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
         f"--object-store-memory={256 * 1024**2}"],
        dict(os.environ),
    )  # fmt: skip
    try:
        wait_for_port(port)
        os.environ["RAY_ADDRESS"] = f"127.0.0.1:{port}"
        yield os.environ["RAY_ADDRESS"]
    finally:
        os.environ.pop("RAY_ADDRESS", None)
        stop_nodes([head])


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
