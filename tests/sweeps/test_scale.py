"""+experiment=scale on a small ladder: real Ray tasks, flowSim and m4, resumable rows, the
comparison table and the log-log plot; bad rungs are refused before any task starts."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from omegaconf import OmegaConf

from m4ray.errors import InputError
from m4ray.sweeps.__main__ import resolve
from m4ray.sweeps.scale import compare, run, run_rung, rungs, summary_text
from tests.test_config import sweep_cfg

SMALL = [
    "+experiment=scale",
    "ladder.rungs=[{template: spectrum_x, gpus: 32, spines: 1}]",
    "ladder.workloads.gpt13b.model.num_layers=1",
    "ladder.workloads.moe.model.num_layers=1",
    "ladder.scale=0.01",
    "progress=false",
]


def test_a_small_ladder_runs_compares_plots_and_resumes(ray_local, tmp_path):
    cfg = sweep_cfg(*SMALL, f"paths.output_dir={tmp_path}")
    run_dir = run(resolve(cfg), OmegaConf.to_container(cfg, resolve=True))
    frame = pd.read_parquet(run_dir / "results.parquet")
    assert len(frame) == 4 and (frame.status == "ok").all()  # 2 jobs x flowSim, m4
    assert set(frame.backend) == {"flowsim", "m4"} and set(frame.workload) == {"gpt13b", "moe"}
    assert (frame.nodes == 45).all() and (frame.links == 72).all()  # the 32-GPU rail cluster
    assert (frame.flows > 0).all() and (frame.peak_rss_mb > 0).all()
    per_job = frame.groupby("workload").flows.nunique()
    assert (per_job == 1).all()  # both backends replay the same flows
    table = compare(frame)
    assert (table[table.backend == "flowsim"].vs_flowsim == 0).all()
    assert table[table.backend == "m4"].vs_flowsim.abs().lt(1).all()
    assert (run_dir / "plots" / "scale_wall.png").stat().st_size > 0
    assert json.loads((run_dir / "manifest.json").read_text())["failed"] == 0
    stamps = sorted(p.stat().st_mtime_ns for p in (run_dir / "runs").glob("*.json"))
    run(resolve(cfg), OmegaConf.to_container(cfg, resolve=True))  # resumes: nothing reruns
    assert sorted(p.stat().st_mtime_ns for p in (run_dir / "runs").glob("*.json")) == stamps


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("ladder.rungs=[{template: spectrum_x, gpus: 36}]", "gpus"),
        ("ladder.rungs=[{template: spectrum_x, gpus: 32, planes: 2}]", "ladder.rungs[0]"),
        ("ladder.workloads.moe.parallel.tp=3", "ladder.workloads.moe.parallel"),
        ("ladder.backends=[flowsim,nope]", "ladder.backends"),
    ],
)
def test_bad_rungs_are_refused_before_any_task(override, field):
    cfg = resolve(sweep_cfg(*SMALL, override))
    with pytest.raises(InputError) as err:
        rungs(cfg)
    assert err.value.field.startswith(field) or field in str(err.value)


def test_a_simai_file_climbs_the_ladder_in_lockstep(tmp_path):
    """A SimAI file as a ladder job: in lockstep its iteration is the full replay's with fewer
    flows run; a job bigger than the rung, or an unknown key, is refused before any task."""
    simai = ["~ladder.workloads.gpt13b", "~ladder.workloads.moe", "ladder.backends=[flowsim]"]
    cfg = resolve(
        sweep_cfg(
            *SMALL,
            *simai,
            "+ladder.workloads.micro={simai: microAllReduce, lockstep: true}",
            "+ladder.workloads.micro_full={simai: microAllReduce}",
        )
    )
    rows = {r.workload_name: run_rung(r, str(tmp_path)) for r in rungs(cfg)}
    lock, full = rows["micro"], rows["micro_full"]
    assert lock["status"] == full["status"] == "ok", (lock.get("error"), full.get("error"))
    assert lock["replay"] == "lockstep" and full["replay"] == "full"
    assert lock["completion_time_s"] == pytest.approx(full["completion_time_s"], rel=1e-9)
    assert lock["flows"] == full["flows"] and lock["events"] < full["events"]
    assert "micro (lockstep)" in summary_text(pd.DataFrame(rows.values()))
    big = tmp_path / "big.txt"
    big.write_text(
        "HYBRID_TRANSFORMER_FWD_IN_BCKWD model_parallel_NPU_group: 8 all_gpus: 64\n1\n"
        "l -1 1 ALLREDUCE 4096 1 NONE 0 1 ALLGATHER 4096 1\n"
    )
    for entry, message in [
        (f"{{simai: '{big}', lockstep: true}}", "needs 64 GPUs, the rung has 32"),
        ("{simai: microAllReduce, lockstep: true, iterations: 2}", "unknown keys"),
    ]:
        cfg = resolve(sweep_cfg(*SMALL, *simai, f"+ladder.workloads.x={entry}"))
        with pytest.raises(InputError, match=message):
            rungs(cfg)


def test_a_synthetic_job_climbs_the_ladder_in_lockstep(tmp_path):
    """``lockstep: true`` on a synthetic ladder job replays its symmetric DAG in lockstep: the
    full replay's iteration on the small rung, with fewer flows run."""
    base = [*SMALL, "~ladder.workloads.gpt13b", "ladder.backends=[flowsim]"]
    full = run_rung(rungs(resolve(sweep_cfg(*base)))[0], str(tmp_path))
    lock = run_rung(
        rungs(resolve(sweep_cfg(*base, "+ladder.workloads.moe.lockstep=true")))[0], str(tmp_path)
    )
    assert full["status"] == lock["status"] == "ok", (full.get("error"), lock.get("error"))
    assert (full["replay"], lock["replay"]) == ("full", "lockstep")
    assert lock["completion_time_s"] == pytest.approx(full["completion_time_s"], rel=1e-9)
    assert lock["flows"] == full["flows"] and lock["events"] < full["events"]
