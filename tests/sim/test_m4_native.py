"""The m4 engine's compiled core (``m4ray/models/_core.c``) against the Python reference: the
fluid anchor's rows and the whole engine, flow for flow, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from m4ray.errors import InputError
from m4ray.models import core
from m4ray.models.components import Batching
from m4ray.models.fairshare import Window
from m4ray.models.fluid import Fluid
from m4ray.models.m4 import M4Model, ModelConfig
from m4ray.models.numpy_step import NumpyModel, NumpyStepper
from m4ray.sim.failures import GrayFailure
from m4ray.sim.flows import Flow
from m4ray.sim.m4 import LocalStepper, M4Engine
from m4ray.sim.m4 import engine as m4_engine
from m4ray.sim.m4.backend import M4Backend
from m4ray.sim.m4.engine import NativeM4Engine
from m4ray.sim.routing import Routing
from m4ray.sim.topologies import FatTreeSpec, RailClusterSpec
from m4ray.sim.trace import run_trace

from .test_m4_fluid import _Direct


def _model(fluid: bool, window: bool = False, hold: bool = True, acks: bool = False) -> M4Model:
    torch.manual_seed(0)
    cfg = ModelConfig(hidden=16, gnn_hidden=24, gnn_layers=3, dropout=0.0, fluid=fluid)
    cfg.fluid_window = window
    cfg.fluid_hold = hold
    cfg.fluid_acks = acks
    model = M4Model(cfg)
    with torch.no_grad():  # a correction that depends on the state, so any slip shows
        model.head[-1].weight.normal_(0, 0.3)
        model.head[-1].bias.fill_(3.0 if not fluid else 0.05)
    return model.double().eval()


def _flows(hosts, rng, n: int) -> list[Flow]:
    flows = []
    for i in range(n):
        a, b = rng.choice(len(hosts), size=2, replace=False)
        size = int(rng.choice([2_000, 30_000, 400_000, 3_000_000]))
        flows.append(Flow(i, hosts[int(a)], hosts[int(b)], size, float(rng.uniform(0, 4e-4))))
    flows += [Flow(n + i, hosts[i], hosts[0], 200_000, 1e-4) for i in range(1, 9)]  # incast
    return flows


def _run(topo, flows, routing, cfgs):
    """Each config's FCTs over ``flows`` and its engine; the last run's table."""
    answers, engines = [], []
    for cfg in cfgs:
        table = run_trace(topo, flows, cfg, routing)
        answers.append(table.column("fct_s").to_numpy())
        engines.append(cfg.engines[0])
    return answers, engines, table


@pytest.mark.parametrize(
    ("fluid", "window", "hold", "window_us", "acks", "batching"),
    [
        (True, True, False, 0.0, False, None),  # m4-v2's engine
        (True, True, False, 0.0, True, None),  # with ACK load
        (True, False, True, None, False, None),
        (True, True, True, 10.0, False, None),
        (False, False, True, 0.0, False, None),  # m4-small's
        (True, True, False, 0.0, False, Batching(4, 0.25, 1 << 20)),  # batched, anchors re-shared
        (True, True, False, 0.0, False, Batching(4, 0.25, 8)),  # and their anchor frozen
        (True, False, True, None, True, Batching(0, 0.5, 0)),
    ],
    ids=[
        "v2",
        "v2-acks",
        "fluid-per-event",
        "window-hold-10us",
        "no-anchor",
        "v2-batched",
        "v2-batched-frozen",
        "per-event-batched-frozen-acks",
    ],
)
def test_the_compiled_engine_answers_as_the_python_one_bit_for_bit(  # noqa: PLR0917
    fluid, window, hold, window_us, acks, batching
):
    """Arrivals that merge components, completions that split links off, a link slowed mid-run,
    every update policy, completion batching: the compiled engine's FCTs equal the reference's
    exactly."""
    assert core.library() is not None  # the core builds here: no silent fallback
    topo = GrayFailure(n_degraded=2, reduction=4).apply(FatTreeSpec(k=4).build())
    routing = Routing(topo, seed=0)
    hosts = sorted(topo.hosts)
    flows = _flows(hosts, np.random.default_rng(7), 120)
    model = _model(fluid, window, hold, acks)
    common = {"window_us": window_us, "param": 0.1, "ack_fraction": 0.05 if acks else 0.0}
    cfgs = [
        _Direct(model, 6_000 if window else None, native=n, batching=batching, **common)
        for n in (False, True)
    ]
    answers, engines, table = _run(topo, flows, routing, cfgs)
    assert type(engines[0]) is M4Engine
    assert type(engines[1]) is NativeM4Engine
    assert engines[1].n_updates == engines[0].n_updates > 40
    assert engines[1].n_stepped_flows == engines[0].n_stepped_flows
    assert engines[1].n_active == engines[1].n_components == 0
    np.testing.assert_array_equal(answers[1], answers[0])
    slowdown = answers[0] / table.column("ideal_fct_s").to_numpy()
    assert slowdown.max() > 1.5  # flows do share


@pytest.mark.parametrize(
    ("window", "hold", "window_us", "acks", "batching"),
    [
        (True, False, 0.0, False, None),  # m4-v2's engine on the FIFO anchor
        (True, False, 0.0, True, None),  # with ACK load
        (False, True, None, False, None),  # every flow in order of arrival
        (True, False, 0.0, True, Batching(4, 0.25, 8)),  # batched, frozen anchors
    ],
    ids=["v2-fifo", "v2-fifo-acks", "fifo-no-window", "v2-fifo-batched-frozen"],
)
def test_the_compiled_fifo_anchor_answers_as_the_python_one_bit_for_bit(
    window, hold, window_us, acks, batching
):
    """``anchor_fifo`` (flowSim's FIFO service up to the window) in the compiled core: its share
    by arrival instant (``fifo_share``) and its drain projection (``fifo_ends``) give the Python
    reference's FCTs exactly, and the FIFO anchor does move the answers (it is not max-min)."""
    topo = GrayFailure(n_degraded=2, reduction=4).apply(FatTreeSpec(k=4).build())
    routing = Routing(topo, seed=0)
    hosts = sorted(topo.hosts)
    flows = _flows(hosts, np.random.default_rng(7), 120)
    flows += [Flow(300 + i, hosts[1 + i % 3], hosts[0], 5_000, 5e-4) for i in range(9)]
    model = _model(True, window, hold, acks)
    common = {"window_us": window_us, "param": 0.1, "ack_fraction": 0.05 if acks else 0.0}
    cfgs = [
        _Direct(
            model, 6_000 if window else None, native=n, batching=batching, anchor_fifo=f, **common
        )
        for n, f in ((False, True), (True, True), (True, False))
    ]
    answers, engines, _ = _run(topo, flows, routing, cfgs)
    assert [type(e) for e in engines] == [M4Engine, NativeM4Engine, NativeM4Engine]
    assert engines[1].n_updates == engines[0].n_updates > 40
    np.testing.assert_array_equal(answers[1], answers[0])
    assert np.abs(answers[2] / answers[0] - 1).max() > 0.05


class _Fused(_Direct):
    """:class:`_Direct` stepping the numpy model, its small updates in one core call
    (``fused``) or through the stepper."""

    def __init__(
        self,
        model: M4Model,
        *args,
        fused: bool,
        memo_flows: int = 64,
        precision: str = "float64",
        **kwargs,
    ):
        super().__init__(model, *args, **kwargs)
        weights = {k: v.double().numpy() for k, v in self.model.state_dict().items()}
        self.numpy_model = NumpyModel(self.model.cfg, weights, precision)
        self.fused, self.memo_flows = fused, memo_flows

    def build(self, topology, routing):
        backend = super().build(topology, routing)
        backend.engine.stepper = NumpyStepper(self.numpy_model)
        if self.fused:
            assert backend.engine.use_compiled_pass(self.numpy_model, memo_flows=self.memo_flows)
        return backend


@pytest.mark.parametrize(
    ("fluid", "window", "acks", "window_us", "batching", "precision"),
    [
        (True, True, True, 0.0, None, "float64"),  # m4-v2's engine
        (True, True, True, 0.0, None, "float32"),  # ... with the float32 pass
        (True, False, False, None, Batching(4, 0.25, 8), "float64"),  # per event, frozen anchors
        (False, False, False, 10.0, None, "float64"),  # m4-small's: no anchor
    ],
    ids=["v2-acks", "v2-acks-float32", "per-event-batched", "no-anchor-10us"],
)
def test_an_update_in_one_core_call_answers_as_the_stepper_bit_for_bit(  # noqa: PLR0917
    fluid, window, acks, window_us, batching, precision, monkeypatch
):
    """NativeM4Engine.use_compiled_pass (prepare, the compiled pass, write-back and the memo in
    one call) gives the FCTs of the same engine stepping through NumpyStepper, exactly, in
    either float type; the memo answers repeated graphs (a wrong memo answer would move them),
    larger updates still go through the stepper, and a model of another config is refused."""
    from m4ray.models import numpy_step

    assert numpy_step.native_step_library() is not None
    monkeypatch.setattr(m4_engine, "STEPPER_FROM_FLOWS", 12)  # some updates take the stepper
    topo = GrayFailure(n_degraded=2, reduction=4).apply(FatTreeSpec(k=4).build())
    routing = Routing(topo, seed=0)
    hosts = sorted(topo.hosts)
    flows = _flows(hosts, np.random.default_rng(7), 120)
    flows += [
        Flow(200 + i, hosts[i % 4], hosts[4 + i % 4], 30_000, 2e-3 + 1e-4 * i) for i in range(40)
    ]  # fmt: skip (alone on idle links, one after another: memo hits)
    model = _model(fluid, window, acks=acks)
    common = {"window_us": window_us, "param": 0.1, "ack_fraction": 0.05 if acks else 0.0}
    cfgs = [
        _Fused(
            model,
            6_000 if window else None,
            fused=f,
            memo_flows=m,
            batching=batching,
            precision=precision,
            **common,
        )
        for f, m in ((False, 64), (True, 64), (True, 0))
    ]
    answers, engines, _ = _run(topo, flows, routing, cfgs)
    plain, fused_, no_memo = engines
    assert plain.n_updates == fused_.n_updates == no_memo.n_updates > 40
    assert plain.n_stepped_flows == fused_.n_stepped_flows
    assert 0 < fused_._stats[3] < fused_.n_updates  # some went through the stepper
    assert fused_.memo_answers > 5 and no_memo.memo_answers == 0
    np.testing.assert_array_equal(answers[1], answers[0])
    np.testing.assert_array_equal(answers[2], answers[0])
    other = _model(not fluid, window, acks=acks)
    other = NumpyModel(other.cfg, {k: v.numpy() for k, v in other.state_dict().items()})
    assert not fused_.use_compiled_pass(other)


def test_set_bandwidth_resets_an_idle_link_at_once_and_a_busy_one_when_it_idles():
    topo = RailClusterSpec().build()
    routing = Routing(topo, seed=0)
    hosts = sorted(topo.hosts)
    model = _model(True, True)
    outs = []
    for native_ in (False, True):
        engine = M4Engine(
            topo.bandwidth_bps,
            model.cfg,
            [0.1] * model.cfg.n_params,
            LocalStepper(model),
            routing,
            window=Window(6_000),
            link_latency_s=topo.latency_s,
            native=native_,
        )
        path = routing.path(hosts[0], hosts[9], 0).links
        engine.arrive_path(0, path, 500_000, 1e-4, 0.0)
        engine.update(0.0)
        engine.set_bandwidth(path[0], 25e9)  # busy: its state keeps going
        idle = routing.path(hosts[3], hosts[20], 1).links[0]
        engine.set_bandwidth(idle, 25e9)  # idle: takes the new initial state now
        first = engine.update(1e-5)
        engine.arrive_path(1, path, 100_000, 2e-5, 2e-5)
        second = engine.update(2e-5)
        engine.complete(0, 3e-5)
        engine.complete(1, 3e-5)
        outs.append((first, second, engine._h_link.copy()))
    assert outs[0][0] == outs[1][0]
    assert outs[0][1] == outs[1][1]
    np.testing.assert_array_equal(outs[0][2], outs[1][2])


def test_bad_links_are_rejected_by_the_compiled_engine_and_change_nothing():
    model = _model(True)
    engine = M4Engine(np.full(4, 1e9), model.cfg, [0.1] * model.cfg.n_params, native=True)
    assert isinstance(engine, NativeM4Engine)
    with pytest.raises(InputError, match=r"links must be ids in \[0, 4\)"):
        engine.arrive_path(0, [1, 4], 1000, 1e-5, 0.0)
    with pytest.raises(InputError, match="not active"):
        engine.complete(0, 1e-5)
    assert engine.n_active == engine.n_components == 0
    engine.arrive_path(0, [1, 2], 1000, 1e-5, 0.0)
    with pytest.raises(InputError, match="already active"):
        engine.arrive_path(0, [3], 1000, 1e-5, 0.0)
    assert engine.n_active == engine.n_components == 1


def test_the_compiled_fluid_rows_equal_the_python_ones():
    """Random components (shared links, sender caps, rows last updated at different times):
    catch_up and advance give the same rows, bases and features."""
    rng = np.random.default_rng(3)
    capacity = rng.choice([10e9, 25e9, 100e9], size=12)
    states = [Fluid(40, native=False), Fluid(40, native=True)]
    assert states[1].native
    rows = np.arange(30)
    links = [rng.choice(12, size=int(rng.integers(1, 5)), replace=False) for _ in rows]
    t = 0.0
    for step in range(6):
        arriving = rows[step * 5 : step * 5 + 5]
        caps = {int(r): (float(rng.uniform(1e9, 20e9)), 8e5) for r in arriving if r % 3 == 0}
        for state in states:
            for r in arriving:
                bottleneck = capacity[links[r]].min()
                state.add(int(r), 50_000 + 1000 * int(r), 1e-5, bottleneck, t, window=caps.get(r))
        live = rows[: step * 5 + 5]
        for state in states:
            state.catch_up(live[::2], [links[r] for r in live[::2]], capacity, t + 1e-6)
        t += 1e-5
        got = [s.advance(live, [links[r] for r in live], capacity, t) for s in states]
        np.testing.assert_array_equal(got[1][0], got[0][0])
        np.testing.assert_array_equal(got[1][1], got[0][1])
        np.testing.assert_array_equal(states[1]._state, states[0]._state)
    assert np.isfinite(states[0].drained).sum() > 3  # drains between updates happened


def test_without_a_compiler_the_python_engine_answers_with_one_warning(monkeypatch, tmp_path):
    monkeypatch.setenv("M4RAY_CACHE_DIR", str(tmp_path))  # nothing built there yet
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    core.library.cache_clear()
    try:
        with pytest.warns(UserWarning, match="compiled m4 core unavailable, using Python"):
            assert core.library() is None
        model = _model(True)
        engine = M4Engine(
            np.full(4, 1e9), model.cfg, [0.1] * model.cfg.n_params, LocalStepper(model)
        )
        assert type(engine) is M4Engine
        assert not Fluid(4).native
        engine.arrive_path(0, [0, 1], 100_000, 1e-4, 0.0)
        engine.arrive_path(1, [1, 2], 100_000, 1e-4, 0.0)
        finish = engine.update(0.0)  # flows 0 and 1 share link 1: one component
        assert sorted(finish) == [0, 1] and min(finish.values()) >= 1e-4
        assert engine.n_components == 1 and engine.n_updates == 1
    finally:
        monkeypatch.delenv("CC")
        monkeypatch.delenv("M4RAY_CACHE_DIR")
        core.library.cache_clear()


class _PerFlow(M4Backend):
    """The backend as it scheduled before batches: one event per flow and update."""

    def _apply(self, predicted):
        if predicted is not None:
            for flow_id, t in zip(predicted[1].tolist(), predicted[2].tolist(), strict=True):
                self._at(flow_id, t)


@pytest.mark.parametrize("window_us", [None, 0.0, 10.0])
def test_batched_completions_run_in_the_order_of_one_event_per_flow(window_us):
    """An update's completions are queued as one batch (next one at a time, at the rank its
    own event would have had): FCTs equal the per-flow scheduling's exactly, with many equal
    predictions (an incast of equal flows) and superseded ones."""
    topo = FatTreeSpec(k=4).build()
    routing = Routing(topo, seed=0)
    hosts = sorted(topo.hosts)
    flows = _flows(hosts, np.random.default_rng(11), 80)
    flows += [Flow(1000 + i, hosts[i], hosts[15], 50_000, 2e-4) for i in range(8)]  # ties
    model = _model(True, True, False)
    answers = []
    for cls in (_PerFlow, M4Backend):
        cfg = _Direct(model, 6_000, window_us=window_us, param=0.1)
        build = cfg.build
        cfg.build = lambda t, r, b=build, c=cls: c(b(t, r).engine, window_us=window_us)
        answers.append(run_trace(topo, flows, cfg, routing).column("fct_s").to_numpy())
    np.testing.assert_array_equal(answers[1], answers[0])
    assert len(np.unique(answers[0])) < len(answers[0])  # some completions coincide


def test_batching_large_components_steps_fewer_flows_and_stays_near_every_update():
    """Completion batching (``M4Config.batch_above_flows``): above the largest component it
    changes nothing (to the bit); batching every component steps far fewer flows, and the FCTs
    stay near those of an update at every completion."""
    topo = FatTreeSpec(k=4).build()
    routing = Routing(topo, seed=0)
    hosts = sorted(topo.hosts)
    rng = np.random.default_rng(11)
    flows = [  # one burst: every flow in one component at once, completing one by one
        Flow(i, hosts[int(a)], hosts[int(b)], int(rng.choice([50_000, 400_000, 2_000_000])), 0.0)
        for i, (a, b) in enumerate(rng.choice(len(hosts), size=(150, 2)))
        if a != b
    ]
    model = _model(True, True)
    runs = {}
    for name, batching in [
        ("every", None),
        ("above-all", Batching(len(flows), 0.2)),
        ("batched", Batching(0, 0.2)),
    ]:
        cfg = _Direct(model, 6_000, window_us=0.0, param=0.1, batching=batching)
        fct = run_trace(topo, flows, cfg, routing).column("fct_s").to_numpy()
        runs[name] = (fct, cfg.engines[0].n_stepped_flows)
    every, stepped = runs["every"]
    np.testing.assert_array_equal(runs["above-all"][0], every)
    assert runs["above-all"][1] == stepped
    batched, fewer = runs["batched"]
    assert fewer < stepped / 3
    error = np.abs(batched / every - 1)
    assert np.median(error) < 0.02 and error.max() < 0.25, (np.median(error), error.max())


@pytest.mark.parametrize("precision", ["float64", "float32"])
def test_the_core_steps_identical_components_of_an_update_once(precision):
    """Every update in one core call (the default: none through the stepper), with the memo
    off: identical components of one update (the same flows on each edge switch of a fat-tree)
    are stepped once and share the answers, a lone component is stepped from its prepared rows,
    and every FCT equals the stepper's path (numpy_step's _distinct), to the bit."""
    topo = FatTreeSpec(k=4).build()
    routing = Routing(topo, seed=0)
    hosts = sorted(topo.hosts)
    pairs = [
        (a, b) for a in hosts for b in hosts if a < b and len(routing.path(a, b, 0).links) == 2
    ]
    assert len(pairs) == 8  # the two hosts of each edge switch
    flows = [
        Flow(3 * i + j, a, b, size, 0.0)
        for i, (a, b) in enumerate(pairs)
        for j, size in enumerate((30_000, 60_000, 90_000))
    ]  # 8 alike components of 3 flows and 2 links, then random traffic, then one alone
    rng = np.random.default_rng(3)
    flows += [
        Flow(100 + f.id, f.src, f.dst, f.size_bytes, f.start_s + 2e-3)
        for f in _flows(hosts, rng, 60)
    ]
    flows += [Flow(300 + j, *pairs[0], 50_000 * (j + 1), 1.0) for j in range(3)]
    model = _model(True, True)
    cfgs = [
        _Fused(model, 6_000, fused=f, memo_flows=0, window_us=0.0, param=0.1, precision=precision)
        for f in (False, True)
    ]
    answers, engines, _ = _run(topo, flows, routing, cfgs)
    stepper, fused_ = engines
    assert fused_._stats[3] == 0  # nothing went through the stepper
    assert fused_.memo_answers == 0 and fused_._stats[5] >= 7  # the 7 repeats at t = 0
    assert fused_._stats[4] < fused_.n_stepped_flows == stepper.n_stepped_flows
    np.testing.assert_array_equal(answers[1], answers[0])
    first = answers[1][:24].reshape(8, 3)
    assert (first == first[0]).all()  # alike components, alike answers
