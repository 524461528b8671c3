"""m3 samples from whole networks (m4ray.m3.netpaths): a real ns-3 run of a small fat-tree."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from m4ray.errors import InputError
from m4ray.m3.netpaths import NetworkFamily
from m4ray.models.m3_features import targets


@pytest.fixture(scope="module")
def network():
    """One small network's samples (a real ns-3 run)."""
    family = NetworkFamily(n_flows=[1500, 1500], sizes={"lognormal": {"sigma": 1.5}}, n_paths=60)
    scenario = family.sample("net", 0, 7, 300.0)
    return family, scenario, scenario.record()


def test_network_paths_record_the_estimates_inputs_and_the_networks_targets(network):
    """Each sampled path is one ``lot_samples`` row: path flowSim's baseline of its foreground
    (with standing queues) and, as target, the percentiles of what network-wide ns-3 gave those
    same flows (``lot_flows``, path after path); draws are the estimate's (∝ foreground)."""
    family, scenario, tables = network
    assert scenario.params()["path_queues"] is True
    assert scenario.scenario_id == family.sample("net", 0, 7, 60.0).scenario_id  # guard aside
    samples, flows = tables["lot_samples"].to_pandas(), tables["lot_flows"].to_pandas()
    assert 10 < len(samples) <= 60 and set(samples.n_links) <= {2, 4, 6}
    assert samples.draws.sum() == 60 and (samples.draws >= 1).all()
    assert samples.n_foreground.sum() == len(flows) and flows.foreground.all()
    assert len(set(flows.flow_id)) == len(flows)  # each network flow on one route
    ends = np.cumsum(samples.n_foreground.to_numpy())
    for row, end in zip(samples.itertuples(), ends, strict=True):
        part = flows.iloc[end - row.n_foreground : end]
        want, mask = targets(part.slowdown.to_numpy(), part.size_bytes.to_numpy())
        np.testing.assert_array_equal(np.asarray(row.target).reshape(4, 100), want)
        np.testing.assert_array_equal(np.asarray(row.mask), mask)
        base, _ = targets(part.flowsim_slowdown.to_numpy(), part.size_bytes.to_numpy())
        np.testing.assert_array_equal(np.asarray(row.flowsim_target).reshape(4, 100), base)
    assert (flows.flowsim_slowdown >= 1 - 1e-9).all() and (flows.slowdown > 0.5).all()


def test_mixture_weights_are_the_estimates_and_old_datasets_recover_their_draws(network, tmp_path):
    """``load_lots`` weighs each path in each bucket as the estimate mixes paths (draws x its
    flows there / its flows); a dataset written before ``lot_samples`` had draws gets the same
    weights from the repeated draws, and draws that are not the network's are refused."""
    import pyarrow.parquet as pq

    from m4ray.m3.aggregate import bucket_counts
    from m4ray.m3.netpaths import recovered_draws
    from m4ray.m3.train import load_lots

    _, scenario, tables = network

    def dataset(name, *parts):
        """One scenario per ``lot_samples`` table given: the same network under ids 0, 1, ..."""
        root = tmp_path / name
        ids = [f"{scenario.scenario_id}{k}" for k in range(len(parts))]
        for sid, samples in zip(ids, parts, strict=True):
            for table, rows in (("lot_samples", samples), ("lot_flows", tables["lot_flows"])):
                part = root / table / f"scenario_id={sid}"
                part.mkdir(parents=True)
                pq.write_table(rows, part / "part-0.parquet")
        pd.DataFrame(
            {"scenario_id": ids, "status": "ok", "seed": scenario.seed,
             "params": json.dumps(scenario.params())}
        ).to_parquet(root / "scenarios.parquet")  # fmt: skip
        return root

    samples, flows = tables["lot_samples"], tables["lot_flows"].to_pandas()
    lots = load_lots(dataset("new", samples), weights=True)
    draws = samples.column("draws").to_numpy()
    np.testing.assert_allclose(lots.weight.sum(axis=1), draws, rtol=1e-6)
    np.testing.assert_array_equal(lots.weight > 0, lots.mask)
    first = flows.iloc[: samples.column("n_foreground")[0].as_py()]
    counts = bucket_counts(first.size_bytes.to_numpy())
    np.testing.assert_allclose(lots.weight[0], draws[0] * counts / counts.sum(), rtol=1e-6)
    assert load_lots(tmp_path / "new").weight is None  # read only when asked for
    old = load_lots(dataset("old", samples.drop_columns(["draws"])), weights=True)
    np.testing.assert_array_equal(old.weight, lots.weight)
    # a dataset extended after draws were recorded: partitions with and without them
    mixed = load_lots(dataset("mixed", samples, samples.drop_columns(["draws"])), weights=True)
    np.testing.assert_array_equal(mixed.weight, np.concatenate([lots.weight, lots.weight]))
    ids = np.split(flows.flow_id.to_numpy(), np.cumsum(samples.column("n_foreground"))[:-1])
    with pytest.raises(InputError, match="draws"):
        recovered_draws(scenario.params(), scenario.seed + 1, ids)


def test_network_paths_under_another_cc_run_its_ns3_and_its_queue_level():
    """A family drawing congestion controls: DCTCP-only families draw the same networks as
    before (no draw), another CC's network runs in ns-3 under it, records it in ``params``
    (what ``train_m3`` reads as the checkpoint's CCs) and its path flowSim waits at its level."""
    plain = NetworkFamily(n_flows=[1500, 1500], sizes={"lognormal": {"sigma": 1.5}}, n_paths=30)
    same = NetworkFamily(
        n_flows=[1500, 1500], sizes={"lognormal": {"sigma": 1.5}}, n_paths=30, cc={"ccs": ["dctcp"]}
    )
    assert plain.sample("net", 0, 7, 0.0).scenario_id == same.sample("net", 0, 7, 0.0).scenario_id
    assert "cc" not in plain.sample("net", 0, 7, 0.0).params()
    family = NetworkFamily(
        n_flows=[1500, 1500], sizes={"lognormal": {"sigma": 1.5}}, n_paths=30,
        cc={"ccs": ["timely"], "timely_t_low_us": [30.0, 30.0]},
    )  # fmt: skip
    scenario = family.sample("net", 0, 7, 300.0)
    assert scenario.network.cc == "timely" and scenario.params()["cc"] == "timely"
    assert scenario.network.cc_params["t_low_s"] == pytest.approx(30e-6)
    flows = scenario.record()["lot_flows"].to_pandas()
    assert len(flows) > 10 and (flows.flowsim_slowdown >= 1 - 1e-9).all()
    assert (flows.slowdown > 0.5).all()
    with pytest.raises(InputError) as err:
        NetworkFamily(cc={"ccs": ["cubic"]})
    assert err.value.field == "cc.ccs"


def test_first_windows_only_where_the_cc_queues_nothing_else(tmp_path):
    """A family with ``first_windows`` sets it on HPCC's networks only (the CC that queues
    only its first windows): the others keep their ids; ``params`` says it, and a dataset whose
    HPCC networks differ in it is refused by ``train_m3``."""
    from m4ray.sweeps.train_m3 import path_first_windows

    def family(**kw):
        return NetworkFamily(n_flows=[1500, 1500], n_paths=30, cc={"ccs": ["dctcp", "hpcc"]}, **kw)

    drawn = [family(first_windows=True).sample("net", i, 100 + i, 0.0) for i in range(12)]
    before = [family().sample("net", i, 100 + i, 0.0) for i in range(12)]
    ccs = {s.network.cc for s in drawn}
    assert ccs == {"dctcp", "hpcc"}
    for new, old in zip(drawn, before, strict=True):
        assert new.first_windows == (new.network.cc == "hpcc")
        assert (new.scenario_id == old.scenario_id) == (new.network.cc != "hpcc")
        assert new.params().get("path_first_windows", False) == new.first_windows
    rows = [json.dumps(s.params()) for s in drawn]
    frame = pd.DataFrame({"params": rows, "status": ["ok"] * len(rows)})
    frame.to_parquet(tmp_path / "scenarios.parquet")
    assert path_first_windows(str(tmp_path)) is True
    hpcc = next(i for i, s in enumerate(drawn) if s.network.cc == "hpcc")
    rows[hpcc] = json.dumps(before[hpcc].params())
    pd.DataFrame({"params": rows, "status": ["ok"] * len(rows)}).to_parquet(
        tmp_path / "scenarios.parquet"
    )
    with pytest.raises(InputError, match="hpcc lots with and without"):
        path_first_windows(str(tmp_path))


@pytest.mark.parametrize(
    ("settings", "field"),
    [({"k": [3]}, "k"), ({"max_load": [0.5, 1.5]}, "max_load"), ({"n_paths": 0}, "n_paths")],
)
def test_bad_network_ranges_name_the_field(settings, field):
    with pytest.raises(InputError) as err:
        NetworkFamily(**settings)
    assert err.value.field == field


def test_bench_m3_networks_mixes_a_bucket_as_the_estimate_does():
    """bench/m3_networks.py's per-network p99: a bucket's paths pooled with the estimate's weights
    (a path without flows there, or weight 0, takes no part), the same p99 as aggregate()."""
    import importlib.util
    from pathlib import Path

    from m4ray.m3.aggregate import aggregate

    path = Path(__file__).resolve().parents[2] / "bench" / "m3_networks.py"
    spec = importlib.util.spec_from_file_location("m3_networks", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rng = np.random.default_rng(3)
    values = np.sort(rng.uniform(1, 5, (6, 4, 100)), axis=2)
    counts = rng.integers(0, 4, (6, 4)).astype(float)
    counts[:, 0] = [0, 1, 2, 0, 5, 1]
    draws = np.array([1, 2, 1, 3, 1, 1], dtype=float)
    weight = draws[:, None] * counts / counts.sum(axis=1, keepdims=True)
    got = bench.bucket_p99(values, weight, counts > 0)
    est = aggregate(values, counts, draws)
    for b, name in enumerate(("<1KB", "1-10KB", "10-50KB", ">=50KB")):
        if name in est.buckets:
            assert got[b] == pytest.approx(float(est.buckets[name].quantile(0.99)), rel=1e-12)
        else:
            assert np.isnan(got[b])
    # a path that is not there changes nothing
    more = np.concatenate([values, values[:1] * 10])
    zero = np.concatenate([weight, np.zeros((1, 4))])
    assert np.allclose(
        bench.bucket_p99(more, zero, np.concatenate([counts, counts[:1]]) > 0), got, equal_nan=True
    )


def test_a_new_path_flowsim_mode_reuses_the_networks_ns3_record(network, tmp_path, monkeypatch):
    """The same network with path flowSim's first windows over the level (``bursts``) is a new
    scenario (new id, ``path_bursts``), but ns-3's answers are the same run's: with the first
    record at hand (``reuse``) it runs no ns-3, keeps every target and ns-3 column, and changes
    only path flowSim's; a record that holds other flows is refused by file and field."""
    import dataclasses

    import pyarrow.parquet as pq

    import m4ray.sim.trace

    _, scenario, tables = network
    bursts = dataclasses.replace(scenario, bursts=True)
    assert bursts.scenario_id != scenario.scenario_id and bursts.params()["path_bursts"] is True
    assert scenario.scenario_id in bursts.truth_twins()
    # where the datasets live is not part of the network
    assert dataclasses.replace(bursts, reuse=(str(tmp_path),)).scenario_id == bursts.scenario_id
    for name, table in tables.items():
        part = tmp_path / name / f"scenario_id={scenario.scenario_id}" / "part-0.parquet"
        part.parent.mkdir(parents=True)
        pq.write_table(table, part)

    def no_ns3(*args, **kwargs):
        raise AssertionError("ns-3 ran although its record was reused")

    monkeypatch.setattr(m4ray.sim.trace, "run_trace", no_ns3)
    again = dataclasses.replace(bursts, reuse=("/nonexistent", str(tmp_path))).record()
    old, new = tables["lot_flows"].to_pandas(), again["lot_flows"].to_pandas()
    for column in ("flow_id", "size_bytes", "slowdown", "fct_s", "ideal_fct_s", "start_s"):
        np.testing.assert_array_equal(new[column], old[column])
    old_s, new_s = tables["lot_samples"].to_pandas(), again["lot_samples"].to_pandas()
    for column in ("target", "mask", "draws", "n_foreground"):
        np.testing.assert_array_equal(np.stack(new_s[column]), np.stack(old_s[column]))
    assert (new.flowsim_slowdown != old.flowsim_slowdown).any()  # path flowSim ran anew
    # bursts at each flow's route round trip: another twin of the same ns-3 run
    route = dataclasses.replace(bursts, route_rtt=True, reuse=(str(tmp_path),))
    assert route.params()["path_route_rtt"] is True
    assert route.scenario_id not in {bursts.scenario_id, scenario.scenario_id}
    assert scenario.scenario_id in route.truth_twins()
    routed = route.record()["lot_flows"].to_pandas()
    np.testing.assert_array_equal(routed.slowdown, old.slowdown)
    assert (routed.flowsim_slowdown != new.flowsim_slowdown).any()
    # a record of other flows (one size changed) is not this network's
    flows = old.copy()
    flows.loc[3, "size_bytes"] += 1
    part = tmp_path / "lot_flows" / f"scenario_id={scenario.scenario_id}" / "part-0.parquet"
    pq.write_table(pa.Table.from_pandas(flows, schema=tables["lot_flows"].schema), part)
    with pytest.raises(InputError, match="not the same network") as err:
        dataclasses.replace(bursts, reuse=(str(tmp_path),)).record()
    assert err.value.field == "flow_id" and str(part) in str(err.value)
    flows.loc[3, "size_bytes"] -= 1
    flows.loc[5, "flow_id"] = 10**9  # not a flow of this network
    pq.write_table(pa.Table.from_pandas(flows, schema=tables["lot_flows"].schema), part)
    with pytest.raises(InputError, match="flow ids outside") as err:
        dataclasses.replace(bursts, reuse=(str(tmp_path),)).record()
    assert err.value.field == "flow_id" and str(part) in str(err.value)
    with pytest.raises(AssertionError, match="ns-3 ran"):  # nothing to reuse: ns-3 runs
        dataclasses.replace(bursts, reuse=(str(tmp_path / "none"),)).record()
