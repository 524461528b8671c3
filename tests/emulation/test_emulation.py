"""The emulation backend: real rank processes (Ray actors), real TCP bytes, tc-shaped namespaces."""

from __future__ import annotations

import socket
import struct
import subprocess
import threading
import zlib

import pytest

from m4ray.emulation import netns
from m4ray.emulation.engine import EmulationConfig
from m4ray.emulation.transport import HEADER, Transport, TransportError, payload
from m4ray.errors import InputError
from m4ray.sim.collectives import Ring
from m4ray.sim.routing import Routing
from m4ray.sim.topology import Cable, Topology
from m4ray.sim.workload import Collective, CollectiveKind, Workload
from tests.conftest import PYTHON, REPO

NO_NETNS = netns.available()
needs_netns = pytest.mark.skipif(NO_NETNS is not None, reason=f"no namespaces: {NO_NETNS}")


def star(n: int = 4, slow: int | None = None, bandwidth_bps: float = 100e9) -> Topology:
    cables = tuple(
        Cable(i, n, bandwidth_bps / 2 if i == slow else bandwidth_bps, 1e-6) for i in range(n)
    )
    return Topology(n_nodes=n + 1, switches=(n,), cables=cables)


def all_reduce(size: int, n: int = 4) -> Workload:
    group = tuple(range(n))
    nodes = [
        Collective(id=r, rank=r, kind=CollectiveKind.ALL_REDUCE, size_bytes=size, group=group)
        for r in range(n)
    ]
    return Workload(n_ranks=n, nodes=nodes)


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def test_messages_arrive_intact_and_in_order_per_source_and_tag():
    ports = free_ports(2)
    addresses = [("127.0.0.1", p) for p in ports]
    a, b = Transport(0, addresses), Transport(1, addresses)
    sizes = [1, 7, 65_536, 1_000_003, 0, 320, 4096] * 3

    def send() -> None:
        for i, size in enumerate(sizes):
            a.send(1, tag=i % 2, nbytes=size)

    sender = threading.Thread(target=send)
    sender.start()
    got = {0: [], 1: []}
    for i in range(len(sizes)):
        tag = i % 2
        msg = b.recv(0, tag, timeout=30)
        got[tag].append((msg.seq, msg.nbytes))
    sender.join()
    for tag in (0, 1):
        expected = [s for i, s in enumerate(sizes) if i % 2 == tag]
        assert got[tag] == list(enumerate(expected))
    # a damaged frame is caught by the checksum and surfaces at the next recv
    with socket.create_connection(addresses[1]) as raw:
        body = payload(0, 5, 0, 100)
        raw.sendall(HEADER.pack(0, 1, 5, 0, 100, zlib.crc32(body) ^ 1) + body)
        with pytest.raises(TransportError, match="corrupt payload"):
            b.recv(0, 5, timeout=30)
    a.close()
    b.close()


def test_payload_is_deterministic_and_sized():
    assert payload(3, 9, 1, 1000) == payload(3, 9, 1, 1000)
    assert payload(3, 9, 1, 1000) != payload(3, 9, 2, 1000)
    assert len(payload(0, 0, 0, 12345)) == 12345 and struct.calcsize("!iiqqqI") == HEADER.size


@needs_netns
def test_ring_all_reduce_over_shaped_links_and_a_degraded_link(ray_local):
    cfg = EmulationConfig(rate_scale=1e-3, size_scale=1e-2)
    size = 400_000_000
    analytic = 2 * 3 * (size / 4) * 8 / 100e9  # 6 ring steps of D/n at 100 Gbps: 48 ms
    times = {}
    for slow in (None, 2):
        topo = star(slow=slow)
        result = cfg.run_workload(topo, Routing(topo), all_reduce(size), Ring())
        times[slow] = result.completion_time_s
        assert len(result.flows.flow_id) == 4 * 6
        assert set(result.flows.size_bytes) == {size // 4}
        assert all(f > s for s, f in zip(result.flows.start_s, result.flows.finish_s, strict=True))
    # stated tolerance: TCP/IP headers (~5 %) and per-step wake-ups on 2 cores (1.43x seen once
    # in a full make test run, 2026-11-28; a shaping or ring-order bug is >= 2x or below 0.95x)
    assert analytic * 0.95 < times[None] < analytic * 1.6
    # half the rate on one GPU's link: every ring step waits for it, about twice as long (real
    # TCP over tc on 2 busy cores measured 2.3-2.9x, and 3.20x once in a full make test run on
    # 2026-12-07: the upper bound only rules out nonsense)
    assert 1.5 < times[2] / times[None] < 4.0
    assert netns.leftovers() == []


@needs_netns
def test_teardown_on_error_and_cleanup_after_a_killed_run():
    topo = star()
    up, down = netns.plan(topo, Routing(topo), 4, 1e-3, 1.0)
    seen = []

    def fail_inside() -> None:
        with netns.NamespaceNetwork("terr", up, down):
            seen.extend(netns.leftovers("terr"))
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fail_inside()
    assert len(seen) == 4 + 1 + 4  # namespaces, bridge, veths
    assert netns.leftovers("terr") == []
    # a run killed with SIGKILL cannot clean up; the next one removes its leftovers
    code = (
        "import os, signal\n"
        "from m4ray.emulation import netns\n"
        "from m4ray.sim.routing import Routing\n"
        "from tests.emulation.test_emulation import star\n"
        "t = star(); up, down = netns.plan(t, Routing(t), 4, 1e-3, 1.0)\n"
        "netns.NamespaceNetwork('tkil', up, down).__enter__()\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run([PYTHON, "-c", code], cwd=REPO, check=False, capture_output=True)
    assert proc.returncode == -9
    assert len(netns.leftovers("tkil")) == 9
    removed = netns.cleanup("tkil")  # veths usually go with their namespaces
    assert {f"m4rtkil-{r}" for r in range(4)} | {"m4rtkilbr"} <= set(removed)
    assert netns.leftovers("tkil") == []


def test_impossible_rates_and_bad_topologies_fail_before_any_process():
    topo = star()
    with pytest.raises(InputError, match=r"0\.01 Mbps.*rate_scale"):
        netns.plan(topo, Routing(topo), 4, 1e-7, 1.0)
    with pytest.raises(InputError, match="6 ranks but the topology has 4 hosts"):
        netns.plan(topo, Routing(topo), 6, 1e-3, 1.0)
    with pytest.raises(InputError, match="unknown network"):
        EmulationConfig(network="wifi")
    cfg = EmulationConfig(rate_scale=1e-7)
    with pytest.raises(InputError, match="rate_scale"):
        cfg.run_workload(topo, Routing(topo), all_reduce(1000), Ring())


@needs_netns
def test_emulation_runs_in_the_gray_failure_sweep_next_to_flowsim(tmp_path):
    import pandas as pd

    gen = [str(PYTHON.rsplit("/", 1)[0] + "/chakra_generator"), "--num_npus", "8"]
    subprocess.run(gen, cwd=tmp_path, check=True, capture_output=True)
    cmd = [
        PYTHON, "-m", "m4ray.sweeps", "+experiment=gray_failure", "grid=smoke", "grid.n=[2]",
        "grid.r=[4]", "workload=chakra", f"workload.prefix={tmp_path}/ALL_REDUCE",
        "backends=[emulation,flowsim]", "backend_options.emulation.size_scale=1.0",
        "collective=ring",  # one ring (the experiment's SimAI collective runs 8 channels)
        "ray.num_cpus=2", "progress=false", f"paths.output_dir={tmp_path}", "name=emu",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    frame = pd.read_parquet(tmp_path / "emu" / "results.parquet")
    assert set(frame.backend) == {"emulation", "flowsim"} and (frame.status == "ok").all()
    emu = frame[frame.backend == "emulation"].iloc[0]
    assert emu.completion_time_s > 0 and emu.n_flows == 8 * 14
    assert netns.leftovers() == []
