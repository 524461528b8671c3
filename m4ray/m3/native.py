"""The compiled path flowSim (``_pathsim.c``), built and loaded by :mod:`m4ray.native`.

m3's cost is dominated by path flowSim (``reference/flowsim_m3.md`` B.7: 1.74 s of 2.66 s per path
in the original, also in C). The Python loop in :mod:`m4ray.m3.pathsim` stays the reference and
the fallback: where no compiler is found, :func:`library` returns ``None`` and says why once.
``M4RAY_NATIVE=0`` forces the fallback; ``CC`` picks the compiler; ``M4RAY_CACHE_DIR`` moves the
cache (default ``~/.cache/m4ray``).
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import numpy as np

from m4ray import native
from m4ray.errors import SimulationError

SOURCE = Path(__file__).with_name("_pathsim.c")


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded library, or ``None`` (with one warning) where it cannot be built."""
    lib = native.load(SOURCE, "compiled path flowSim")
    if lib is None:
        return None
    ptr = ctypes.c_void_p  # raw data pointers: path_finish hands over contiguous arrays
    fn = lib.m4ray_path_finish
    fn.restype = ctypes.c_int
    fn.argtypes = [
        ctypes.c_int64, ptr, ptr, ptr, ptr, ctypes.c_int, ptr, ptr, ctypes.c_int, ptr,
        ctypes.c_double, ptr, ctypes.c_double, ptr, ctypes.c_int, ctypes.c_double, ptr,
    ]  # fmt: skip
    fn = lib.m4ray_lot_stretches
    fn.restype = ctypes.c_int64
    fn.argtypes = [ctypes.c_int, ptr, ptr, ptr, ptr, ctypes.c_int64, ptr, ptr, ptr]
    return lib


def path_finish(  # noqa: PLR0917 (the C function's signature)
    cls: np.ndarray,
    bits: np.ndarray,
    start_s: np.ndarray,
    order: np.ndarray,
    classes: list[tuple[int, int]],
    capacity: list[float],
    *,
    nic_cap_bps: float | None,
    queues: tuple[np.ndarray, float, list[float], bool] | None = None,
) -> np.ndarray:
    """Finish times (s) of every flow from the compiled loop (index order of the input);
    ``queues``: (each flow's round trip, the window on the wire, each link's queue cap, whether
    only flows in their first round trip queue)."""
    lib = library()
    assert lib is not None
    n = len(cls)
    finish = np.empty(n)
    arrays = [
        np.ascontiguousarray(cls, dtype=np.int64),
        np.ascontiguousarray(bits, dtype=np.float64),
        np.ascontiguousarray(start_s, dtype=np.float64),
        np.ascontiguousarray(order, dtype=np.int64),
        np.array([c[0] for c in classes], dtype=np.int32),
        np.array([c[1] for c in classes], dtype=np.int32),
        np.asarray(capacity, dtype=np.float64),
    ]  # kept alive here while C reads them
    rtt, window, qcap, first, buffer = None, 0.0, None, False, 0.0
    if queues is not None:
        rtt = np.ascontiguousarray(queues[0], dtype=np.float64)
        window = float(queues[1])
        qcap = np.ascontiguousarray(queues[2], dtype=np.float64)
        first = bool(queues[3])
        buffer = float(queues[4]) if len(queues) > 4 else 0.0
        arrays += [rtt, qcap]
    cls_, bits_, start_, order_, ca, cb, cap = (x.ctypes.data for x in arrays[:7])
    rc = lib.m4ray_path_finish(
        n, cls_, bits_, start_, order_, len(classes), ca, cb, len(capacity), cap,
        float(nic_cap_bps) if nic_cap_bps else 0.0,
        None if rtt is None else rtt.ctypes.data, window,
        None if qcap is None else qcap.ctypes.data, int(first), buffer, finish.ctypes.data,
    )  # fmt: skip
    if rc == 1:
        raise SimulationError("flows with zero rate: a path link has no capacity")
    if rc:
        raise MemoryError("compiled path flowSim: out of memory")
    return finish
