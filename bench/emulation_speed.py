"""Emulation backend: achieved goodput of tc-shaped links vs the configured rate, and emulation
wall time vs ns-3 wall time for one scaled gray-failure scenario (needs root + iproute2).

    .venv/bin/python bench/emulation_speed.py [--rates 10 50 100 200 500] [--skip-scenario]
"""

from __future__ import annotations

import argparse
import threading
import time

from m4ray.emulation import netns
from m4ray.emulation.transport import Transport
from m4ray.sim.routing import Routing
from m4ray.sim.topology import Cable, Topology


def goodput(rate_mbps: float, seconds: float = 1.0) -> float:
    """Mbps of payload from rank 0 to rank 1 through a link shaped to ``rate_mbps``."""
    cables = (Cable(0, 2, rate_mbps * 1e9, 1e-6), Cable(1, 2, rate_mbps * 1e9, 1e-6))
    topo = Topology(n_nodes=3, switches=(2,), cables=cables)
    up, down = netns.plan(topo, Routing(topo), 2, 1e-3, 1.0)
    nbytes = int(rate_mbps * 1e6 / 8 * seconds)
    with netns.NamespaceNetwork("bench", up, down) as net:
        addresses = [(netns.address(r), 17900) for r in range(2)]
        ends: list = [None, None]

        def setup(rank: int) -> None:
            netns.enter(net.namespace(rank))
            ends[rank] = Transport(rank, addresses)

        for rank in (0, 1):
            t = threading.Thread(target=setup, args=(rank,))
            t.start()
            t.join()
        result = {}

        def send() -> None:
            netns.enter(net.namespace(0))
            ends[0].send(1, 0, 1000)  # warm the connection
            result["t0"] = time.time()
            ends[0].send(1, 1, nbytes)

        sender = threading.Thread(target=send)
        sender.start()
        ends[1].recv(0, 0)
        arrived = ends[1].recv(0, 1).arrived_s
        sender.join()
        for end in ends:
            end.close()
    return nbytes * 8 / (arrived - result["t0"]) / 1e6


def scenario_walls() -> list[tuple[str, float, float]]:
    import ray

    from m4ray.emulation.engine import EmulationConfig
    from m4ray.sim.failures import GrayFailure
    from m4ray.sim.routing import WireFormat
    from m4ray.sim.scenario import Scenario, simulate
    from m4ray.workload.simai import SimAIWorkloadSpec

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    rows = []
    base = {
        "failure": GrayFailure(n_degraded=2, reduction=4),
        "workload": SimAIWorkloadSpec(path="microAllReduce", scale=0.02),
        "wire": WireFormat(mtu_bytes=8948, header_bytes=54),
    }
    from m4ray.sim.flowsim import FlowSimConfig
    from m4ray.sim.m4 import M4Config
    from m4ray.sim.ns3.backend import Ns3Config

    for name, backend in (
        ("ns3", Ns3Config()),
        ("emulation", EmulationConfig(rate_scale=1e-3, size_scale=1e-2)),
        ("m4", M4Config()),
        ("flowsim", FlowSimConfig()),
    ):
        row, _ = simulate(Scenario(backend=name, backend_config=backend, **base))
        if row["status"] != "ok":
            print(f"{name} failed: {row.get('error')}")
        rows.append((name, row.get("completion_time_s", float("nan")), row["wall_s"]))
    ray.shutdown()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[10, 50, 100, 200, 500])
    parser.add_argument("--skip-scenario", action="store_true")
    args = parser.parse_args()
    reason = netns.available()
    if reason:
        raise SystemExit(f"network namespaces unavailable: {reason}")
    print(f"{'configured Mbps':>16}{'goodput Mbps':>14}{'ratio':>8}")
    for rate in args.rates:
        got = goodput(rate)
        print(f"{rate:>16.0f}{got:>14.1f}{got / rate:>8.3f}")
    if args.skip_scenario:
        return
    print("\nmicroAllReduce x 0.02, rail32, N=2 R=4 (emulation: rates x 1e-3, bytes x 1e-2)")
    print(f"{'backend':>10}{'completion ms':>15}{'wall s':>9}")
    for name, completion, wall in scenario_walls():
        print(f"{name:>10}{completion * 1e3:>15.3f}{wall:>9.1f}")


if __name__ == "__main__":
    main()
