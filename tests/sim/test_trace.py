from __future__ import annotations

import subprocess

import pyarrow.csv as pacsv
import pytest

from m4ray.errors import InputError
from m4ray.sim.flows import Flow, format_flows, read_flows
from m4ray.sim.topology import write_topology
from tests.conftest import PYTHON, parking_lot, write

FLOWS = "3\n0 0 2 3 100 10000 0.000000000\n1 0 1 3 100 10000 0\n2 1 2 3 100 5000 0.000005\n"


def run_cli(*args, cwd):
    return subprocess.run(
        [PYTHON, "-m", "m4ray.sim", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
        check=False,
    )


@pytest.mark.parametrize("backend", ["flowsim", "m4"])
def test_trace_cli_writes_one_row_per_flow(tmp_path, backend):
    topo = write_topology(parking_lot([10, 10]), tmp_path / "topo.txt")
    flows = write(tmp_path / "flows.txt", FLOWS)
    out = tmp_path / "fct.csv"
    proc = run_cli(
        f"trace.topology={topo}",
        f"trace.flows={flows}",
        f"trace.output={out}",
        f"backend={backend}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    table = pacsv.read_csv(out)
    assert table.column_names == [
        "flow_id",
        "src",
        "dst",
        "size_bytes",
        "start_s",
        "fct_s",
        "ideal_fct_s",
        "slowdown",
    ]
    assert table.column("flow_id").to_pylist() == [0, 1, 2]
    assert min(table.column("slowdown").to_pylist()) >= 1 - 1e-6  # raw: ideal up to rounding
    assert max(table.column("slowdown").to_pylist()) > 1.0  # flows 0 and 1 share a link
    assert "3 flows" in proc.stdout


def test_trace_cli_default_output_is_named_by_content(tmp_path):
    topo = write_topology(parking_lot([10]), tmp_path / "topo.txt")
    flows = write(tmp_path / "flows.txt", "1\n0 0 1 3 100 1000 0\n")
    proc = run_cli(f"trace.topology={topo}", f"trace.flows={flows}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    written = list((tmp_path / "outputs" / "trace").glob("flows.flowsim.*.csv"))
    assert len(written) == 1 and str(written[0]) in proc.stdout


@pytest.mark.parametrize(
    ("flows", "message"),
    [
        ("2\n0 0 1 3 100 10 0\n", "announces 2 flows"),
        ("1\n0 0 9 3 100 10 0\n", "field 'dst': unknown host id 9"),
        ("1\n0 0 1 3 100 0 0\n", "field 'size_bytes': must be > 0"),
        ("1\n0 0 1 3 100 -5 0\n", "field 'size_bytes': must be > 0"),
        ("1\n0 0 1 3 100 10\n", "expected 7 fields"),
    ],
)
def test_trace_cli_bad_flows(tmp_path, flows, message):
    topo = write_topology(parking_lot([10]), tmp_path / "topo.txt")
    path = write(tmp_path / "flows.txt", flows)
    out = tmp_path / "fct.csv"
    proc = run_cli(
        f"trace.topology={topo}", f"trace.flows={path}", f"trace.output={out}", cwd=tmp_path
    )
    assert proc.returncode == 2
    assert message in proc.stderr and str(path) in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists()


def test_trace_cli_unknown_backend(tmp_path):
    proc = run_cli("trace.topology=x", "trace.flows=y", "backend=nope", cwd=tmp_path)
    assert proc.returncode != 0 and "flowsim" in proc.stderr  # Hydra lists the valid options


def test_flows_round_trip(tmp_path):
    flows = [Flow(3, 0, 1, 1000, 0.5), Flow(4, 1, 0, 20, 1.25)]
    path = write(tmp_path / "f.txt", format_flows(flows))
    assert read_flows(path, hosts={0, 1}) == flows


def test_duplicate_flow_ids(tmp_path):
    path = write(tmp_path / "f.txt", "2\n1 0 1 3 100 10 0\n1 0 1 3 100 10 0\n")
    with pytest.raises(InputError, match="duplicate") as info:
        read_flows(path)
    assert info.value.line == 3


def test_disconnected_pair_fails_before_simulating():
    from m4ray.sim.flowsim import FlowSimConfig
    from m4ray.sim.routing import Routing
    from m4ray.sim.topology import Cable, Topology
    from m4ray.sim.trace import run_trace

    islands = Topology(
        n_nodes=4, switches=(2, 3), cables=(Cable(0, 2, 1e9, 0.0), Cable(1, 3, 1e9, 0.0))
    )
    with pytest.raises(InputError, match="flow 5: hosts 0 and 1 are not connected"):
        run_trace(islands, [Flow(5, 0, 1, 100, 0.0)], FlowSimConfig(), Routing(islands))


def test_a_probe_runs_its_own_events_beside_the_flows():
    """``run_trace(probe=...)``: the probe schedules events on the backend before the run and
    sees the flows not yet done fall as they finish; the FCTs are those without it."""
    from m4ray.sim.flowsim import FlowSimConfig
    from m4ray.sim.routing import Routing
    from m4ray.sim.trace import run_trace

    topo = parking_lot([10.0, 10.0], latency_s=1e-6)
    routing = Routing(topo)
    flows = [Flow(0, 0, 2, 100_000, 0.0), Flow(1, 1, 2, 100_000, 2e-5)]
    seen: list[tuple[float, int]] = []

    def probe(backend, unfinished) -> None:
        def tick() -> None:
            seen.append((backend.now(), unfinished()))
            if unfinished():
                backend.schedule(1e-5, tick)

        backend.schedule(0.0, tick)

    plain = run_trace(topo, flows, FlowSimConfig(), routing).column("fct_s").to_pylist()
    probed = run_trace(topo, flows, FlowSimConfig(), routing, probe=probe)
    assert probed.column("fct_s").to_pylist() == pytest.approx(plain, rel=1e-12)
    counts = [n for _, n in seen]
    assert counts[0] == 2 and counts[-1] == 0 and counts == sorted(counts, reverse=True)
    assert len(seen) > 3
