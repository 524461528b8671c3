"""``backend=m4``: the learned backend as a :class:`~m4ray.sim.backend.NetworkBackend`.

The backend owns the simulated clock and the event queue; an :class:`~m4ray.sim.m4.engine.M4Engine`
(in-process) or a Serve session (``m4ray.serve.client``) owns the model state. Each flow's
completion is scheduled at its latest prediction and rescheduled whenever an update changes it
(older predictions are dropped by a version check). When updates happen is ``window_us``:

* ``None`` — after every single arrival and completion, as the model was trained (m4's
  standalone engine);
* ``0`` — once per simulated instant, for every arrival and completion at that instant together;
* ``> 0`` — SimAI's temporal batching (``reference/m4.md`` §8): the first change arms a timer
  ``window_us`` later and one update covers everything that happened meanwhile; each arrival is
  scheduled at its ideal completion until then.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Protocol

import numpy as np

from m4ray.errors import InputError, SimulationError
from m4ray.fingerprint import added_field
from m4ray.models.components import Batching
from m4ray.models.config import ParamsRange
from m4ray.sim.backend import DoneCallback, EventQueue, QueueClock
from m4ray.sim.flows import Flow
from m4ray.sim.m4.arrival import Arrival
from m4ray.sim.ns3.backend import IMITATED, PARAMS13, Ns3Config, params13
from m4ray.sim.routing import Routing
from m4ray.sim.topology import Topology

if TYPE_CHECKING:  # torch is imported when a model is built, not with the config (the driver)
    from m4ray.sim.m4.shared import SharedStepper

CHECKPOINTS = Path(__file__).resolve().parents[3] / "checkpoints"
DEVICE_PATTERN = r"cpu|auto|cuda(:[0-9]+)?"  # where m4's step may run (M4Config, Serve's app)
DEFAULT_PRECISION = "float32"  # the step's float type unless set (M4Config, Serve's app)


def weights_digest(name: str) -> str:
    """A digest of checkpoint ``name``'s ``model.json`` and ``model.pt`` ("" where there is
    none: the error comes when the backend is built)."""
    try:
        directory = checkpoint_dir(name)
    except InputError:
        return ""
    files = [directory / "model.json", directory / "model.pt"]
    return _digest(
        tuple((str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in files if f.exists())
    )


@functools.lru_cache(maxsize=16)
def _digest(files: tuple[tuple[str, int, int], ...]) -> str:
    h = hashlib.sha256()
    for path, *_ in files:
        h.update(Path(path).read_bytes())
    return h.hexdigest()[:16]


def checkpoint_dir(name: str) -> Path:
    """``checkpoints/<name>`` of this repository, or ``name`` itself when it is a directory."""
    for candidate in (CHECKPOINTS / name, Path(name)):
        if (candidate / "model.json").exists():
            return candidate.resolve()
    shipped = sorted(p.name for p in CHECKPOINTS.iterdir() if (p / "model.json").exists())
    raise InputError(
        f"no checkpoint '{name}' (shipped: {', '.join(shipped) or 'none'}; or give a directory "
        "holding model.json and model.pt)",
        field="checkpoint",
    )


def learned_transport(name: str) -> str:
    """The ns-3 transport the checkpoint learned (recorded since m4-v2; before: TCP)."""
    info = json.loads((checkpoint_dir(name) / "model.json").read_text())
    return info.get("transport", IMITATED)


@functools.lru_cache(maxsize=16)
def check_transport(name: str, transport: str) -> None:
    """Warn (once per checkpoint and transport) when the checkpoint learned another ns-3
    transport than the one the backend describes to it."""
    learned = learned_transport(name)
    if learned != transport:
        warnings.warn(
            f"m4 checkpoint '{name}' learned ns-3 {learned}, but the backend describes the "
            f"network as {transport} (set the m4 backend's network.transport={learned})",
            stacklevel=2,
        )


def check_cc(name: str, network: Ns3Config) -> None:
    """Refuse a network whose congestion control the checkpoint never saw (its ``model.json``
    ``supported_cc``; checkpoints before it learned DCTCP only): m4 would extrapolate silently."""
    _check_cc(name, network.rdma.cc if network.transport == "rdma" else "dctcp")


@functools.lru_cache(maxsize=16)
def _check_cc(name: str, cc: str) -> None:
    """:func:`check_cc` once per checkpoint and CC (a sweep builds a backend per scenario)."""
    info = json.loads((checkpoint_dir(name) / "model.json").read_text())
    supported = info.get("supported_cc", ["dctcp"])
    if cc not in supported:
        raise InputError(
            f"m4 checkpoint '{name}' learned {', '.join(supported)} only; it cannot imitate {cc}",
            field="m4.network.rdma.cc",
        )


@functools.lru_cache(maxsize=4)
def load_model(name: str, device: str = "cpu", precision: str = "float64"):
    """The checkpoint's model for inference (eval mode, on ``device``, float64 unless
    ``precision`` says float32), loaded once per process (and device and precision).

    Float64: how a step's matrix products round depends on what else is in the batch (one
    simulation or many, :mod:`m4ray.sim.m4.shared`); in float32 that moved predicted times by
    ~100 ps and changed which completions coincide, so a flow's answer depended on its company.
    In float64 the rounding is far below the picosecond the engine rounds times to."""
    import torch

    from m4ray.models.checkpoint import load

    model, _ = load(checkpoint_dir(name), device)
    return model.to(getattr(torch, precision)).eval()


class Engine(Protocol):
    """What the backend needs from the model side (local engine or a Serve session)."""

    def arrive(self, flow: Arrival, t: float) -> float: ...

    def complete(self, flow_id: int, t: float) -> float: ...

    def update(self, t: float) -> dict[int, float]: ...

    def predict(self, t: float) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None: ...

    def row(self, flow_id: int) -> int: ...

    def set_bandwidth(self, link: int, bandwidth_bps: float) -> None: ...


@dataclass(kw_only=True, slots=True)
class M4Settings:
    """What both m4 backends (in-process :class:`M4Config`, Serve's
    :class:`~m4ray.serve.client.M4ServedConfig`) tell their engine, one definition for both.

    ``network``: the ns-3 network/CC settings the model is asked to imitate (its params13).
    ``batch_above_flows``: completion batching (:class:`~m4ray.models.components.Batching`): a
    component of more than this many flows is updated at an arrival, or once its completions
    since its last update number ``batch_fraction`` of its flows, not at every completion; its
    other flows keep their last predictions meanwhile (None: every completion updates). It
    bounds a component's updates over its life to ~n/f stepped flows instead of ~n²/2: the
    MoE job on Spectrum-X 512 GPUs ``bench/m4_batching.py`` measures. ``batch_frozen_above``:
    above this many flows too (0: every batched component) a batched component's fluid anchor
    is frozen between its updates (its flows drain at their last rates, not re-shared).
    ``extrapolate``: network parameters outside the span the checkpoint was trained on (its
    ``model.json`` ``params_range``: the SimAI study's 100 MB buffers against training's
    1-16 MB) are brought to the span's edge, with a warning (False), or fed as they are (True).
    ``anchor``: the fluid anchor's service, ``fair`` (max-min) or ``fifo`` (flows of at most the
    sender's window served in order of arrival, as flowSim's ``service: fifo``).
    A subclass's ``__post_init__`` calls :meth:`check_settings`. Run ids hash the fields by name
    (:mod:`m4ray.fingerprint`), so they are the same as when each backend declared its own."""

    network: Ns3Config = field(default_factory=Ns3Config)  # m4-v2 learned ns-3 rdma
    batch_above_flows: int | None = 128
    batch_fraction: float = 0.5  # 0.1 before 2026-11-29 (conf/m4_settings/default.yaml says why)
    batch_frozen_above: int = added_field(
        0, "batched components' anchors frozen (2026-11-29)", ids_had=1024
    )
    extrapolate: bool = added_field(False, "params13 outside the checkpoint's range (2026-11-27)")
    # the fluid anchor's service: fair (max-min) or fifo (flowSim's service="fifo" up to the
    # window); a checkpoint trained on the FIFO anchor runs on it either way
    anchor: str = added_field("fair", "a FIFO anchor (issue 29)")

    def check_settings(self) -> None:
        """Bad values fail here, before any task."""
        self.batching()
        if self.anchor not in ("fair", "fifo"):
            raise InputError(f"expected fair or fifo, got {self.anchor!r}", field="anchor")

    def batching(self) -> Batching | None:
        """The engine's completion batching of large components (None: every update)."""
        return Batching.of(self.batch_above_flows, self.batch_fraction, self.batch_frozen_above)


@dataclass(kw_only=True, slots=True)
class M4Config(M4Settings):
    """m4 backend settings (and :class:`M4Settings`'s, which Serve's backend shares).

    ``checkpoint``: a name under ``checkpoints/`` or a directory; ``window_us``: when updates
    happen (module docstring); ``threads``: BLAS threads of the process running the numpy step
    (1 is fastest for small graphs; 0 leaves them);
    ``max_flows_per_step``: cap on flows in one forward pass; ``share_steps``: a sweep task runs
    up to this many m4 scenarios together in one process, their updates batched into shared
    forward passes (:mod:`m4ray.sim.m4.shared`; same answers); 1 runs each alone;
    ``precision``: the step's float type (float32, as the model was trained: its compiled
    passes are ~1.8x float64's speed; float64's answers are not the same to the bit:
    :mod:`~m4ray.models.numpy_step` says by how much); ``device``: ``cpu`` steps in numpy,
    ``cuda`` (or ``cuda:N``) runs the torch step on that GPU (:func:`~m4ray.models.step.step`,
    in ``precision``; the same answers to float rounding), ``auto`` picks ``cuda`` where torch
    sees one. ``weights`` is set from the checkpoint's files (:func:`weights_digest`), so a
    run's id names the model that ran, not only its name: a checkpoint retrained in place does
    not reuse old results."""

    replay: ClassVar[str] = "dag"  # m4ray.sim.replays

    checkpoint: str = "m4-lite"
    window_us: float | None = 0.0
    threads: int = 1
    max_flows_per_step: int = 4096
    share_steps: int = 1  # conf/backend/m4.yaml says why (groups pay on a GPU)
    weights: str = added_field("", "a run's id names its checkpoint's weights (2026-11-26)")
    precision: str = added_field(
        DEFAULT_PRECISION, "the numpy step's float type (2026-11-26)", ids_had="float64"
    )  # float32 by default since 2026-11-29: runs before then were float64, and keep their ids
    device: str = added_field("cpu", "m4's step on a GPU (2026-11-27)")

    def __post_init__(self) -> None:
        from m4ray.models.numpy_step import float_type

        float_type(self.precision)  # an unknown one fails here, before any task
        self.weights = weights_digest(self.checkpoint)
        if self.window_us is not None and self.window_us < 0:
            raise InputError(f"must be >= 0 or null, got {self.window_us}", field="window_us")
        if self.share_steps < 1:
            raise InputError(f"must be >= 1, got {self.share_steps}", field="share_steps")
        self.check_settings()
        if not re.fullmatch(DEVICE_PATTERN, self.device):
            raise InputError(
                f"unknown device {self.device!r} (cpu, cuda, cuda:N or auto)", field="device"
            )

    def group(self) -> tuple[tuple, int] | None:
        """How sweep tasks may group m4 scenarios: those with the same key share one process
        and its :class:`SharedStepper`, at most ``share_steps`` of them (None: each alone)."""
        if self.share_steps <= 1:
            return None
        key = (self.checkpoint, self.max_flows_per_step, self.threads, self.precision, self.device)
        return ("m4", *key), self.share_steps

    def _stepper(self):
        """A stepper of its own over the checkpoint's model (:func:`local_stepper`)."""
        return local_stepper(
            self.checkpoint,
            self.device,
            precision=self.precision,
            max_flows=self.max_flows_per_step,
            threads=self.threads,
        )

    def shared_stepper(self) -> SharedStepper:
        """The stepper a group of this config's scenarios shares (see :meth:`group`)."""
        from m4ray.sim.m4.memo import StepMemo
        from m4ray.sim.m4.shared import SharedStepper

        return SharedStepper(self._stepper(), StepMemo())

    def build(self, topology: Topology, routing: Routing) -> M4Backend:
        from m4ray.sim.m4.memo import StepMemo
        from m4ray.sim.m4.shared import CURRENT, SharedStepper

        check_transport(self.checkpoint, self.network.transport)
        check_cc(self.checkpoint, self.network)
        own = self._stepper()
        model = own.model
        stepper = CURRENT.get()  # set when this simulation runs in a group (shared.py)
        if stepper is None:  # alone: its own memo of the graphs it stepped (m4ray.sim.m4.memo)
            stepper = SharedStepper(own, StepMemo())
        elif stepper.stepper.model is not model:
            raise SimulationError(f"the shared stepper runs another model than '{self.checkpoint}'")
        engine = engine_for(
            topology,
            model.cfg,
            self.network,
            routing,
            stepper,
            batching=self.batching(),
            params_range=None if self.extrapolate else trained_params_range(self.checkpoint),
            checkpoint=self.checkpoint,
            anchor_fifo=self.anchor == "fifo",
        )
        if CURRENT.get() is None and hasattr(engine, "use_compiled_pass"):
            engine.use_compiled_pass(model)  # alone on a CPU: small updates in one C call
        return M4Backend(engine, window_us=self.window_us)


def fitted_params(
    params: list[float], params_range: ParamsRange | None, checkpoint: str = "m4"
) -> tuple[list[float], list[str]]:
    """``params`` (params13) brought into the checkpoint's trained ``params_range``
    (:meth:`ParamsRange.fit`), with a warning, once per checkpoint and value, naming what moved,
    and those notes; unchanged (no notes) where the range is None."""
    if params_range is None:
        return list(params), []
    fitted, notes = params_range.fit(params, PARAMS13)
    if notes:
        _warn_fitted(checkpoint, tuple(notes))
    return fitted, notes


@functools.lru_cache(maxsize=64)
def _warn_fitted(checkpoint: str, notes: tuple[str, ...]) -> None:
    warnings.warn(
        f"m4 checkpoint '{checkpoint}' was not trained on this network: "
        + "; ".join(notes)
        + " (extrapolate=true feeds them as they are)",
        stacklevel=3,
    )


@functools.lru_cache(maxsize=16)
def trained_params_range(name: str) -> ParamsRange | None:
    """The params13 span checkpoint ``name`` recorded (``model.json`` ``params_range``; None
    for checkpoints that recorded none)."""
    path = checkpoint_dir(name) / "model.json"
    return ParamsRange.of(json.loads(path.read_text()), file=str(path))


def local_stepper(checkpoint: str, device: str, *, precision: str, max_flows: int, threads: int):
    """A stepper over ``checkpoint``'s model in this process, in passes of at most
    ``max_flows`` flows, in ``precision``: on the CPU the numpy step
    (:mod:`m4ray.models.numpy_step`, its pass compiled; this process never imports torch for
    it) with ``threads`` BLAS threads, on a GPU the torch step with ``threads`` torch threads
    (0 leaves them). The in-process backend and Serve's model replica both step through it; its
    ``model`` has the checkpoint's ``cfg``."""
    device = resolve_device(device)
    if device != "cpu":
        import torch

        from m4ray.models.step import LocalStepper

        if threads > 0:
            torch.set_num_threads(threads)
        return LocalStepper(load_model(checkpoint, device, precision), max_flows=max_flows)
    from m4ray.models.numpy_step import NumpyStepper, load_numpy_model

    model = load_numpy_model(str(checkpoint_dir(checkpoint)), precision)
    return NumpyStepper(model, max_flows=max_flows, threads=threads)


def resolve_device(device: str) -> str:
    """``device`` with ``auto`` settled (``cuda`` where torch sees a GPU, else ``cpu``); a GPU
    asked for by name and absent is an error, not a silent CPU run."""
    if device == "cpu":
        return device
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if not torch.cuda.is_available():
        raise InputError(f"{device} asked for, but torch sees no GPU here", field="m4.device")
    return device


def engine_for(
    topology: Topology,
    model_cfg,
    network: Ns3Config,
    routing: Routing,
    stepper=None,
    *,
    batching: Batching | None = None,
    params_range: ParamsRange | None = None,
    checkpoint: str = "m4",
    anchor_fifo: bool = False,
):
    """An m4 engine for ``topology`` described as ``network`` (the model's params13 and, for
    models whose anchor has a window, the network's sender window over the links' latencies;
    with ACK load, the network's ACK bits per data bit), with ``batching`` of large
    components' completions (:class:`~m4ray.models.components.Batching`; None: off).
    ``params_range``: the span of params13 the model was trained on (:func:`fitted_params`;
    the engine's ``params_notes`` say what was read at its edge); None feeds them as they are."""
    from m4ray.models.fairshare import Window, network_ack_fraction
    from m4ray.sim.m4.engine import M4Engine

    params, notes = fitted_params(params13(network, routing), params_range, checkpoint)
    engine = M4Engine(
        topology.bandwidth_bps,
        model_cfg,
        params,
        stepper,
        routing,
        window=Window.of(network, routing) if model_cfg.fluid_window else None,
        link_latency_s=topology.latency_s,
        ack_fraction=network_ack_fraction(network, routing.wire) if model_cfg.fluid_acks else 0.0,
        batching=batching,
        anchor_fifo=anchor_fifo,
    )
    engine.params_notes = notes
    return engine


class _Batch:
    """One update's predicted completions in time order (the flows' ids, rows and the rows'
    versions then), and the next one to run (``i``)."""

    __slots__ = ("flows", "i", "ranks", "rows", "times", "versions")

    def __init__(self, times, flows, rows, versions, ranks) -> None:
        self.times, self.flows, self.rows = times, flows, rows
        self.versions, self.ranks = versions, ranks
        self.i = 0


class M4Backend(QueueClock):
    """Event-driven clock around an m4 engine, implementing ``NetworkBackend`` (seconds).

    A replay may move it into a compiled loop (:meth:`dag_loop`): its events, updates and
    batched completions then run in C (``_dagloop.c``'s m4 mode), in the same order."""

    rate_cap_bps = None  # (no per-flow cap: the compiled replay asks)

    def __init__(self, engine: Engine, *, window_us: float | None = 0.0) -> None:
        self.engine = engine
        self.window_s = None if window_us is None else window_us * 1e-6
        self.events = EventQueue()
        self._now = 0.0
        self._done: dict[int, DoneCallback] = {}
        # per engine row, the version of its latest prediction: an event whose version is no
        # longer its row's was superseded (rows are reused, versions only grow)
        self._version = np.zeros(64, dtype=np.int64)
        self._armed = False
        self.n_events = 0  # arrivals + completions
        self._loop = None  # the compiled loop it runs in (dag_loop), or None

    # ------------------------------------------------------------ protocol
    def send(self, flow: Flow, on_done: DoneCallback) -> None:
        if self._loop is not None:
            raise SimulationError("m4 in a compiled loop takes its replay's flows only")
        baseline = self.engine.arrive(
            Arrival(flow.id, flow.src, flow.dst, flow.size_bytes), self._now
        )
        self._done[flow.id] = on_done
        self.n_events += 1
        if self.window_s:
            self._at(flow.id, baseline)
        self._changed()

    def dag_loop(self):
        """The compiled loop a replay's flows may run in (:mod:`m4ray.sim.dagloop`, its m4
        mode), entered now, or None: updates other than once per instant (``window_us`` 0), an
        engine without its compiled one-call updates (``NativeM4Engine.use_compiled_pass``), or
        flows already sent."""
        if self._loop is None and self.window_s == 0.0 and not self.n_events:
            make = getattr(self.engine, "dag_loop", None)
            loop = make() if make is not None else None
            if loop is not None:  # what was scheduled so far moves over, in its order
                for t, fn in self.events.drain():
                    loop.queue.push(t, fn)
                self._loop, self.events = loop, loop.queue
        return self._loop

    def _m4_update(self) -> None:
        """An update the compiled loop hands back (beyond the engine's ``compiled_limits``: the
        stepper's path)."""
        self._loop.m4_schedule(*self.engine.loop_update(self._now))

    def run(self, until: float | None = None) -> None:
        horizon = float("inf") if until is None else until
        if self._loop is not None:
            self._loop.run(self, horizon)
            self.n_events = self._loop.n_events
            if until is None and self.engine.n_components:
                raise SimulationError(f"{self.engine.n_components} m4 components never ended")
            return
        while len(self.events):
            t = self.events.peek_time()
            if t > horizon:
                self._now = horizon
                return
            _, fn = self.events.pop()
            self._now = t
            fn()
        if self._done:
            raise SimulationError(f"{len(self._done)} flows never completed")

    def set_bandwidth(self, link: int, bandwidth_bps: float) -> None:
        self.engine.set_bandwidth(link, bandwidth_bps)

    # ------------------------------------------------------------ internals
    def _changed(self) -> None:
        if self.window_s is None:
            self._apply(self.engine.predict(self._now))
        elif not self._armed:
            self._armed = True
            self.events.push(self._now + self.window_s, self._timer)

    def _timer(self) -> None:
        self._armed = False
        self._apply(self.engine.predict(self._now))

    def _bump(self, rows: np.ndarray) -> np.ndarray:
        """New versions of ``rows``' predictions."""
        try:
            self._version[rows] += 1  # an index error changes nothing (the read comes first)
        except IndexError:
            grown = np.zeros(2 * int(rows.max()) + 2, dtype=np.int64)
            grown[: len(self._version)] = self._version
            self._version = grown
            self._version[rows] += 1
        return self._version[rows]

    def _apply(self, predicted) -> None:
        """Schedule an update's predicted completions as one batch: the flows in time order,
        each at the insertion rank its own event would have had (:meth:`EventQueue.reserve`),
        and only the next one in the queue at a time. Same order of events as one event per
        flow, without a heap entry per flow and update (a component of thousands of flows,
        an all-to-all at scale, is updated at every completion). ``predicted``: the engine's
        (rows, flow ids, times), or None."""
        if predicted is None:
            return
        rows, flows, times = predicted
        if not len(rows):
            return
        times = np.maximum(times, self._now)
        versions = self._bump(rows)
        first = self.events.reserve(len(rows))
        order = np.argsort(times, kind="stable")  # ties by rank
        batch = _Batch(
            times[order].tolist(),
            flows[order].tolist(),
            rows[order].tolist(),
            versions[order].tolist(),
            (order + first).tolist(),
        )
        self._next_in(batch)

    def _next_in(self, batch: _Batch) -> None:
        """Queue ``batch``'s next completion that is still current (a later update may have
        superseded the others: they would do nothing)."""
        version, i, rows = self._version, batch.i, batch.rows
        while i < len(rows) and version[rows[i]] != batch.versions[i]:
            i += 1
        batch.i = i
        if i < len(batch.flows):
            self.events.push_ranked(batch.times[i], batch.ranks[i], lambda: self._fire(batch))

    def _fire(self, batch: _Batch) -> None:
        i = batch.i
        batch.i = i + 1
        self._finish(batch.flows[i], batch.rows[i], batch.versions[i])
        self._next_in(batch)

    def _at(self, flow_id: int, t: float) -> None:
        row = self.engine.row(flow_id)
        version = int(self._bump(np.array([row]))[0])
        self.events.push(max(t, self._now), lambda: self._finish(flow_id, row, version))

    def _finish(self, flow_id: int, row: int, version: int) -> None:
        if self._version[row] != version:
            return  # superseded by a newer prediction
        self.engine.complete(flow_id, self._now)
        on_done = self._done.pop(flow_id)
        self.n_events += 1
        self._changed()
        on_done(flow_id, self._now)


__all__ = ["CHECKPOINTS", "M4Backend", "M4Config", "checkpoint_dir", "load_model"]
