"""Fast, isolated loading of the ns-3 wheel's wired-network modules through cppyy.

``from ns import ns`` parses ~50 modules (15 s, 640 MB) and globs ``PATH``, ``LD_LIBRARY_PATH`` and
the working directory for ns-3 libraries, failing when it finds a second install
(``reference/ns3.md`` §2.1). This loader reads only the installed wheel's own ``lib64/`` and
``include/`` and the modules a wired simulation needs (~3 s), and sets picosecond resolution.
It replicates the official loader's ``Node.__del__`` override so Python never frees nodes the
simulator still holds.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import Any

from m4ray.errors import SimulationError

VERSION = "3.44"
MODULES = (
    "core",
    "network",
    "stats",
    "bridge",
    "traffic-control",
    "internet",
    "point-to-point",
    "applications",
)


def ns3_prefix() -> Path:
    """The installed wheel's directory (holding ``lib64/`` and ``include/``)."""
    spec = importlib.util.find_spec("ns3")
    if spec is None or not spec.submodule_search_locations:
        raise SimulationError("the ns-3 backend needs the 'ns3' wheel: pip install ns3==3.44.post0")
    return Path(next(iter(spec.submodule_search_locations)))


@functools.cache
def load() -> Any:
    """The ``ns3`` C++ namespace (same API object as ``from ns import ns``), loaded once."""
    prefix = ns3_prefix()
    import cppyy
    import libcppyy

    libcppyy.AddSmartPtrType("Ptr")
    cppyy.add_library_path(str(prefix / "lib64"))
    cppyy.add_include_path(str(prefix / "include"))
    cppyy.cppdef("#define HAVE_GSL 1\n#define HAVE_SQLITE3 1\n")
    for module in MODULES:
        cppyy.include(f"ns3/{module}-module.h")
    for module in MODULES:
        cppyy.load_library(str(prefix / "lib64" / f"libns{VERSION}-{module}.so"))
    ns = cppyy.gbl.ns3
    ns.cppyy = cppyy
    # nanoseconds (the default) truncate a 1 KB packet's 3.3 ns at 2.4 Tbps; int64 picoseconds
    # still span 106 days of simulated time
    ns.Time.SetResolution(ns.Time.PS)
    pending: list[Any] = []

    def keep_node(self: Any) -> None:  # the simulator owns nodes until Simulator::Destroy
        pending.append(self)

    ns.Node.__del__ = keep_node
    return ns
