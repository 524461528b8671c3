"""``python -m m4ray.sweeps +experiment=serve``: start Ray Serve with the m4 application.

Starts (or joins, with ``ray.address``) Ray, runs the application on ``host:port`` under
``route_prefix``, checks it end to end with one session (a flow pair on a small rail cluster),
prints the URLs, and keeps serving until interrupted (``serve.hold=false``: stop after the check).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from m4ray.errors import InputError

LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(kw_only=True, slots=True)
class ServeSettings:
    """Where to serve (``host``, ``port``, ``route_prefix``), whether to keep serving after the
    self-check (``hold``), and the application's arguments (``app``: the fields of
    :class:`m4ray.serve.app.AppArgs`, e.g. ``checkpoint``, ``max_batch_requests``)."""

    host: str = "127.0.0.1"
    port: int = 8000
    route_prefix: str = "/m4"
    app: dict[str, Any] = field(default_factory=dict)
    hold: bool = True
    m3_checkpoint: str | None = None  # also serve this m3 checkpoint at <host:port>/m3

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}{self.route_prefix}"


def app_args(settings: ServeSettings):
    """``settings.app`` as :class:`~m4ray.serve.app.AppArgs`; a bad value names its key."""
    from pydantic import ValidationError

    from m4ray.serve.app import AppArgs

    try:
        return AppArgs(**settings.app)
    except ValidationError as err:
        first = err.errors()[0]
        key = ".".join(str(part) for part in first["loc"])
        raise InputError(first["msg"], field=f"serve.app.{key}") from None


def start(settings: ServeSettings, ray_cfg) -> str:
    """Deploy the application; returns its base URL."""
    from ray import serve

    from m4ray.runtime.cluster import start_ray
    from m4ray.serve.app import build
    from m4ray.sim.m4.backend import checkpoint_dir

    args = app_args(settings)
    if args.token is None and settings.host not in LOOPBACK:
        raise InputError(
            f"serving on {settings.host} opens the API to that network: set serve.app.token",
            field="serve.app.token",
        )
    checkpoint_dir(args.checkpoint)  # a bad name fails before anything starts
    start_ray(ray_cfg)
    serve.start(http_options={"host": settings.host, "port": settings.port})
    serve.run(build(args), name="m4", route_prefix=settings.route_prefix)
    if settings.m3_checkpoint:
        from m4ray.serve import m3

        serve.run(
            m3.build(m3.M3Args(checkpoint=settings.m3_checkpoint)), name="m3", route_prefix="/m3"
        )
        print(
            f"m3 corrections serving at http://{settings.host}:{settings.port}/m3 (POST /predict)"
        )
    return settings.url


def self_check(url: str, settings: ServeSettings) -> dict[str, float]:
    """One session on a 16-GPU rail cluster: two flows into one host, predictions back."""
    from m4ray.serve.client import SessionClient
    from m4ray.sim.m4.engine import Arrival
    from m4ray.sim.routing import Routing
    from m4ray.sim.topologies import RailClusterSpec

    topo = RailClusterSpec(servers=2).build()
    routing = Routing(topo)
    hosts = sorted(topo.hosts)
    client = SessionClient(url, topo, routing, token=app_args(settings).token)
    try:
        flows = [Arrival(i, hosts[i], hosts[8], 1_000_000) for i in range(2)]
        return client.events(0.0, flows, [])
    finally:
        client.close()


def run(sweep, raw_config: dict[str, Any]) -> str:
    settings: ServeSettings = sweep.serve
    if not isinstance(settings, ServeSettings):
        raise InputError("this experiment needs a 'serve' section", field="serve")
    t0 = time.perf_counter()
    url = start(settings, sweep.ray)
    predictions = self_check(url, settings)
    print(
        f"m4 backend serving at {url} (checkpoint {app_args(settings).checkpoint}), "
        f"ready in {time.perf_counter() - t0:.1f} s"
    )
    print(f"  API docs: {url}/docs   schema: {url}/openapi.json")
    print(
        "  self-check: 2 flows -> predicted finish (us): "
        + ", ".join(f"{f}: {t * 1e6:.2f}" for f, t in sorted(predictions.items()))
    )
    print(
        f"  simulate through it: python -m m4ray.sweeps +experiment=gray_failure "
        f"'backends=[m4_served]' backend_options.m4_served.url={url}"
    )
    if settings.hold:  # Ctrl-C / SIGTERM: the entry point shuts Serve and Ray down cleanly
        print("serving; Ctrl-C to stop", flush=True)
        while True:
            time.sleep(3600)
    from ray import serve

    serve.shutdown()
    return url
