"""The compiled path flowSim (``_pathsim.c``): built on first use with the system C compiler into a
per-user cache named by the source's hash, loaded with ctypes.

m3's cost is dominated by path flowSim (``reference/flowsim_m3.md`` B.7: 1.74 s of 2.66 s per path
in the original, also in C). The Python loop in :mod:`m4ray.m3.pathsim` stays the reference and
the fallback: where no compiler is found, :func:`library` returns ``None`` and says why once.
``M4RAY_NATIVE=0`` forces the fallback; ``CC`` picks the compiler; ``M4RAY_CACHE_DIR`` moves the
cache (default ``~/.cache/m4ray``).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import numpy as np

from m4ray.errors import SimulationError

SOURCE = Path(__file__).with_name("_pathsim.c")


def cache_dir() -> Path:
    """Where built libraries live: ``$M4RAY_CACHE_DIR`` or ``~/.cache/m4ray``, else (not
    writable) the temp directory."""
    base = Path(os.environ.get("M4RAY_CACHE_DIR") or Path.home() / ".cache" / "m4ray") / "native"
    try:
        base.mkdir(parents=True, exist_ok=True)
        if os.access(base, os.W_OK):
            return base
    except OSError:
        pass
    return Path(tempfile.gettempdir()) / f"m4ray-native-{os.getuid()}"


def _build(target: Path) -> None:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        raise OSError("no C compiler (set CC or install gcc)")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        out = Path(tmp) / target.name
        cmd = [compiler, "-O2", "-fPIC", "-shared", "-o", str(out), str(SOURCE), "-lm"]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode:
            raise OSError(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
        out.replace(target)  # atomic: concurrent builders (Ray workers) race harmlessly


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded library, or ``None`` (with one warning) where it cannot be built."""
    if os.environ.get("M4RAY_NATIVE", "1") == "0":
        return None
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    target = cache_dir() / f"pathsim-{digest}.so"
    try:
        if not target.exists():
            _build(target)
        lib = ctypes.CDLL(str(target))
    except OSError as err:
        warnings.warn(f"compiled path flowSim unavailable, using Python: {err}", stacklevel=2)
        return None
    ptr = ctypes.c_void_p  # raw data pointers: path_finish hands over contiguous arrays
    fn = lib.m4ray_path_finish
    fn.restype = ctypes.c_int
    fn.argtypes = [
        ctypes.c_int64, ptr, ptr, ptr, ptr, ctypes.c_int, ptr, ptr, ctypes.c_int, ptr,
        ctypes.c_double, ptr,
    ]  # fmt: skip
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
) -> np.ndarray:
    """Finish times (s) of every flow from the compiled loop (index order of the input)."""
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
    cls_, bits_, start_, order_, ca, cb, cap = (x.ctypes.data for x in arrays)
    rc = lib.m4ray_path_finish(
        n, cls_, bits_, start_, order_, len(classes), ca, cb, len(capacity), cap,
        float(nic_cap_bps) if nic_cap_bps else 0.0, finish.ctypes.data,
    )  # fmt: skip
    if rc == 1:
        raise SimulationError("flows with zero rate: a path link has no capacity")
    if rc:
        raise MemoryError("compiled path flowSim: out of memory")
    return finish
