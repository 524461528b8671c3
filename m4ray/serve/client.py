"""``backend=m4_served``: the NetworkBackend protocol on top of the m4 Serve application.

Two ways in (``via``):

* ``http`` — for simulators anywhere: :class:`SessionClient` speaks the session API (stdlib
  ``http.client`` with one kept-alive connection, so simulators need no extra dependency).
  :class:`ServedEngine` buffers the arrivals and completions of a window and posts them in one
  request when the backend asks for an update; the session (engine state) lives in the ingress.
* ``handle`` — for Ray tasks on the same cluster (a sweep): one hop. The engine state stays in
  the task (an in-process :class:`~m4ray.sim.m4.engine.M4Engine`) and only its step goes to the
  model deployment, through a Serve deployment handle (:class:`HandleStepper`): no HTTP, no
  JSON, no ingress; the model deployment batches the steps of all tasks into shared passes.

Either way :class:`~m4ray.sim.m4.backend.M4Backend` keeps the clock exactly as for the
in-process engine, so a served simulation makes one call per update window, never one per flow.
"""

from __future__ import annotations

import http.client
import json
import math
import weakref
from dataclasses import asdict, dataclass
from typing import Any, ClassVar
from urllib.parse import urlsplit

import numpy as np

from m4ray.errors import InputError, M4rayError, SimulationError
from m4ray.models.components import Batching
from m4ray.sim.m4.arrival import Arrival
from m4ray.sim.m4.backend import M4Backend, M4Settings
from m4ray.sim.ns3.backend import Ns3Config
from m4ray.sim.routing import Routing
from m4ray.sim.topology import Topology, format_topology


class SessionClient:
    """One simulation's session on an m4 Serve endpoint (``url`` includes the route prefix)."""

    def __init__(
        self,
        url: str,
        topology: Topology,
        routing: Routing,
        network: Ns3Config | None = None,
        *,
        timeout_s: float = 60.0,
        token: str | None = None,
        batching: Batching | None = None,
        extrapolate: bool = False,
        anchor: str = "fair",
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise InputError(f"expected http://host:port/prefix, got '{url}'", field="url")
        self._host, self._port = parts.hostname, parts.port or 80
        self._prefix = parts.path.rstrip("/")
        self._timeout = timeout_s
        self._auth = {} if token is None else {"Authorization": f"Bearer {token}"}
        self._conn: http.client.HTTPConnection | None = None
        body = {
            "topology": format_topology(topology),
            "routing_seed": routing.seed,
            "mtu_bytes": routing.wire.mtu_bytes,
            "header_bytes": routing.wire.header_bytes,
            "network": asdict(network or Ns3Config()),
            "extrapolate": extrapolate,
            "anchor": anchor,
        }
        if batching is not None:
            body["batch_above_flows"] = batching.above_flows
            body["batch_fraction"] = batching.fraction
            body["batch_frozen_above"] = batching.frozen_above
        info = self.request("POST", "/sessions", body)
        self.session_id: str = info["session_id"]
        self.info = info

    def events(
        self,
        time_s: float,
        arrivals: list[Arrival] = (),
        completions: list[int] = (),
        sequence: list[tuple[float, Arrival | int]] = (),
    ) -> dict[int, float]:
        """Post what happened up to ``time_s`` — ``sequence`` in order, each at its own time,
        then ``completions`` and ``arrivals`` at ``time_s`` — and update the model at
        ``time_s``; predicted completion time per changed flow."""
        body = {
            "time_s": time_s,
            "sequence": [
                {"time_s": t, "arrival": _arrival(e)}
                if isinstance(e, Arrival)
                else {"time_s": t, "completion": {"id": e}}
                for t, e in sequence
            ],
            "arrivals": [_arrival(a) for a in arrivals],
            "completions": list(completions),
        }
        out = self.request("POST", f"/sessions/{self.session_id}/events", body)
        return {p["id"]: p["finish_s"] for p in out["predictions"]}

    def close(self) -> None:
        try:
            self.request("DELETE", f"/sessions/{self.session_id}")
        except (OSError, M4rayError):
            pass  # the server is gone or already forgot (expired) the session
        finally:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def request(self, method: str, path: str, body: Any = None) -> Any:
        payload = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if payload else {}
        headers.update(self._auth)
        for attempt in (0, 1):  # one retry on a dropped kept-alive connection
            if self._conn is None:
                self._conn = http.client.HTTPConnection(
                    self._host, self._port, timeout=self._timeout
                )
            try:
                self._conn.request(method, self._prefix + path, payload, headers)
                response = self._conn.getresponse()
                data = response.read()
                break
            except (ConnectionError, http.client.HTTPException) as err:
                self._conn.close()
                self._conn = None
                if attempt:
                    raise SimulationError(
                        f"m4 server at {self._host}:{self._port}: {err}"
                    ) from None
        text = data.decode(errors="replace")
        if response.status >= 400:
            try:
                detail = json.loads(text).get("detail", text)
            except json.JSONDecodeError:
                detail = text
            error = InputError if response.status < 500 else SimulationError
            raise error(f"m4 server ({response.status}): {detail}")
        return json.loads(text)


def _arrival(a: Arrival) -> dict[str, int]:
    return {"id": a.id, "src": a.src, "dst": a.dst, "size_bytes": a.size_bytes}


class ServedEngine:
    """The engine side of :class:`M4Backend`, held by a server session. Active flows get rows
    here as the in-process engine gives them (reused once a flow leaves), which the backend
    keys its predictions' versions by."""

    def __init__(self, client: SessionClient, routing: Routing) -> None:
        self.client = client
        self.routing = routing
        self._events: list[tuple[float, Arrival | int]] = []  # in order, since the last update
        self._rows: dict[int, int] = {}
        self._free: list[int] = []

    def arrive(self, flow: Arrival, t: float) -> float:
        self._events.append((t, flow))
        self._rows[flow.id] = self._free.pop() if self._free else len(self._rows)
        path = self.routing.path(flow.src, flow.dst, flow.id)
        return t + self.routing.ideal_fct(flow.size_bytes, path)

    def complete(self, flow_id: int, t: float) -> float:
        self._events.append((t, flow_id))
        self._free.append(self._rows.pop(flow_id))
        return math.nan

    def row(self, flow_id: int) -> int:
        return self._rows[flow_id]

    def update(self, t: float) -> dict[int, float]:
        if not self._events:
            return {}
        events, self._events = self._events, []
        return self.client.events(t, sequence=events)

    def predict(self, t: float) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """:meth:`update` as (rows, flow ids, times), as the in-process engine gives them."""
        predictions = self.update(t)
        if not predictions:
            return None
        ids = np.fromiter(predictions, np.int64, len(predictions))
        rows = np.fromiter(map(self._rows.__getitem__, predictions), np.int64, len(ids))
        return rows, ids, np.fromiter(predictions.values(), np.float64, len(ids))

    def set_bandwidth(self, link: int, bandwidth_bps: float) -> None:
        raise SimulationError("link-rate changes during a run are not supported by m4_served")


class HandleStepper:
    """The model deployment's batched step, called through a Serve deployment handle (for an
    in-process engine in a Ray task on the app's cluster)."""

    def __init__(self, app_name: str, deployment: str = "M4Model", timeout_s: float = 60.0):
        from ray import serve

        try:
            self.handle = serve.get_deployment_handle(deployment, app_name=app_name)
            self.config = self.handle.config.remote().result(timeout_s=timeout_s)
        except Exception as err:  # no such app/deployment, Serve not running
            raise InputError(
                f"no m4 Serve app '{app_name}' with a deployment '{deployment}' on this Ray "
                f"cluster ({type(err).__name__}: {err})",
                field="app_name",
            ) from None
        self.timeout_s = timeout_s

    def __call__(self, graphs):
        return self.handle.step.remote(graphs).result(timeout_s=self.timeout_s)


@dataclass(kw_only=True, slots=True)
class M4ServedConfig(M4Settings):
    """``backend=m4_served``: ``via`` http (``url`` of the Serve app, with its route prefix, and
    its bearer ``token`` if it has one) or handle (the app named ``app_name`` on this Ray
    cluster); update ``window_us`` (default: 10 µs temporal batches, one call each); the call
    timeout; the ns-3 ``network`` the model imitates, completion batching, ``extrapolate`` and
    the fluid ``anchor`` as for ``backend=m4`` (:class:`~m4ray.sim.m4.backend.M4Settings`, one
    definition for both)."""

    replay: ClassVar[str] = "dag"  # m4ray.sim.replays

    via: str = "http"
    url: str = "http://127.0.0.1:8000/m4"
    app_name: str = "m4"
    window_us: float | None = 10.0
    timeout_s: float = 60.0
    token: str | None = None

    def __post_init__(self) -> None:
        if self.via not in ("http", "handle"):
            raise InputError(f"must be 'http' or 'handle', got '{self.via}'", field="via")
        self.check_settings()

    def build(self, topology: Topology, routing: Routing) -> M4Backend:
        if self.via == "handle":
            from m4ray.models.config import ParamsRange
            from m4ray.models.m4 import ModelConfig
            from m4ray.sim.m4.backend import engine_for

            stepper = HandleStepper(self.app_name, timeout_s=self.timeout_s)
            model_cfg = ModelConfig(**stepper.config["model"])
            span = None if self.extrapolate else ParamsRange.of(stepper.config)
            engine = engine_for(
                topology, model_cfg, self.network, routing, stepper, batching=self.batching(),
                params_range=span, checkpoint=stepper.config.get("checkpoint", "m4"),
                anchor_fifo=self.anchor == "fifo",
            )  # fmt: skip
            return M4Backend(engine, window_us=self.window_us)
        client = SessionClient(
            self.url,
            topology,
            routing,
            self.network,
            timeout_s=self.timeout_s,
            token=self.token,
            batching=self.batching(),
            extrapolate=self.extrapolate,
            anchor=self.anchor,
        )
        backend = M4Backend(ServedEngine(client, routing), window_us=self.window_us)
        weakref.finalize(backend, client.close)
        return backend


__all__ = ["HandleStepper", "M4ServedConfig", "ServedEngine", "SessionClient"]
