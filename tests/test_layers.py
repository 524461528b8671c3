"""The layering of DESIGN.md, checked on the source: every import between m4ray's packages runs
down an arrow of :data:`ALLOWED`, and the arrows themselves form no cycle. Nothing is excepted:
an import inside a function counts as much as one at the top of a module.

Packages (``m4ray/<package>/``, or a top-level module for the ground floor):

* ground — ``errors``, ``fingerprint``, ``native``, ``textio``, ``cli``: imports nothing of m4ray;
* ``runtime`` — Ray start/connect, the resumable fan-out, provenance;
* ``config`` — the sweep's schemas;
* ``models`` — model configs, the m4 and m3 networks, the numpy step, the fluid anchor and its
  fair share, checkpoint I/O: under sim, train and serve alike;
* ``sim`` — topologies, routing, backends, replay (with ``sim.m4`` and ``sim.ns3``);
* ``workload``, ``emulation``, ``datagen``, ``train``, ``m3``, ``serve`` above them;
* ``api`` — the public surface (``m4ray/api.py``), names only;
* ``sweeps`` — the entry layer, which nothing imports.
"""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "m4ray"
GROUND = {"errors", "fingerprint", "native", "textio", "cli", "__init__", "__main__"}

ALLOWED: dict[str, set[str]] = {
    "ground": set(),
    "runtime": {"ground"},
    "config": {"ground", "runtime"},
    "models": {"ground"},
    "sim": {"ground", "models", "config"},
    "emulation": {"ground", "models", "sim"},
    "workload": {"ground", "runtime", "models", "sim"},
    "datagen": {"ground", "runtime", "models", "sim", "workload"},
    "train": {"ground", "runtime", "models"},  # never sim: the models layer is what they share
    "m3": {"ground", "runtime", "models", "sim", "datagen", "train"},
    "serve": {"ground", "runtime", "models", "sim", "m3"},
    "api": {"ground", "models", "sim", "workload", "emulation", "serve"},  # the public names
}
ALLOWED["sweeps"] = set(ALLOWED) - {"sweeps"}  # the entry layer may import every package


def package_of(module: str) -> str | None:
    """The layer package of an ``m4ray`` module name (None: not m4ray's)."""
    parts = module.split(".")
    if parts[0] != "m4ray":
        return None
    if len(parts) == 1 or parts[1] in GROUND:
        return "ground"
    return parts[1]


def package_of_file(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return "ground" if len(rel.parts) == 1 and rel.stem in GROUND else rel.parts[0].split(".")[0]


def imported_modules(path: Path) -> set[str]:
    """Every m4ray module a file imports, at module level or inside functions (``from m4ray
    import native`` counts as ``m4ray.native``; relative imports are resolved)."""
    names = set()
    here = ["m4ray", *path.relative_to(PACKAGE).with_suffix("").parts]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = here[: len(here) - node.level]
                base = ".".join([*parent, *([base] if base else [])])
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def edges() -> dict[tuple[str, str], list[str]]:
    """(importer package, imported package) -> the files that make that arrow."""
    out: dict[tuple[str, str], list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        src = package_of_file(path)
        for module in imported_modules(path):
            dst = package_of(module)
            if dst is not None and dst != src:
                out.setdefault((src, dst), []).append(str(path.relative_to(PACKAGE)))
    return out


def test_every_package_has_a_place_in_the_layers():
    found = {package_of_file(p) for p in PACKAGE.rglob("*.py")}
    assert found - set(ALLOWED) == set(), "a new package: give it its arrows in ALLOWED"


def test_the_allowed_arrows_form_no_cycle():
    order = list(TopologicalSorter(ALLOWED).static_order())
    assert order[0] == "ground" and order[-1] == "sweeps"
    assert "sim" not in ALLOWED["train"] and "train" not in ALLOWED["sim"]
    assert not any("sweeps" in deps for deps in ALLOWED.values())


def test_every_import_runs_down_an_allowed_arrow():
    bad = {
        f"{src} -> {dst}": sorted(set(files))
        for (src, dst), files in edges().items()
        if dst not in ALLOWED[src]
    }
    assert bad == {}


def test_the_check_sees_imports_inside_functions_and_relative_ones(tmp_path, monkeypatch):
    probe = PACKAGE / "models" / "probe.py"
    source = "def f():\n    from m4ray.sweeps.grid import expand\n    from ..sim import flowsim\n"
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: source)
    found = imported_modules(probe)
    assert "m4ray.sweeps.grid.expand" in found
    assert "m4ray.sim.flowsim" in found
    assert {package_of(m) for m in found} == {"sweeps", "sim"}


def test_a_cycle_in_the_arrows_would_be_caught():
    with pytest.raises(CycleError):
        list(TopologicalSorter({**ALLOWED, "models": {"ground", "sim"}}).static_order())
