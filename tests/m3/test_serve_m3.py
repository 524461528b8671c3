"""The m3 Serve app over real HTTP: served corrections equal the in-process model, the estimate
equals the local aggregation, bad requests get 400 and change nothing."""

from __future__ import annotations

import socket

import httpx
import numpy as np
import pytest
import torch

from m4ray.m3.aggregate import aggregate
from m4ray.m3.estimate import path_features
from m4ray.m3.paths import RoutedFlows
from m4ray.m3.train import M3
from m4ray.models import checkpoint
from m4ray.models.m3 import M3Model, M3ModelConfig
from m4ray.models.m3_features import NetConfig
from m4ray.sim.flows import Flow
from m4ray.sim.routing import Routing, WireFormat
from m4ray.sim.topologies import fat_tree


@pytest.fixture(scope="module")
def served(ray_local, tmp_path_factory):
    """An untrained tiny m3 (a real exported checkpoint: serving is what is under test)."""
    from ray import serve

    from m4ray.serve.m3 import M3Args, build

    torch.manual_seed(0)
    model = M3Model(M3ModelConfig(dim=16, layers=1, heads=2, ffn=32, mlp=32)).eval()
    export = tmp_path_factory.mktemp("m3ckpt")
    checkpoint.export(model, export, {"supported_cc": ["dctcp"]}, "# test m3", kind=M3)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(build(M3Args(checkpoint=str(export))), name="m3", route_prefix="/m3")
    yield f"http://127.0.0.1:{port}/m3", checkpoint.load(export, kind=M3)[0]
    serve.shutdown()


@pytest.fixture(scope="module")
def features():
    topo = fat_tree(k=4, bandwidth_bps=10e9, fabric_bandwidth_bps=40e9)
    rng = np.random.default_rng(2)
    flows = [
        Flow(i, *map(int, rng.choice(topo.hosts, 2, replace=False)), int(rng.integers(100, 90_000)),
             i * 2e-6)
        for i in range(300)
    ]  # fmt: skip
    routed = RoutedFlows(flows, Routing(topo, seed=1))
    net = NetConfig(buffer_bytes=4e5, window_bytes=1.8e4, ecn_k_bytes=1.2e4)
    return path_features(routed, routed.sample(40, seed=3), WireFormat(), net)


def _body(rows, with_counts=True):
    return {
        "paths": [
            {
                "tokens": tok.tolist(),
                "empty": empty.tolist(),
                "baseline": base.tolist(),
                **({"counts": counts.tolist(), "draws": int(draws)} if with_counts else {}),
            }
            for tok, empty, counts, base, draws in rows
        ]
    }


def test_served_predictions_and_estimate_equal_local(served, features):
    url, model = served
    reply = httpx.post(f"{url}/predict", json=_body(features), timeout=60)
    assert reply.status_code == 200, reply.text
    got = np.array(reply.json()["percentiles"])
    local = []
    for tok, empty, _, base, _ in features:
        t, e = torch.from_numpy(tok[None]), torch.from_numpy(empty[None])
        n, b = torch.tensor([len(tok) - 1]), torch.from_numpy(base[None])
        with torch.no_grad():
            local.append(model(t[:, 0], e[:, 0], t[:, 1:], e[:, 1:], n, b)[0].numpy())
    np.testing.assert_allclose(got, np.stack(local), rtol=1e-4, atol=1e-5)
    est = aggregate(
        np.stack(local), np.stack([r[2] for r in features]), np.array([r[4] for r in features])
    )
    served_est = reply.json()["estimate"]
    assert served_est["overall"]["p99"] == pytest.approx(
        float(est.overall.quantile(0.99)), rel=1e-4
    )
    assert set(served_est) == {"overall", *est.buckets}


def test_bad_requests_get_400(served, features):
    url, _ = served
    body = _body(features[:2], with_counts=False)
    assert "estimate" not in httpx.post(f"{url}/predict", json=body, timeout=60).json()
    wrong_cc = httpx.post(f"{url}/predict", json={**body, "cc": "hpcc"}, timeout=60)
    assert wrong_cc.status_code == 400 and "not 'hpcc'" in wrong_cc.text
    short = {"paths": [{"tokens": [[1.0] * 5, [1.0] * 5], "empty": [[True] * 10] * 2}]}
    bad = httpx.post(f"{url}/predict", json=short, timeout=60)
    assert bad.status_code == 400 and "paths[0]" in bad.text
    no_base = {"paths": [{k: v for k, v in body["paths"][0].items() if k != "baseline"}]}
    bad = httpx.post(f"{url}/predict", json=no_base, timeout=60)
    assert bad.status_code == 400 and "paths[0].baseline" in bad.text
    health = httpx.get(f"{url}/health", timeout=30).json()
    assert health["supported_cc"] == ["dctcp"] and health["batches"] >= 1
    assert health["path_flowsim_queues"] is False  # this checkpoint records none
    assert health["path_flowsim_first_windows"] is False
