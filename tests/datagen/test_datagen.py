"""The datagen experiment end to end with real ns-3 (subprocess CLI, embedded local Ray)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from m4ray.datagen.schema import SCENARIOS, TABLES
from tests.conftest import run_datagen


def datagen(output_dir, *overrides):
    return run_datagen(output_dir, *overrides)


@pytest.fixture(scope="module")
def first(tiny_dataset):
    return tiny_dataset


def read(run_dir, table):
    return ds.dataset(run_dir / "dataset" / table, partitioning="hive").to_table().to_pandas()


def test_dataset_layout_schema_and_manifest(first):
    run_dir, proc = first
    # the sweep joined the session's Ray head through RAY_ADDRESS (conftest.shared_ray_head)
    assert "Connecting to existing Ray cluster" in proc.stderr + proc.stdout
    dataset = run_dir / "dataset"
    scenarios = pq.read_table(dataset / "scenarios.parquet")
    assert scenarios.schema.equals(SCENARIOS, check_metadata=False)
    frame = scenarios.to_pandas()
    assert len(frame) == 4 and (frame.status == "ok").all()
    assert sorted(frame.family) == ["m4_fabric", "m4_fabric", "rail", "rail"]
    for name, schema in TABLES.items():
        parts = sorted((dataset / name).glob("scenario_id=*/part-0.parquet"))
        assert len(parts) == 4
        assert pq.read_schema(parts[0]).equals(schema, check_metadata=False), name
    text = (dataset / "SCHEMA.md").read_text()
    assert all(f"## {name}" in text for name in TABLES) and "`remaining_bytes`" in text
    version = (dataset / "VERSION").read_text().strip()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["dataset_version"] == version and len(version) == 16
    assert manifest["ns3_version"].startswith("3.44")
    assert [s["status"] for s in manifest["scenarios"]] == ["ok"] * 4
    assert all(s["wall_s"] > 0 for s in manifest["scenarios"])
    assert manifest["config"]["datagen"]["scenarios"] == 4
    for plot in ("slowdown_cdf", "period_sizes"):
        assert (run_dir / "plots" / f"{plot}.png").stat().st_size > 10_000
    assert f"dataset version {version}" in proc.stdout and "m4_fabric" in proc.stdout
    params13 = np.stack(frame.params13.to_numpy())
    assert params13.shape == (4, 13) and (params13[:, 2] == 1).all()


def test_flows_are_physical(first):
    run_dir, _ = first
    flows = read(run_dir, "flows")
    links = read(run_dir, "links")
    assert (flows.size_bytes >= 50).all() and (flows.start_s >= 0).all()
    # ns-3 never beats the ideal FCT (one way, what a lone flow achieves) beyond picosecond
    # rounding; slowdowns are stored raw
    for scenario_id, group in flows.groupby("scenario_id"):
        bw = links[links.scenario_id == scenario_id].set_index("link").bandwidth_bps
        assert set(bw.index) >= {link for p in group.path for link in p}
        assert (group.fct_s >= group.ideal_fct_s * (1 - 1e-6)).all()
        assert (group.n_links == group.path.map(len)).all()
    assert np.allclose(flows.slowdown, flows.fct_s / flows.ideal_fct_s)
    assert (flows.flowsim_fct_s >= flows.ideal_fct_s * (1 - 1e-9)).all()
    assert flows.fct_s.max() < 1.0


def test_dense_supervision_is_consistent(first):
    run_dir, _ = first
    flows = read(run_dir, "flows").set_index(["scenario_id", "flow_id"])
    events = read(run_dir, "events")
    remaining = read(run_dir, "remaining")
    queues = read(run_dir, "queues")
    periods = read(run_dir, "periods")
    # two events per flow, in time order, arrival first
    for _, group in events.groupby("scenario_id"):
        assert (np.diff(group.sort_values("event").time_s.to_numpy()) >= 0).all()
        per_flow = group.groupby("flow_id").kind.agg(list)
        assert (per_flow.map(sorted) == per_flow).all() and (per_flow.map(len) == 2).all()
    # remaining bytes: start at the size, never grow, end at zero at the flow's completion
    remaining = remaining.sort_values(["scenario_id", "flow_id", "event"])
    for (sid, fid), series in remaining.groupby(["scenario_id", "flow_id"]):
        values = series.remaining_bytes.to_numpy()
        assert values[0] == flows.loc[(sid, fid)].size_bytes
        assert values[-1] == 0 and (np.diff(values) <= 0).all()
    # one queue sample per hop of every flow, never negative
    assert (queues.queue_bytes >= 0).all()
    hops = queues.groupby(["scenario_id", "flow_id"]).hop.count()
    assert (hops == flows.n_links.loc[hops.index]).all() and len(hops) == len(flows)
    # busy periods partition the flows
    counts = flows.groupby("scenario_id").period_id.value_counts().sort_index()
    stored = periods.set_index(["scenario_id", "period_id"]).n_flows.sort_index()
    assert counts.to_numpy().tolist() == stored.to_numpy().tolist()
    assert stored.sum() == len(flows)


def test_same_seed_same_dataset_and_resume(first, tmp_path):
    run_dir, _ = first
    stamps = {p: p.stat().st_mtime_ns for p in (run_dir / "dataset").rglob("part-0.parquet")}
    again = datagen(run_dir.parent)  # re-run in place: everything is done, nothing reruns
    assert again.returncode == 0, again.stderr[-3000:]
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    other = datagen(tmp_path)  # a fresh run of the same config
    assert other.returncode == 0, other.stderr[-3000:]
    version = (run_dir / "dataset" / "VERSION").read_text()
    assert (tmp_path / "datagen" / "dataset" / "VERSION").read_text() == version
    a, b = read(run_dir, "remaining"), read(tmp_path / "datagen", "remaining")
    pd.testing.assert_frame_equal(a, b)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("datagen.families.m4_fabric.max_load=[0.5,1.5]", "field 'max_load'"),
        ("+datagen.families.m4_fabric.sizes.zipf.kind=zipf", "unknown size distribution 'zipf'"),
        ("+datagen.weights.nope=1", "weights for unknown families"),
        ("+datagen.reuse_truth=[/nonexistent]", "cannot reuse another dataset's ns-3 runs"),
    ],
)
def test_bad_config_fails_before_any_scenario(tmp_path, override, message):
    proc = datagen(tmp_path, override)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    run_dir = tmp_path / "datagen"  # Hydra may create the run directory; nothing is in it
    assert not (run_dir / "runs").exists() and not (run_dir / "dataset").exists()


def test_a_4_to_1_incast_on_ns3_shares_the_receiver_link():
    """The incast family on real ns-3: four senders into one receiver share its link, so the last
    of them finishes about 4 ideal FCTs in (the link drained 4 flows' bytes); DCTCP shares
    unevenly, so the others finish earlier (flowSim says exactly 4 for all: what m4 must learn
    to beat)."""
    from m4ray.datagen.families import IncastFamily
    from m4ray.datagen.record import record

    family = IncastFamily(k=[4, 4], rounds=[1, 1], size_bytes=[200_000, 200_000])
    tables = record(family.sample("incast", 0, 3, 120.0))
    flows = tables["flows"].to_pandas()
    assert len(flows) == 4 and flows.dst.nunique() == 1
    slowdown = flows.fct_s / flows.ideal_fct_s
    assert 3.5 < slowdown.max() < 4.5 and slowdown.min() > 1.5, slowdown.tolist()


def test_ack_coupled_periods_record_on_ns3():
    """``ack_periods`` (data v2) through a real ns-3 recording: the same flows and FCTs, busy
    periods that join flows on each other's reverse links (never more periods than without);
    the scenarios' params say which was used."""
    import dataclasses

    from m4ray.datagen.families import IncastFamily
    from m4ray.datagen.record import record

    family = IncastFamily(k=[2, 3], rounds=[2, 2], size_bytes=[20_000, 60_000])
    scenario = family.sample("incast", 0, 5, 120.0)
    plain = record(scenario)
    coupled = record(dataclasses.replace(scenario, ack_periods=True))
    a, b = plain["flows"].to_pandas(), coupled["flows"].to_pandas()
    pd.testing.assert_frame_equal(a.drop(columns="period_id"), b.drop(columns="period_id"))
    assert 0 < b.period_id.nunique() <= a.period_id.nunique()


def test_simai_collectives_record_on_ns3():
    """The rail family with SimAI's collectives (``algorithms: [simai]``, the next m4's data):
    a real ns-3 recording holds a chunk per channel, cross-rail server hops, and flows that are
    physical (none finishes faster than its ideal beyond the picosecond clock)."""
    from m4ray.datagen.families import CollectiveFamily
    from m4ray.datagen.record import record

    family = CollectiveFamily(
        kinds=["all_reduce"], algorithms=["simai"], layouts=["all"], phases=[1, 1],
        size_bytes=[262_144, 262_144], degraded_gpus=[0, 0],
    )  # fmt: skip
    scenario = family.sample("rail", 0, 7, 120.0)
    flows = record(scenario)["flows"].to_pandas()
    assert len(flows) == 8 * 32 * 62  # 8 channels x 32 ranks x 2(n - 1) steps
    (phase,) = scenario.traffic.phases
    assert set(flows.size_bytes) == {phase.size_bytes // 32 // 8}
    cross = flows[flows.src // 8 != flows.dst // 8]
    assert len(cross) and (cross.src % 8 != cross.dst % 8).all()
    assert (flows.fct_s / flows.ideal_fct_s).min() > 0.99


def test_deliver_is_deterministic_and_jitter_moves_starts_only_below_its_bound():
    """``deliver`` (what ``bench/ns3_noise.py`` measures ns-3's floor with): the same scenario
    twice gives the same finish times to the bit; ``jitter_s`` starts each flow later by less
    than the bound, keeps the flows, and moves some answer (ns-3 sees the new timing)."""
    from m4ray.datagen.families import IncastFamily
    from m4ray.datagen.record import deliver

    family = IncastFamily(k=[4, 4], rounds=[2, 2], size_bytes=[30_000, 30_000])
    scenario = family.sample("incast", 0, 3, 120.0)

    def times(**kw):
        return sorted((f.id, f.start_s, t) for f, t in deliver(scenario, **kw)[3])

    base = times()
    assert times() == base
    moved = times(jitter_s=1e-6)
    assert [i for i, _, _ in moved] == [i for i, _, _ in base]
    shift = np.array([m[1] - b[1] for m, b in zip(moved, base, strict=True)])
    assert (shift >= 0).all() and (shift < 1e-6).all() and shift.max() > 0
    assert any(m[2] - m[1] != b[2] - b[1] for m, b in zip(moved, base, strict=True))
