"""The fluid anchor of m4 v2 models: flowSim's view in the engine and in the training replay."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from m4ray.models.components import Batching
from m4ray.models.fairshare import Window, max_min_rates
from m4ray.models.fluid import Fluid
from m4ray.models.m4 import M4Model, ModelConfig
from m4ray.sim.flows import Flow
from m4ray.sim.flowsim import FlowSimConfig, wire_window
from m4ray.sim.m4 import LocalStepper, M4Engine
from m4ray.sim.m4.backend import M4Backend
from m4ray.sim.routing import Routing, WireFormat
from m4ray.sim.topologies import RailClusterSpec
from m4ray.sim.trace import run_trace
from m4ray.train.periods import forward_period

from .test_m4 import _chain_period, _replay_online, _single_component_periods


def _fluid_model(
    correction: bool, hold: bool = True, window: bool = False, acks: bool = False
) -> M4Model:
    torch.manual_seed(0)
    cfg = ModelConfig(hidden=16, gnn_hidden=24, gnn_layers=3, dropout=0.0, fluid=True)
    cfg.fluid_hold = hold
    cfg.fluid_window = window
    cfg.fluid_acks = acks
    model = M4Model(cfg)
    if correction:  # a model-dependent answer, so a wrong mapping would show
        with torch.no_grad():
            model.head[-1].weight.normal_(0, 0.3)
            model.head[-1].bias.fill_(3.0)  # above the clamp at 1 whatever params13 holds
    return model.eval()


def test_fluid_advance_shares_max_min_and_projects_a_lone_flow_at_its_ideal():
    fluid = Fluid(4)
    capacity = np.array([10e9, 10e9, 40e9])
    # flow 0 alone on links 0, 2: its ideal is 8 µs of payload at 10 Gbps + 2 µs delay
    fluid.add(0, 10_000, 10e-6, 10e9, 0.0)
    base, features = fluid.advance(np.array([0]), [np.array([0, 2])], capacity, 0.0)
    assert base[0] == pytest.approx(1.0)
    np.testing.assert_allclose(features[0], [0.0, 1.0, 1.0])
    # 4 µs later flow 1 joins on link 0: half of flow 0's bits are left, both get 5 Gbps
    fluid.add(1, 10_000, 10e-6, 10e9, 4e-6)
    links = [np.array([0, 2]), np.array([0, 1])]
    base, features = fluid.advance(np.array([0, 1]), links, capacity, 4e-6)
    np.testing.assert_allclose(fluid.rate[:2], max_min_rates(links, capacity))
    np.testing.assert_allclose(fluid.rate[:2], [5e9, 5e9])
    # flow 0: 4 µs elapsed + 40,000 bits at 5 Gbps (8 µs) + 2 µs delay = 14 µs of 10
    np.testing.assert_allclose(base, [1.4, 1.8])  # flow 1: 16 µs + 2 µs of 10
    np.testing.assert_allclose(features[:, 1], [0.5, 0.5])
    np.testing.assert_allclose(features[:, 2], [0.5, 1.0])
    np.testing.assert_allclose(features[:, 0], np.log2([1.4, 1.8]))


class _Direct:
    """A backend config around an in-memory model (the tests' stand-in for a checkpoint); the
    engines it built are kept in ``engines``."""

    def __init__(
        self,
        model: M4Model,
        window_bytes: int | None = None,
        *,
        native: bool = True,
        window_us: float | None = None,
        param: float = 0.0,
        ack_fraction: float = 0.0,
        batching: Batching | None = None,
        anchor_fifo: bool = False,
    ) -> None:
        self.model = model.double()
        self.anchor_fifo = anchor_fifo
        self.window_bytes = window_bytes
        self.native = native
        self.window_us = window_us
        self.param = param
        self.ack_fraction = ack_fraction
        self.batching = batching
        self.engines: list[M4Engine] = []

    def build(self, topology, routing):
        engine = M4Engine(
            topology.bandwidth_bps,
            self.model.cfg,
            [self.param] * self.model.cfg.n_params,
            LocalStepper(self.model),
            routing,
            window=None if self.window_bytes is None else Window(self.window_bytes),
            link_latency_s=topology.latency_s,
            ack_fraction=self.ack_fraction,
            batching=self.batching,
            native=self.native,
            anchor_fifo=self.anchor_fifo,
        )
        self.engines.append(engine)
        return M4Backend(engine, window_us=self.window_us)


@pytest.mark.parametrize("fifo", [False, True], ids=["max-min", "fifo"])
@pytest.mark.parametrize("window", [None, 24_000], ids=["no-window", "window"])
@pytest.mark.parametrize("hold", [True, False])
@pytest.mark.parametrize("size_scale", [1.0, 0.002])  # 2–20 MB flows; 4–40 KB flows
def test_an_untrained_fluid_model_answers_as_flowsim(size_scale, hold, window, fifo):
    """Correction 0 (the head's last layer starts at zero): the engine is flowSim — max-min
    fluid sharing, re-shared at every arrival and drain end (those between m4's updates are
    simulated by the anchor), delivered a delivery delay after draining; with a window anchor,
    flowSim with that window (each flow capped at its packets per round trip); with a FIFO
    anchor (``anchor_fifo``), flowSim with FIFO service up to the window (every flow without
    one), each flow projected at its drain if nothing else arrives."""
    topo = RailClusterSpec().build()
    routing = Routing(topo, seed=0)  # the default wire: 48-byte headers per 1000 bytes
    hosts = sorted(topo.hosts)
    rng = np.random.default_rng(1)
    pairs = rng.choice(32, size=(12, 2), replace=False).reshape(-1, 2)
    flows = [Flow(i, hosts[i], hosts[8], 10_000_000, i * 20e-6) for i in range(4)]  # incast
    starts = rng.uniform(0, 2e-3, len(pairs))
    flows += [
        Flow(4 + i, hosts[int(a)], hosts[int(b)], int(rng.integers(2, 20)) * 1_000_000, start)
        for i, ((a, b), start) in enumerate(zip(pairs, starts, strict=True))
    ]
    flows = [
        Flow(f.id, f.src, f.dst, int(f.size_bytes * size_scale), f.start_s * size_scale)
        for f in flows
    ]
    model = _fluid_model(correction=False, hold=hold, window=window is not None)
    m4 = run_trace(topo, flows, _Direct(model, window, anchor_fifo=fifo), routing)
    service = {"service": "fifo", "fifo_bytes": window} if fifo else {}
    flowsim = run_trace(topo, flows, FlowSimConfig(window_bytes=window, **service), routing)
    a, b = m4.column("fct_s").to_numpy(), flowsim.column("fct_s").to_numpy()
    slowdown = b / flowsim.column("ideal_fct_s").to_numpy()
    assert slowdown.max() > 1.25  # flows do share (or are window-bound)
    if window is not None:  # the window binds: classic flowSim would answer otherwise
        classic = run_trace(topo, flows, FlowSimConfig(), routing).column("fct_s").to_numpy()
        assert np.abs(classic / b - 1).max() > 0.1
    if fifo and window is None:  # every flow in order of arrival: the incast is served FIFO
        fair = run_trace(topo, flows, FlowSimConfig(window_bytes=window), routing)
        assert np.abs(fair.column("fct_s").to_numpy() / b - 1).max() > 0.1
    np.testing.assert_allclose(a, b, rtol=1e-5)


def _chain_with_ideals():
    p = _chain_period()
    bottleneck = torch.zeros(len(p.arrival), dtype=torch.float64)
    for f in range(len(p.arrival)):
        bottleneck[f] = p.link_bandwidth[p.incidence[1, p.incidence[0] == f]].double().min()
    p.ideal_s = p.size_bytes.double() * 8 / bottleneck + 2e-6
    return p


@pytest.mark.parametrize("hold", [True, False])
def test_engine_reproduces_offline_predictions_with_the_fluid_anchor(tiny_dataset, hold):
    """Training = inference with the anchor: the replay's fluid features and bases are the
    engine's, on a chain and on recorded periods with several components and idle links."""
    from m4ray.train.data import DataConfig, scenario_samples, split_scenarios

    model = _fluid_model(correction=True, hold=hold)
    dataset = tiny_dataset[0] / "dataset"
    cfg = DataConfig(dataset=str(dataset))
    ids = [i for split in split_scenarios(dataset, cfg).values() for i in split]
    samples = [s for i in ids for s in scenario_samples(dataset, i, cfg)]
    simple = {id(s) for s in _single_component_periods(samples)}
    multi = [s.period for s in samples if id(s) not in simple and len(s.period.arrival) <= 400]
    assert multi, "the tiny dataset has no multi-component period"
    for p in [_chain_with_ideals(), *multi[:4]]:
        with torch.no_grad():
            offline = forward_period(copy.deepcopy(model).float(), p)[0].clamp(min=1.0)
        online = _replay_online(copy.deepcopy(model).double(), p)
        assert len(set(offline.tolist())) > len(offline) // 2  # model-dependent answers
        torch.testing.assert_close(online, offline, rtol=3e-4, atol=3e-4)


def _windowed_chain(window: Window):
    """The chain with ideals, its wire bytes and each flow's ``window`` limit over links of
    1 µs (two per path); the window and the links' latencies."""
    p = _chain_with_ideals()
    wire = WireFormat()
    p.wire_bytes = torch.tensor(wire.wire_bytes(p.size_bytes.numpy()))
    latency = np.full(len(p.link_bandwidth), 1e-6)
    limits = []
    for f in range(len(p.arrival)):
        rates = p.link_bandwidth[p.incidence[1, p.incidence[0] == f]].double().numpy()
        bits = float(p.wire_bytes[f]) * 8
        limits.append(window.limit_on(wire, 2e-6, (1 / rates).sum(), rates.min(), bits))
    p.window = torch.tensor(limits, dtype=torch.float64)
    return p, window, latency


def test_engine_reproduces_offline_predictions_with_a_window_anchor():
    """The replay drains each flow as the sample's window says and the engine as its own
    window over the links' latencies says: the same caps, so the same predictions."""
    model = _fluid_model(correction=True, window=True)
    p, window, latency = _windowed_chain(Window(1_500))
    assert np.isfinite(p.window[:, 0].numpy()).all()  # the window binds for every flow
    with torch.no_grad():
        offline = forward_period(copy.deepcopy(model).float(), p)[0].clamp(min=1.0)
        no_window = _fluid_model(correction=True)
        plain = forward_period(no_window.float(), p)[0].clamp(min=1.0)
    online = _replay_online(copy.deepcopy(model).double(), p, window, latency)
    assert not torch.allclose(offline, plain, rtol=1e-2)  # the window changes the answers
    torch.testing.assert_close(online, offline, rtol=3e-4, atol=3e-4)
    p.window = None
    p.schedules.clear()  # the replay's schedule is kept on the sample
    with pytest.raises(ValueError, match="windows"):
        forward_period(model, p)


@pytest.mark.parametrize("drains_by_window", [True, False], ids=["window", "no-window-cap"])
def test_engine_reproduces_offline_predictions_with_a_fifo_anchor(drains_by_window):
    """A model trained on the FIFO anchor (``fluid_fifo``): the replay serves the flows of at
    most the sample's ``fifo_bits`` in order of arrival, and the engine those of at most the
    sender's window on the wire (it takes the anchor from the checkpoint's config, unasked),
    whether or not the anchor also drains by the window (``fluid_window``): the same shares
    and drain projections, so the same predictions; and FIFO changes them."""
    model = _fluid_model(correction=True, window=drains_by_window)
    model.cfg.fluid_fifo = True
    p, window, latency = _windowed_chain(Window(12_000))
    p.fifo_bits = wire_window(window.bytes, WireFormat()) * 8.0
    assert 0 < int((p.wire_bytes * 8 <= p.fifo_bits).sum()) < len(p.arrival)
    with torch.no_grad():
        offline = forward_period(copy.deepcopy(model).float(), p)[0].clamp(min=1.0)
        fair = _fluid_model(correction=True, window=drains_by_window)
        plain = forward_period(fair.float(), p)[0].clamp(min=1.0)
    assert model.cfg.anchor == ("hold+window+fifo" if drains_by_window else "hold+fifo")
    online = _replay_online(copy.deepcopy(model).double(), p, window, latency)
    assert not torch.allclose(offline, plain, rtol=1e-3)  # FIFO changes the answers
    torch.testing.assert_close(online, offline, rtol=3e-4, atol=3e-4)
    with pytest.raises(ValueError, match="fluid_fifo needs fluid"):
        ModelConfig(fluid_fifo=True)


def test_engine_reproduces_offline_predictions_with_ack_load():
    """The replay's anchor carries the ACKs of each link's reverse data as the engine's does
    (the chain's links 2k and 2k + 1 are one cable's two directions, as the engine's are): the
    same rates, so the same predictions; and ACKs change them."""
    model = _fluid_model(correction=True, acks=True)
    p = _chain_with_ideals()
    p.link_reverse = torch.arange(len(p.link_bandwidth)) ^ 1
    p.link_reverse[-1] = -1  # link 7 is not in the period
    p.ack_fraction = 64 / 1048
    with torch.no_grad():
        offline = forward_period(copy.deepcopy(model).float(), p)[0].clamp(min=1.0)
        p.schedules.clear()
        no_acks = forward_period(_fluid_model(correction=True).float(), p)[0].clamp(min=1.0)
    online = _replay_online(copy.deepcopy(model).double(), p, ack_fraction=p.ack_fraction)
    assert not torch.allclose(offline, no_acks, rtol=1e-3)  # the ACK load changes the answers
    torch.testing.assert_close(online, offline, rtol=3e-4, atol=3e-4)


def test_fluid_ack_load_follows_rates_and_leaves_with_the_flow():
    """Two rows on one cable's two directions: each gets 1 − a + a² of it (three passes from
    idle links), the per-link data rates are theirs, and a released row's rate leaves its
    links; the compiled rows equal the Python ones bit for bit."""
    a, capacity = 0.1, np.full(4, 10e9)
    links = [np.array([0, 2]), np.array([3, 1])]  # 0/1 and 2/3 are cables' two directions
    results = []
    for native in (False, True):
        fluid = Fluid(2, native=native, acks=(a, np.arange(4) ^ 1))
        for row in (0, 1):
            fluid.add(row, 1e6, 1e-3, 10e9, 0.0)
        fluid.advance(np.array([0, 1]), links, capacity, 0.0)
        np.testing.assert_allclose(fluid.rate[:2], 10e9 * (1 - a + a * a))
        np.testing.assert_allclose(fluid.data, [fluid.rate[0], fluid.rate[1]] * 2)
        fluid.catch_up(np.array([0, 1]), links, capacity, 1e-5)
        fluid.release(1, links[1])
        assert fluid.rate[1] == 0 and fluid.data[1] == fluid.data[3] == 0
        base, _ = fluid.advance(np.array([0]), links[:1], capacity, 1e-5)
        assert fluid.rate[0] == 10e9  # its ACKs' link carries no data now
        results.append((fluid.rate[:2].copy(), fluid.left[:2].copy(), base))
    for x, y in zip(*results, strict=True):
        np.testing.assert_array_equal(x, y)


def test_a_fluid_model_needs_ideal_fcts():
    p = _chain_period()  # no ideal_s
    with pytest.raises(ValueError, match="ideal FCTs"):
        forward_period(_fluid_model(correction=False), p)


def test_the_backend_warns_when_the_network_is_not_the_one_the_checkpoint_learned(tmp_path):
    from m4ray.models.checkpoint import export
    from m4ray.sim.m4 import M4Config
    from m4ray.sim.ns3.backend import Ns3Config

    export(_fluid_model(correction=False), tmp_path / "ckpt", {"transport": "rdma"}, "# card\n")
    topo = RailClusterSpec().build()
    routing = Routing(topo, seed=0)
    ckpt = str(tmp_path / "ckpt")
    with pytest.warns(UserWarning, match="learned ns-3 rdma.*network.transport=rdma"):
        M4Config(checkpoint=ckpt, network=Ns3Config(transport="tcp")).build(topo, routing)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        M4Config(checkpoint=ckpt, network=Ns3Config(transport="rdma")).build(topo, routing)
    from m4ray.sim.m4.backend import check_transport

    check_transport.cache_clear()  # warned once per process: make this call the first
    with pytest.warns(UserWarning, match="'m4-small' learned ns-3 tcp"):  # recorded no transport
        M4Config(checkpoint="m4-small", network=Ns3Config(transport="rdma")).build(topo, routing)


def test_the_every_update_loss_scores_what_the_engine_reads_at_each_update():
    """``every_flows``: per flow, the mean relative error of the slowdowns read at each update
    it takes part in — the predictions the online engine schedules completions by."""
    from m4ray.train.periods import collate, forward_batch

    model = _fluid_model(correction=True)
    with torch.no_grad():
        model.head[-1].bias.fill_(2.0)  # above the engine's clamp at 1
    p = _chain_with_ideals()
    p.slowdown = torch.linspace(1.5, 4.0, len(p.arrival))
    with torch.no_grad():
        *_, every, shift = forward_batch(
            copy.deepcopy(model).float(), collate([p], True), every=True
        )
        *_, shift0 = forward_batch(
            _fluid_model(correction=False).float(), collate([p], True), every=True
        )
    assert float(shift0.abs().max()) == 0.0  # correction 0: the readings are the anchor's
    assert float(shift.min()) > 0.5  # bias 2.0: every reading is moved from its anchor
    engine = M4Engine(
        p.link_bandwidth.numpy(), model.cfg, p.params.tolist(), LocalStepper(model.double())
    )
    t = np.cumsum(p.dt_us.double().numpy()) * 1e-6
    start, read = {}, {f: [] for f in range(len(p.arrival))}
    for j in range(len(p.dt_us)):
        for f in (p.arrival == j).nonzero().flatten().tolist():
            links = p.incidence[1, p.incidence[0] == f].numpy()
            engine.arrive_path(f, links, int(p.size_bytes[f]), float(p.ideal_s[f]), t[j])
            start[f] = t[j]
        for f in (p.departure == j).nonzero().flatten().tolist():
            engine.complete(f, t[j])
        for f, finish in engine.update(t[j]).items():
            read[f].append((finish - start[f]) / float(p.ideal_s[f]))
    expected = [np.mean(np.abs(np.array(r) / float(p.slowdown[f]) - 1)) for f, r in read.items()]
    assert min(len(r) for r in read.values()) >= 2  # flows are read more than once
    np.testing.assert_allclose(every.numpy(), expected, rtol=2e-4, atol=2e-4)


def test_a_flow_prior_model_reads_classic_flowsims_answer_per_flow(tiny_dataset):
    """``flow_prior``: the dataset's periods carry classic flowSim's slowdown of each flow; the
    model reads its log2 beside params13 (one more input to the rate cell and the head), so
    changing one flow's prior moves that model's answers and not a plain one's; a model that
    needs the prior refuses periods without it, and the engines refuse it, by field."""
    from m4ray.errors import InputError
    from m4ray.sim.m4.engine import M4Engine
    from m4ray.train.data import DataConfig, scenario_samples, split_scenarios

    dataset = tiny_dataset[0] / "dataset"
    cfg = DataConfig(dataset=str(dataset))
    ids = [i for split in split_scenarios(dataset, cfg).values() for i in split]
    sample = max(
        (s for i in ids for s in scenario_samples(dataset, i, cfg)), key=lambda s: s.n_flows
    )
    p = sample.period
    assert p.prior is not None and torch.equal(p.prior, sample.flowsim_slowdown)
    assert (p.prior >= 1).all() and p.prior.max() > 1.01  # flows do share
    with pytest.raises(ValueError, match="flow_prior needs fluid"):
        ModelConfig(flow_prior=True)
    plain = _fluid_model(correction=True)
    torch.manual_seed(0)
    prior_cfg = ModelConfig(hidden=16, gnn_hidden=24, gnn_layers=3, dropout=0.0, fluid=True)
    prior_cfg.flow_prior = True
    model = M4Model(prior_cfg)
    assert model.head[0].in_features == plain.head[0].in_features + 1
    with torch.no_grad():
        model.head[-1].weight.normal_(0, 0.3)
        model.head[-1].bias.fill_(3.0)
    model.eval()
    moved = copy.deepcopy(p)
    moved.prior = p.prior.clone()
    moved.prior[0] = p.prior[0] * 8
    with torch.no_grad():
        first, again = forward_period(model, p)[0], forward_period(model, moved)[0]
        same = (forward_period(plain, p)[0], forward_period(plain, moved)[0])
    assert not torch.allclose(first, again)
    torch.testing.assert_close(*same)
    moved.prior = None
    with pytest.raises(InputError, match="prior"):
        forward_period(model, moved)
    with pytest.raises(InputError, match="flow_prior"):
        M4Engine(p.link_bandwidth.numpy(), prior_cfg, p.params.tolist())


def test_the_backends_anchor_is_fair_or_fifo():
    from m4ray.errors import InputError
    from m4ray.serve.client import M4ServedConfig
    from m4ray.sim.m4 import M4Config

    for kind in (M4Config, M4ServedConfig):  # one setting (M4Settings) for both m4 backends
        assert kind().anchor == "fair"
        with pytest.raises(InputError) as err:
            kind(anchor="lifo")
        assert err.value.field == "anchor"
