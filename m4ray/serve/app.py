"""Ray Serve application: the m4 model as a batched step, behind an HTTP session API.

Two deployments:

* :class:`M4Model` — the checkpoint's weights and the step: on a CPU the in-process backend's
  (:mod:`m4ray.models.numpy_step`, its pass compiled, in ``precision``; the replica never
  imports torch),
  on a GPU :func:`m4ray.models.step.step` in torch; ``@serve.batch``
  gathers the step requests of many concurrent simulations and runs them as one forward pass over
  the disjoint union of their graphs, split into passes of at most ``max_batch_flows`` flows (the
  batch size that matters is flows, not requests). Serve's own ``batch_size_fn`` could count
  flows, but it fails any single request larger than the cap, and one simulation's update can be
  arbitrarily large; so batches are capped in requests and split into passes by flows here;
* :class:`M4Sessions` — the FastAPI ingress. A session is one simulation's
  :class:`~m4ray.sim.m4.engine.M4Engine` (topology, routing, model state). A simulator posts what
  happened at a time (arrivals, completions) and gets the predicted completion time of every flow
  whose prediction changed. Sessions live in this replica's memory, so it runs one replica.

Endpoints (JSON; the schema is served at ``/docs`` and ``/openapi.json`` under the route prefix):
``GET /health``, ``POST /sessions``, ``POST /sessions/{id}/events``, ``GET /sessions/{id}``,
``DELETE /sessions/{id}``. Errors, each a JSON ``{"detail": ...}`` documented in the OpenAPI schema:
400 events the topology or the session's state rejects (node ids, duplicate or unknown flows,
time going back) or a topology that does not parse; 401 a missing or wrong bearer token (when
the app has one); 404 unknown session; 413 a body over ``max_request_bytes`` or a request with
more than ``max_events_per_request`` events; 422 a body that breaks the schema (types, bounds);
429 ``max_sessions`` sessions are open. A rejected request changes nothing.

Run it with ``python -m m4ray.sweeps +experiment=serve`` or ``serve run m4ray.serve.app:app``
(``jobs/serve.yaml`` for ``serve deploy``).
"""

import asyncio
import collections
import dataclasses
import gc
import secrets
import time
import uuid
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from ray import serve
from starlette.exceptions import HTTPException as StarletteHTTPException

from m4ray.errors import InputError
from m4ray.models.components import Batching
from m4ray.models.config import ParamsRange
from m4ray.models.numpy_step import PRECISIONS
from m4ray.models.step import StepGraph, StepOut
from m4ray.runtime.memory import rss_mb
from m4ray.sim.m4.backend import (
    DEFAULT_PRECISION,
    DEVICE_PATTERN,
    engine_for,
    local_stepper,
    trained_params_range,
)
from m4ray.sim.m4.engine import Arrival, M4Engine
from m4ray.sim.ns3.backend import Ns3Config
from m4ray.sim.routing import Routing, WireFormat
from m4ray.sim.topology import parse_topology

API_VERSION = "1"
MAX_ID = 2**53 - 1  # ids and sizes: exact in JSON numbers and in the engine's int64 arrays
MAX_NODE = 2**31 - 1


# ------------------------------------------------------------------ schema
class NewSession(BaseModel):
    """A simulation: its topology and the settings its routing and model inputs depend on."""

    topology: str = Field(
        min_length=1, description="the topology in SimAI text format (m4ray's topology files)"
    )
    routing_seed: int = Field(
        0, ge=0, le=MAX_ID, description="ECMP seed: the same seed gives the same paths"
    )
    mtu_bytes: int = Field(
        1000, gt=0, le=1_000_000, description="payload bytes per packet (ideal FCTs)"
    )
    header_bytes: int = Field(48, ge=0, le=65_535, description="header bytes per packet")
    network: dict[str, Any] = Field(
        default_factory=dict,
        description="ns-3 settings the model imitates (Ns3Config fields: transport, rdma, tcp)",
    )
    batch_above_flows: int | None = Field(
        None,
        ge=0,
        le=MAX_ID,
        description="completion batching: a component of more flows updates at arrivals and once "
        "batch_fraction of its flows completed, not at every completion (null: off); its other "
        "flows are left out of an update's answer meanwhile and keep their last predictions",
    )
    batch_fraction: float = Field(
        0.5, gt=0, le=1, description="completions, as a fraction of a batched component's flows"
    )
    batch_frozen_above: int = Field(
        0,
        ge=0,
        le=MAX_ID,
        description="a batched component of more flows (0: every one) has its fluid anchor "
        "frozen between its updates (its flows drain at their last rates)",
    )
    extrapolate: bool = Field(
        False,
        description="network parameters outside the span the checkpoint was trained on are "
        "brought to its edge (false; the session's notes say which) or fed as they are (true)",
    )
    anchor: Literal["fair", "fifo"] = Field(
        "fair",
        description="the fluid anchor's service: fair (max-min) or fifo (flows of at most the "
        "sender's window served in order of arrival); a checkpoint trained on fifo runs on it",
    )


class SessionInfo(BaseModel):
    session_id: str
    n_nodes: int
    n_hosts: int
    n_links: int
    checkpoint: str
    notes: list[str] = Field(
        default_factory=list,
        description="network parameters read at the edge of the checkpoint's trained span",
    )


class ErrorBody(BaseModel):
    detail: str = Field(description="what was wrong, naming the field")


FlowId = Annotated[int, Field(ge=0, le=MAX_ID)]
Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class FlowArrival(BaseModel):
    id: FlowId = Field(description="flow id, unique among the session's active flows")
    src: int = Field(ge=0, le=MAX_NODE, description="source host id")
    dst: int = Field(ge=0, le=MAX_NODE, description="destination host id")
    size_bytes: int = Field(gt=0, le=MAX_ID)


class Completion(BaseModel):
    id: FlowId = Field(description="id of a flow the simulator completed")


class TimedEvent(BaseModel):
    """One arrival or one completion at its own time (for a window of events in order)."""

    time_s: Seconds
    arrival: FlowArrival | None = None
    completion: Completion | None = None


class Events(BaseModel):
    """What happened up to ``time_s`` (simulated seconds, non-decreasing across calls).

    ``sequence``: events in the order they happened, each at its own time (<= ``time_s``) —
    what a simulator batching a window of events sends; then ``completions`` and ``arrivals``
    (the short form), all at ``time_s``. The model is updated once, at ``time_s``."""

    time_s: Seconds
    sequence: list[TimedEvent] = Field(default_factory=list)
    arrivals: list[FlowArrival] = Field(default_factory=list)
    completions: list[FlowId] = Field(
        default_factory=list, description="ids of flows the simulator completed at time_s"
    )

    def count(self) -> int:
        return len(self.sequence) + len(self.arrivals) + len(self.completions)


class Prediction(BaseModel):
    id: int
    finish_s: float = Field(description="predicted completion time (simulated seconds)")


class Predictions(BaseModel):
    time_s: float
    predictions: list[Prediction]
    active: int = Field(description="flows active after these events")


class SessionState(BaseModel):
    session_id: str
    time_s: float
    active: int
    components: int
    updates: int


class AppArgs(BaseModel):
    """Application arguments (``serve run m4ray.serve.app:build checkpoint=m4-lite``)."""

    model_config = ConfigDict(extra="forbid")  # a misspelt argument is an error

    checkpoint: str = "m4-lite"
    max_batch_requests: int = Field(64, ge=1, description="1 disables batching")
    batch_wait_s: float = Field(0.002, ge=0)
    max_batch_flows: int = Field(4096, ge=1, description="flows per forward pass")
    threads: int = Field(1, ge=1, description="BLAS (CPU) or torch (GPU) threads of the replica")
    device: str = Field(
        "cpu",
        pattern=f"^({DEVICE_PATTERN})$",
        description="the model replica's device: cpu, cuda[:N] or auto (cuda where Ray has a GPU)",
    )
    precision: str = Field(
        DEFAULT_PRECISION,
        pattern=f"^({'|'.join(PRECISIONS)})$",
        description="the step's float type: float32 (as m4 was trained; the in-process default)",
    )
    session_idle_s: float = Field(3600.0, gt=0, description="close sessions idle this long")
    max_request_bytes: int = Field(8 << 20, ge=1, description="larger bodies get 413")
    max_events_per_request: int = Field(100_000, ge=1, description="more events get 413")
    max_sessions: int = Field(1024, ge=1, description="a new session beyond this gets 429")
    token: str | None = Field(
        None, min_length=8, description="if set, every call needs 'Authorization: Bearer <token>'"
    )


# ------------------------------------------------------------------ model
def process_memory(top: int = 6) -> dict[str, Any]:
    """This replica's resident memory and its live Python objects after a full collection,
    with the most common types: a leak in the sessions or the model shows in the objects, while
    the allocator's and Ray's own native memory show only in the RSS."""
    gc.collect()
    counts = collections.Counter(type(obj).__name__ for obj in gc.get_objects())
    return {
        "rss_mb": rss_mb(),
        "objects": sum(counts.values()),
        "top": dict(counts.most_common(top)),
    }


@serve.deployment(ray_actor_options={"num_cpus": 1}, max_ongoing_requests=256)
class M4Model:
    """The neural step, batched across requests (one forward pass per batch)."""

    def __init__(self, args: AppArgs) -> None:
        # the in-process backend's stepper: numpy (its pass compiled) on a CPU, torch on a GPU,
        # in passes of at most max_batch_flows flows
        self.stepper = local_stepper(
            args.checkpoint,
            args.device,
            precision=args.precision,
            max_flows=args.max_batch_flows,
            threads=args.threads,
        )
        self.model = self.stepper.model
        self.checkpoint = args.checkpoint
        self.step_batch.set_max_batch_size(args.max_batch_requests)
        self.step_batch.set_batch_wait_timeout_s(args.batch_wait_s)
        self._totals = {"batches": 0, "requests": 0, "flows": 0}

    @serve.batch(max_batch_size=64, batch_wait_timeout_s=0.002)
    async def step_batch(self, requests: list[list[StepGraph]]) -> list[list[StepOut]]:
        graphs = [g for r in requests for g in r]
        self._totals["batches"] += 1
        self._totals["requests"] += len(requests)
        self._totals["flows"] += sum(g.n_flows for g in graphs)
        outs: list[StepOut] = self.stepper(graphs)
        result, i = [], 0
        for r in requests:
            result.append(outs[i : i + len(r)])
            i += len(r)
        return result

    async def step(self, graphs: list[StepGraph]) -> list[StepOut]:
        return await self.step_batch(graphs)

    def config(self) -> dict[str, Any]:
        info = {"checkpoint": self.checkpoint, "model": dataclasses.asdict(self.model.cfg)}
        if (span := trained_params_range(self.checkpoint)) is not None:
            info["params_range"] = span.to_json()
        return info

    def stats(self, reset: bool = False) -> dict[str, int]:
        """Batches, requests and flows stepped so far (since the last reset)."""
        out = dict(self._totals)
        if reset:
            self._totals = dict.fromkeys(out, 0)
        return out

    def memory(self) -> dict[str, Any]:
        """See :func:`process_memory` (a handle call, not an HTTP route)."""
        return process_memory()


# ------------------------------------------------------------------ sessions
def _ordered(events: Events, since: float) -> list:
    """The request's events as ``(t, Arrival | flow id)`` in order; bad times raise."""
    out: list = []
    last = since
    for i, e in enumerate(events.sequence):
        if (e.arrival is None) == (e.completion is None):
            raise InputError(
                "needs exactly one of 'arrival' and 'completion'", field=f"sequence[{i}]"
            )
        if not last <= e.time_s <= events.time_s:
            raise InputError(
                f"time_s {e.time_s} is outside [{last}, {events.time_s}] (events go in order, "
                "not before the session's time, not after the request's)",
                field=f"sequence[{i}].time_s",
            )
        last = e.time_s
        a = e.arrival
        out.append(
            (e.time_s, e.completion.id if a is None else Arrival(a.id, a.src, a.dst, a.size_bytes))
        )
    out += [(events.time_s, f) for f in events.completions]
    out += [(events.time_s, Arrival(a.id, a.src, a.dst, a.size_bytes)) for a in events.arrivals]
    return out


api = FastAPI(
    title="m4ray m4 backend",
    version=API_VERSION,
    description="Learned flow-level network backend: post flow arrivals and completions, get "
    "predicted completion times. One session per simulation.",
)
_REPLICA = {"args": AppArgs()}  # this process's ingress arguments (set by M4Sessions)


def _configure(args: AppArgs) -> None:
    """Serve pickles the ingress class and app by value: a module function and a module dict
    are what the replica's routes, dependencies and middleware share for certain."""
    _REPLICA["args"] = args


def _args() -> AppArgs:
    return _REPLICA["args"]


def _errors(*codes: int) -> dict:
    """OpenAPI documentation of the error statuses a route returns (FastAPI documents its own
    422, whose ``detail`` lists what broke the schema)."""
    return {code: {"model": ErrorBody, "description": _REASONS[code]} for code in codes}


_REASONS = {
    400: "the request is well formed but the topology or the session's state rejects it",
    401: "missing or wrong bearer token",
    404: "unknown session (closed, expired or never created)",
    413: "body or event count over the app's limits",
    429: "too many open sessions",
}


async def authorized(request: Request) -> None:
    """With a token, every call needs ``Authorization: Bearer <token>``. The header is read here
    rather than declared as an OpenAPI security scheme: a scheme would make it required in the
    schema even when the app runs without a token (the default on 127.0.0.1)."""
    token = _args().token
    if token is None:
        return
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not secrets.compare_digest(given.encode(), token.encode()):
        raise HTTPException(401, "missing or wrong bearer token", {"WWW-Authenticate": "Bearer"})


@api.middleware("http")
async def limit_body(request: Request, call_next):
    """413 before a body over the limit is read (by its Content-Length, which every HTTP client
    sends for a JSON body)."""
    limit = _args().max_request_bytes
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        return JSONResponse({"detail": f"body over {limit} bytes"}, status_code=413)
    return await call_next(request)


def _routes(router) -> list:
    """Every route of a router, into included routers (Serve includes the ingress app's)."""
    found = []
    for route in getattr(router, "routes", None) or []:
        inner = getattr(route, "original_router", None)
        found += _routes(inner) if inner is not None else [route]
    return found


def route_matches(route, path: str) -> bool:
    regex = getattr(route, "path_regex", None)
    return regex is not None and bool(getattr(route, "methods", None)) and bool(regex.match(path))


@api.exception_handler(StarletteHTTPException)
async def http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
    """Errors as ``{"detail"}``; a 405 lists every method the path has (Starlette names only the
    first route that matched the path)."""
    headers = dict(err.headers or {})
    if err.status_code == 405:
        root = request.scope.get("root_path", "")
        path = request.url.path
        path = path[len(root) :] if root and path.startswith(root) else path
        allowed = {
            m for route in _routes(request.app) if route_matches(route, path) for m in route.methods
        }
        headers["Allow"] = ", ".join(sorted(allowed))
    return JSONResponse({"detail": err.detail}, status_code=err.status_code, headers=headers)


@dataclasses.dataclass
class _Session:
    engine: M4Engine
    lock: asyncio.Lock
    time_s: float = 0.0
    used: float = dataclasses.field(default_factory=time.monotonic)  # last request (wall clock)


def expire(sessions: dict, now: float, idle_s: float) -> list[str]:
    """Drop sessions unused for more than ``idle_s`` wall-clock seconds (a simulator that died
    without closing); returns their ids."""
    gone = [sid for sid, s in sessions.items() if now - s.used > idle_s and not s.lock.locked()]
    for sid in gone:
        del sessions[sid]
    return gone


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=512)
@serve.ingress(api)
class M4Sessions:
    """HTTP session API over an :class:`M4Model` deployment handle."""

    def __init__(self, model, args: AppArgs) -> None:
        from m4ray.models.m4 import ModelConfig

        _configure(args)
        self.model = model
        self.checkpoint = args.checkpoint
        self.session_idle_s = args.session_idle_s
        self.sessions: dict[str, _Session] = {}
        self._model_cfg: ModelConfig | None = None
        self._params_range: ParamsRange | None = None

    async def _cfg(self):
        """The model's config and the params13 span it was trained on."""
        if self._model_cfg is None:
            from m4ray.models.m4 import ModelConfig

            info = await self.model.config.remote()
            self._model_cfg = ModelConfig(**info["model"])
            self._params_range = ParamsRange.of(info, file=f"{self.checkpoint}/model.json")
        return self._model_cfg, self._params_range

    @api.get("/health", responses=_errors(401), dependencies=[Depends(authorized)])
    async def health(self) -> dict[str, Any]:
        return {"ok": True, "sessions": len(self.sessions), "checkpoint": self.checkpoint}

    @api.post(
        "/sessions",
        status_code=201,
        responses=_errors(400, 401, 413, 429),
        dependencies=[Depends(authorized)],
    )
    async def create(self, spec: NewSession) -> SessionInfo:
        try:
            topo = parse_topology(spec.topology, "topology")  # errors: "topology:<line>: …"
        except InputError as err:
            raise HTTPException(400, str(err)) from None
        try:
            ns3 = Ns3Config(**spec.network)
        except InputError as err:
            raise HTTPException(400, f"network: {err}") from None
        except TypeError as err:
            raise HTTPException(400, f"network: {err}") from None
        wire = WireFormat(mtu_bytes=spec.mtu_bytes, header_bytes=spec.header_bytes)
        routing = Routing(topo, seed=spec.routing_seed, wire=wire)
        cfg, span = await self._cfg()
        span = None if spec.extrapolate else span
        batching = Batching.of(spec.batch_above_flows, spec.batch_fraction, spec.batch_frozen_above)
        engine = engine_for(
            topo, cfg, ns3, routing, batching=batching, params_range=span,
            checkpoint=self.checkpoint, anchor_fifo=spec.anchor == "fifo",
        )  # fmt: skip
        session_id = uuid.uuid4().hex
        expire(self.sessions, time.monotonic(), self.session_idle_s)
        limit = _args().max_sessions
        if len(self.sessions) >= limit:
            raise HTTPException(429, f"{limit} sessions are open: close one first")
        self.sessions[session_id] = _Session(engine, asyncio.Lock())
        return SessionInfo(
            session_id=session_id,
            n_nodes=topo.n_nodes,
            n_hosts=len(topo.hosts),
            n_links=len(topo.bandwidth_bps),
            checkpoint=self.checkpoint,
            notes=engine.params_notes,
        )

    @api.post(
        "/sessions/{session_id}/events",
        responses=_errors(400, 401, 404, 413),
        dependencies=[Depends(authorized)],
    )
    async def events(self, session_id: str, events: Events) -> Predictions:
        limit = _args().max_events_per_request
        if events.count() > limit:
            raise HTTPException(413, f"{events.count()} events in one request, limit {limit}")
        session = self._session(session_id)
        async with session.lock:
            if events.time_s < session.time_s:
                raise HTTPException(
                    400, f"time_s {events.time_s} is before the session's time {session.time_s}"
                )
            engine = session.engine
            try:
                ordered = _ordered(events, session.time_s)
                engine.check(ordered)
            except InputError as err:
                raise HTTPException(400, str(err)) from None
            session.time_s = events.time_s
            engine.apply(ordered)
            pending = engine.prepare(events.time_s)
            predictions = {}
            if pending is not None:
                outs = await self.model.step.remote(pending.graphs)
                predictions = engine.finish(pending, outs)
        return Predictions(
            time_s=events.time_s,
            predictions=[Prediction(id=f, finish_s=t) for f, t in predictions.items()],
            active=engine.n_active,
        )

    @api.get(
        "/sessions/{session_id}",
        responses=_errors(401, 404),
        dependencies=[Depends(authorized)],
    )
    async def state(self, session_id: str) -> SessionState:
        s = self._session(session_id)
        return SessionState(
            session_id=session_id,
            time_s=s.time_s,
            active=s.engine.n_active,
            components=s.engine.n_components,
            updates=s.engine.n_updates,
        )

    @api.delete(
        "/sessions/{session_id}",
        responses=_errors(401, 404),
        dependencies=[Depends(authorized)],
    )
    async def close(self, session_id: str) -> dict[str, Any]:
        self._session(session_id)
        del self.sessions[session_id]
        return {"closed": session_id}

    def memory(self) -> dict[str, Any]:
        """See :func:`process_memory`, with the open sessions (a handle call, not a route)."""
        return {**process_memory(), "sessions": len(self.sessions)}

    def _session(self, session_id: str) -> _Session:
        session = self.sessions.get(session_id)
        if session is None:
            raise HTTPException(
                404, f"unknown session '{session_id}' (closed, expired or never created)"
            )
        session.used = time.monotonic()
        return session


def _cluster_gpus() -> float:
    import ray

    return ray.cluster_resources().get("GPU", 0.0) if ray.is_initialized() else 0.0


def build(args: AppArgs):
    """The Serve application: the model deployment behind the session ingress."""
    model = M4Model
    if args.device != "cpu" and (args.device != "auto" or _cluster_gpus() > 0):
        # a replica that uses the GPU asks Ray for one (auto: only where the cluster has one)
        model = M4Model.options(ray_actor_options={"num_cpus": 1, "num_gpus": 1})
    return M4Sessions.bind(model.bind(args), args)


app = build(AppArgs())

__all__ = ["API_VERSION", "AppArgs", "M4Model", "M4Sessions", "app", "build"]
