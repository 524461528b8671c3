"""The ns-3 backend against physics and against flowSim, with real ns-3 in Ray worker processes
(an ns-3 assertion kills its process; a worker can die, the test session cannot)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from m4ray.runtime.cluster import RayConfig
from m4ray.runtime.fanout import run_many
from m4ray.sim.collectives import Ring
from m4ray.sim.failures import degrade
from m4ray.sim.flows import Flow
from m4ray.sim.flowsim import FlowSimConfig
from m4ray.sim.ns3.backend import Ns3Config
from m4ray.sim.replay import Replay
from m4ray.sim.routing import Routing, WireFormat
from m4ray.sim.scenario import Scenario, flow_table
from m4ray.sim.topologies import fat_tree
from m4ray.sim.topology import Cable, Topology
from m4ray.sim.trace import run_trace
from m4ray.sim.workload import Collective, CollectiveKind, Workload
from m4ray.sweeps.grid import GridConfig, expand
from m4ray.sweeps.runner import flows_path, load_done, run_and_store
from m4ray.workload.simai import SimAIWorkloadSpec

JUMBO = WireFormat(mtu_bytes=8948, header_bytes=54)
MB = 1_000_000


def dumbbell(bw: float, delay: float = 1e-6) -> Topology:
    """Hosts 0, 1 on switch 4; hosts 2, 3 on switch 5; one switch-to-switch link."""
    return Topology(
        n_nodes=6,
        switches=(4, 5),
        cables=(
            Cable(0, 4, bw, delay),
            Cable(1, 4, bw, delay),
            Cable(4, 5, bw, delay),
            Cable(2, 5, bw, delay),
            Cable(3, 5, bw, delay),
        ),
    )


def _trace(topo, flows, backend):
    routing = Routing(topo, wire=JUMBO)
    table = run_trace(topo, flows, backend, routing)
    return table.column("fct_s").to_numpy(), table.column("ideal_fct_s").to_numpy()


@pytest.fixture(scope="module")
def remote(ray_local):
    return ray_local.remote(_trace)


def run(remote, ray, topo, flows, backend=None):
    return ray.get(remote.remote(topo, flows, backend or Ns3Config()))


@pytest.mark.parametrize("bw", [10e9, 100e9])
def test_lone_flow_is_close_to_ideal(ray_local, remote, bw):
    fct, ideal = run(remote, ray_local, dumbbell(bw), [Flow(0, 0, 2, 10 * MB, 0.0)])
    assert fct[0] == pytest.approx(ideal[0], rel=0.03)


def test_sharing_and_degradation(ray_local, remote):
    topo = dumbbell(100e9)
    lone, _ = run(remote, ray_local, topo, [Flow(0, 0, 2, 10 * MB, 0.0)])
    shared, _ = run(
        remote, ray_local, topo, [Flow(0, 0, 2, 10 * MB, 0.0), Flow(1, 1, 3, 10 * MB, 0.0)]
    )
    assert shared / lone[0] == pytest.approx([2.0, 2.0], rel=0.1)  # each gets about half
    slow = degrade(topo, [], 1)  # no host degraded: degrade the switch-to-switch cable by hand
    cables = list(slow.cables)
    cables[2] = dataclasses.replace(cables[2], bandwidth_bps=25e9)
    degraded, _ = run(
        remote, ray_local, slow.replace_cables(tuple(cables)), [Flow(0, 0, 2, 10 * MB, 0.0)]
    )
    assert degraded[0] / lone[0] == pytest.approx(4.0, rel=0.08)


def test_same_scenario_twice_gives_identical_fcts(ray_local, remote):
    topo = fat_tree(k=4, bandwidth_bps=10e9)
    rng = np.random.default_rng(1)
    flows = [
        Flow(i, int(s), int(d), int(rng.integers(10_000, 2 * MB)), float(i) * 20e-6)
        for i, (s, d) in enumerate(rng.choice(16, (12, 2), replace=True))
        if s != d
    ]
    first, _ = run(remote, ray_local, topo, flows)
    second, _ = run(remote, ray_local, topo, flows)
    assert np.array_equal(first, second)


def test_agrees_with_flowsim_when_light_and_is_slower_under_congestion(ray_local, remote):
    topo = fat_tree(k=4, bandwidth_bps=10e9)
    light = [Flow(i, i, 15 - i, 2 * MB, i * 5e-3) for i in range(6)]  # one flow at a time
    ns3, _ = run(remote, ray_local, topo, light)
    fluid, _ = run(remote, ray_local, topo, light, FlowSimConfig())
    assert ns3 == pytest.approx(fluid, rel=0.05)
    # short flows behind a long one on the same access link: ns-3 TCP queues them (ECN keeps ~K
    # packets standing), the fluid model gives them their fair share at once (the RDMA window
    # keeps the standing queue under one BDP: test_rdma.py covers its congestion)
    congested = [Flow(0, 0, 15, 20 * MB, 0.0)]
    congested += [Flow(i, 1 + i % 7, 15, 20_000, 2e-3 + i * 1e-3) for i in range(1, 9)]
    ns3, _ = run(remote, ray_local, topo, congested, Ns3Config(transport="tcp"))
    fluid, _ = run(remote, ray_local, topo, congested, FlowSimConfig())
    assert fluid[1:].mean() < 0.8 * ns3[1:].mean()


def _ring(n: int, size: int, send_latency: float, ns3: Ns3Config | None = None):
    topo = Topology(
        n_nodes=n + 1, switches=(n,), cables=tuple(Cable(i, n, 10e9, 1e-6) for i in range(n))
    )
    workload = Workload(
        n_ranks=n,
        nodes=[
            Collective(
                id=r, rank=r, kind=CollectiveKind.ALL_REDUCE, size_bytes=size, group=tuple(range(n))
            )
            for r in range(n)
        ],
    )
    routing = Routing(topo, wire=JUMBO)
    replay = Replay(
        workload,
        (ns3 or Ns3Config()).build(topo, routing),
        routing,
        Ring(),
        send_latency_s=send_latency,
    )
    result = replay.run()
    return result.completion_time_s, flow_table(result.flows).to_pandas()


def test_ring_all_reduce_steps_wait_for_their_predecessors(ray_local):
    n, size, latency = 4, 4 * MB, 3e-6
    completion, flows = ray_local.get(ray_local.remote(_ring).remote(n, size, latency))
    assert len(flows) == n * 2 * (n - 1) and flows.finish_s.notna().all()
    for rank in range(n):
        sent = flows[flows.src == rank].sort_values("start_s")
        received = flows[flows.dst == rank].sort_values("finish_s")
        # step k's send starts only after the step k-1 chunk arrived (plus the send latency)
        gaps = sent.start_s.to_numpy()[1:] - received.finish_s.to_numpy()[:-1]
        assert (gaps >= latency - 1e-9).all()
    chunk_bits = JUMBO.wire_bytes(size // n) * 8
    assert completion >= 2 * (n - 1) * (latency + chunk_bits / 10e9)


def test_a_send_delay_is_a_longer_send_latency(ray_local):
    """``send_delay_s`` (backend ``ns3_again``) sends every flow that much later, as a longer
    send latency does: the ring ends at the same picosecond, later than without it."""
    n, size, latency, delay = 4, MB // 4, 3e-6, 2e-9
    ring = ray_local.remote(_ring)
    later, longer, plain = ray_local.get(
        [
            ring.remote(n, size, latency, Ns3Config(send_delay_s=delay)),
            ring.remote(n, size, latency + delay),
            ring.remote(n, size, latency),
        ]
    )
    assert later[0] == pytest.approx(longer[0], abs=2e-12)
    assert later[0] - plain[0] == pytest.approx(2 * (n - 1) * delay, abs=1e-10)


def test_failures_become_rows_and_other_scenarios_finish(ray_local, tmp_path):
    template = Scenario(workload=SimAIWorkloadSpec(path="microAllReduce", scale=0.001), wire=JUMBO)
    grid = GridConfig(n=[8], r=[4])
    broken = Ns3Config()
    broken.rdma.pfc_threshold_bytes = 2 * broken.rdma.buffer_bytes  # checked again at build
    options = {
        "flowsim": FlowSimConfig(),
        "ns3": broken,
        "ns3_slow": Ns3Config(wall_limit_s=1.0),
    }
    bad, ok = expand(grid, template, ["ns3", "flowsim"], options, 0)
    slow = expand(
        grid,
        dataclasses.replace(template, workload=SimAIWorkloadSpec(path="microAllReduce", scale=1.0)),
        ["ns3_slow"],
        options,
        0,
    )[0]
    rows = run_many(
        [bad, slow, ok], tmp_path, RayConfig(), progress=False, task=run_and_store, load=load_done
    )
    assert [r["status"] for r in rows] == ["failed", "failed", "ok"]
    assert "pfc_threshold_bytes" in rows[0]["error"]
    assert "wall-clock limit of 1 s" in rows[1]["error"]
    assert flows_path(tmp_path, slow).exists()  # what completed before the stop is kept


def _lone_gpu_flow(failure, size):
    from m4ray.sim.replays import schedule_onset
    from m4ray.sim.topologies import rail_cluster

    base = rail_cluster()
    topo = failure.apply(base)
    routing = Routing(topo, wire=JUMBO)
    backend = Ns3Config().build(topo, routing)
    schedule_onset(backend, failure, base)
    done = {}
    backend.send(Flow(0, 0, 8, size, 0.0), done.setdefault)
    backend.run()
    return done[0]


def test_mid_run_rate_drop_and_packet_loss(ray_local):
    from m4ray.sim.failures import GrayFailure

    task = ray_local.remote(_lone_gpu_flow)
    size = 20 * MB
    healthy, late, lossy, lossless = ray_local.get(
        [
            task.remote(GrayFailure(n_degraded=0, reduction=1), size),
            task.remote(GrayFailure(n_degraded=2, reduction=4, onset_s=200e-6), size),
            task.remote(GrayFailure(n_degraded=2, reduction=4, loss_rate=0.01), size),
            task.remote(GrayFailure(n_degraded=2, reduction=4), size),
        ]
    )
    bits = JUMBO.wire_bytes(size) * 8
    sent_before = 400e9 * (200e-6 - (healthy - bits / 400e9))  # healthy run's pace until onset
    expected = 200e-6 + (bits - sent_before) / 100e9
    assert late == pytest.approx(expected, rel=0.05)
    assert healthy < late < lossless
    assert lossy > 1.02 * lossless  # retransmissions cost time


def test_trace_mode_cli_with_ns3(tmp_path):
    import subprocess

    import pyarrow.csv as pacsv

    from m4ray.sim.topology import write_topology
    from tests.conftest import PYTHON, write

    topo = write_topology(dumbbell(10e9), tmp_path / "topo.txt")
    flows = write(tmp_path / "flows.txt", "2\n0 0 2 3 100 1000000 0\n1 1 3 3 100 1000000 0\n")
    out = tmp_path / "fct.csv"
    proc = subprocess.run(
        [
            PYTHON,
            "-m",
            "m4ray.sim",
            f"trace.topology={topo}",
            f"trace.flows={flows}",
            f"trace.output={out}",
            "backend=ns3",
            "wire=jumbo",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = pacsv.read_csv(out)
    slowdown = table.column("slowdown").to_numpy()
    assert table.num_rows == 2 and (slowdown >= 1 - 1e-6).all() and (slowdown > 1.5).any()


def test_lockstep_rounds_run_on_ns3_as_the_full_replay_does():
    """workload.lockstep on ns-3: each distinct collective step is one packet-level run, and
    the iteration is the full ns-3 replay's (measured 1.3e-5 apart; 0.5 s against 4.9 s)."""
    from m4ray.sim.failures import GrayFailure
    from m4ray.sim.routing import WireFormat
    from m4ray.sim.scenario import Scenario, simulate
    from m4ray.workload.simai import SimAIWorkloadSpec

    rows = []
    for lockstep in (False, True):
        workload = SimAIWorkloadSpec(path="microAllReduce", scale=0.01, lockstep=lockstep)
        scenario = Scenario(
            failure=GrayFailure(n_degraded=8, reduction=4),
            workload=workload,
            backend="ns3",
            backend_config=Ns3Config(),
            wire=WireFormat(mtu_bytes=8948, header_bytes=54),
        )
        row, _ = simulate(scenario)
        assert row["status"] == "ok", row["error"]
        rows.append(row)
    assert rows[1]["completion_time_s"] == pytest.approx(rows[0]["completion_time_s"], rel=1e-3)
    assert rows[1]["n_flows"] == rows[0]["n_flows"]
