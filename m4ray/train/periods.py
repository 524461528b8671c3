"""m4's training replay: busy periods as tensors (:class:`PeriodSample`), the updates the online
engine would make over them (:func:`engine_schedule`, the same component bookkeeping and fluid
anchor), periods batched as one disjoint graph (:func:`collate`) and replayed through the model
event by event in lockstep (:func:`forward_batch`), and the losses (:func:`period_losses`;
:class:`PeriodLoss` is what DDP wraps). The model itself is architecture only
(:mod:`m4ray.models.m4`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import accumulate

import numpy as np
import torch
from torch import nn

from m4ray.errors import InputError
from m4ray.models.components import Components
from m4ray.models.fluid import N_FEATURES as N_FLUID
from m4ray.models.fluid import Fluid
from m4ray.models.m4 import M4Model


@dataclass(kw_only=True, slots=True)
class PeriodSample:
    """One busy period as tensors (flows re-indexed 0..F−1, links 0..L−1 within the period).

    ``arrival``/``departure`` ``[F]``: event indices; ``dt_us [E]``: time since the previous event
    (0 for the first); ``incidence [2, ΣE]``: (flow, link) pairs; ``link_bandwidth [L]``: bit/s;
    ``params [P]``; targets: ``slowdown [F]``, remaining fractions ``remain [R, 3]`` as
    (event, flow, fraction) rows and cube-root queue lengths ``queue [Q, 3]`` as
    (flow, link, value) rows at the flow's arrival; ``ideal_s [F]``: ideal FCTs (s), which
    models with ``fluid`` need, and ``wire_bytes [F]`` (payload and headers; default the
    sizes), what their fluid anchor drains; ``window [F, 2]`` (rate cap in bit/s, bits to
    drain) where the sender's window binds (:meth:`~m4ray.models.fairshare.Window.limit`; inf, wire
    bits elsewhere), which models with ``fluid_window`` need; ``link_reverse [L]`` each link
    row's reverse link row (-1: not in the period) and ``ack_fraction`` (ACK bits per data
    bit; 0: TCP), which models with ``fluid_acks`` need; ``fifo_bits``: the sender window on
    the wire in bits (inf: none), up to which a ``fluid_fifo`` anchor serves flows in order.
    """

    size_bytes: torch.Tensor
    n_links: torch.Tensor
    arrival: torch.Tensor
    departure: torch.Tensor
    dt_us: torch.Tensor
    incidence: torch.Tensor
    link_bandwidth: torch.Tensor
    params: torch.Tensor
    slowdown: torch.Tensor
    remain: torch.Tensor
    queue: torch.Tensor
    ideal_s: torch.Tensor | None = None
    wire_bytes: torch.Tensor | None = None
    window: torch.Tensor | None = None
    link_reverse: torch.Tensor | None = None
    ack_fraction: float = 0.0
    fifo_bits: float = math.inf
    # classic flowSim's slowdown of each flow [F] (a run of the whole scenario; >= 1), which
    # models with flow_prior read
    prior: torch.Tensor | None = None
    # engine_schedule's answers (they depend on the recorded events only), by `fluid`
    schedules: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def n_link_rows(self) -> int:
        return len(self.link_bandwidth)

    def to(self, device: torch.device | str) -> PeriodSample:
        moved = {
            name: value.to(device) if isinstance(value, torch.Tensor) else value
            for name in self.__slots__
            if name != "schedules" and (value := getattr(self, name)) is not None
        }
        return PeriodSample(**moved, schedules=self.schedules)


@dataclass(frozen=True, slots=True)
class EventUpdate:
    """What the online engine updates at one event of a period (local rows): the flows and
    links of the components the event touched, each row's Δt (µs, since its component's last
    update), and the links that went idle at the event (reset to their initial state first);
    with the fluid anchor, the updated flows' ``base [n]`` and ``fluid [n, 3]``
    (:meth:`~m4ray.models.fluid.Fluid.advance`), else empty."""

    flows: np.ndarray
    links: np.ndarray
    dt_flow: np.ndarray
    dt_link: np.ndarray
    reset: np.ndarray
    base: np.ndarray
    fluid: np.ndarray


class _Replay:
    """The engine's bookkeeping (:class:`~m4ray.models.components.Components`, times in µs) over
    a period's local flow and link rows, with the fluid anchor where the model has one."""

    def __init__(self, paths: list[list[int]], n_links: int, fluid: tuple | None = None) -> None:
        self.paths = paths
        # (Fluid, link bandwidths [L], ideal FCTs [F] in s, wire bytes [F], window [F, 2] or
        # None) with the anchor
        self.fluid = fluid
        self.components = Components(n_links)

    def arrive(self, f: int, t: float) -> None:
        self.components.join(f, self.paths[f], t)
        if self.fluid is not None:
            state, bandwidth, ideal, size, window = self.fluid
            state.add(
                f,
                size[f],
                ideal[f],
                bandwidth[self.paths[f]].min(),
                t * 1e-6,
                window=None if window is None else tuple(window[f]),
            )

    def depart(self, f: int, t: float) -> list[int]:
        """``f`` leaves at ``t``; returns the links it leaves idle."""
        if self.fluid is not None:  # the flows left behind shared with it until now (engine)
            state, bandwidth, *_ = self.fluid
            flows = self.components.of(f).flows
            members = np.fromiter(flows, np.int64, len(flows))
            state.catch_up(members, [np.asarray(self.paths[g]) for g in flows], bandwidth, t * 1e-6)
            state.release(f, self.paths[f])
        return self.components.leave(f, self.paths[f])

    def update(self, t: float, idle: list[int]) -> EventUpdate:
        """Advance the touched components to ``t`` (the rows and Δt of this event)."""
        flows_j: list[int] = []
        links_j: list[int] = []
        dtf: list[float] = []
        dtl: list[float] = []
        comps = self.components.comps
        for c in self.components.take_touched():
            comp = comps[c]
            dt = max(t - comp.t_last, 0.0)
            comp.t_last = t
            flows_j += comp.flows
            links_j += sorted(comp.links)
            dtf += [dt] * len(comp.flows)
            dtl += [dt] * len(comp.links)
        flows = np.asarray(flows_j, dtype=np.int64)
        base, fluid = np.zeros(0), np.zeros((0, N_FLUID))
        if self.fluid is not None and len(flows):
            state, bandwidth, *_ = self.fluid
            links = [np.asarray(self.paths[f]) for f in flows_j]
            base, fluid = state.advance(flows, links, bandwidth, t * 1e-6)
        return EventUpdate(
            flows=flows,
            links=np.asarray(links_j, dtype=np.int64),
            dt_flow=np.asarray(dtf, dtype=np.float32),
            dt_link=np.asarray(dtl, dtype=np.float32),
            reset=np.asarray(sorted(set(idle)), dtype=np.int64),
            base=base,
            fluid=fluid,
        )


def engine_schedule(s: PeriodSample, fluid: bool | str | None = False) -> list[EventUpdate]:
    """The online engine's bookkeeping (:class:`~m4ray.sim.m4.engine.M4Engine`, one update per
    event) replayed over a recorded period: at each event the arrivals join (merging the
    components they touch; a merged component keeps the oldest last-update time), the
    departures leave (links left without a flow go idle and are reset), and only the touched
    components advance, by the time since their own last update. Training replays this
    schedule, so the model learns the updates it gets online. With ``fluid`` each update
    also carries flowSim's view of its flows (needs ``s.ideal_s``), as the engine computes it.
    Kept on the sample: an epoch replays the same periods again."""
    if fluid not in s.schedules:
        s.schedules[fluid] = _schedule(s, fluid)
    return s.schedules[fluid]


def _schedule(s: PeriodSample, fluid: bool | str | None) -> list[EventUpdate]:
    t_us = np.cumsum(s.dt_us.double().cpu().numpy())
    flow_of, link_of = s.incidence.cpu().numpy()
    paths: list[list[int]] = [[] for _ in range(len(s.arrival))]
    for f, link in zip(flow_of.tolist(), link_of.tolist(), strict=True):
        paths[f].append(link)
    arrive_at: dict[int, list[int]] = {}
    depart_at: dict[int, list[int]] = {}
    for f, (a, d) in enumerate(zip(s.arrival.tolist(), s.departure.tolist(), strict=True)):
        arrive_at.setdefault(a, []).append(f)
        depart_at.setdefault(d, []).append(f)
    anchor = None
    if fluid:
        if s.ideal_s is None:
            raise ValueError("a fluid-anchored model needs the periods' ideal FCTs (ideal_s)")
        window = acks = None
        kinds = fluid.split("+") if isinstance(fluid, str) else []
        if "window" in kinds:
            if s.window is None:
                raise ValueError("a window-anchored model needs the periods' windows (window)")
            window = s.window.double().cpu().numpy()
        if "acks" in kinds and s.ack_fraction > 0:
            if s.link_reverse is None:
                raise ValueError("an ACK-loaded anchor needs the periods' reverse links")
            acks = (s.ack_fraction, s.link_reverse.cpu().numpy())
        fifo_bits = float(s.fifo_bits) if "fifo" in kinds else None
        anchor = (
            Fluid(len(paths), hold="drain" not in kinds, acks=acks, fifo_bits=fifo_bits),
            s.link_bandwidth.double().cpu().numpy(),
            s.ideal_s.double().cpu().numpy(),
            (s.size_bytes if s.wire_bytes is None else s.wire_bytes).double().cpu().numpy(),
            window,
        )
    state = _Replay(paths, s.n_link_rows, anchor)
    out = []
    for j, t in enumerate(t_us.tolist()):
        for f in arrive_at.get(j, ()):
            state.arrive(f, t)
        idle = [link for f in depart_at.get(j, ()) for link in state.depart(f, t)]
        out.append(state.update(t, idle))
    return out


def split_components(
    s: PeriodSample, fluid: bool | str | None = False
) -> list[tuple[np.ndarray, PeriodSample]]:
    """A period cut into the engine's components: groups of flows that never shared a
    component with a flow of another group (the union of every update's flows), each as a
    :class:`PeriodSample` of its own with the rows of its flows (ascending; returned beside it)
    and only its events, carrying its part of the whole period's :func:`engine_schedule`
    (``fluid``'s; the anchor is computed over the whole period first, so one component's ACKs
    still load another's links, as online).

    Replayed alone, each group's flows and links take the same updates as in the whole
    period, so their slowdowns (at departure and at every update) are the whole period's, to
    float rounding (``tests/train/test_split.py``), at a cost that grows with the group, not
    the period. A recorded busy period also joins flows whose data share a cable with another's
    ACKs (:func:`~m4ray.datagen.periods.ack_coupled`), which chains the study's rings into
    periods of thousands of flows; their components are hundreds of rings, and lockstep over
    the whole period copies every state at every event.
    The one difference: a remaining-size target recorded at another group's event is read at
    the group's last event before it, after the time step and before that event's spatial
    step (the auxiliary head's input is the flow's state a step earlier)."""
    schedule = engine_schedule(s, fluid)
    n_flows = len(s.size_bytes)
    arrival, departure = s.arrival.cpu().numpy(), s.departure.cpu().numpy()
    event_flow = np.full(len(schedule), -1, dtype=np.int64)
    event_flow[arrival] = np.arange(n_flows)
    event_flow[departure] = np.arange(n_flows)
    if (event_flow < 0).any() or len(schedule) != 2 * n_flows:
        raise ValueError("a period to split needs one arrival and one departure event per flow")
    parent = np.arange(n_flows)

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = int(parent[x])
        return x

    for update in schedule:
        if len(update.flows) > 1:
            root = find(int(update.flows[0]))
            for f in update.flows[1:].tolist():
                parent[find(f)] = root
    roots, group = np.unique(
        np.fromiter((find(f) for f in range(n_flows)), np.int64, n_flows), return_inverse=True
    )
    t_us = np.cumsum(s.dt_us.double().cpu().numpy())
    flow_of, link_of = s.incidence.cpu().numpy()
    reverse = None if s.link_reverse is None else s.link_reverse.cpu().numpy()
    remain, queue = s.remain.cpu().numpy(), s.queue.cpu().numpy()
    rem_flow, que_flow = remain[:, 1].astype(np.int64), queue[:, 0].astype(np.int64)
    # per group: its flows, events, incidence rows, remaining-size rows and queue rows
    cuts = [
        _by_group(group[x], len(roots))
        for x in (np.arange(n_flows), event_flow, flow_of, rem_flow, que_flow)
    ]
    flow_local = np.empty(n_flows, dtype=np.int64)  # a flow's row in its group (one array: the
    for flows in cuts[0]:  # groups partition the flows)
        flow_local[flows] = np.arange(len(flows))
    out = []
    for flows, events, edges, rem_rows, que_rows in zip(*cuts, strict=True):
        links = np.unique(link_of[edges])  # sorted: a link's row is its rank here
        rem, que = remain[rem_rows], queue[que_rows]
        rem_event = np.searchsorted(events, rem[:, 0].astype(np.int64), side="right") - 1
        t = t_us[events]
        part = PeriodSample(
            size_bytes=s.size_bytes[flows],
            n_links=s.n_links[flows],
            arrival=torch.from_numpy(np.searchsorted(events, arrival[flows])),
            departure=torch.from_numpy(np.searchsorted(events, departure[flows])),
            dt_us=torch.from_numpy(np.diff(t, prepend=t[0]).astype(np.float32)),
            incidence=torch.from_numpy(
                np.stack([flow_local[flow_of[edges]], np.searchsorted(links, link_of[edges])])
            ),
            link_bandwidth=s.link_bandwidth[links],
            params=s.params,
            slowdown=s.slowdown[flows],
            remain=torch.from_numpy(
                np.stack([rem_event, flow_local[rem_flow[rem_rows]], rem[:, 2]], axis=1)
            ).to(s.remain.dtype),
            queue=torch.from_numpy(
                np.stack(
                    [
                        flow_local[que_flow[que_rows]],
                        np.searchsorted(links, que[:, 1].astype(np.int64)),
                        que[:, 2],
                    ],
                    axis=1,
                )
            ).to(s.queue.dtype),
            ideal_s=None if s.ideal_s is None else s.ideal_s[flows],
            wire_bytes=None if s.wire_bytes is None else s.wire_bytes[flows],
            window=None if s.window is None else s.window[flows],
            link_reverse=None if reverse is None else torch.from_numpy(_rows_in(links, reverse)),
            ack_fraction=s.ack_fraction,
            fifo_bits=s.fifo_bits,
            prior=None if s.prior is None else s.prior[flows],
        )
        part.schedules[fluid] = [_local(schedule[j], flow_local, links) for j in events]
        out.append((flows, part))
    return out


def _by_group(key: np.ndarray, n_groups: int) -> list[np.ndarray]:
    """The indices of ``key``'s entries per group ``0..n_groups-1``, ascending (one sort)."""
    order = np.argsort(key, kind="stable")
    return np.split(order, np.searchsorted(key[order], np.arange(1, n_groups)))


def _rows_in(links: np.ndarray, reverse: np.ndarray) -> np.ndarray:
    """Each of the sorted ``links``' reverse link as a row of ``links``, or -1 (not in it)."""
    back = reverse[links]
    at = np.minimum(np.searchsorted(links, back), len(links) - 1)
    return np.where((back >= 0) & (links[at] == back), at, -1)


def _local(u: EventUpdate, flow_local: np.ndarray, links: np.ndarray) -> EventUpdate:
    """``u`` with its flow and link rows renumbered (a component's own rows; ``links`` sorted,
    a link's row is its rank)."""
    return EventUpdate(
        flows=flow_local[u.flows],
        links=np.searchsorted(links, u.links),
        dt_flow=u.dt_flow,
        dt_link=u.dt_link,
        reset=np.searchsorted(links, u.reset),
        base=u.base,
        fluid=u.fluid,
    )


@dataclass(kw_only=True, slots=True)
class PeriodBatch:
    """Busy periods side by side as one disjoint graph (flow and link rows offset per period).

    Event ``j`` of the replay is every period's own event ``j``: ``dt_us [B, E_max]`` (0-padded),
    ``flow_sample [F]`` / ``link_sample [L]`` map rows to their period. ``remain`` rows are
    sorted by event with ``remain_ptr [E_max + 1]`` bounds, ``queue`` rows by their flow's
    arrival with ``queue_ptr``; both carry global row indices."""

    n_samples: int
    size_bytes: torch.Tensor
    n_links: torch.Tensor
    arrival: torch.Tensor
    departure: torch.Tensor
    flow_sample: torch.Tensor
    link_sample: torch.Tensor
    dt_us: torch.Tensor
    incidence: torch.Tensor
    link_bandwidth: torch.Tensor
    params: torch.Tensor
    slowdown: torch.Tensor
    remain: torch.Tensor
    remain_ptr: torch.Tensor
    queue: torch.Tensor
    queue_ptr: torch.Tensor
    # classic flowSim's slowdown per flow row (None: a period came without it)
    prior: torch.Tensor | None
    # per event: flows, links, dt_flow, dt_link, reset, base, fluid (the last two empty
    # without the fluid anchor)
    updates: list[tuple[torch.Tensor, ...]]


def collate(samples: list[PeriodSample], fluid: bool | str | None = False) -> PeriodBatch:
    """Stack periods into a :class:`PeriodBatch` (row order: period by period); ``fluid``:
    compute the fluid anchor's features (:func:`engine_schedule`; a :attr:`ModelConfig.anchor`:
    ``"drain"`` without :class:`~m4ray.models.fluid.Fluid`'s ``hold``, ``+window`` with the
    senders' windows)."""
    if not samples:
        raise ValueError("empty batch")
    device = samples[0].size_bytes.device
    n_flows = [len(s.size_bytes) for s in samples]
    n_links = [s.n_link_rows for s in samples]
    flow_off = [0, *accumulate(n_flows)][:-1]
    link_off = [0, *accumulate(n_links)][:-1]
    n_events = max(len(s.dt_us) for s in samples)
    dt = torch.zeros(len(samples), n_events, device=device)
    for i, s in enumerate(samples):
        dt[i, : len(s.dt_us)] = s.dt_us
    ids = torch.arange(len(samples), device=device)
    incidence = torch.cat(
        [
            s.incidence + torch.tensor([[f], [lk]], device=device)
            for s, f, lk in zip(samples, flow_off, link_off, strict=True)
        ],
        dim=1,
    )
    remain = torch.cat(
        [
            s.remain + torch.tensor([0.0, f, 0.0], device=device)
            for s, f in zip(samples, flow_off, strict=True)
        ]
    )
    queue = torch.cat(
        [
            s.queue + torch.tensor([f, lk, 0.0], device=device)
            for s, f, lk in zip(samples, flow_off, link_off, strict=True)
        ]
    )
    arrival = torch.cat([s.arrival for s in samples])
    remain = remain[torch.argsort(remain[:, 0], stable=True)]
    queue_event = arrival[queue[:, 0].long()]
    order = torch.argsort(queue_event, stable=True)
    queue, queue_event = queue[order], queue_event[order]
    steps = torch.arange(n_events + 1, device=device)
    schedules = [engine_schedule(s, fluid) for s in samples]
    updates = []
    for j in range(n_events):
        parts = [
            (sched[j], f, lk)
            for sched, f, lk in zip(schedules, flow_off, link_off, strict=True)
            if j < len(sched)
        ]
        updates.append(
            tuple(
                torch.from_numpy(np.concatenate(arrays)).to(device)
                for arrays in zip(
                    *(
                        (
                            u.flows + f,
                            u.links + lk,
                            u.dt_flow,
                            u.dt_link,
                            u.reset + lk,
                            u.base.astype(np.float32),
                            u.fluid.astype(np.float32),
                        )
                        for u, f, lk in parts
                    ),
                    strict=True,
                )
            )
        )
    return PeriodBatch(
        n_samples=len(samples),
        size_bytes=torch.cat([s.size_bytes for s in samples]),
        n_links=torch.cat([s.n_links for s in samples]),
        arrival=arrival,
        departure=torch.cat([s.departure for s in samples]),
        flow_sample=ids.repeat_interleave(torch.tensor(n_flows, device=device)),
        link_sample=ids.repeat_interleave(torch.tensor(n_links, device=device)),
        dt_us=dt,
        incidence=incidence,
        link_bandwidth=torch.cat([s.link_bandwidth for s in samples]),
        params=torch.cat(
            [s.params.reshape(1, -1).expand(n, -1) for s, n in zip(samples, n_flows, strict=True)]
        ),
        slowdown=torch.cat([s.slowdown for s in samples]),
        remain=remain,
        remain_ptr=torch.searchsorted(remain[:, 0].contiguous(), steps.to(remain.dtype)),
        queue=queue,
        queue_ptr=torch.searchsorted(queue_event.contiguous(), steps),
        prior=(
            torch.cat([s.prior for s in samples])
            if all(s.prior is not None for s in samples)
            else None
        ),
        updates=updates,
    )


def forward_batch(
    model: M4Model, b: PeriodBatch, every: bool = False, error: str = "relative"
) -> tuple[torch.Tensor, ...]:
    """Replay busy periods event by event in lockstep (``reference/m4.md`` §4), updating what
    the online engine updates (:func:`engine_schedule`).

    At event ``j`` the links that went idle are reset, the flows and links of the touched
    components get the time update (each component's own Δt since its last update), the aux
    heads are read, then the spatial update runs over those components' flow–link graphs
    (periods are disjoint, so they do not interact). Returns
    the predicted slowdown ``[ΣF]`` (each flow read out from its state frozen at its departure)
    and the per-period mean absolute errors ``[B]`` of the remaining-size and queue heads;
    with ``every``, also each flow's mean relative error ``[ΣF]`` over the slowdowns read at
    every update it takes part in (``error``: :data:`ERRORS`), and (fluid models; else 0) the
    mean |correction| of those readings, |slowdown / anchor − 1| ``[ΣF]``.
    """
    measure = ERRORS[error]
    n_flows, n_link_rows = len(b.size_bytes), len(b.link_bandwidth)
    device = b.size_bytes.device
    params = flow_inputs(model.cfg, b)
    h_flow = model.flow_state(b.size_bytes, b.n_links)
    link_init = model.link_state(b.link_bandwidth)
    h_link = link_init
    in_update = torch.zeros(n_flows, dtype=torch.bool, device=device)
    # the fluid anchor at each flow's last update (what its final slowdown is read against)
    base_last = h_flow.new_ones(n_flows)
    fluid_last = h_flow.new_zeros(n_flows, N_FLUID)
    every_sum = h_flow.new_zeros(n_flows)
    every_n = h_flow.new_zeros(n_flows)
    shift_sum = h_flow.new_zeros(n_flows)
    flow_row = torch.full((n_flows,), -1, dtype=torch.long, device=device)
    link_row = torch.full((n_link_rows,), -1, dtype=torch.long, device=device)
    remain, queue = ([], []), ([], [])  # (errors, periods) of each aux head
    for j, (flows, links, dt_flow, dt_link, reset, base, fluid) in enumerate(b.updates):
        if len(reset):  # links left idle at this event start over, as online
            h_link = h_link.index_copy(0, reset, link_init[reset])
        if len(flows):
            new_flow, new_link = model.time_step(
                h_flow[flows], h_link[links], dt_flow.to(h_flow.dtype), dt_link.to(h_flow.dtype)
            )
            h_flow = h_flow.index_copy(0, flows, new_flow)
            h_link = h_link.index_copy(0, links, new_link)
        _aux(model.remain_head, h_flow, j, (b.remain, b.remain_ptr, b.flow_sample), remain)
        _aux(model.queue_head, h_link, j, (b.queue, b.queue_ptr, b.link_sample), queue)
        if not len(flows):
            continue
        in_update[flows] = True
        edges = b.incidence[:, in_update[b.incidence[0]]]
        in_update[flows] = False
        flow_row[flows] = torch.arange(len(flows), device=device)
        link_row[links] = torch.arange(len(links), device=device)
        local = torch.stack([flow_row[edges[0]], link_row[edges[1]]])
        new_flow, new_link = model.spatial_step(
            h_flow[flows], h_link[links], local, params[flows], fluid if len(fluid) else None
        )
        h_flow = h_flow.index_copy(0, flows, new_flow)
        h_link = h_link.index_copy(0, links, new_link)
        if model.cfg.fluid:
            base_last = base_last.index_copy(0, flows, base.to(base_last.dtype))
            fluid_last = fluid_last.index_copy(0, flows, fluid.to(fluid_last.dtype))
        if every:
            now = model.slowdown(
                new_flow, b.n_links[flows], params[flows], fluid_last[flows], base_last[flows]
            )
            every_sum = every_sum.index_add(0, flows, measure(now, b.slowdown[flows]))
            every_n = every_n.index_add(0, flows, torch.ones_like(now))
            if model.cfg.fluid:  # how far the model moves from its anchor
                shift_sum = shift_sum.index_add(0, flows, (now / base_last[flows] - 1).abs())
    out = (
        model.slowdown(h_flow, b.n_links, params, fluid_last, base_last),
        _per_sample(*remain, b.n_samples, h_flow),
        _per_sample(*queue, b.n_samples, h_flow),
    )
    if not every:
        return out
    return (*out, every_sum / every_n.clamp(min=1), shift_sum / every_n.clamp(min=1))


def flow_inputs(cfg, b: PeriodBatch) -> torch.Tensor:
    """Each flow row's inputs beside its state ``[F, P (+ 1)]``: params13 and, for models with
    ``flow_prior``, log2 of classic flowSim's slowdown."""
    if not cfg.flow_prior:
        return b.params
    if b.prior is None:
        raise InputError(
            "the model reads classic flowSim's slowdown per flow (flow_prior); these periods "
            "have none",
            field="prior",
        )
    prior = torch.log2(b.prior.to(b.params.dtype).clamp(min=1.0)).unsqueeze(1)
    return torch.cat([b.params, prior], dim=1)


def _aux(head, h, j: int, target: tuple, out: tuple[list, list]) -> None:
    """An aux head's absolute errors on its ``target`` rows (rows, event bounds, period of
    each state row) of event ``j``, appended to ``out`` (errors, periods)."""
    rows, ptr, sample_of = target
    lo, hi = int(ptr[j]), int(ptr[j + 1])
    if hi > lo:
        rows = rows[lo:hi]
        at = rows[:, 1].long()
        out[0].append((head(h[at]).squeeze(1) - rows[:, 2]).abs())
        out[1].append(sample_of[at])


def _per_sample(errors: list, who: list, n: int, like: torch.Tensor) -> torch.Tensor:
    """Mean error per period ``[n]`` (0 for a period without rows)."""
    if not errors:
        return like.new_zeros(n)
    err, who = torch.cat(errors), torch.cat(who)
    total = like.new_zeros(n).index_add_(0, who, err)
    return total / torch.bincount(who, minlength=n).clamp(min=1)


def forward_period(
    model: M4Model, s: PeriodSample
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One period: slowdown predictions ``[F]`` and the two aux-head errors (scalars)."""
    pred, remain, queue = forward_batch(model, collate([s], fluid=model.cfg.anchor))
    return pred, remain[0], queue[0]


def _relative(pred: torch.Tensor, true: torch.Tensor) -> torch.Tensor:
    return (pred / true - 1).abs()


def _log(pred: torch.Tensor, true: torch.Tensor) -> torch.Tensor:
    # below half the truth, the tangent at 1/2 (same value and slope): a prediction near 0 would
    # otherwise send its gradient to infinity (a hidden-64 model diverged on an H200 with it)
    ratio = pred / true
    return torch.where(
        ratio < 0.5, math.log(2.0) + 2.0 * (0.5 - ratio), torch.log(ratio.clamp(min=0.5)).abs()
    )


# a flow's error as training measures it: "relative" |ŝ/s − 1| (m4's), whose minimiser where the
# outcome is uncertain is the 1/s-weighted median (it leans toward the fast outcomes); "log"
# |log(ŝ/s)|, whose minimiser is the plain median
ERRORS = {"relative": _relative, "log": _log}


def relative_l1(pred: torch.Tensor, true: torch.Tensor) -> torch.Tensor:
    """m4's main loss: mean ``|ŝ / s − 1|``."""
    return _relative(pred, true).mean()


def period_losses(
    model: M4Model, batch: list[PeriodSample], every: bool = False, error: str = "relative"
) -> dict[str, torch.Tensor]:
    """Losses of a batch of busy periods, replayed in lockstep (what :class:`PeriodLoss` gives DDP).

    Per period: ``main_each [B]`` = relative L1 on slowdown, ``remain_each`` / ``queue_each``
    = mean absolute errors of the dense-supervision heads; ``main`` / ``remain`` / ``queue``
    are their means over the batch; ``main_flows`` = relative L1 over every flow of the batch
    (large periods weigh more); ``pred [ΣF]`` = the slowdown predictions, periods
    concatenated in order; with ``every``, ``every_flows`` = the relative L1 of the slowdown
    read at every
    update a flow takes part in (averaged per flow, then over flows): what the online engine
    schedules completions by, and, unlike the read-out at departure, never informed by how
    long the flow has already taken in the recording; ``every_shift`` = the mean
    |correction| of those readings (fluid models: how far they move from the anchor). ``error``
    (:data:`ERRORS`) is how the flows' errors are measured; the aux heads' are absolute."""
    b = collate(batch, fluid=model.cfg.anchor)
    pred, remain_each, queue_each, *read = forward_batch(model, b, every=every, error=error)
    err = ERRORS[error](pred, b.slowdown)
    count = torch.bincount(b.flow_sample, minlength=b.n_samples).clamp(min=1)
    main_each = pred.new_zeros(b.n_samples).index_add_(0, b.flow_sample, err) / count
    return {
        "main": main_each.mean(),
        "main_flows": err.mean(),
        **({"every_flows": read[0].mean(), "every_shift": read[1].mean()} if every else {}),
        "remain": remain_each.mean(),
        "queue": queue_each.mean(),
        "main_each": main_each,
        "remain_each": remain_each,
        "queue_each": queue_each,
        "pred": pred,
    }


class PeriodLoss(nn.Module):
    """The module DDP wraps in training: calling it gives :func:`period_losses` of the wrapped
    model (whose parameters it shares, so the model itself is what is saved)."""

    def __init__(self, model: M4Model) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, batch: list[PeriodSample], every: bool = False, error: str = "relative"
    ) -> dict[str, torch.Tensor]:
        return period_losses(self.model, batch, every, error)


__all__ = [
    "ERRORS",
    "PeriodBatch",
    "PeriodLoss",
    "PeriodSample",
    "collate",
    "forward_batch",
    "forward_period",
    "period_losses",
    "relative_l1",
    "split_components",
]
