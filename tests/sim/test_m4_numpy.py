"""The m4 step in numpy (the in-process backend's) against the torch step (the reference, which
Serve and training run): same states and slowdowns to float64 rounding, from the same
checkpoint; and a sweep's m4 scenario never imports torch."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from m4ray.errors import InputError
from m4ray.models import m4 as torch_model
from m4ray.models.checkpoint import export
from m4ray.models.graph import StepGraph
from m4ray.models.m4 import M4Model, ModelConfig
from m4ray.models.numpy_step import NumpyModel, initial_link_state, load_numpy_model
from m4ray.models.step import step
from m4ray.sim.m4.backend import checkpoint_dir, load_model


def _graphs(cfg: ModelConfig, rng, sizes) -> list[StepGraph]:
    out = []
    for n_flow, n_link in sizes:
        per = int(rng.integers(1, min(n_link, 4) + 1))
        inc = np.stack(
            [
                np.repeat(np.arange(n_flow), per),
                np.concatenate([rng.choice(n_link, per, replace=False) for _ in range(n_flow)]),
            ]
        )
        dt_flow = rng.uniform(0, 5, n_flow) * (rng.random(n_flow) > 0.3)  # some rows Δt = 0
        out.append(
            StepGraph(
                h_flow=rng.normal(size=(n_flow, cfg.hidden)),
                h_link=rng.normal(size=(n_link, cfg.hidden)),
                dt_flow_us=dt_flow,
                dt_link_us=rng.uniform(0, 5, n_link),
                incidence=inc,
                params=rng.random((n_flow, cfg.n_params)),
                n_links=np.full(n_flow, per),
                base=rng.uniform(1, 3, n_flow) if cfg.fluid else None,
                fluid=rng.normal(size=(n_flow, 3)) if cfg.fluid else None,
            )
        )
    return out


def _trained_like(fluid: bool) -> M4Model:
    torch.manual_seed(1)
    cfg = ModelConfig(hidden=16, gnn_hidden=24, gnn_layers=3, dropout=0.0, fluid=fluid)
    model = M4Model(cfg)
    with torch.no_grad():
        model.head[-1].weight.normal_(0, 0.3)
        model.head[-1].bias.fill_(0.2 if fluid else 2.0)
    return model.double().eval()


def _assert_same(torch_outs, numpy_outs) -> None:
    assert len(torch_outs) == len(numpy_outs)
    for a, b in zip(torch_outs, numpy_outs, strict=True):
        for name in ("h_flow", "h_link", "slowdown"):
            np.testing.assert_allclose(
                getattr(b, name), getattr(a, name).numpy(), rtol=1e-12, atol=1e-12
            )


@pytest.mark.parametrize("fluid", [True, False], ids=["fluid", "m4"])
def test_the_numpy_step_equals_the_torch_step(fluid, tmp_path, monkeypatch):
    """Several graphs in one pass (rows with Δt 0, links shared by many flows), through a real
    exported checkpoint: states and slowdowns within 1e-12 of torch's."""
    monkeypatch.setenv("M4RAY_CACHE_DIR", str(tmp_path / "cache"))
    model = _trained_like(fluid)
    directory = export(model.float(), tmp_path / "ckpt", {}, "card")
    reference = load_model.__wrapped__(str(directory))  # float64, as the backend ran torch
    numpy_model = NumpyModel.load(directory)
    assert list((tmp_path / "cache").rglob("m4-*.npz"))  # the weights were cached once
    rng = np.random.default_rng(0)
    graphs = _graphs(model.cfg, rng, [(3, 4), (1, 2), (30, 9), (5, 5)])
    outs = numpy_model.step(graphs)
    _assert_same(step(reference, graphs), outs)
    assert all((o.slowdown >= 1).all() for o in outs)
    assert len({float(x) for o in outs for x in o.slowdown}) > 10  # not all clamped
    for g, together in zip(graphs, outs, strict=True):  # alone = in the batch, to rounding
        (alone,) = numpy_model.step([g])
        np.testing.assert_allclose(alone.slowdown, together.slowdown, rtol=1e-13)
        np.testing.assert_allclose(alone.h_flow, together.h_flow, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("name", ["m4-v2", "m4-lite"])
def test_the_shipped_checkpoint_steps_alike_in_numpy_and_torch(name):
    directory = str(checkpoint_dir(name))
    numpy_model, reference = load_numpy_model(directory), load_model(name)
    graphs = _graphs(numpy_model.cfg, np.random.default_rng(5), [(12, 10), (2, 3), (60, 25)])
    _assert_same(step(reference, graphs), numpy_model.step(graphs))


def test_the_float32_step_answers_near_the_float64_step_and_keeps_float64_states():
    """``precision="float32"``: the torch model's own float type; slowdowns and states within
    float32 rounding of float64's, handed back as float64 (the engine's state type)."""
    directory = str(checkpoint_dir("m4-v2"))
    f64, f32 = load_numpy_model(directory), load_numpy_model(directory, "float32")
    assert f32.w["head.3.bias"].dtype == np.float32 and f32.cfg == f64.cfg
    graphs = _graphs(f64.cfg, np.random.default_rng(7), [(12, 10), (2, 3), (60, 25)])
    for a, b in zip(f64.step(graphs), f32.step(graphs), strict=True):
        for name in ("h_flow", "h_link", "slowdown"):
            assert getattr(b, name).dtype == np.float64
            np.testing.assert_allclose(getattr(b, name), getattr(a, name), rtol=1e-4, atol=1e-5)
        assert not np.array_equal(a.h_flow, b.h_flow)  # it did run in float32
    with pytest.raises(InputError, match="unknown precision 'float16'"):
        NumpyModel(f64.cfg, {}, "float16")


# the compiled pass against numpy's in the same float type: (rtol, atol) of its rounding
_ROUNDING = {"float64": (1e-12, 1e-13), "float32": (2e-5, 2e-6)}


@pytest.mark.parametrize("precision", ["float64", "float32"])
@pytest.mark.parametrize("fluid", [True, False], ids=["fluid", "m4"])
def test_the_compiled_pass_equals_numpys_and_does_not_depend_on_the_batch(
    fluid, precision, monkeypatch
):
    """Passes run in C (``_step.c``, in the model's float type): states and slowdowns within
    that type's rounding of the numpy pass in the same type (rows with Δt 0 and without,
    several graphs, a model with one more per-flow input; widths that fill float32's strips of
    16 columns and leave a part), and each graph's answers equal to the bit whether it is
    stepped alone or in a batch (every row is summed in a fixed order). The float32 pass is
    float32 (not float64's answers)."""
    from m4ray.models import numpy_step

    rtol, atol = _ROUNDING[precision]

    assert numpy_step.native_step_library() is not None  # it must build on this machine
    for prior in (False, True) if fluid else (False,):  # the prior is read beside the anchor
        torch.manual_seed(2)
        cfg = ModelConfig(
            hidden=16, gnn_hidden=24, gnn_layers=3, dropout=0.0, fluid=fluid, flow_prior=prior
        )
        torch_model_ = M4Model(cfg)
        with torch.no_grad():  # answers past the clamp at 1, as _trained_like's
            torch_model_.head[-1].weight.normal_(0, 0.3)
            torch_model_.head[-1].bias.fill_(0.2 if fluid else 2.0)
        weights = {k: v.double().numpy() for k, v in torch_model_.state_dict().items()}
        model = NumpyModel(cfg, weights, precision)
        graphs = _graphs(cfg, np.random.default_rng(11), [(3, 4), (1, 1), (9, 5), (2, 6)])
        if prior:
            for g in graphs:
                g.params = np.random.default_rng(3).random((len(g.h_flow), cfg.n_inputs))
        monkeypatch.setattr(numpy_step, "NATIVE_MAX_ROWS", 0)
        reference = model.step(graphs)
        monkeypatch.setattr(numpy_step, "NATIVE_MAX_ROWS", 10**6)
        compiled = model.step(graphs)
        for a, b in zip(reference, compiled, strict=True):
            for name in ("h_flow", "h_link", "slowdown"):
                assert getattr(b, name).dtype == np.float64
                np.testing.assert_allclose(getattr(b, name), getattr(a, name), rtol=rtol, atol=atol)
        if precision == "float32":  # in float32: float64's states differ beyond its rounding
            f64 = NumpyModel(cfg, weights).step(graphs)
            gaps = [np.abs(a.h_flow - b.h_flow).max() for a, b in zip(f64, compiled, strict=True)]
            assert max(gaps) > 1e-9
        assert not all(
            np.array_equal(a.h_flow, b.h_flow) for a, b in zip(reference, compiled, strict=True)
        )  # the C pass did run (its sums are not BLAS's to the bit)
        assert len({float(x) for o in compiled for x in o.slowdown}) > 10  # not all clamped
        for g, together in zip(graphs, compiled, strict=True):
            (alone,) = model.step([g])
            for name in ("h_flow", "h_link", "slowdown"):
                assert np.array_equal(getattr(alone, name), getattr(together, name))
    # a graph whose scratch passes what the pass keeps between calls (64 MB: given back after
    # it), twice: the same bits each time, and numpy's answers
    (big,) = _graphs(cfg, np.random.default_rng(4), [(15_000, 11_000)])
    big.params = np.random.default_rng(5).random((15_000, cfg.n_inputs))
    first, again = model.step([big]), model.step([big])
    monkeypatch.setattr(numpy_step, "NATIVE_MAX_ROWS", 0)
    reference = model.step([big])
    for name in ("h_flow", "h_link", "slowdown"):
        assert np.array_equal(getattr(first[0], name), getattr(again[0], name))
        np.testing.assert_allclose(
            getattr(first[0], name), getattr(reference[0], name), rtol=10 * rtol, atol=10 * atol
        )


def _with_components(graphs: list[StepGraph], cfg: ModelConfig) -> StepGraph:
    """``graphs`` as the components of one graph (rows and wiring concatenated), as the
    engine packs the components an update touched."""
    f_off = np.cumsum([0, *(len(g.h_flow) for g in graphs)])
    l_off = np.cumsum([0, *(len(g.h_link) for g in graphs)])
    cat = np.concatenate
    return StepGraph(
        h_flow=cat([g.h_flow for g in graphs]),
        h_link=cat([g.h_link for g in graphs]),
        dt_flow_us=cat([g.dt_flow_us for g in graphs]),
        dt_link_us=cat([g.dt_link_us for g in graphs]),
        incidence=cat(
            [g.incidence + np.array([[f_off[i]], [l_off[i]]]) for i, g in enumerate(graphs)], axis=1
        ),
        params=cat([g.params for g in graphs]),
        n_links=cat([g.n_links for g in graphs]),
        base=cat([g.base for g in graphs]) if cfg.fluid else None,
        fluid=cat([g.fluid for g in graphs]) if cfg.fluid else None,
        comp_flows=np.array([len(g.h_flow) for g in graphs]),
        comp_links=np.array([len(g.h_link) for g in graphs]),
    )


@pytest.mark.parametrize("collide", [False, True], ids=["fingerprints", "all-collide"])
def test_identical_components_are_stepped_once_with_the_same_answers(collide, monkeypatch):
    """A batch whose components repeat (a collective's steps; one ring in many scenarios):
    each distinct component is stepped once and its outputs shared, and the answers equal the
    plain forward pass over every row (to float64's rounding). A component that differs from
    another in one bit of one link state is not shared; with every fingerprint colliding
    (forced), the word-by-word check still tells components apart."""
    from m4ray.models import numpy_step

    if collide:
        monkeypatch.setattr(numpy_step, "_MIX", np.zeros(4096, dtype=np.uint64))
    monkeypatch.setattr(numpy_step, "DEDUP_MIN_FLOWS", 1)  # this batch is small: look anyway
    model = load_numpy_model(str(checkpoint_dir("m4-v2")))
    cfg = model.cfg
    a, b, c = _graphs(cfg, np.random.default_rng(7), [(2, 3), (1, 2), (4, 4)])
    a2 = StepGraph(**{k: getattr(a, k) for k in a.__slots__})
    a2.h_link = a.h_link.copy()
    a2.h_link[1, 5] = np.nextafter(a.h_link[1, 5], np.inf)  # one bit from a
    graphs = [_with_components([a, b, a, c, b], cfg), _with_components([a2, a], cfg), b]
    rows: list = []
    forward = model._forward

    def counted(h_flow, *args):
        rows.append(len(h_flow))
        return forward(h_flow, *args)

    monkeypatch.setattr(model, "_forward", counted)
    outs = model.step(graphs)
    assert rows == [2 + 1 + 4 + 2]  # a, b, c and a2: each distinct component once
    union = _with_components([a, b, a, c, b, a2, a, b], cfg)
    plain = forward(
        union.h_flow,
        union.h_link,
        union.dt_flow_us,
        union.dt_link_us,
        union.incidence,
        union.params,
        union.n_links.astype(float),
        union.base,
        union.fluid,
    )
    got = [np.concatenate([getattr(o, name) for o in outs]) for name in ("h_flow", "h_link")]
    got.append(np.concatenate([o.slowdown for o in outs]))
    # the pass over the distinct rows and the plain one multiply matrices of different shapes,
    # so BLAS may round them differently (which kernel runs depends on the CPU and the shape):
    # equal to float64's last bits, not to the bit
    for ours, theirs in zip(got, plain[:3], strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-14)
    assert not np.array_equal(outs[1].h_link[:3], outs[1].h_link[3:])  # a2 is not a
    # below DEDUP_MIN_FLOWS a pass steps every row (looking would cost more than it saves)
    monkeypatch.setattr(numpy_step, "DEDUP_MIN_FLOWS", 16)
    rows.clear()
    again = model.step(graphs)
    assert rows == [15]
    for o, p in zip(outs, again, strict=True):
        np.testing.assert_allclose(o.slowdown, p.slowdown, rtol=1e-12, atol=1e-14)


def test_initial_link_states_equal_the_models():
    cfg = ModelConfig(hidden=8)
    rates = np.array([10e9, 25e9, 40e9, 100e9, 200e9, 400e9, 2400e9, 3200e9, 1.6e12])
    rates = np.concatenate([rates, *(rates // r for r in range(2, 11))])
    want = torch_model.initial_link_state(cfg, torch.tensor(rates, dtype=torch.float64))
    np.testing.assert_array_equal(initial_link_state(cfg, rates), want.double().numpy())


def test_a_checkpoint_with_a_missing_or_misshapen_weight_is_rejected(tmp_path, monkeypatch):
    monkeypatch.setenv("M4RAY_CACHE_DIR", str(tmp_path / "cache"))
    model = _trained_like(True)
    weights = {k: v.numpy() for k, v in model.state_dict().items()}
    with pytest.raises(InputError, match=r"no weight .head\.3\.bias."):
        NumpyModel(model.cfg, {k: v for k, v in weights.items() if k != "head.3.bias"})
    weights["gru_rate.weight_ih"] = weights["gru_rate.weight_ih"][:, :-1]
    with pytest.raises(InputError, match=r"'gru_rate.weight_ih' has shape \(48, 31\)"):
        NumpyModel(model.cfg, weights)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "model.json").write_text(json.dumps({"model": {}}))
    with pytest.raises(InputError, match=r"model\.pt: no such file"):
        NumpyModel.load(tmp_path / "empty")


def test_an_m4_scenario_in_process_does_not_import_torch():
    code = (
        "import sys\n"
        "from m4ray.sim.scenario import Scenario, simulate\n"
        "from m4ray.sim.failures import GrayFailure\n"
        "from m4ray.sim.m4 import M4Config\n"
        "from m4ray.workload.simai import SimAIWorkloadSpec\n"
        "s = Scenario(failure=GrayFailure(n_degraded=4, reduction=4),\n"
        "    workload=SimAIWorkloadSpec(path='microAllReduce', scale=0.01),\n"
        "    backend='m4', backend_config=M4Config())\n"
        "row, _ = simulate(s)\n"
        "assert row['status'] == 'ok', row['error']\n"
        "print('torch' in sys.modules)\n"
    )
    load_numpy_model(str(checkpoint_dir("m4-v2")))  # its weights are in the cache now
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
