"""Every config group option and every experiment composes and resolves to typed objects."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from m4ray.config import CONF_DIR, SweepConfig, register_configs, sections
from m4ray.sweeps.__main__ import load_experiment, resolve

register_configs()
EXPERIMENTS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))
GROUPS = {
    g.name: sorted(p.stem for p in g.glob("*.yaml"))
    for g in CONF_DIR.iterdir()
    if g.is_dir() and g.name not in ("experiment", "local")
}


def sweep_cfg(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("sweep", overrides=list(overrides), return_hydra_config=False)


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes_and_resolves(experiment):
    cfg = sweep_cfg(f"+experiment={experiment}")
    sweep = resolve(cfg)
    assert isinstance(sweep, SweepConfig) and sweep.name == experiment
    assert all(hasattr(sweep.backend_options[b], "build") for b in sweep.backends)
    assert hasattr(sweep.topology, "build") and hasattr(sweep.workload, "build")
    assert Path(OmegaConf.to_container(cfg, resolve=True)["paths"]["run_dir"]).name == experiment
    # its module takes the sections it declares, each of the type it declares
    module = load_experiment(sweep)
    assert set(module.SECTIONS) <= set(sections())
    assert all(isinstance(getattr(sweep, n), t) for n, t in module.SECTIONS.items())


OPTIONS = [
    (group, name)
    for group, names in GROUPS.items()
    if group not in ("backend", "family", "m4_settings")  # placed in other configs, not chosen
    for name in names
]


@pytest.mark.parametrize(("group", "option"), OPTIONS)
def test_every_group_option_composes(group, option, tmp_path):
    overrides = ["+experiment=gray_failure", f"{group}={option}"]
    if group == "topology" and option == "file":
        overrides.append("topology.path=/tmp/topo.txt")
    if group == "workload" and option == "chakra":  # a real trace: the prefix is mandatory
        from m4ray.workload import chakra
        from m4ray.workload.synth import synthesize
        from tests.workload.test_synth import job

        chakra.write(synthesize(job()), tmp_path / "job")
        overrides.append(f"workload.prefix={tmp_path / 'job'}")
    sweep = resolve(sweep_cfg(*overrides))
    assert sweep.name == "gray_failure"


@pytest.mark.parametrize("family", GROUPS["family"])
def test_every_family_composes_into_datagen(family):
    sweep = resolve(sweep_cfg("+experiment=datagen", f"+family@datagen.families.extra={family}"))
    assert hasattr(sweep.datagen.families["extra"], "sample")
    assert sweep.datagen.counts()["extra"] == 0  # no weight: composes, draws nothing


def test_datagen_v2_weights_every_family_and_holds_out_the_evaluation_topologies():
    sweep = resolve(sweep_cfg("+experiment=datagen_v2"))
    counts = sweep.datagen.counts()
    assert counts == {
        "fat_tree": 30, "fat_tree_4to1": 30, "incast": 60, "m4_fabric": 90, "rail": 90
    }  # fmt: skip
    over = sweep.datagen.families["fat_tree_4to1"].topology
    assert (over.k, over.oversubscription) == (6, 4) and len(over.build().hosts) == 216
    # the 2:1 fat-tree of bench/m4_holdout.py is in no family
    assert all(
        getattr(f.topology, "oversubscription", 1) != 2 for f in sweep.datagen.families.values()
    )


def test_datagen_v4_adds_the_studys_network_regime_and_holds_out_its_failures():
    """data v4's rail_study family: SimAI's collectives only, on the study's 1,000 B payload
    with RED per link rate and ~100 MB buffers; random degraded GPUs, never a server-aligned
    set of the sweep; data v3's families as they were."""
    from m4ray.sim.failures import gray_failure_gpus

    sweep = resolve(sweep_cfg("+experiment=datagen_v4"))
    counts = sweep.datagen.counts()
    assert counts["rail_study"] == 200 and sum(counts.values()) == 800
    assert sweep.datagen.families["rail"].wire.mtu_bytes == 8948
    study = sweep.datagen.families["rail_study"]
    aligned = {tuple(sorted(gray_failure_gpus(n, 8, 4))) for n in range(2, 17)}
    for index in range(8):
        scenario = study.sample("rail_study", index, seed=index, wall_limit_s=60)
        assert scenario.traffic.algorithm == "simai" and scenario.wire.mtu_bytes == 1000
        rdma = scenario.ns3.rdma
        assert rdma.ecn_p_max == 0.2 and rdma.ecn_k_max_bytes  # RED, not a step
        assert 50e6 <= rdma.buffer_bytes <= 100e6
        assert tuple(scenario.degraded) not in aligned


def test_datagen_m3_v6_keeps_v4s_networks_and_adds_small_flow_mixes():
    """v6 adds the measured mixes without moving v4's counts (seeds are per family, so v4's
    networks are v6's first 210); the mix family is network_paths' ranges with other sizes,
    and web search (m3's evaluation) is in neither."""
    import dataclasses

    import numpy as np

    v4 = resolve(sweep_cfg("+experiment=datagen_m3_v4", "datagen.scenarios=210")).datagen
    v6 = resolve(sweep_cfg("+experiment=datagen_m3_v6", "datagen.scenarios=270")).datagen
    assert v6.counts() == {**v4.counts(), "mix": 30, "mixcc": 30}
    base, mix = v4.families["net"], v6.families["mix"]
    for f in dataclasses.fields(base):
        if f.name != "sizes":
            assert getattr(mix, f.name) == getattr(base, f.name), f.name
    assert v6.families["mixcc"].cc.ccs == ["dcqcn", "hpcc", "timely"]
    assert v6.families["mixcc"].first_windows
    assert sorted(mix.sizes) == ["ali_storage", "fb_hadoop", "google_rpc"]
    # heavy in small flows beside large ones, at the eval's 20 KB mean too
    rng = np.random.default_rng(0)
    x = mix.sizes["fb_hadoop"].sample(rng, 20_000.0, 100_000, 50)
    assert np.mean(x < 1000) > 0.5 and x[x > 200_000].sum() > 0.3 * x.sum()


def test_datagen_m3_v7_to_v9_are_v6s_networks_and_reuse_their_ns3_records(tmp_path):
    """v7 draws v6's 270 networks (same families, counts and seeds) with path flowSim's first
    windows over the level: new ids, each with its v6 network among its twins (so v6's records
    give ns-3's answers); reuse_truth must name datasets with recorded flows."""
    from m4ray.datagen.job import expand
    from m4ray.errors import InputError

    v6 = resolve(sweep_cfg("+experiment=datagen_m3_v6", "datagen.scenarios=270")).datagen
    v7 = resolve(sweep_cfg("+experiment=datagen_m3_v7", "datagen.scenarios=270")).datagen
    assert v7.counts() == v6.counts() and v7.reuse_truth == []
    old, new = expand(v6, 0), expand(v7, 0)
    assert [s.bursts for s in new] == [True] * 270 and not any(s.bursts for s in old)
    for a, b in zip(old, new, strict=True):
        assert (a.family, a.index, a.seed) == (b.family, b.index, b.seed)
        assert a.scenario_id != b.scenario_id and a.scenario_id in b.truth_twins()
    # v8: v4's 210 networks (m3-v5's) with bursts, which are v7's with v7's ids
    v8 = resolve(sweep_cfg("+experiment=datagen_m3_v8", "datagen.scenarios=210")).datagen
    assert {k: n for k, n in v8.counts().items() if n} == {
        "net": 100, "net8": 50, "netcc": 40, "net8cc": 20
    }  # fmt: skip
    ids = {s.scenario_id for s in new}
    assert all(s.scenario_id in ids for s in expand(v8, 0))
    # v9: v8's networks with route round trips, twins of v8's (and of v6's: the same ns-3 runs)
    v9 = resolve(sweep_cfg("+experiment=datagen_m3_v9", "datagen.scenarios=210")).datagen
    for a, b in zip(expand(v8, 0), expand(v9, 0), strict=True):
        assert b.route_rtt and b.bursts and not a.route_rtt
        assert a.scenario_id != b.scenario_id and a.scenario_id in b.truth_twins()
    (tmp_path / "lot_flows").mkdir()
    reusing = resolve(
        sweep_cfg(
            "+experiment=datagen_m3_v7", "datagen.scenarios=3", f"datagen.reuse_truth=[{tmp_path}]"
        )
    ).datagen
    assert all(s.reuse == (str(tmp_path),) for s in expand(reusing, 0))
    bad = resolve(
        sweep_cfg("+experiment=datagen_m3_v7", "datagen.scenarios=3", "datagen.reuse_truth=[/none]")
    ).datagen
    with pytest.raises(InputError, match="not a dataset with recorded flows") as err:
        expand(bad, 0)
    assert err.value.field == "datagen.reuse_truth"


@pytest.mark.parametrize("backend", GROUPS["backend"])
def test_every_backend_composes_in_trace_mode(backend):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            "trace", overrides=[f"backend={backend}", "trace.topology=t", "trace.flows=f"]
        )
    assert cfg.backend._target_.startswith("m4ray.")
    OmegaConf.resolve(cfg)  # every interpolation resolves within the trace config


def test_without_experiment_the_error_lists_experiments():
    from m4ray.errors import InputError

    with pytest.raises(InputError, match="gray_failure"):
        resolve(sweep_cfg())


def test_typed_schema_rejects_bad_values():
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException):
        sweep_cfg("+experiment=gray_failure", "grid.n=[two]")


def test_flowsim_can_take_the_ns3_backends_window():
    """The README's recipe: flowSim's window interpolated from the ns-3 backend's, so the two
    are compared on one setting (null stays classic flowSim)."""
    same = "backend_options.flowsim.window_bytes=${backend_options.ns3.rdma.window_bytes}"
    sweep = resolve(
        sweep_cfg("+experiment=gray_failure", "backend_options.ns3.rdma.window_bytes=20000", same)
    )
    assert sweep.backend_options["flowsim"].window_bytes == 20_000
    assert sweep.backend_options["ns3"].rdma.window_bytes == 20_000
    assert (
        resolve(sweep_cfg("+experiment=gray_failure", same)).backend_options["flowsim"].window_bytes
        is None
    )


def test_simai_timing_preset_sets_simai_ns3_over_the_study_settings():
    """``backend@backend_options.ns3=ns3_simai_timing`` with ``wire=simai``: the study's DCTCP
    settings (RED from 1 KB per Gbit/s, 100 MB buffers) plus SimAI's ns-3 timing, and m4 told
    the same network; the default study preset keeps the m4ray timing."""
    sweep = resolve(
        sweep_cfg(
            "+experiment=gray_failure", "backend@backend_options.ns3=ns3_simai_timing", "wire=simai"
        )
    )
    rdma = sweep.backend_options["ns3"].rdma
    assert (rdma.round_ns, rdma.dctcp_reference_alpha, rdma.ack_high_priority) == (
        True,
        True,
        False,
    )
    assert (rdma.ack_bytes, rdma.window_rule, rdma.buffer_bytes) == (48, "simai", 100_000_000)
    assert rdma.done_at_ack and rdma.feed_when_idle and rdma.nic_wake_simai
    assert rdma.ecn_k_bytes == [[40.0e9, 40000], [2400.0e9, 2400000]]
    assert (rdma.red_marking(40e9), rdma.red_marking(400e9)) == (
        (40_000, 160_000, 0.2, "ecn_k_max_bytes"),
        (400_000, 1_600_000, 0.2, "ecn_k_max_bytes"),
    )
    assert sweep.backend_options["m4"].network.rdma == rdma
    assert (sweep.wire.mtu_bytes, sweep.wire.header_bytes) == (1000, 40)
    default = resolve(sweep_cfg("+experiment=gray_failure")).backend_options["ns3"].rdma
    assert (default.round_ns, default.ack_high_priority, default.window_rule) == (
        False,
        True,
        "m4ray",
    )


def test_ns3_again_is_the_experiments_ns3_sent_2_ns_later():
    """``ns3_again`` is whatever ``ns3`` is in the composed sweep (the study's preset in
    gray_failure, any override of it) with only its own ``send_delay_s``; it takes no other
    setting of its own (Hydra refuses one, rather than it being dropped)."""
    import dataclasses

    from hydra.errors import ConfigCompositionException

    from m4ray.errors import InputError
    from m4ray.sim.ns3.backend import Ns3Config

    for overrides in (
        ["+experiment=gray_failure"],
        ["+experiment=datagen"],
        ["+experiment=gray_failure", "backend_options.ns3.rdma.window_bytes=20000"],
        ["+experiment=gray_failure", "backend_options.ns3_again.send_delay_s=1e-8"],
    ):
        options = resolve(sweep_cfg(*overrides)).backend_options
        again, ns3 = options["ns3_again"], options["ns3"]
        assert again.send_delay_s == (1e-8 if "1e-8" in overrides[-1] else 2e-9)
        assert ns3.send_delay_s == 0.0
        assert dataclasses.replace(again, send_delay_s=0.0) == ns3
        window = 20000 if "window_bytes" in overrides[-1] else None
        assert again.rdma.window_bytes == window
        assert again.rdma.ecn_p_max == (0.2 if "gray_failure" in overrides[0] else 1.0)
    with pytest.raises(ConfigCompositionException, match="rdma"):
        sweep_cfg("+experiment=gray_failure", "backend_options.ns3_again.rdma.cc=hpcc")
    with pytest.raises(InputError, match=r"field 'ns3\.send_delay_s': must be >= 0 s"):
        Ns3Config(send_delay_s=-1e-9)


def test_every_backend_setting_can_be_overridden_by_name():
    """Each field of a backend's config class has its key in the backend's YAML, so
    ``backend_options.<backend>.<field>=...`` works for all of them (Hydra refuses a key the
    YAML lacks); ``weights`` alone is derived (m4's checkpoint digest), not set."""
    import dataclasses
    import importlib

    cfg = sweep_cfg("+experiment=gray_failure")
    for name, section in cfg.backend_options.items():
        if name == "ns3_again":  # ns3's settings, its own send delay (the test above)
            continue
        keys = set(OmegaConf.to_container(section, resolve=False))
        module, cls = OmegaConf.select(section, "_target_").rsplit(".", 1)
        fields = {f.name for f in dataclasses.fields(getattr(importlib.import_module(module), cls))}
        assert fields - keys <= {"weights"}, (name, sorted(fields - keys))
    sweep = resolve(sweep_cfg("+experiment=gray_failure", "backend_options.m4.extrapolate=true"))
    assert sweep.backend_options["m4"].extrapolate is True


def test_both_m4_backends_take_their_engine_settings_from_one_definition():
    """``backend=m4`` and ``backend=m4_served`` share the engine settings they declare once
    (:class:`~m4ray.sim.m4.backend.M4Settings`, ``conf/m4_settings/default.yaml``): the same
    defaults in Python and in the composed YAML, each still overridden alone, a bad value refused
    by field in either."""
    import dataclasses

    from m4ray.errors import InputError
    from m4ray.serve.client import M4ServedConfig
    from m4ray.sim.m4.backend import M4Config, M4Settings

    shared = {f.name: f for f in dataclasses.fields(M4Settings)}
    assert set(shared) == {
        "network", "batch_above_flows", "batch_fraction", "batch_frozen_above", "extrapolate",
        "anchor",
    }  # fmt: skip
    cfg = sweep_cfg("+experiment=gray_failure", "backend_options.m4.batch_fraction=0.2")
    for cls, name in ((M4Config, "m4"), (M4ServedConfig, "m4_served")):
        assert issubclass(cls, M4Settings)
        mine = {f.name: f for f in dataclasses.fields(cls)}
        assert all(mine[k] is f for k, f in shared.items())  # inherited, never declared again
        yaml = OmegaConf.to_container(cfg.backend_options[name], resolve=True)
        defaults = cls(network=M4Settings().network)
        for key in ("batch_above_flows", "batch_frozen_above", "extrapolate"):
            assert yaml[key] == getattr(defaults, key), (name, key)
        assert yaml["network"]["transport"] == "rdma"
        with pytest.raises(InputError) as err:
            cls(batch_fraction=0.0)
        assert err.value.field == "batch_fraction"
    assert cfg.backend_options.m4.batch_fraction == 0.2
    assert cfg.backend_options.m4_served.batch_fraction == 0.5
    # the gray-failure experiment gives both m4 backends the FIFO anchor (m4_served follows m4)
    assert cfg.backend_options.m4.anchor == cfg.backend_options.m4_served.anchor == "fifo"
    assert M4Settings().anchor == "fair"
