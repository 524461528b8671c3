"""+experiment=multi_tenant on a small cluster: real Ray tasks on flowSim and m4, per-job rows,
the slowdown table, the blast-radius heat map and the placement plot, resume; bad sites and a
cluster that does not match are refused before any task."""

from __future__ import annotations

import dataclasses
import json

import pandas as pd
import pytest
from omegaconf import OmegaConf

from m4ray.errors import InputError
from m4ray.sweeps.__main__ import load_experiment, resolve
from m4ray.sweeps.multi_tenant import plan, run
from m4ray.workload.multi import MultiJobSpec
from tests.test_config import sweep_cfg
from tests.workload.test_multi import dp_job

SMALL = [
    "+experiment=multi_tenant",
    "topology.gpus=32",
    "topology.spines=2",
    "tenants.failures=[{name: gpu0, target: gpus, at: [0]},"
    " {name: spine0, target: spines, at: [0]}]",
    "progress=false",
]


def small(*overrides: str):
    cfg = sweep_cfg(*SMALL, *overrides)
    jobs = [dp_job("tp", 8, tp=8), dp_job("dp", 8), dp_job("mix", 8, tp=2)]
    sweep = dataclasses.replace(resolve(cfg), workload=MultiJobSpec(jobs=jobs, gpus_per_server=8))
    return sweep, OmegaConf.to_container(cfg, resolve=True)


def test_the_default_experiment_composes_with_its_jobs():
    sweep = resolve(sweep_cfg("+experiment=multi_tenant"))
    load_experiment(sweep)
    assert [j.name for j in sweep.workload.jobs] == ["gpt13b", "moe", "dp"]
    scenarios, labels = plan(sweep)
    # 3 policies x (shared + 3 alone + 3 failures x 1 R) x 2 backends
    assert len(scenarios) == 42 and len(labels) == 42


def test_a_small_multi_tenant_run_answers_per_job_and_resumes(ray_local, tmp_path):
    sweep, raw = small(f"paths.output_dir={tmp_path}")
    run_dir = run(sweep, raw)
    frame = pd.read_parquet(run_dir / "results.parquet")
    assert len(frame) == 3 * 2 * (1 + 3 + 2) and (frame.status == "ok").all()
    jobs = pd.read_parquet(run_dir / "jobs.parquet")
    assert set(jobs.job) == {"tp", "dp", "mix"}
    assert set(jobs.policy) == {"packed", "spread", "random_servers"}
    alone = jobs[jobs.kind == "alone"]
    assert len(alone) == 3 * 2 * 3  # each job alone once per policy and backend
    # packed: the TP-8 job sits on server 0 alone; GPU 0's fault hits it and no other job
    fl = jobs[(jobs.backend == "flowsim") & (jobs.policy == "packed")].set_index(["kind", "job"])
    healthy = fl.loc["shared"].iteration_s
    failed = jobs[
        (jobs.backend == "flowsim") & (jobs.policy == "packed") & (jobs.failure == "gpu0")
    ]
    hurt = failed.set_index("job").iteration_s / healthy - 1
    assert hurt["tp"] > 0.02 and abs(hurt["dp"]) < 1e-9 and abs(hurt["mix"]) < 1e-9
    flows = pd.read_parquet(next((run_dir / "flows").glob("*.parquet")))
    assert set(flows.job) <= {"tp", "dp", "mix"} and len(flows)
    for name in ("blast_radius.png", "placement.png"):
        assert (run_dir / "plots" / name).stat().st_size > 10_000
    assert json.loads((run_dir / "manifest.json").read_text())["failed"] == 0
    stamps = sorted(p.stat().st_mtime_ns for p in (run_dir / "runs").glob("*.json"))
    run(sweep, raw)  # resumes: nothing reruns
    assert sorted(p.stat().st_mtime_ns for p in (run_dir / "runs").glob("*.json")) == stamps


@pytest.mark.parametrize(
    ("override", "field", "message"),
    [
        (
            "tenants.failures=[{name: far, target: gpus, at: [40]}]",
            "tenants.failures[0].at",
            "failure 'far'",
        ),
        (
            "tenants.failures=[{name: s, target: spines, at: [2]}]",
            "tenants.failures[0].at",
            "2 tier-2",
        ),
        ("topology.gpus_per_server=4", "workload.gpus_per_server", "4 GPUs per server"),
        ("backends=[flowsim,nope]", "backends", "unknown backend"),
    ],
)
def test_bad_sites_and_mismatches_are_refused_before_any_task(override, field, message):
    sweep, _ = small(override)
    with pytest.raises(InputError, match=message) as err:
        plan(sweep)
    assert err.value.field == field


def test_bad_tenant_settings_name_their_field():
    from hydra.errors import InstantiationException  # Hydra wraps the section's own error

    with pytest.raises(InstantiationException, match="unknown placement policy") as err:
        resolve(sweep_cfg("+experiment=multi_tenant", "tenants.policies=[packed,scattered]"))
    assert "field 'tenants.policies[1]'" in str(err.value)
