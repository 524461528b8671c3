"""Ray Serve m4 throughput and latency: 1, 8 and 32 concurrent simulated clients, batched vs not.

    .venv/bin/python bench/serve_speed.py [--seconds 8] [--clients 1 8 32]

Each client is a thread with its own session on a 16-GPU rail cluster; every request posts two
arrivals (and, past ``--active`` active flows, two completions) 1 µs of simulated time after the
previous one, which is one model step over the flows of the touched components. The application runs
twice, with ``@serve.batch`` (up to 64 requests per batch) and with ``max_batch_requests=1``;
one table prints steps/s, flows/s (flows stepped), p50/p99 request latency and the mean batch.
Client threads, the HTTP proxy, the ingress and the model replica share this machine's cores.
"""

from __future__ import annotations

import argparse
import os
import socket
import threading
import time

import numpy as np

from m4ray.runtime.cluster import RAY_ENV_DEFAULTS
from m4ray.serve.client import SessionClient
from m4ray.sim.m4.engine import Arrival
from m4ray.sim.routing import Routing
from m4ray.sim.topologies import RailClusterSpec
from m4ray.sweeps.report import format_table


def client_loop(url, topo, routing, seconds, *, seed, out, active_flows=8):
    rng = np.random.default_rng(seed)
    hosts = sorted(topo.hosts)
    c = SessionClient(url, topo, routing)
    active: list[int] = []
    latencies, flows, next_id, t = [], 0, 0, 0.0
    stop = time.perf_counter() + seconds
    while time.perf_counter() < stop:
        arrivals = []
        for _ in range(2):
            src, dst = rng.choice(len(hosts), 2, replace=False)
            arrivals.append(
                Arrival(next_id, hosts[src], hosts[dst], int(rng.integers(10_000, 1_000_000)))
            )
            next_id += 1
        done = active[:2] if len(active) >= active_flows else []
        start = time.perf_counter()
        predictions = c.events(t, arrivals, done)
        latencies.append(time.perf_counter() - start)
        flows += len(predictions)
        active = [f for f in active if f not in done] + [a.id for a in arrivals]
        t += 1e-6
    c.close()
    out.append((latencies, flows))


def measure(url, topo, routing, n_clients, seconds, *, active_flows=8):
    out: list = []
    threads = [
        threading.Thread(
            target=client_loop,
            args=(url, topo, routing, seconds),
            kwargs={"seed": i, "out": out, "active_flows": active_flows},
        )
        for i in range(n_clients)
    ]
    start = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - start
    lat = np.concatenate([np.array(x[0]) for x in out])
    return len(lat) / wall, sum(x[1] for x in out) / wall, lat


def paper_sized_checkpoint() -> str:
    """A checkpoint with m4's sizes and random weights (costs, not answers), in a temp dir."""
    import tempfile

    import torch

    from m4ray.models.checkpoint import export
    from m4ray.models.m4 import M4Model, ModelConfig

    torch.manual_seed(0)
    model = M4Model(ModelConfig(hidden=200, gnn_hidden=300, dropout=0.0))
    directory = tempfile.mkdtemp(prefix="m4-paper-random-")
    export(model, directory, {"note": "random weights, benchmark only"}, "random weights\n")
    return directory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--active", type=int, default=8, help="active flows per session")
    parser.add_argument(
        "--checkpoint",
        default="m4-small",
        help="a name under checkpoints/ or a directory; 'paper-random' = the paper's sizes "
        "(hidden 200, GNN 300) with random weights, for the cost of a full-size model",
    )
    args = parser.parse_args()
    for key, value in RAY_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    import ray
    from ray import serve

    from m4ray.serve.app import AppArgs, build

    checkpoint = args.checkpoint
    if checkpoint == "paper-random":
        checkpoint = paper_sized_checkpoint()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    url = f"http://127.0.0.1:{port}/m4"
    topo = RailClusterSpec(servers=2).build()
    routing = Routing(topo)
    rows = []
    for label, batch in (("batched (64)", 64), ("max_batch_size=1", 1)):
        app = build(AppArgs(checkpoint=checkpoint, max_batch_requests=batch))
        serve.run(app, name="m4", route_prefix="/m4")
        model = serve.get_deployment_handle("M4Model", app_name="m4")
        measure(url, topo, routing, 2, 1.0)  # warm
        for n in args.clients:
            model.stats.remote(reset=True).result()
            steps, flows, lat = measure(
                url, topo, routing, n, args.seconds, active_flows=args.active
            )
            totals = model.stats.remote(reset=True).result()
            n_batches = max(totals["batches"], 1)
            rows.append(
                [
                    label,
                    n,
                    f"{steps:.0f}",
                    f"{flows:.0f}",
                    f"{np.percentile(lat, 50) * 1e3:.1f}",
                    f"{np.percentile(lat, 99) * 1e3:.1f}",
                    f"{totals['requests'] / n_batches:.1f}",
                    f"{totals['flows'] / n_batches:.0f}",
                ]
            )
            print(" ".join(map(str, rows[-1])), flush=True)
    header = [
        "app",
        "clients",
        "steps/s",
        "flows/s",
        "p50 ms",
        "p99 ms",
        "req/batch",
        "flows/batch",
    ]
    print(
        f"{args.checkpoint}, {args.active} active flows per session, {args.seconds:g} s per point"
    )
    print(format_table(header, rows))
    serve.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    main()
