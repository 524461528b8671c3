"""Load on the m4 Serve endpoint: N simulated clients for a minute, sessions opened and closed
continuously; throughput, latency, errors and the replicas' memory over time.

    .venv/bin/python bench/serve_load.py                     # idle, then 8 clients, 60 s each
    .venv/bin/python bench/serve_load.py --clients 1 8 --seconds 30
    .venv/bin/python bench/serve_load.py --clients 0 8 --seconds 180   # idle control, then load

Each client is a thread that loops: open a session on a 16-GPU rail cluster, post
``--requests`` event windows (two arrivals each, and two completions once 8 flows are active),
close it. Every failed call is counted, never raised. The resident memory of every Serve
process (the ingress and model replicas, the proxy and the controller; read from /proc) is
sampled every 2 s after a 10 s warm-up; a leak shows as growth from the first sample to the last
and, unlike a warm-up, keeps its pace in the second half of the run. Each deployment also counts
its live Python objects (``memory()`` on its handle, after a full collection) at the end of the
warm-up and after the run: sessions or model state that are kept would show there, while the RSS
also moves with the allocator's and Ray's native memory.
"""

from __future__ import annotations

import argparse
import os
import socket
import threading
import time
from pathlib import Path

import numpy as np

from m4ray.runtime.cluster import RAY_ENV_DEFAULTS
from m4ray.serve.client import SessionClient
from m4ray.sim.m4.engine import Arrival
from m4ray.sim.routing import Routing
from m4ray.sim.topologies import RailClusterSpec
from m4ray.sweeps.report import format_table

WARMUP_S = 10.0


def serve_rss_mb() -> dict[str, float]:
    """Resident memory (MB) of this machine's Serve processes, by process title."""
    out: dict[str, float] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="ignore")
            if "Serve" not in cmdline and "ProxyActor" not in cmdline:
                continue
            status = (proc / "status").read_text()
        except OSError:
            continue
        rss = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS"))
        title = cmdline.split()[0].removeprefix("ray::").split(".")[0]  # the title names the
        out[f"{title} ({proc.name})"] = rss / 1024  # running method: keep the actor's name
    return out


def client(url, topo, routing, *, stop_at, requests, seed, stats, lock) -> None:
    rng = np.random.default_rng(seed)
    hosts = sorted(topo.hosts)
    while time.perf_counter() < stop_at:
        try:
            session = SessionClient(url, topo, routing)
        except Exception:
            with lock:
                stats["errors"] += 1
            continue
        active: list[int] = []
        t, next_id = 0.0, 0
        for _ in range(requests):
            arrivals = []
            for _ in range(2):
                src, dst = rng.choice(len(hosts), 2, replace=False)
                size = int(rng.integers(10_000, 1_000_000))
                arrivals.append(Arrival(next_id, hosts[src], hosts[dst], size))
                next_id += 1
            done = active[:2] if len(active) >= 8 else []
            start = time.perf_counter()
            try:
                session.events(t, arrivals, done)
            except Exception:
                with lock:
                    stats["errors"] += 1
                break
            with lock:
                stats["latency"].append(time.perf_counter() - start)
            active = [f for f in active if f not in done] + [a.id for a in arrivals]
            t += 1e-6
        try:
            session.close()
            with lock:
                stats["sessions"] += 1
        except Exception:
            with lock:
                stats["errors"] += 1


def objects(handles) -> dict[str, dict]:
    """Each deployment's ``memory()``: RSS, live Python objects, most common types."""
    return {name: handle.memory.remote().result() for name, handle in handles.items()}


def run(url, topo, routing, handles, *, n_clients, seconds, requests) -> dict:
    stats = {"latency": [], "errors": 0, "sessions": 0}
    lock = threading.Lock()
    start = time.perf_counter()
    stop_at = start + seconds
    threads = [
        threading.Thread(
            target=client,
            args=(url, topo, routing),
            kwargs={
                "stop_at": stop_at,
                "requests": requests,
                "seed": i,
                "stats": stats,
                "lock": lock,
            },
        )
        for i in range(n_clients)
    ]
    for th in threads:
        th.start()
    samples: list[tuple[float, float]] = []
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    before: dict[str, dict] = {}
    while time.perf_counter() < stop_at or any(th.is_alive() for th in threads):
        time.sleep(2.0)
        elapsed = time.perf_counter() - start
        if elapsed >= WARMUP_S:
            last = serve_rss_mb()
            first = first or last
            before = before or objects(handles)
            samples.append((elapsed, sum(last.values())))
    for th in threads:
        th.join()
    after = objects(handles)
    half = (
        [(t, mb) for t, mb in samples if t >= samples[-1][0] / 2 + WARMUP_S / 2] if samples else []
    )
    wall = time.perf_counter() - start
    lat = np.array(stats["latency"]) * 1e3
    return {
        "requests/s": len(lat) / wall,
        "sessions": stats["sessions"],
        "p50": float(np.median(lat)) if len(lat) else float("nan"),
        "p99": float(np.quantile(lat, 0.99)) if len(lat) else float("nan"),
        "errors": stats["errors"],
        "rss_first": samples[0][1] if samples else float("nan"),
        "rss_last": samples[-1][1] if samples else float("nan"),
        "rss_max": max(s[1] for s in samples) if samples else float("nan"),
        "second_half": (half[-1][1] - half[0][1]) / max(half[-1][0] - half[0][0], 1e-9) * 60
        if len(half) > 1
        else float("nan"),
        "by_process": {k: (first[k], last.get(k, float("nan"))) for k in first},
        "objects": {k: (before[k], after[k]) for k in before},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--clients", type=int, nargs="+", default=[0, 8], help="0: idle Ray, the control"
    )
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--requests", type=int, default=20, help="event windows per session")
    args = parser.parse_args()
    for key, value in RAY_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    import httpx
    import ray
    from ray import serve

    from m4ray.serve.app import AppArgs, build

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(build(AppArgs()), name="m4", route_prefix="/m4")
    url = f"http://127.0.0.1:{port}/m4"
    handles = {
        name: serve.get_deployment_handle(name, app_name="m4") for name in ("M4Sessions", "M4Model")
    }
    topo = RailClusterSpec(servers=2).build()
    routing = Routing(topo)
    rows = []
    for n in args.clients:
        r = run(
            url, topo, routing, handles, n_clients=n, seconds=args.seconds, requests=args.requests
        )
        open_sessions = httpx.get(f"{url}/health").json()["sessions"]
        growth = r["rss_last"] - r["rss_first"]
        rows.append(
            [
                n,
                f"{args.seconds:g}",
                r["sessions"],
                f"{r['requests/s']:.1f}",
                f"{r['p50']:.1f}",
                f"{r['p99']:.1f}",
                r["errors"],
                open_sessions,
                f"{r['rss_first']:.0f} -> {r['rss_last']:.0f} (max {r['rss_max']:.0f})",
                f"{growth:+.0f} MB ({growth / r['rss_first']:+.1%})",
                f"{r['second_half']:+.1f}",
                " ".join(
                    f"{name[2:]} {b['objects']}->{a['objects']}"
                    for name, (b, a) in r["objects"].items()
                ),
            ]
        )
        print(f"  {n} clients done; Serve processes, MB first -> last:", flush=True)
        for name, (mb0, mb1) in sorted(r["by_process"].items()):
            print(f"    {name}: {mb0:.0f} -> {mb1:.0f} ({mb1 - mb0:+.1f})", flush=True)
        for name, (b, a) in r["objects"].items():
            print(f"    {name} Python objects by type, after warm-up: {b['top']}", flush=True)
            print(f"    {name} Python objects by type, after the run:  {a['top']}", flush=True)
    serve.shutdown()
    ray.shutdown()
    head = ["clients", "s", "sessions", "req/s", "p50 ms", "p99 ms", "errors", "left open"]
    tail = ["Serve RSS MB (first -> last)", "growth", "MB/min 2nd half", "Python objects"]
    print(format_table([*head, *tail], rows))


if __name__ == "__main__":
    main()
