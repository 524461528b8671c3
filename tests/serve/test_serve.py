"""The m4 Serve application: a real deployment in a local Ray, called over HTTP."""

from __future__ import annotations

import json
import socket
import threading

import httpx
import numpy as np
import pytest

from m4ray.errors import InputError
from m4ray.serve.client import M4ServedConfig, SessionClient
from m4ray.sim.flows import Flow
from m4ray.sim.m4 import Arrival, M4Config
from m4ray.sim.ns3.backend import Ns3Config
from m4ray.sim.routing import Routing
from m4ray.sim.scenario import Scenario, simulate
from m4ray.sim.topologies import RailClusterSpec
from m4ray.sim.topology import format_topology
from m4ray.sim.trace import run_trace
from m4ray.workload.simai import SimAIWorkloadSpec


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def url(ray_local):
    from ray import serve

    from m4ray.serve.app import AppArgs, build

    port = _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(build(AppArgs(batch_wait_s=0.005)), name="m4", route_prefix="/m4")
    yield f"http://127.0.0.1:{port}/m4"
    serve.shutdown()


@pytest.fixture(scope="module")
def rail():
    topo = RailClusterSpec(servers=2).build()
    return topo, Routing(topo, seed=0), sorted(topo.hosts)


def _flows(hosts, n=8, offset=0):
    return [
        Flow(
            i,
            hosts[(i + offset) % 16],
            hosts[(i * 5 + 3 + offset) % 16],
            40_000 * (i + 1),
            i * 4e-6,
        )
        for i in range(n)
        if hosts[(i + offset) % 16] != hosts[(i * 5 + 3 + offset) % 16]
    ]


@pytest.mark.parametrize(
    ("window_us", "above", "frozen"),
    [(0.0, 64, 0), (10.0, 64, 0), (0.0, 2, 0), (0.0, 2, 1 << 20)],
)
def test_served_backend_equals_in_process(url, rail, window_us, above, frozen):
    # 10 us windows: each request carries several arrivals and completions, each at its own time;
    # above 2 flows: the session batches a burst's completions as the in-process engine does,
    # its anchors frozen between updates or re-shared (batch_frozen_above reaches the session)
    topo, routing, hosts = rail
    flows = _flows(hosts)
    if above == 2:
        flows = [
            Flow(i, hosts[i % 16], hosts[(i * 7 + 3) % 16], 100_000 * (1 + i % 5), 0.0)
            for i in range(24)
            if i % 16 != (i * 7 + 3) % 16
        ]
    batching = {"batch_above_flows": above, "batch_frozen_above": frozen}
    local = run_trace(topo, flows, M4Config(window_us=window_us, **batching), routing)
    served = run_trace(
        topo, flows, M4ServedConfig(url=url, window_us=window_us, **batching), routing
    )
    np.testing.assert_allclose(
        served.column("fct_s").to_numpy(), local.column("fct_s").to_numpy(), rtol=1e-5
    )


@pytest.mark.parametrize("via", ["http", "handle"])
def test_replay_through_serve_equals_in_process(url, via):
    workload = SimAIWorkloadSpec(path="microAllReduce", scale=0.002)
    topology = RailClusterSpec()  # 32 GPUs, as the workload
    local, _ = simulate(
        Scenario(topology=topology, workload=workload, backend="m4", backend_config=M4Config())
    )
    served, _ = simulate(
        Scenario(
            topology=topology,
            workload=workload,
            backend="m4_served",
            backend_config=M4ServedConfig(via=via, url=url, window_us=0.0),
        )
    )
    assert local["status"] == served["status"] == "ok", (local, served)
    assert served["completion_time_s"] == pytest.approx(local["completion_time_s"], rel=1e-5)
    if via == "handle":  # the same engine and float64 model, one hop away: the same answer
        assert served["completion_time_s"] == local["completion_time_s"]
    assert served["n_flows"] == local["n_flows"] > 0


def _session_run(client: SessionClient, script) -> list[dict[int, float]]:
    return [client.events(t, arrivals, completions) for t, arrivals, completions in script]


def _script(hosts, base):
    a = [Arrival(base + i, hosts[i], hosts[8 + (i % 3)], 200_000 * (i + 1)) for i in range(4)]
    return [
        (0.0, a[:2], []),
        (2e-6, a[2:], []),
        (9e-6, [], [base]),
        (15e-6, [Arrival(base + 9, hosts[5], hosts[9], 70_000)], [base + 2]),
    ]


def test_concurrent_sessions_are_isolated(url, rail):
    topo, routing, hosts = rail
    alone = {}
    for base in (0, 100):
        c = SessionClient(url, topo, routing)
        alone[base] = _session_run(c, _script(hosts, base))
        c.close()
    # interleaved step by step on two sessions
    a, b = SessionClient(url, topo, routing), SessionClient(url, topo, routing)
    sa, sb = _script(hosts, 0), _script(hosts, 100)
    got_a, got_b = [], []
    for ea, eb in zip(sa, sb, strict=True):
        got_b.append(b.events(*eb))
        got_a.append(a.events(*ea))
    assert _same(got_a, alone[0])
    assert _same(got_b, alone[100])
    # and concurrently from threads (their steps share model batches)
    results: dict[int, list] = {}

    def worker(base):
        c = SessionClient(url, topo, routing)
        results[base] = _session_run(c, _script(hosts, base))
        c.close()

    threads = [threading.Thread(target=worker, args=(base,)) for base in (0, 100)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert _same(results[0], alone[0]) and _same(results[100], alone[100])


def _same(xs: list[dict[int, float]], ys: list[dict[int, float]]) -> bool:
    return len(xs) == len(ys) and all(
        x.keys() == y.keys() and all(abs(x[k] - y[k]) <= 1e-9 + 1e-6 * abs(y[k]) for k in x)
        for x, y in zip(xs, ys, strict=True)
    )


def test_bad_requests_get_4xx_and_leave_sessions_alone(url, rail):
    topo, routing, hosts = rail
    good = SessionClient(url, topo, routing)
    script = _script(hosts, 0)
    first = good.events(*script[0])
    with httpx.Client(base_url=url, timeout=30) as http:
        r = http.post("/sessions/nope/events", json={"time_s": 0.0})
        assert r.status_code == 404 and "unknown session" in r.json()["detail"]
        sid = good.session_id
        r = http.post(f"/sessions/{sid}/events", json={"time_s": 1e-6, "arrivals": [{"id": 5}]})
        assert r.status_code == 422  # malformed: src, dst, size_bytes missing
        r = http.post(
            f"/sessions/{sid}/events",
            json={"time_s": 1e-6, "arrivals": [{"id": 5, "src": 0, "dst": 9999, "size_bytes": 10}]},
        )
        assert r.status_code == 400 and "9999" in r.json()["detail"]
        r = http.post(f"/sessions/{sid}/events", json={"time_s": 1e-6, "completions": [77]})
        assert r.status_code == 400 and "77" in r.json()["detail"]
        r = http.post(f"/sessions/{sid}/events", json={"time_s": -1.0})
        assert r.status_code == 422
        late = {"time_s": 2e-6, "completion": {"id": 0}}
        r = http.post(f"/sessions/{sid}/events", json={"time_s": 1e-6, "sequence": [late]})
        assert r.status_code == 400 and "sequence[0].time_s" in r.json()["detail"]
        both = {"time_s": 1e-6}
        r = http.post(f"/sessions/{sid}/events", json={"time_s": 1e-6, "sequence": [both]})
        assert r.status_code == 400 and "exactly one" in r.json()["detail"]
        r = http.post("/sessions", json={"topology": "3 1 0 1 1 A100\n2\n0 9 100Gbps 1us 0\n"})
        assert r.status_code == 400 and "topology:3: field 'dst'" in r.json()["detail"]
        text = format_topology(topo)
        r = http.post("/sessions", json={"topology": text, "batch_fraction": 0.0})
        assert r.status_code == 422 and "batch_fraction" in str(r.json()["detail"])
        r = http.post("/sessions", json={"topology": text, "batch_above_flows": -1})
        assert r.status_code == 422 and "batch_above_flows" in str(r.json()["detail"])
        r = http.post("/sessions", json={"topology": text, "batch_frozen_above": -1})
        assert r.status_code == 422 and "batch_frozen_above" in str(r.json()["detail"])
        state = http.get(f"/sessions/{sid}").json()
        assert state["active"] == 2  # the rejected requests changed nothing
        schema = http.get("/openapi.json").json()
        assert "/sessions/{session_id}/events" in schema["paths"]
    rest = [good.events(*e) for e in script[1:]]
    other = SessionClient(url, topo, routing)
    assert _same([first, *rest], _session_run(other, script))
    good.close()
    other.close()
    with pytest.raises(InputError, match="unknown session"):
        good.events(0.0, [], [])
    good.close()  # closing a closed session is harmless


def test_topology_text_round_trips_into_a_session(url, rail):
    topo, routing, _ = rail
    c = SessionClient(url, topo, routing)
    assert c.info["n_links"] == len(topo.bandwidth_bps)
    assert c.info["n_hosts"] == len(topo.hosts)
    assert c.info["notes"] == []  # the default network is inside the checkpoint's trained span
    c.close()


def test_a_session_says_which_network_parameters_it_read_at_the_trained_edge(url, rail):
    """A network outside the span the served checkpoint was trained on (100 MB buffers) is read
    at its edge, as backend=m4 reads it, and the session's info names what moved; with
    ``extrapolate`` the values are fed as they are and nothing is noted."""
    from m4ray.sim.ns3.transports import RdmaConfig

    topo, routing, _ = rail
    deep = Ns3Config(rdma=RdmaConfig(buffer_bytes=100_000_000, pfc_threshold_bytes=12_500_000))
    c = SessionClient(url, topo, routing, deep)
    assert len(c.info["notes"]) == 1 and c.info["notes"][0].startswith("bfsz 10000 read as 159")
    c.close()
    c = SessionClient(url, topo, routing, deep, extrapolate=True)
    assert c.info["notes"] == []
    c.close()


def test_idle_sessions_expire_and_busy_ones_stay():
    import asyncio

    from m4ray.serve.app import _Session, expire

    old, fresh, busy = (_Session(None, asyncio.Lock(), used=t) for t in (0.0, 95.0, 0.0))
    asyncio.run(busy.lock.acquire())
    sessions = {"old": old, "fresh": fresh, "busy": busy}
    assert expire(sessions, now=100.0, idle_s=10.0) == ["old"]
    assert set(sessions) == {"fresh", "busy"}


@pytest.mark.parametrize("via", ["http", "handle"])
def test_gray_failure_sweep_through_serve(url, tmp_path, via):
    """`backends=[m4_served]`: the sweep's Ray tasks simulate through the Serve endpoint (HTTP,
    or one hop to the model deployment) and get what the in-process backend gets (both with
    10 us update windows)."""
    import pandas as pd
    from omegaconf import OmegaConf

    from m4ray.sweeps.__main__ import resolve
    from m4ray.sweeps.gray_failure import run
    from tests.test_config import sweep_cfg

    cfg = sweep_cfg(
        "+experiment=gray_failure",
        "grid=smoke",
        "workload.scale=0.005",
        "backends=[m4,m4_served]",
        "backend_options.m4.window_us=10",
        f"backend_options.m4_served.url={url}",
        f"backend_options.m4_served.via={via}",
        f"paths.output_dir={tmp_path}",
        "progress=false",
    )
    run_dir = run(resolve(cfg), OmegaConf.to_container(cfg, resolve=True))
    results = pd.read_parquet(run_dir / "results.parquet")
    assert len(results) == 8 and (results.status == "ok").all()
    by = results.pivot(index="scenario_id", columns="backend", values="completion_time_s")
    assert by.m4_served.to_numpy() == pytest.approx(by.m4.to_numpy(), rel=1e-6)


def test_a_handle_to_a_missing_app_is_a_clear_error(url):
    with pytest.raises(InputError, match="no m4 Serve app 'nope'"):
        M4ServedConfig(via="handle", app_name="nope", timeout_s=5).build(*_rail_pair())
    with pytest.raises(InputError, match="via"):
        M4ServedConfig(via="grpc")


def _rail_pair():
    topo = RailClusterSpec(servers=2).build()
    return topo, Routing(topo)


def test_serve_settings_check_the_app_arguments():
    from m4ray.serve.job import ServeSettings, app_args

    assert app_args(ServeSettings(app={"max_batch_requests": 1})).max_batch_requests == 1
    with pytest.raises(InputError, match=r"serve\.app\.max_batch_requests"):
        app_args(ServeSettings(app={"max_batch_requests": 0}))
    with pytest.raises(InputError, match=r"serve\.app\.nope"):
        app_args(ServeSettings(app={"nope": 1}))


def test_jobs_serve_yaml_is_a_serve_config_of_this_app():
    import yaml
    from ray.serve.schema import ServeDeploySchema

    from m4ray.serve.app import AppArgs
    from tests.conftest import REPO

    config = yaml.safe_load((REPO / "jobs" / "serve.yaml").read_text())
    ServeDeploySchema.parse_obj(config)  # what `serve deploy` checks
    (app,) = config["applications"]
    assert app["import_path"] == "m4ray.serve.app:build"
    AppArgs(**app["args"])  # every argument is one of the app's, within its bounds
    names = {d["name"] for d in app["deployments"]}
    assert names == {"M4Model", "M4Sessions"}


def test_each_deployment_reports_its_memory_over_its_handle(url):
    from ray import serve

    sessions = serve.get_deployment_handle("M4Sessions", app_name="m4").memory.remote().result()
    model = serve.get_deployment_handle("M4Model", app_name="m4").memory.remote().result()
    for report in (sessions, model):
        assert report["rss_mb"] > 50 and report["objects"] > 0 and report["top"]
    assert sessions["sessions"] == httpx.get(f"{url}/health").json()["sessions"]


@pytest.fixture
def strict_url(url):
    """A second app with a token and small limits (deleted after the test)."""
    from ray import serve

    from m4ray.serve.app import AppArgs, build

    args = AppArgs(
        token="s3cret-token",
        max_sessions=2,
        max_events_per_request=3,
        max_request_bytes=4000,
        batch_wait_s=0.0,
    )
    serve.run(build(args), name="m4-strict", route_prefix="/strict")
    yield url.rsplit("/", 1)[0] + "/strict"
    serve.delete("m4-strict")


def test_the_contract_token_limits_and_documented_errors(strict_url, rail):
    topo, routing, hosts = rail
    from m4ray.sim.topology import format_topology

    body = {"topology": format_topology(topo)}
    auth = {"Authorization": "Bearer s3cret-token"}
    with httpx.Client(base_url=strict_url, timeout=30) as http:
        for headers in ({}, {"Authorization": "Bearer wrong-token"}):
            r = http.post("/sessions", json=body, headers=headers)
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        r = http.post("/sessions", json={"topology": ""}, headers=auth)
        assert r.status_code == 422  # the schema says a topology is not empty, and so it is
        big = {"topology": "x" * 5000}
        assert http.post("/sessions", json=big, headers=auth).status_code == 413
        ids = [http.post("/sessions", json=body, headers=auth).json()["session_id"] for _ in "ab"]
        r = http.post("/sessions", json=body, headers=auth)
        assert r.status_code == 429 and "2 sessions" in r.json()["detail"]
        arrivals = [
            {"id": i, "src": hosts[i], "dst": hosts[i + 8], "size_bytes": 1000} for i in range(4)
        ]
        r = http.post(f"/sessions/{ids[0]}/events", json={"time_s": 0, "arrivals": arrivals},
                      headers=auth)  # fmt: skip
        assert r.status_code == 413 and "4 events" in r.json()["detail"]
        assert http.get(f"/sessions/{ids[0]}", headers=auth).json()["active"] == 0
        r = http.put(f"/sessions/{ids[0]}", headers=auth)
        assert r.status_code == 405 and r.headers["allow"] == "DELETE, GET"
        assert http.delete(f"/sessions/{ids[1]}", headers=auth).status_code == 200
        assert http.post("/sessions", json=body, headers=auth).status_code == 201
        assert http.delete(f"/sessions/{ids[0]}", headers=auth).status_code == 200
        schema = http.get("/openapi.json").json()
    documented = {
        (path, method): set(op["responses"])
        for path, ops in schema["paths"].items()
        for method, op in ops.items()
    }
    assert documented[("/sessions", "post")] == {"201", "400", "401", "413", "422", "429"}
    assert documented[("/sessions/{session_id}/events", "post")] >= {"400", "404", "413", "422"}
    assert documented[("/sessions/{session_id}", "delete")] >= {"401", "404"}
    assert schema["components"]["schemas"]["NewSession"]["properties"]["topology"]["minLength"] == 1
    # the client passes the token on
    client = SessionClient(strict_url, topo, routing, token="s3cret-token")
    assert client.events(0.0, [Arrival(0, hosts[0], hosts[8], 10_000)], [])
    client.close()


def test_serving_beyond_loopback_needs_a_token():
    from m4ray.runtime.cluster import RayConfig
    from m4ray.serve.job import ServeSettings, start

    with pytest.raises(InputError, match=r"serve\.app\.token"):
        start(ServeSettings(host="0.0.0.0"), RayConfig())  # fails before Ray or Serve start


def test_the_app_takes_a_device_and_refuses_an_unknown_one():
    """``device=cuda`` asks Ray for a GPU for the model replica (``auto``: only where the
    cluster has one); an unknown device fails at the argument, before any replica starts."""
    from pydantic import ValidationError

    from m4ray.serve.app import AppArgs, build

    assert AppArgs(device="cuda:1").device == "cuda:1"
    with pytest.raises(ValidationError, match="device"):
        AppArgs(device="tpu")
    gpu_app = build(AppArgs(device="cuda"))
    model = gpu_app._bound_deployment.init_args[0]  # the ingress is bound to the model
    assert model._bound_deployment.ray_actor_options["num_gpus"] == 1


def test_several_jobs_replay_on_the_served_backend(url):
    """A multi-job workload (two jobs that share a rail uplink) on m4 over HTTP gives each job
    the iteration the in-process m4 gives (on a CPU both step through numpy_step)."""
    from m4ray.sim.nccl import SimAISpec
    from m4ray.sim.templates import ClusterTemplateSpec
    from m4ray.workload.multi import MultiJobSpec
    from tests.workload.test_multi import dp_job

    topo = ClusterTemplateSpec(template="spectrum_x", gpus=16, gpus_per_server=4, spines=1)
    spec = MultiJobSpec(jobs=[dp_job("a", 2, [0, 5]), dp_job("b", 2, [8, 13])], gpus_per_server=4)
    times = {}
    for name, config in [
        ("m4_served", M4ServedConfig(url=url, window_us=0.0)),
        ("m4", M4Config(window_us=0.0)),
    ]:
        scenario = Scenario(
            topology=topo,
            workload=spec,
            collective=SimAISpec(),
            backend=name,
            backend_config=config,
        )
        row, flows = simulate(scenario)
        assert row["status"] == "ok", row["error"]
        assert set(flows.column("job").to_pylist()) == {"a", "b"}
        times[name] = json.loads(row["job_iteration_s"])
    for job in ("a", "b"):
        assert times["m4_served"][job] == pytest.approx(times["m4"][job], rel=1e-6)
