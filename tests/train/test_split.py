"""Busy periods cut into the engine's components (``split_components``, ``DataConfig.components``):
each part replayed alone gives its flows the whole period's slowdowns."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from m4ray.models.m4 import M4Model, ModelConfig
from m4ray.train.data import DataConfig, Sample, components_of, load_splits, peak_active
from m4ray.train.periods import (
    PeriodSample,
    collate,
    engine_schedule,
    forward_batch,
    split_components,
)

FLUID = ModelConfig(hidden=16, gnn_hidden=24, gnn_layers=3, fluid=True, fluid_acks=True)


def period() -> PeriodSample:
    """Four flows, one event each at a time: f0 and f1 share link 0 (one component); f2 sends on
    link 1, link 0's reverse, so its ACKs load link 0 but it never joins f0's component; f3 is
    alone on link 3. Events: a0 a2 a1 a3 d1 d0 d3 d2."""
    return PeriodSample(
        size_bytes=torch.tensor([200_000, 50_000, 400_000, 30_000]),
        n_links=torch.tensor([1, 2, 1, 1]),
        arrival=torch.tensor([0, 2, 1, 3]),
        departure=torch.tensor([5, 4, 7, 6]),
        dt_us=torch.tensor([0.0, 1.0, 2.0, 0.5, 9.0, 6.0, 3.0, 12.0]),
        incidence=torch.tensor([[0, 1, 1, 2, 3], [0, 0, 2, 1, 3]]),
        link_bandwidth=torch.tensor([100e9, 100e9, 50e9, 25e9]),
        params=torch.tensor([12.0, 10.0, 1.0, 0, 0, 0, 20.0, 0, 0, 0, 0, 0, 0]),
        slowdown=torch.tensor([1.5, 2.0, 1.2, 1.0]),
        # f0's remaining size at f2's arrival (another component's event) and its own
        remain=torch.tensor([[0, 0, 1.0], [1, 0, 0.9], [2, 1, 1.0], [4, 0, 0.4]]),
        queue=torch.tensor([[0, 0, 0.0], [1, 0, 1.0], [1, 2, 0.5], [2, 1, 0.0], [3, 3, 0.0]]),
        ideal_s=torch.tensor([16e-6, 12e-6, 32e-6, 9.6e-6], dtype=torch.float64),
        wire_bytes=torch.tensor([210_000, 53_000, 420_000, 32_000]),
        link_reverse=torch.tensor([1, 0, -1, -1]),
        ack_fraction=0.05,
    )


def test_each_component_replayed_alone_gets_the_whole_periods_slowdowns():
    torch.manual_seed(5)
    model = M4Model(FLUID).eval()
    whole = period()
    parts = split_components(whole, FLUID.anchor)
    assert [f.tolist() for f, _ in parts] == [[0, 1], [2], [3]]
    first = parts[0][1]
    assert first.arrival.tolist() == [0, 1] and first.departure.tolist() == [3, 2]
    # its own events only, their times kept: a0 (0), a1 (3), d1 (12.5), d0 (18.5) µs
    assert np.allclose(np.cumsum(first.dt_us.numpy()), [0.0, 3.0, 12.5, 18.5])
    assert torch.equal(first.link_bandwidth, whole.link_bandwidth[[0, 2]])
    assert first.link_reverse.tolist() == [-1, -1]  # link 1 is f2's, not this part's
    # f0's remaining size at f2's arrival (event 1) is read at the part's last event before it
    assert first.remain[:, :2].tolist() == [[0, 0], [0, 0], [1, 1], [2, 0]]
    with torch.no_grad():
        full = forward_batch(model, collate([whole], FLUID.anchor), every=True)
        pred, every = torch.zeros(4), torch.zeros(4)
        for flows, part in parts:
            out = forward_batch(model, collate([part], FLUID.anchor), every=True)
            pred[flows], every[flows] = out[0], out[3]
    assert torch.allclose(pred, full[0], rtol=1e-6)
    assert torch.allclose(every, full[3], rtol=1e-6, atol=1e-7)
    # the part carries the whole period's anchor: f2's ACKs on link 0 slowed f0 and f1
    alone = dataclasses.replace(first, schedules={})
    carried = [u.base for u in first.schedules[FLUID.anchor] if len(u.flows)]
    own = [u.base for u in engine_schedule(alone, FLUID.anchor) if len(u.flows)]
    assert any(not np.allclose(a, b) for a, b in zip(carried, own, strict=True))


def test_components_of_keeps_the_parts_within_the_limits():
    whole = period()
    flowsim = torch.tensor([1.0, 2, 3, 4])
    sample = Sample(scenario_id="s", period_id=3, period=whole, flowsim_slowdown=flowsim)
    cfg = DataConfig(components=True, max_flows=2, max_active=3)
    (part,) = components_of(sample, cfg, FLUID.anchor)  # the single-flow parts are dropped
    assert (part.period_id, part.component, part.n_flows) == (3, 0, 2)
    assert part.flowsim_slowdown.tolist() == [1.0, 2.0]
    assert peak_active(part.period) == 2 and peak_active(whole) == 4
    assert not components_of(sample, dataclasses.replace(cfg, max_active=2), FLUID.anchor)
    assert not components_of(sample, dataclasses.replace(cfg, max_flows=1), FLUID.anchor)


def test_real_periods_side_by_side_cut_apart_and_answer_as_whole(tiny_dataset):
    """Two recorded periods of the real-ns-3 test dataset as one (their events interleaved in
    time, on disjoint links; the tiny dataset's periods are one component each): the cut gives
    each flow what the whole gives it."""
    dataset, _ = tiny_dataset
    cfg = DataConfig(dataset=str(dataset / "dataset"), max_flows=10_000, max_active=10_000)
    whole = sorted(load_splits(cfg, FLUID.anchor)["train"], key=lambda s: -s.n_flows)
    a, b = whole[0].period, whole[1].period
    both = side_by_side(a, b)
    torch.manual_seed(6)
    model = M4Model(FLUID).eval()
    cut = split_components(both, FLUID.anchor)
    assert len(cut) >= 2
    assert all(f.max() < len(a.size_bytes) or f.min() >= len(a.size_bytes) for f, _ in cut)
    paired = 0  # parts' links whose reverse is theirs too: its row there
    flow_of, link_of = both.incidence.numpy()
    for flows, part in cut:
        links = np.unique(link_of[np.isin(flow_of, flows)])
        rows = {link: row for row, link in enumerate(links.tolist())}
        expected = [rows.get(r, -1) for r in both.link_reverse.numpy()[links].tolist()]
        assert part.link_reverse.tolist() == expected
        paired += sum(r >= 0 for r in expected)
    assert paired
    with torch.no_grad():
        full = forward_batch(model, collate([both], FLUID.anchor), every=True)
        for flows, part in cut:
            got = forward_batch(model, collate([part], FLUID.anchor), every=True)
            assert torch.allclose(got[0], full[0][flows], rtol=1e-5)
            assert torch.allclose(got[3], full[3][flows], rtol=1e-5, atol=1e-6)
    # what load_splits cuts is what components_of cuts, and it keeps the limits
    parts = load_splits(dataclasses.replace(cfg, components=True, max_flows=40), FLUID.anchor)
    assert parts["train"] and all(2 <= p.n_flows <= 40 for p in parts["train"])
    assert {(p.scenario_id, p.period_id) for p in parts["train"]} <= {
        (p.scenario_id, p.period_id) for p in whole
    }


def side_by_side(a: PeriodSample, b: PeriodSample) -> PeriodSample:
    """``a`` and ``b`` as one period (``a``'s parameters): ``b``'s flows and links after
    ``a``'s, the events of both merged in time order."""
    fa, la = len(a.size_bytes), a.n_link_rows
    times = [np.cumsum(p.dt_us.double().numpy()) for p in (a, b)]
    order = np.argsort(np.concatenate(times), kind="stable")  # merged position -> old event
    new_of = np.empty(len(order), dtype=np.int64)
    new_of[order] = np.arange(len(order))
    off = len(times[0])

    def ev(events, shift):
        return torch.from_numpy(new_of[np.asarray(events, dtype=np.int64) + shift])

    t = np.concatenate(times)[order]
    reverse = torch.cat([a.link_reverse, torch.where(b.link_reverse >= 0, b.link_reverse + la, -1)])
    rem_b = b.remain.clone()
    rem_b[:, 0] = ev(rem_b[:, 0].numpy(), off).float()
    rem_b[:, 1] += fa
    rem_a = a.remain.clone()
    rem_a[:, 0] = ev(rem_a[:, 0].numpy(), 0).float()
    queue_b = b.queue.clone()
    queue_b[:, 0] += fa
    queue_b[:, 1] += la
    return PeriodSample(
        size_bytes=torch.cat([a.size_bytes, b.size_bytes]),
        n_links=torch.cat([a.n_links, b.n_links]),
        arrival=torch.cat([ev(a.arrival, 0), ev(b.arrival, off)]),
        departure=torch.cat([ev(a.departure, 0), ev(b.departure, off)]),
        dt_us=torch.from_numpy(np.diff(t, prepend=t[0]).astype(np.float32)),
        incidence=torch.cat([a.incidence, b.incidence + torch.tensor([[fa], [la]])], dim=1),
        link_bandwidth=torch.cat([a.link_bandwidth, b.link_bandwidth]),
        params=a.params,
        slowdown=torch.cat([a.slowdown, b.slowdown]),
        remain=torch.cat([rem_a, rem_b]),
        queue=torch.cat([a.queue, queue_b]),
        ideal_s=torch.cat([a.ideal_s, b.ideal_s]),
        wire_bytes=torch.cat([a.wire_bytes, b.wire_bytes]),
        window=torch.cat([a.window, b.window]),
        link_reverse=reverse,
        ack_fraction=a.ack_fraction,
    )
