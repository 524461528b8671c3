"""m3 end to end with real parts: parking lots in ns-3 (datagen_m3), Ray Train + MLflow
(train_m3), the exported checkpoint, and the estimate on a small fat-tree (+experiment=m3)."""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from m4ray.datagen.traffic import SizeDistribution
from m4ray.errors import InputError
from m4ray.m3.datagen import LotScenario, LotTraffic
from m4ray.m3.train import M3, M3TrainConfig, load_lots, predict
from m4ray.models import checkpoint
from m4ray.sim.ns3.backend import Ns3Config
from m4ray.sim.ns3.transports import RdmaConfig
from tests.conftest import PYTHON, REPO

TINY_MODEL = [
    "train.model.dim=16",
    "train.model.heads=2",
    "train.model.ffn=32",
    "train.model.mlp=32",
]


def sweep(output_dir, *args, timeout=600):
    return subprocess.run(
        [PYTHON, "-m", "m4ray.sweeps", *args, "ray.num_cpus=2", f"paths.output_dir={output_dir}"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=timeout,
        check=False,
    )


def test_lone_flows_on_a_lot_run_at_the_nic_cap_in_ns3():
    """ns-3 on a 4-link lot [10, 40, 40, 10] G: a lone foreground flow and, later, a lone
    mid-path (1, 3) flow — paced at 10G, not the 40G of its links — both finish at their ideal."""
    traffic = LotTraffic(
        pairs=((0, 4), (1, 3)),
        weights=(0.0, 1.0),  # the first flow is always foreground, the second (1, 3)
        n_flows=2,
        size_name="exponential",
        size=SizeDistribution(kind="exponential"),
        size_mean_bytes=50_000,
        max_load=0.001,  # far apart: each flow alone
    )
    scenario = LotScenario(
        family="lot",
        index=0,
        seed=5,
        capacity_bps=(10e9, 40e9, 40e9, 10e9),
        latency_s=(1e-6,) * 4,
        traffic=traffic,
        ns3=Ns3Config(
            rdma=RdmaConfig(
                buffer_bytes=400_000,
                pfc_threshold_bytes=100_000,
                ecn_k_bytes=[[10e9, 10_000.0]],
                window_bytes=0,
            )
        ),
    )
    flows = scenario.record()["lot_flows"].to_pandas()
    assert list(zip(flows.a, flows.b, strict=True)) == [(0, 4), (1, 3)]
    assert flows.slowdown.to_numpy() == pytest.approx(1.0, abs=0.02)
    assert flows.flowsim_slowdown.to_numpy() == pytest.approx(1.0, abs=1e-9)


def test_the_m3_network_runs_every_cc_in_ns3_beside_its_fluid_references():
    """``M3Network(cc=...)``: DCQCN's RED from K_min = K to 4 K at each rate, the others with
    their defaults; ns-3 runs each on a small fat-tree (every flow done, never faster than
    ideal), flowSim with the CC's standing queues never faster than classic flowSim."""
    from m4ray.m3.estimate import M3Network
    from m4ray.sim.flows import Flow
    from m4ray.sim.flowsim import FlowSimConfig, StandingQueues
    from m4ray.sim.routing import Routing
    from m4ray.sim.topologies import fat_tree
    from m4ray.sim.trace import run_trace

    rdma = M3Network(cc="dcqcn").ns3(10e9, 40e9).rdma
    params = rdma.cc_config()
    assert params.k_min_bytes == [[10e9, 12_000.0], [40e9, 48_000.0]]
    assert params.k_max_bytes == [[10e9, 48_000.0], [40e9, 192_000.0]]
    assert rdma.red_marking(10e9) == (12_000, 48_000, params.p_max, "cc_params.k_max_bytes")
    own = M3Network(cc="timely", cc_params={"t_low_s": 30e-6}).ns3(10e9, 40e9).rdma
    assert own.cc == "timely" and own.cc_config().t_low_s == 30e-6
    topo = fat_tree(k=4)
    routing = Routing(topo, seed=1)
    rng = np.random.default_rng(3)
    flows = [
        Flow(i, int(s), int(d), int(rng.choice([500, 30_000, 300_000])), i * 2e-6)
        for i, (s, d) in enumerate(rng.choice(16, (120, 2)))
        if s != d
    ]

    def slowdowns(backend) -> np.ndarray:
        table = run_trace(topo, flows, backend, routing).to_pandas().set_index("flow_id")
        return table.slowdown.loc[[f.id for f in flows]].to_numpy()

    classic = slowdowns(FlowSimConfig())
    for cc in ("dcqcn", "hpcc", "timely"):
        ns3 = M3Network(cc=cc).ns3(10e9, 10e9)
        assert slowdowns(ns3).min() > 0.99, cc
        queued = slowdowns(FlowSimConfig(queues=StandingQueues.of(ns3, routing)))
        assert (queued >= classic * (1 - 1e-12)).all(), cc


def test_a_refused_cc_names_a_shipped_m3_that_knows_it():
    """m3-v2 knows DCTCP only: asked for HPCC it refuses, naming the latest shipped m3 that
    knows it (m3-v10: versions compare by number); m3-v3, m3-v4, m3-v5 and m3-v10 know all four,
    only m3-v4, m3-v5 and m3-v10 queue HPCC's first windows in path flowSim, and only m3-v10 its
    bursts at route round trips (the estimate runs each as it was trained)."""
    from m4ray.errors import InputError
    from m4ray.m3.estimate import M3Config, checkpoint_queues, load_model
    from m4ray.sim.topologies import fat_tree

    with pytest.raises(InputError, match=r"m3\.checkpoint=.*m3-v10 knows it") as err:
        load_model(str(REPO / "checkpoints" / "m3-v2"), "hpcc")
    assert err.value.field == "m3.network.cc"
    topo = fat_tree(k=4, bandwidth_bps=10e9, fabric_bandwidth_bps=40e9)
    for name, first in (("m3-v3", False), ("m3-v4", True), ("m3-v5", True), ("m3-v10", True)):
        _, info = load_model(str(REPO / "checkpoints" / name), "hpcc")
        assert info["supported_cc"] == ["dcqcn", "dctcp", "hpcc", "timely"]
        queues = checkpoint_queues(M3Config(), topo, info)
        assert queues.first_windows is first
        assert queues.bursts is queues.route_rtt is (name == "m3-v10")
        assert queues.rates is False and queues.rate_control() is None  # none trained on it


def test_path_rates_override_the_checkpoint_under_dcqcn_only():
    """``m3.path_rates``: path flowSim under DCQCN's rates whatever the checkpoint was trained
    with, taking the network's DCQCN settings; refused by field on another CC and with a
    checkpoint trained without standing queues (rates run with them)."""
    from m4ray.errors import InputError
    from m4ray.m3.estimate import M3Config, M3Network, checkpoint_queues, load_model
    from m4ray.sim.topologies import fat_tree

    topo = fat_tree(k=4, bandwidth_bps=10e9, fabric_bandwidth_bps=40e9)
    _, info = load_model(str(REPO / "checkpoints" / "m3-v10"), "dcqcn")
    params = {"increase_interval_s": 55e-6}
    cfg = M3Config(network=M3Network(cc="dcqcn", cc_params=params), path_rates=True)
    rates = checkpoint_queues(cfg, topo, info).rate_control()
    assert rates.params().increase_interval_s == 55e-6
    assert checkpoint_queues(M3Config(network=M3Network(cc="dcqcn")), topo, info).rates is False
    with pytest.raises(InputError) as err:
        M3Config(network=M3Network(cc="hpcc"), path_rates=True)
    assert err.value.field == "m3.path_rates"
    _, plain = load_model(str(REPO / "checkpoints" / "m3-small"), "dctcp")
    with pytest.raises(InputError) as err:
        checkpoint_queues(M3Config(path_rates=True, network=M3Network(cc="dcqcn")), topo, plain)
    assert err.value.field == "m3.path_rates"
    # the fluid as a comparison, on every CC's network
    assert M3Config(compare=["fluid_dctcp"]).compare == ["fluid_dctcp"]
    for cc in ("dcqcn", "hpcc", "timely"):
        M3Config(network=M3Network(cc=cc), compare=["ns3", "fluid_dctcp"])


def test_lots_with_standing_queues_change_path_flowsim_not_ns3(tmp_path):
    """A lot recorded with path flowSim's standing queues: the same ns-3 run, flowSim's
    slowdowns never below the plain ones (many above), and the scenario says so (``params``),
    which train_m3 reads into the checkpoint (a mix of lots is refused by name)."""
    import dataclasses

    import pandas as pd

    from m4ray.errors import InputError
    from m4ray.sweeps.train_m3 import path_queues

    traffic = LotTraffic(
        pairs=((0, 4), (1, 3), (0, 2), (2, 4)),
        weights=(1.0, 1.0, 1.0, 1.0),
        n_flows=300,
        size_name="exponential",
        size=SizeDistribution(kind="exponential"),
        size_mean_bytes=20_000,
        max_load=0.7,
    )
    rdma = RdmaConfig(
        buffer_bytes=400_000, pfc_threshold_bytes=100_000, window_bytes=18_000,
        ecn_k_bytes=[[10e9, 12_000.0], [40e9, 48_000.0]],
    )  # fmt: skip
    plain = LotScenario(
        family="lot", index=0, seed=9, capacity_bps=(10e9, 40e9, 40e9, 10e9),
        latency_s=(1e-6,) * 4, traffic=traffic, ns3=Ns3Config(rdma=rdma),
    )  # fmt: skip
    queued = dataclasses.replace(plain, queues=True)
    assert queued.scenario_id != plain.scenario_id
    assert "path_queues" not in plain.params() and queued.params()["path_queues"] is True
    a, b = (s.record()["lot_flows"].to_pandas() for s in (plain, queued))
    np.testing.assert_array_equal(a.fct_s, b.fct_s)  # ns-3 is the same run
    assert (b.flowsim_slowdown >= a.flowsim_slowdown).all()
    assert (b.flowsim_slowdown > a.flowsim_slowdown * 1.01).sum() > 20
    rows = [json.dumps(s.params()) for s in (queued, queued)]
    pd.DataFrame({"params": rows, "status": ["ok", "ok"]}).to_parquet(
        tmp_path / "scenarios.parquet"
    )
    assert path_queues(str(tmp_path)) is True
    rows[1] = json.dumps(plain.params())
    pd.DataFrame({"params": rows, "status": ["ok", "ok"]}).to_parquet(
        tmp_path / "scenarios.parquet"
    )
    with pytest.raises(InputError, match="with and without"):
        path_queues(str(tmp_path))


@pytest.fixture(scope="module")
def m3_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("m3")
    data = sweep(out, "+experiment=datagen_m3", "datagen.scenarios=6",
                 "datagen.families.lot.n_flows=[100,200]")  # fmt: skip
    assert data.returncode == 0, data.stderr[-3000:]
    train = sweep(out, "+experiment=train_m3", "train.epochs=2", "train.num_workers=1",
                  "train.val_fraction=0.2", "train.test_fraction=0.2", *TINY_MODEL)  # fmt: skip
    assert train.returncode == 0, train.stderr[-3000:]
    return out, data, train


def test_datagen_m3_writes_versioned_lot_samples(m3_run):
    out, data, _ = m3_run
    dataset = out / "datagen_m3" / "dataset"
    assert "lot" in data.stdout and (dataset / "VERSION").read_text().strip()
    lots = load_lots(dataset)
    assert len(lots) == 6 and set(lots.n_links) <= {2, 4, 6}
    assert lots.tokens.shape[1:] == (int(lots.n_links.max()) + 1, 1013)
    assert (lots.target[lots.mask] > 0.5).all() and (lots.target[~lots.mask] == 1.0).all()
    assert "## lot_samples" in (dataset / "SCHEMA.md").read_text()
    assert (out / "datagen_m3" / "plots" / "lot_slowdown_cdf.png").stat().st_size > 5000
    scenarios = pq.read_table(dataset / "scenarios.parquet").to_pandas()
    assert (scenarios.status == "ok").all()


def test_load_lots_reads_only_the_listed_scenarios(m3_run, tmp_path):
    """A partition left in the folder by another run (a copied or resumed dataset) is not
    read: only the scenarios ``scenarios.parquet`` lists as ok."""
    out, _, _ = m3_run
    copy = tmp_path / "dataset"
    shutil.copytree(out / "datagen_m3" / "dataset", copy)
    scenarios = pq.read_table(copy / "scenarios.parquet").to_pandas()
    dropped = scenarios.scenario_id.iloc[0]
    scenarios.iloc[1:].to_parquet(copy / "scenarios.parquet")  # its partitions stay
    lots = load_lots(copy)
    assert len(lots) == 5 and dropped not in set(lots.scenario_id)


def test_train_m3_exports_a_checkpoint_that_round_trips(m3_run):
    out, _, train = m3_run
    assert "1 worker(s) on CPU (gloo)" in train.stdout and "flowsim" in train.stdout
    export = out / "train_m3" / "export"
    model, info = checkpoint.load(export, kind=M3)
    assert info["format"] == "m4ray-m3-v1" and info["supported_cc"] == ["dctcp"]
    assert info["epochs"] == 2 and "dataset version" in (export / "model_card.md").read_text()
    lots = load_lots(out / "datagen_m3" / "dataset")
    again, _ = checkpoint.load(export, kind=M3)
    np.testing.assert_array_equal(predict(model, lots), predict(again, lots))
    with pytest.raises(Exception, match="m4ray-m3-v1"):
        checkpoint.load(export)  # an m3 checkpoint is not an m4 one


def test_train_m3_fits_the_mixture_from_a_checkpoint(m3_run):
    """train.loss=mixture (one scenario a batch, scenarios split whole) from the exported
    checkpoint's weights; a checkpoint of another model size is refused by name."""
    out, _, _ = m3_run
    export = out / "train_m3" / "export"
    proc = sweep(out, "+experiment=train_m3", "train.epochs=1", "train.num_workers=1",
                 "train.loss=mixture", f"train.init_checkpoint={export}", "name=mix",
                 "train.mixture_weight=estimate", "train.soup=[0,1]",
                 "train.val_fraction=0.2", "train.test_fraction=0.2", *TINY_MODEL)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    card = (out / "mix" / "export" / "model_card.md").read_text()
    assert "loss `mixture`" in card and str(export) in card and "as the estimate mixes" in card
    # a soup of two members, each trained in its own folder on its own split
    _, info = checkpoint.load(out / "mix" / "export", kind=M3)
    assert info["soup"] == [0, 1] and "a model soup" in card
    assert {p.name for p in (out / "mix").glob("member-*")} == {"member-0", "member-1"}
    assert 0 <= info["lots"]["held_out"] <= info["lots"]["test"] + info["lots"]["val"]
    with pytest.raises(InputError) as err:
        M3TrainConfig(soup=[0, 1])  # no checkpoint for the members to start from
    assert err.value.field == "train.soup"
    with pytest.raises(InputError) as err:
        M3TrainConfig(loss="mixture", mixture_weight="paths")
    assert err.value.field == "train.mixture_weight"
    bad = sweep(out, "+experiment=train_m3", "train.epochs=1", "train.num_workers=1",
                f"train.init_checkpoint={export}", "name=bad", "train.model.dim=32",
                "train.model.heads=2", "train.model.ffn=32", "train.model.mlp=32")  # fmt: skip
    assert bad.returncode == 2 and "train.init_checkpoint" in bad.stderr + bad.stdout


def test_estimate_on_a_small_fat_tree_with_flowsim_comparison(m3_run):
    out, _, _ = m3_run
    export = out / "train_m3" / "export"
    proc = sweep(out, "+experiment=m3", f"m3.checkpoint={export}", "topology.k=4",
                 "m3.workload.n_flows=400", "m3.n_paths=50", "m3.tasks=2",
                 "m3.compare=[flowsim,flowsim_queues,fluid_dctcp]")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    [estimate] = (out / "m3").glob("estimate-*.parquet")
    frame = pq.read_table(estimate).to_pandas()
    assert set(frame.method) == {"m3", "path_flowsim", "flowsim", "flowsim_queues", "fluid_dctcp"}
    overall = frame[frame.bucket == "overall"].set_index("method")
    assert (overall.p50 <= overall.p90).all() and (overall.p90 <= overall.p99).all()
    # the standing queues only ever add waiting: no flow is faster than classic flowSim's
    assert (overall.p99.flowsim_queues >= overall.p99.flowsim) and (
        overall.p50.flowsim_queues >= overall.p50.flowsim
    )
    assert list((out / "m3" / "plots").glob("slowdown_cdf-*.png"))
    [manifest] = (out / "m3").glob("manifest-*.json")
    assert json.loads(manifest.read_text())["paths_sampled"] == 50
    # a checkpoint trained on lots with standing queues gets path flowSim with them
    queued = out / "queued_export"
    shutil.copytree(export, queued)
    info = json.loads((queued / "model.json").read_text())
    assert "path_flowsim_queues" in info and not info["path_flowsim_queues"]
    info["path_flowsim_queues"] = True
    (queued / "model.json").write_text(json.dumps(info))
    proc = sweep(out / "q", "+experiment=m3", f"m3.checkpoint={queued}", "topology.k=4",
                 "m3.workload.n_flows=400", "m3.n_paths=50", "m3.tasks=2")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    [again] = (out / "q" / "m3").glob("estimate-*.parquet")
    waits = pq.read_table(again).to_pandas().query("bucket == 'overall'").set_index("method")
    assert waits.p99.path_flowsim > overall.p99.path_flowsim


def test_estimate_bad_inputs_write_nothing(m3_run, tmp_path):
    out, _, _ = m3_run
    export = out / "train_m3" / "export"
    flows = tmp_path / "flows.txt"
    flows.write_text("2\n0 0 1 3 100 1000 0.0\n1 0 99 3 100 1000 0.0\n")
    cases = [
        ([f"m3.workload.flows_file={flows}"], "flow 1 (#1) references node 99"),
        (["m3.network.cc=hpcc"], "trained on ['dctcp'], not 'hpcc'"),
        (["m3.network.cc=cubic"], "unknown congestion control 'cubic'"),
        (["m3.n_paths=0"], "must be >= 1"),
    ]
    for overrides, message in cases:
        proc = sweep(tmp_path / "o", "+experiment=m3", f"m3.checkpoint={export}", "topology.k=4",
                     *overrides)  # fmt: skip
        assert proc.returncode == 2, (overrides, proc.stderr[-2000:])
        assert message in proc.stderr + proc.stdout, (overrides, proc.stderr[-2000:])
        assert not list((tmp_path / "o").rglob("estimate-*.parquet"))


def test_model_inference_is_batched_consistently(m3_run):
    out, _, _ = m3_run
    model, _ = checkpoint.load(out / "train_m3" / "export", kind=M3)
    lots = load_lots(out / "datagen_m3" / "dataset")
    together = predict(model, lots)
    alone = np.concatenate([predict(model, lots.take([i])) for i in range(len(lots))])
    np.testing.assert_allclose(together, alone, rtol=1e-5, atol=1e-5)
    assert torch.isfinite(torch.from_numpy(together)).all()


@pytest.mark.slow
def test_tune_m3_runs_trials_with_their_own_mlflow_runs(m3_run):
    import mlflow

    out, _, _ = m3_run
    proc = sweep(out, "+experiment=tune_m3", "train.epochs=2", "tune.num_samples=2",
                 "tune.grace_period=1", "train.num_workers=1", "train.val_fraction=0.2",
                 "train.test_fraction=0.2", "train.model.heads=2",
                 "tune.space={lr: {choice: [0.001]}, model.dim: {choice: [16, 32]}, "
                 "model.layers: {choice: [1]}, batch_size: {choice: [4]}}")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "best:" in proc.stdout
    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{out / 'tune_m3' / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("m3-tune").experiment_id])
    assert len(runs) == 2
