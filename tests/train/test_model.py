"""The m4 model: shapes as in the released weights, permutation invariance, overfitting a period."""

from __future__ import annotations

import pytest
import torch

from m4ray.models.m4 import M4Model, ModelConfig, SAGELayer
from m4ray.train.periods import (
    ERRORS,
    PeriodSample,
    forward_period,
    period_losses,
    relative_l1,
)


def test_full_size_parameter_shapes_match_the_released_model():
    model = M4Model(ModelConfig())
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    assert shapes["gnn.0.lin.weight"] == (200, 200)
    assert shapes["gnn.0.lin_l.weight"] == (300, 200) and "gnn.0.lin_r.bias" not in shapes
    assert shapes["gnn.1.lin_l.weight"] == (300, 300) and shapes["gnn.2.lin_l.weight"] == (200, 300)
    assert shapes["gnn.2.norm.weight"] == (200,)
    assert shapes["gru_time.weight_ih"] == (600, 1) and shapes["gru_time_link.weight_hh"] == (
        600,
        200,
    )
    assert shapes["gru_rate.weight_ih"] == (600, 213) and shapes["gru_rate_link.weight_ih"] == (
        600,
        200,
    )
    assert shapes["head.0.weight"] == (200, 214) and shapes["head.3.weight"] == (1, 200)
    assert shapes["remain_head.0.weight"] == (200, 200) and shapes["queue_head.3.weight"] == (
        1,
        200,
    )


def test_sage_layer_sums_projected_neighbours_plus_root():
    torch.manual_seed(0)
    layer = SAGELayer(3, 5)
    x = torch.randn(4, 3)
    edges = torch.tensor([[0, 1, 2], [3, 3, 0]])  # 0→3, 1→3, 2→0
    out = layer(x, edges)
    assert out.shape == (4, 5)
    proj = torch.relu(layer.lin(x))
    expected_3 = layer.norm(layer.lin_l(proj[0] + proj[1]) + layer.lin_r(x[3]))
    expected_1 = layer.norm(layer.lin_l(torch.zeros(3)) + layer.lin_r(x[1]))  # no neighbours
    assert torch.allclose(out[3], expected_3, atol=1e-6)
    assert torch.allclose(out[1], expected_1, atol=1e-6)


def test_spatial_step_is_permutation_equivariant_on_a_four_node_graph():
    torch.manual_seed(1)
    model = M4Model(ModelConfig.tiny()).eval()
    h_flow, h_link = torch.randn(2, 16), torch.randn(2, 16)
    params = torch.randn(2, 13)
    incidence = torch.tensor([[0, 0, 1], [0, 1, 1]])  # flow 0 on links 0, 1; flow 1 on link 1
    f, lk = model.spatial_step(h_flow, h_link, incidence, params)
    assert f.shape == (2, 16) and lk.shape == (2, 16)
    flip = torch.tensor([1, 0])  # swap both flows and both links
    incidence_p = torch.stack([flip[incidence[0]], flip[incidence[1]]])
    fp, lp = model.spatial_step(h_flow[flip], h_link[flip], incidence_p, params[flip])
    assert torch.allclose(fp, f[flip], atol=1e-6) and torch.allclose(lp, lk[flip], atol=1e-6)
    # the edge order does not matter either
    f2, l2 = model.spatial_step(h_flow, h_link, incidence[:, [2, 0, 1]], params)
    assert torch.allclose(f2, f, atol=1e-6) and torch.allclose(l2, lk, atol=1e-6)


def period() -> PeriodSample:
    """Three flows on two links: f0 and f1 share link 0; f2 joins on links 0 and 1."""
    return PeriodSample(
        size_bytes=torch.tensor([20_000, 5_000, 80_000]),
        n_links=torch.tensor([1, 1, 2]),
        arrival=torch.tensor([0, 1, 2]),
        departure=torch.tensor([4, 3, 5]),
        dt_us=torch.tensor([0.0, 2.0, 1.5, 3.0, 4.0, 10.0]),
        incidence=torch.tensor([[0, 1, 2, 2], [0, 0, 0, 1]]),
        link_bandwidth=torch.tensor([10e9, 5e9]),
        params=torch.tensor([12.0, 10.0, 1.0, 0, 0, 0, 20.0, 0, 0, 0, 0, 0, 0]),
        slowdown=torch.tensor([1.5, 2.0, 3.0]),
        remain=torch.tensor([[0, 0, 1.0], [1, 0, 0.8], [1, 1, 1.0], [2, 2, 1.0], [3, 1, 0.0]]),
        queue=torch.tensor([[1, 0, 2.0], [2, 0, 3.0], [2, 1, 0.5]]),
    )


def test_forward_period_shapes_and_aux_losses():
    torch.manual_seed(2)
    model = M4Model(ModelConfig.tiny())
    pred, remain, queue = forward_period(model, period())
    assert pred.shape == (3,) and remain.ndim == 0 and queue.ndim == 0
    assert remain > 0 and queue > 0


def test_a_tiny_model_overfits_one_busy_period():
    torch.manual_seed(3)
    model = M4Model(ModelConfig.tiny())
    sample = period()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    decay = torch.optim.lr_scheduler.ExponentialLR(opt, 0.99)
    for _ in range(300):
        pred, remain, queue = forward_period(model, sample)
        loss = relative_l1(pred, sample.slowdown) + 0.1 * (remain + queue)
        opt.zero_grad()
        loss.backward()
        opt.step()
        decay.step()
    pred, remain, queue = forward_period(model, sample)
    assert relative_l1(pred, sample.slowdown) < 0.03
    assert remain < 0.1 and queue < 0.1


def other_period() -> PeriodSample:
    """Two flows on one 40 Gbps link, arriving together, with a longer event list."""
    return PeriodSample(
        size_bytes=torch.tensor([1_000_000, 3_000]),
        n_links=torch.tensor([3, 3]),
        arrival=torch.tensor([0, 1]),
        departure=torch.tensor([3, 2]),
        dt_us=torch.tensor([0.0, 0.0, 7.0, 50.0]),
        incidence=torch.tensor([[0, 1], [0, 0]]),
        link_bandwidth=torch.tensor([40e9]),
        params=torch.tensor([300.0, 90.0, 1.0, 0, 0, 0, 180.0, 0, 0, 0, 0, 0, 0]),
        slowdown=torch.tensor([1.1, 4.0]),
        remain=torch.tensor([[0, 0, 1.0], [1, 0, 1.0], [1, 1, 1.0], [2, 0, 0.9]]),
        queue=torch.tensor([[0, 0, 0.0], [1, 0, 1.0]]),
    )


def test_a_batch_replays_each_period_as_if_alone():
    torch.manual_seed(4)
    model = M4Model(ModelConfig.tiny()).eval()
    a, b = period(), other_period()
    with torch.no_grad():
        both = period_losses(model, [a, b, a])
        alone = [period_losses(model, [s]) for s in (a, b)]
    assert torch.allclose(
        both["pred"], torch.cat([alone[0]["pred"], alone[1]["pred"], alone[0]["pred"]]), atol=1e-5
    )
    for key in ("main", "remain", "queue"):
        expected = torch.stack([alone[0][key], alone[1][key], alone[0][key]])
        assert torch.allclose(both[f"{key}_each"], expected, atol=1e-5), key
    assert torch.isclose(both["main"], both["main_each"].mean())


def test_link_bandwidth_enters_the_link_state_and_is_off_in_m4_mode():
    bw = torch.tensor([10e9, 400e9, 100e9])
    h = M4Model(ModelConfig.tiny()).link_state(bw)
    assert torch.allclose(h[:, 2], torch.tensor([1.0, 6.321928, 4.321928]))
    m4 = M4Model(ModelConfig(hidden=16, gnn_hidden=24, link_bandwidth=False)).link_state(bw)
    assert torch.equal(m4[:, 2], torch.ones(3)) and torch.equal(m4[:, 1], torch.ones(3))


def test_a_samples_window_is_windowed_flowsims_on_the_recorded_links():
    """data._window reads the recorded links table (rates, latencies) and the scenario's
    window: per flow the same (cap, bits) as flowSim's Window on the routed path; TCP and
    scenarios without a window get none."""
    import json
    import math

    import pandas as pd

    from m4ray.models.fairshare import Window
    from m4ray.sim.routing import Routing, WireFormat
    from m4ray.sim.topologies import FatTreeSpec
    from m4ray.train.data import _window

    topo = FatTreeSpec(k=4, bandwidth_bps=10e9, fabric_bandwidth_bps=40e9).build()
    wire = WireFormat()
    routing = Routing(topo, seed=0, wire=wire)
    links = pd.DataFrame(
        {"bandwidth_bps": topo.bandwidth_bps, "latency_s": topo.latency_s}
    ).rename_axis("link")
    rdma = _window(json.dumps({"transport": "rdma", "window_bytes": 6_000}), links, wire)
    hosts = sorted(topo.hosts)
    bound = 0
    for i, (a, b) in enumerate([(0, 15), (0, 1), (3, 9)]):
        path = routing.path(hosts[a], hosts[b], i)
        bits = wire.wire_bytes(80_000) * 8.0
        expected = Window(6_000).limit(wire, path, bits)
        assert rdma(list(path.links), bits) == pytest.approx(expected, rel=1e-12)
        bound += math.isfinite(expected[0])
    assert bound >= 2  # the window binds on the longer paths
    tcp = _window(json.dumps({"transport": "tcp", "window_bytes": 6_000}), links, wire)
    assert tcp([0, 1], 1e6) == (math.inf, 1e6)


def test_the_log_error_is_symmetric_in_ratio_and_stays_finite_near_zero():
    """``log`` weighs a prediction 2x too slow as one 2x too fast (``relative`` does not: 1.0
    against 0.5, so its minimiser leans fast); below half the truth it goes on linearly, with a
    finite slope, down to a prediction of 0; a batch trains on it through period_losses."""
    true = torch.tensor([2.0, 2.0, 2.0, 2.0])
    pred = torch.tensor([4.0, 1.0, 1e-9, 0.9], requires_grad=True)
    log = ERRORS["log"](pred, true)
    assert log[0].item() == pytest.approx(log[1].item()) == pytest.approx(0.693147, rel=1e-5)
    rel = ERRORS["relative"](pred.detach(), true)
    assert rel[0].item() == pytest.approx(1.0) and rel[1].item() == pytest.approx(0.5)
    assert log[2].item() == pytest.approx(0.693147 + 1.0, rel=1e-5)
    log.sum().backward()
    assert torch.isfinite(pred.grad).all()
    # slope in the prediction: -1/ŝ on the log side, meeting the line's -1/(2 × 1/2 s) = -1 at ŝ = 1
    assert pred.grad[1:].tolist() == pytest.approx([-1.0, -1.0, -1.0])
    assert pred.grad[0].item() == pytest.approx(0.25)
    torch.manual_seed(5)
    model = M4Model(ModelConfig.tiny())
    out = period_losses(model, [period(), other_period()], every=True, error="log")
    again = period_losses(model, [period(), other_period()], every=True)
    assert torch.isfinite(out["main_flows"]) and torch.isfinite(out["every_flows"])
    assert not torch.isclose(out["main_flows"], again["main_flows"])
    out["every_flows"].backward()
