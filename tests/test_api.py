"""The public surface (m4ray/api.py): every name it promises resolves, importing it is cheap, and
a simulation runs through it alone."""

from __future__ import annotations

import subprocess
import sys

import pytest

from m4ray import api


def test_every_public_name_resolves_and_nothing_else_does():
    for name in api.__all__:
        assert getattr(api, name) is not None, name
    with pytest.raises(AttributeError, match="its names"):
        api.NoSuchThing  # noqa: B018


def test_the_type_checking_imports_name_the_same_homes():
    """api.py lists each name twice (its lazy home and a typing-only import, which the layering
    test reads): the two lists agree."""
    import ast
    from pathlib import Path

    tree = ast.parse(Path(api.__file__).read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If))
    typed = {
        alias.asname or alias.name: node.module
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert typed == api._HOMES
    assert api.__all__ == sorted(api._HOMES)


def test_importing_the_api_loads_no_torch_ray_or_ns3():
    code = (
        "import sys, m4ray.api\n"
        "heavy = [m for m in ('torch', 'ray', 'ns') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_gray_failure_simulation_through_the_api_alone():
    scenario = api.Scenario(
        topology=api.RailClusterSpec(),
        failure=api.GrayFailure(n_degraded=4, reduction=4),
        workload=api.SimAIWorkloadSpec(path="microAllReduce", scale=0.01),
        collective=api.RingSpec(),
        backend="flowsim",
        backend_config=api.FlowSimConfig(),
    )
    row, flows = api.simulate(scenario)
    assert row["status"] == "ok" and row["completion_time_s"] > 0
    assert flows.num_rows == row["n_flows"] > 0
