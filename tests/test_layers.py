"""The layering of DESIGN.md, checked on the source: nothing below the entry layer imports it."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "m4ray"


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at module level or inside functions."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_nothing_below_the_entry_layer_imports_m4ray_sweeps():
    offenders = {
        str(path.relative_to(PACKAGE)): sorted(
            m for m in imported_modules(path) if m.startswith("m4ray.sweeps")
        )
        for path in PACKAGE.rglob("*.py")
        if "sweeps" not in path.relative_to(PACKAGE).parts
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_runtime_and_sim_layers_import_nothing_above_them():
    """Known arrows, allowed: the m4 backend (sim/m4) builds the model architecture of
    m4ray.train.model from its config (m4ray.train.config, which the numpy step reads without
    torch) and reads its checkpoint files with m4ray.train.checkpoint; none holds training
    code (STYLE.md: model code is architecture only)."""
    above = ("m4ray.sweeps", "m4ray.train", "m4ray.serve", "m4ray.datagen", "m4ray.workload")
    allowed = {"m4ray.train.model", "m4ray.train.config", "m4ray.train.checkpoint"}
    for layer in ("runtime", "sim"):
        for path in (PACKAGE / layer).rglob("*.py"):
            bad = sorted(
                m for m in imported_modules(path) if m.startswith(above) and m not in allowed
            )
            assert not bad, f"{path.relative_to(PACKAGE)} imports {bad}"


def test_the_walk_sees_imports_inside_functions(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from m4ray.sweeps.grid import expand\n")
    assert "m4ray.sweeps.grid" in imported_modules(probe)
