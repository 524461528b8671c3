"""backend=m4: the online engine against the offline (training) replay, trace mode, batching."""

from __future__ import annotations

import copy
import dataclasses
import json

import numpy as np
import pytest
import torch

from m4ray.errors import InputError
from m4ray.models.step import step
from m4ray.sim.flows import Flow
from m4ray.sim.m4 import Arrival, LocalStepper, M4Config, M4Engine, StepGraph, load_model
from m4ray.sim.m4.backend import checkpoint_dir
from m4ray.sim.ns3.backend import Ns3Config, params13
from m4ray.sim.routing import Routing
from m4ray.sim.topologies import RailClusterSpec
from m4ray.sim.trace import run_trace
from m4ray.train.periods import PeriodSample, forward_period

TCP = Ns3Config(transport="tcp")


@pytest.fixture(scope="module")
def model():
    return load_model("m4-small")


def _single_component_periods(samples):
    """Periods the online engine sees as one component throughout, with no link idling and
    coming back (there the engine resets the link, as m4's does; training keeps its state)."""
    keep = []
    for s in samples:
        p = s.period
        events = sorted(
            [(int(a), 0, f) for f, a in enumerate(p.arrival.tolist())]
            + [(int(d), 1, f) for f, d in enumerate(p.departure.tolist())]
        )
        links = [p.incidence[1, p.incidence[0] == f].tolist() for f in range(len(p.arrival))]
        users: dict[int, int] = {}
        idle: set[int] = set()
        seen: set[int] = set()
        ok = True
        active: set[int] = set()
        for _, kind, f in events:
            if kind == 0:
                if active and not any(users.get(lk, 0) for lk in links[f]):
                    ok = False  # joins no active link: a separate component online
                if idle & set(links[f]):
                    ok = False
                active.add(f)
                for lk in links[f]:
                    users[lk] = users.get(lk, 0) + 1
                    seen.add(lk)
            else:
                active.discard(f)
                for lk in links[f]:
                    users[lk] -= 1
                    if users[lk] == 0 and active:
                        idle.add(lk)
        if ok:
            keep.append(s)
    return keep


def _chain_period() -> PeriodSample:
    """Six flows on a chain of links (each shares one with the next), staggered arrivals,
    departures in another order: one component from start to end."""
    n = 6
    flows = [f for f in range(n) for _ in (0, 1)]
    links = [lk for f in range(n) for lk in (f, f + 1)]
    return PeriodSample(
        size_bytes=torch.tensor([2000, 50_000, 10_000, 300_000, 7000, 90_000]),
        n_links=torch.full((n,), 2),
        arrival=torch.tensor([0, 1, 2, 3, 5, 6]),
        departure=torch.tensor([4, 8, 7, 9, 11, 10]),
        dt_us=torch.tensor([0.0, 1.5, 0.0, 3.0, 2.0, 0.5, 4.0, 1.0, 2.5, 0.0, 6.0, 3.0]),
        incidence=torch.tensor([flows, links]),
        link_bandwidth=torch.tensor([100e9, 400e9, 25e9, 100e9, 100e9, 400e9, 100e9]),
        # m4-small's network (it learned TCP runs), whatever the backend's default
        params=torch.tensor(params13(TCP, Routing(RailClusterSpec().build()))),
        slowdown=torch.ones(n),
        remain=torch.zeros(0, 3),
        queue=torch.zeros(0, 3),
    )


def _replay_online(
    model, p: PeriodSample, window=None, latency_s=None, ack_fraction: float = 0.0
) -> torch.Tensor:
    """Drive the engine with the period's events; each flow's slowdown when it completes."""
    engine = M4Engine(
        p.link_bandwidth.numpy(),
        model.cfg,
        p.params.tolist(),
        LocalStepper(model),
        window=window,
        link_latency_s=latency_s,
        ack_fraction=ack_fraction,
    )
    t = np.cumsum(p.dt_us.double().numpy()) * 1e-6
    online = {}
    for j in range(len(p.dt_us)):
        for f in (p.arrival == j).nonzero().flatten().tolist():
            links = p.incidence[1, p.incidence[0] == f].numpy()
            ideal = 1.0 if p.ideal_s is None else float(p.ideal_s[f])
            wire = None if p.wire_bytes is None else int(p.wire_bytes[f])
            engine.arrive_path(f, links, int(p.size_bytes[f]), ideal, t[j], wire_bytes=wire)
        for f in (p.departure == j).nonzero().flatten().tolist():
            online[f] = engine.complete(f, t[j])
        engine.update(t[j])
    return torch.tensor([online[f] for f in range(len(p.arrival))])


def test_engine_reproduces_offline_predictions_on_a_chain(model):
    model = copy.deepcopy(model)
    with torch.no_grad():
        model.head[-1].bias += 2.0  # lift every prediction above the clamp at 1
    p = _chain_period()
    with torch.no_grad():
        offline = forward_period(copy.deepcopy(model).float(), p)[0].clamp(min=1.0)
    assert len(set(offline.tolist())) == len(offline)  # distinct: a wrong mapping would show
    torch.testing.assert_close(_replay_online(model, p), offline, rtol=1e-4, atol=1e-4)


def test_engine_reproduces_offline_predictions_on_recorded_periods(tiny_dataset, model):
    """Training replays what the engine updates (components, their own Δt, idle links reset),
    so offline and online agree on every recorded period, several components and links that
    go idle and come back included."""
    from m4ray.train.data import DataConfig, scenario_samples, split_scenarios

    dataset = tiny_dataset[0] / "dataset"
    cfg = DataConfig(dataset=str(dataset))
    ids = [i for split in split_scenarios(dataset, cfg).values() for i in split]
    samples = [s for i in ids for s in scenario_samples(dataset, i, cfg)]
    simple = {id(s) for s in _single_component_periods(samples)}
    multi = [s for s in samples if id(s) not in simple and len(s.period.arrival) <= 400]
    assert multi, "the tiny dataset has no multi-component period"
    model = copy.deepcopy(model)
    with torch.no_grad():
        model.head[-1].bias += 2.0  # lift every prediction above the clamp at 1
    float32 = copy.deepcopy(model).float()  # the engine runs the inference model in float64
    for sample in [*multi[:4], *[s for s in samples if id(s) in simple][:2]]:
        p = sample.period
        with torch.no_grad():
            offline = forward_period(float32, p)[0].clamp(min=1.0)  # as trained
        assert (offline > 1).all()
        torch.testing.assert_close(_replay_online(model, p), offline, rtol=2e-4, atol=2e-4)


def test_stepping_graphs_together_equals_stepping_them_alone(model):
    rng = np.random.default_rng(0)
    h = model.cfg.hidden

    def graph(n_flow, n_link):
        inc = np.stack([np.repeat(np.arange(n_flow), 2), rng.integers(0, n_link, 2 * n_flow)])
        return StepGraph(
            h_flow=torch.randn(n_flow, h),
            h_link=torch.randn(n_link, h),
            dt_flow_us=torch.full((n_flow,), float(rng.uniform(0, 5))),
            dt_link_us=torch.full((n_link,), float(rng.uniform(0, 5))),
            incidence=torch.from_numpy(inc),
            params=torch.rand(n_flow, model.cfg.n_params),
            n_links=torch.full((n_flow,), 2),
        )

    graphs = [graph(3, 4), graph(1, 2), graph(6, 5)]
    together = step(model, graphs)
    for g, out in zip(graphs, together, strict=True):
        (alone,) = step(model, [g])
        torch.testing.assert_close(out.slowdown, alone.slowdown, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out.h_flow, alone.h_flow, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out.h_link, alone.h_link, rtol=1e-5, atol=1e-5)
        assert (out.slowdown >= 1).all()


def _rail():
    topo = RailClusterSpec().build()
    routing = Routing(topo, seed=0)
    return topo, routing, sorted(topo.hosts)


def test_trace_mode_update_policies():
    topo, routing, hosts = _rail()
    # staggered flows: no two events at one instant, so per-event and per-instant agree
    flows = [Flow(i, hosts[i], hosts[(i + 9) % 32], 100_000 * (i + 1), i * 3e-6) for i in range(6)]
    per_event = run_trace(topo, flows, M4Config(window_us=None), routing)
    per_instant = run_trace(topo, flows, M4Config(window_us=0.0), routing)
    windowed = run_trace(topo, flows, M4Config(window_us=10.0), routing)
    a, b = per_event.column("fct_s").to_numpy(), per_instant.column("fct_s").to_numpy()
    np.testing.assert_allclose(a, b, rtol=1e-9)
    for table in (per_event, windowed):  # ŝ >= 1: no flow beats its ideal FCT (unclamped)
        fct, ideal = table.column("fct_s").to_numpy(), table.column("ideal_fct_s").to_numpy()
        assert (fct >= ideal * (1 - 1e-9)).all()
    # a lone flow finishes at start + ŝ × ideal with ŝ from the model's update at its arrival
    lone = run_trace(topo, flows[:1], M4Config(), routing)
    model = load_model(M4Config().checkpoint)
    engine = M4Engine(
        topo.bandwidth_bps,
        model.cfg,
        params13(M4Config().network, routing),
        LocalStepper(model),
        routing,
    )
    f = flows[0]
    engine.arrive(Arrival(f.id, f.src, f.dst, f.size_bytes), 0.0)
    assert lone.column("fct_s")[0].as_py() == pytest.approx(engine.update(0.0)[f.id], rel=1e-12)


def test_the_float32_step_runs_a_trace_near_float64():
    """``precision=float32`` (the default): the same trace within float32 rounding of
    float64's; float32 names its runs, and a float64 run keeps the id it had when float64 was
    the default; a bad precision is a clear error."""
    from m4ray.fingerprint import canonical, fingerprint

    topo, routing, hosts = _rail()
    flows = [Flow(i, hosts[i], hosts[(i + 9) % 32], 100_000 * (i + 1), 0.0) for i in range(8)]
    f64 = run_trace(topo, flows, M4Config(precision="float64"), routing).column("fct_s")
    f32 = run_trace(topo, flows, M4Config(), routing).column("fct_s").to_numpy()
    np.testing.assert_allclose(f32, f64.to_numpy(), rtol=1e-5)
    assert M4Config().precision == "float32"
    assert fingerprint(M4Config(precision="float32")) == fingerprint(M4Config())
    assert canonical(M4Config())["precision"] == "float32"  # hashed: a new run
    assert "precision" not in canonical(M4Config(precision="float64"))  # the id it had
    with pytest.raises(InputError, match="unknown precision 'half'"):
        M4Config(precision="half")


def test_the_device_option_runs_the_torch_step_and_refuses_a_missing_gpu(monkeypatch):
    """``device``: the torch step (what a GPU runs) gives the numpy step's trace to float64
    rounding; ``auto`` settles on the CPU here; a GPU asked for by name and absent, or an unknown
    device, is a clear error; cpu keeps the run id."""
    from m4ray.fingerprint import fingerprint
    from m4ray.sim.m4 import backend

    topo, routing, hosts = _rail()
    flows = [Flow(i, hosts[i], hosts[(i + 9) % 32], 100_000 * (i + 1), 0.0) for i in range(8)]
    f64 = M4Config(precision="float64")
    numpy_run = run_trace(topo, flows, f64, routing).column("fct_s").to_numpy()
    monkeypatch.setattr(backend, "resolve_device", lambda device: "cpu-torch")
    monkeypatch.setattr(backend, "load_model", lambda name, device, precision: load_model(name))
    on_gpu = dataclasses.replace(f64, device="cuda")
    torch_run = run_trace(topo, flows, on_gpu, routing).column("fct_s").to_numpy()
    np.testing.assert_allclose(torch_run, numpy_run, rtol=1e-12)
    monkeypatch.undo()
    assert backend.resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    assert fingerprint(M4Config(device="cpu")) == fingerprint(M4Config())
    assert fingerprint(M4Config(device="cuda")) != fingerprint(M4Config())
    with pytest.raises(InputError, match="unknown device 'tpu'"):
        M4Config(device="tpu")
    if not torch.cuda.is_available():
        with pytest.raises(InputError, match="cuda asked for, but torch sees no GPU") as err:
            M4Config(device="cuda").build(topo, routing)
        assert err.value.field == "m4.device"


def test_contention_slows_flows_down():
    topo, routing, hosts = _rail()
    size = 1_000_000
    alone = run_trace(topo, [Flow(0, hosts[0], hosts[8], size)], M4Config(), routing)
    shared = run_trace(
        topo, [Flow(i, hosts[i], hosts[8], size) for i in range(4)], M4Config(), routing
    )  # four senders into one receiver NIC
    # the default model sees the contention (four flows share the NIC: ns-3 and flowSim ~4x)
    assert shared.column("fct_s").to_numpy().mean() > 1.1 * alone.column("fct_s")[0].as_py()


def test_m4_refuses_a_congestion_control_its_checkpoint_never_saw():
    """The shipped checkpoints learned DCTCP: asked to imitate HPCC, m4 says so by name."""
    from m4ray.sim.ns3.transports import RdmaConfig

    topo = RailClusterSpec(servers=2).build()
    network = Ns3Config(rdma=RdmaConfig(cc="hpcc"))
    with pytest.raises(InputError, match="learned dctcp only; it cannot imitate hpcc") as err:
        M4Config(checkpoint="m4-v2", network=network).build(topo, Routing(topo))
    assert err.value.field == "m4.network.rdma.cc"


def test_engine_rejects_bad_events(model):
    topo, routing, hosts = _rail()
    engine = M4Engine(
        topo.bandwidth_bps,
        model.cfg,
        params13(M4Config().network, routing),
        LocalStepper(model),
        routing,
    )
    engine.arrive(Arrival(1, hosts[0], hosts[1], 1000), 0.0)
    with pytest.raises(InputError, match="already active"):
        engine.arrive(Arrival(1, hosts[0], hosts[1], 1000), 0.0)
    with pytest.raises(InputError, match="not a host"):
        engine.arrive(Arrival(2, hosts[0], 10_000, 1000), 0.0)
    with pytest.raises(InputError, match="size must be > 0"):
        engine.arrive(Arrival(3, hosts[0], hosts[1], 0), 0.0)
    with pytest.raises(InputError, match="not active"):
        engine.complete(7, 0.0)
    assert set(engine.update(0.0)) == {1}  # the good flow is untouched by the bad calls


def test_unknown_checkpoint_names_the_shipped_ones():
    assert checkpoint_dir("m4-small").name == "m4-small"
    with pytest.raises(InputError, match="m4-small"):
        checkpoint_dir("no-such-model")


def test_engine_initial_flow_states_are_the_models(model):
    from m4ray.models.m4 import initial_flow_state

    engine = M4Engine(np.full(8, 100e9), model.cfg, [0.0] * model.cfg.n_params)
    sizes, paths = [1, 999, 4096, 10**9, 2**40], [[0], [1, 2], [3, 4, 5], [6], [7, 0]]
    for i, (size, links) in enumerate(zip(sizes, paths, strict=True)):
        engine.arrive_path(i, links, size, 1.0, 0.0)
    pending = engine.prepare(0.0)
    expected = initial_flow_state(
        model.cfg, torch.tensor(sizes), torch.tensor([len(p) for p in paths])
    )
    (graph,) = pending.graphs  # flows 0 and 4 share link 0: one component, listed first
    assert np.asarray(pending.flow_ids).tolist() == [0, 4, 1, 2, 3]
    order = torch.as_tensor(pending.flow_ids)
    torch.testing.assert_close(
        torch.as_tensor(graph.h_flow), expected[order].double(), rtol=1e-7, atol=1e-7
    )


def test_a_shared_stepper_steps_alone_outside_a_group_and_fails_every_member_on_error(model):
    from m4ray.sim.m4.shared import SharedStepper, simulate_together

    def engine(stepper):
        e = M4Engine(np.full(4, 100e9), model.cfg, [0.0] * model.cfg.n_params, stepper)
        e.arrive_path(0, [0, 1], 50_000, 1e-6, 0.0)
        return e

    shared = SharedStepper(LocalStepper(model))
    alone = engine(LocalStepper(model)).update(1e-6)
    assert engine(shared).update(1e-6) == alone  # no group running: steps at once
    assert shared.n_passes == 1

    def simulate(k):
        return engine(shared).update(1e-6 * (k + 1))

    got = simulate_together(list(range(3)), shared, simulate)
    assert got[0] == alone and shared.n_passes == 2 and shared.n_calls == 4  # one batched pass

    class Broken:
        model = shared.stepper.model

        def __call__(self, graphs):
            raise RuntimeError("step failed")

    broken = SharedStepper(Broken())
    caught = []

    def guarded(k):
        try:
            return engine(broken).update(1e-6)
        except RuntimeError as err:
            caught.append(str(err))
            return None

    assert simulate_together(list(range(3)), broken, guarded) == [None] * 3
    assert caught == ["step failed"] * 3


def test_the_step_memo_answers_repeated_graphs_as_the_pass_did(model):
    """A graph stepped before is answered from the memo (no pass, read-only outputs equal to
    the pass's); a graph that differs in one input byte, or one too large to keep, is stepped;
    a memo over its byte budget forgets and still answers right; in a group, simulations whose
    requests are known do not wait for the round's pass."""
    from m4ray.sim.m4.memo import StepMemo
    from m4ray.sim.m4.shared import SharedStepper, simulate_together

    def engine(stepper, size=50_000):
        e = M4Engine(np.full(4, 100e9), model.cfg, [0.0] * model.cfg.n_params, stepper)
        e.arrive_path(0, [0, 1], size, 1e-6, 0.0)
        e.arrive_path(1, [2, 3], size, 1e-6, 0.0)
        return e

    def graphs(size=50_000):
        return engine(LocalStepper(model), size).prepare(1e-6).graphs

    def same(a, b) -> bool:
        return all(
            np.array_equal(np.asarray(getattr(x, k)), np.asarray(getattr(y, k)))
            for x, y in zip(a, b, strict=True)
            for k in ("h_flow", "h_link", "slowdown")
        )

    plain = LocalStepper(model)(graphs())
    memo = StepMemo()
    shared = SharedStepper(LocalStepper(model), memo)
    assert same(shared(graphs()), plain) and shared.n_passes == 1
    known = shared(graphs())  # the same graph again: from the memo
    assert same(known, plain) and not known[0].h_flow.flags.writeable
    assert (shared.n_passes, shared.n_known, memo.hits, memo.misses) == (1, 1, 1, 1)
    changed = shared(graphs(50_001))  # one input differs: stepped
    assert same(changed, LocalStepper(model)(graphs(50_001))) and not same(changed, plain)
    assert shared.n_passes == 2
    small = SharedStepper(LocalStepper(model), StepMemo(max_flows=1))  # 2 flows: not kept
    assert same(small(graphs()), plain) and same(small(graphs()), plain)
    assert small.n_passes == 2 and not small.memo.table
    tight = SharedStepper(LocalStepper(model), StepMemo(max_bytes=1))  # over its budget
    assert same(tight(graphs()), plain) and same(tight(graphs()), plain)
    assert tight.n_passes == 2 and not tight.memo.table
    assert len(memo.table) == 2  # room for one of them: the second clears the first
    one = SharedStepper(LocalStepper(model), StepMemo(max_bytes=memo.bytes // 2 + 1))
    assert same(one(graphs()), plain) and same(one(graphs(50_001)), changed)
    assert len(one.memo.table) == 1 and same(one(graphs(50_001)), changed)
    assert same(one(graphs()), plain) and one.n_passes == 3

    group = SharedStepper(LocalStepper(model), StepMemo())
    alone = engine(LocalStepper(model)).update(2e-6)
    got = simulate_together(list(range(4)), group, lambda k: engine(group).update(2e-6))
    assert got == [alone] * 4 and group.n_passes == 1  # one round's pass
    assert simulate_together([0, 1], group, lambda k: engine(group).update(2e-6)) == [alone] * 2
    assert group.n_passes == 1 and group.n_known == 2  # known: answered without a round


@pytest.mark.parametrize("name", ["m4-lite", "m4-v2", "m4-v3"])
def test_the_rdma_checkpoints_have_cards_the_benches_wrote(name):
    """m4-lite is the default of backend=m4 (m4-v2 before 2026-12-07); each records the ns-3
    transport it learned (the default backend describes that one) and the span of network
    parameters it was trained on (the backend reads others at its edge), and its card's
    measured section is bench/m4_card.py's:
    each subsection quotes the command (an existing bench or the sweep) whose output follows."""
    import json
    import re
    from pathlib import Path

    from m4ray.models.config import ParamsRange

    assert M4Config().checkpoint == "m4-lite"
    directory = checkpoint_dir(name)
    info = json.loads((directory / "model.json").read_text())
    assert info["transport"] == M4Config().network.transport == "rdma"
    assert info["model"]["fluid"] is True
    span = ParamsRange.of(info)
    assert span.low[0] < 200 and 1500 < span.high[0] < 1600  # buffers of 1-16 MB, in 10 KB
    card = (directory / "model_card.md").read_text()
    marker = "<!-- bench/m4_card.py: "
    section = card[card.index(marker + "begin") : card.index(marker + "end")]
    commands = re.findall(r"^`python (\S+) [^`]*` \(\d+ s\)$", section, re.M)
    assert {"bench/m4_holdout.py", "bench/incast.py", "-m"} <= set(commands)
    root = Path(__file__).resolve().parents[2]
    for script in commands:
        assert script == "-m" or (root / script).exists(), script
    assert section.count("```") == 2 * len(commands)  # every command's output pasted


def test_a_run_id_names_the_checkpoints_weights_not_only_its_name(tmp_path):
    """A checkpoint retrained in place gets new run ids (a resumed sweep reruns it instead of
    returning the old model's rows); the same files keep theirs."""
    import shutil

    from m4ray.sim.scenario import Scenario
    from m4ray.workload.simai import SimAIWorkloadSpec

    def scenario(path):
        workload = SimAIWorkloadSpec(path="microAllReduce")
        return Scenario(backend="m4", backend_config=M4Config(checkpoint=path), workload=workload)

    ckpt = tmp_path / "mine"
    shutil.copytree(checkpoint_dir("m4-small"), ckpt)
    first = scenario(str(ckpt)).run_id
    again = scenario(str(ckpt)).run_id
    (ckpt / "model.pt").write_bytes((ckpt / "model.pt").read_bytes() + b"retrained")
    retrained = scenario(str(ckpt)).run_id
    assert first == again != retrained


def test_completion_batching_is_checked_and_names_the_run():
    """``batch_above_flows`` / ``batch_fraction``: bad values are clear errors naming the field;
    the engine gets the batching asked for (none with null); each setting names its run."""
    from m4ray.fingerprint import canonical, fingerprint
    from m4ray.models.components import Batching

    with pytest.raises(InputError, match="batch_above_flows"):
        M4Config(batch_above_flows=-1)
    for bad in (0.0, 1.5):
        with pytest.raises(InputError, match=r"must be in \(0, 1\]") as err:
            M4Config(batch_fraction=bad)
        assert err.value.field == "batch_fraction"
    assert M4Config().batching() == Batching(128, 0.5, 0)
    with pytest.raises(InputError, match="must be >= 0") as err:
        M4Config(batch_frozen_above=-1)
    assert err.value.field == "batch_frozen_above"
    assert M4Config(batch_above_flows=None).batching() is None
    topo, routing, _ = _rail()
    backend = M4Config(batch_above_flows=8, batch_fraction=0.5).build(topo, routing)
    assert backend.engine.batching == Batching(8, 0.5)
    assert fingerprint(M4Config(batch_above_flows=None)) != fingerprint(M4Config())
    # anchors frozen above 1,024 flows, the rule every id before 2026-11-29 was made with, is
    # left out of the hash; the new default is hashed
    assert fingerprint(M4Config(batch_frozen_above=1024)) != fingerprint(M4Config())
    old = dataclasses.replace(M4Config(batch_fraction=0.1), batch_frozen_above=1024)
    assert "batch_frozen_above" not in json.dumps(canonical(old))


def test_network_parameters_outside_the_trained_span_are_read_at_its_edge(tmp_path):
    """A checkpoint records the params13 span its training scenarios covered; a network outside
    it (the SimAI study's 100 MB buffers: training saw 1-16 MB) is read at the span's edge, with
    a warning naming what moved, unless ``extrapolate`` asks for the raw values. A span that is
    not two equal-length lists of numbers is a clear error naming the file and field."""
    import dataclasses
    import json
    import shutil

    from m4ray.models.config import ParamsRange
    from m4ray.sim.m4.backend import _warn_fitted, trained_params_range
    from m4ray.sim.ns3.transports import RdmaConfig

    topo = RailClusterSpec(servers=2).build()
    routing = Routing(topo)
    deep = Ns3Config(rdma=RdmaConfig(buffer_bytes=100_000_000, pfc_threshold_bytes=12_500_000))
    raw = params13(deep, routing)
    name = M4Config().checkpoint
    span = trained_params_range(name)
    assert span is not None and raw[0] == 10_000 > span.high[0]  # buffer in 10 KB units
    _warn_fitted.cache_clear()
    with pytest.warns(UserWarning, match=rf"'{name}' was not trained on this network: bfsz 10000"):
        engine = M4Config(network=deep).build(topo, routing).engine
    expected = [min(max(v, lo), hi) for v, lo, hi in zip(raw, span.low, span.high, strict=True)]
    assert engine.params[0].tolist() == expected and expected[0] == span.high[0]
    assert expected[1:] == raw[1:]  # the window and DCTCP's K are inside it
    assert len(engine.params_notes) == 1 and engine.params_notes[0].startswith("bfsz 10000 ")
    as_is = M4Config(network=deep, extrapolate=True).build(topo, routing).engine
    assert as_is.params[0].tolist() == raw and as_is.params_notes == []
    inside = dataclasses.replace(deep, rdma=RdmaConfig())
    assert M4Config(network=inside).build(topo, routing).engine.params[0].tolist() == params13(
        inside, routing
    )

    bad = tmp_path / "bad"
    shutil.copytree(checkpoint_dir("m4-v2"), bad)
    info = json.loads((bad / "model.json").read_text())
    info["params_range"] = {"low": [0.0] * 13, "high": [1.0] * 12}
    (bad / "model.json").write_text(json.dumps(info))
    with pytest.raises(InputError, match="one finite entry per parameter") as err:
        M4Config(checkpoint=str(bad)).build(topo, routing)
    assert err.value.field == "params_range" and "model.json" in str(err.value)
    with pytest.raises(InputError, match="no scenarios"):
        ParamsRange.spanning([])
