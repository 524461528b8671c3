"""``python -m m4ray.sweeps +experiment=serve``: start Ray Serve with the m4 application.

Starts (or joins, with ``ray.address``) Ray, runs the application on ``host:port`` under
``route_prefix``, checks it end to end with one session (a flow pair on a small rail cluster),
prints the URLs, and keeps serving until interrupted (``serve.hold=false``: stop after the check).
"""

from __future__ import annotations

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
