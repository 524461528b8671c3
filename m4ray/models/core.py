"""The m4 engine's compiled core (``_core.c``), built and loaded by :mod:`m4ray.native`: the
fluid anchor's loops (:class:`~m4ray.models.fluid.Fluid`) and the engine's bookkeeping
(:class:`~m4ray.sim.m4.engine.NativeM4Engine`). The Python code beside them is the reference and
the fallback."""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

from m4ray import native

SOURCE = Path(__file__).with_name("_core.c")


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded core with its signatures, or ``None`` (one warning) where it cannot be
    built."""
    lib = native.load(SOURCE, "compiled m4 core")
    if lib is None:
        return None
    ptr, i64, f64 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_double
    common = [ptr, i64, i64, ptr, ptr, ptr, ptr, ptr, f64]  # state .. t
    acks = [f64, ptr, ptr]  # ACK fraction, reverse links (NULL: no ACK load), data rates
    fifo = [f64]  # FIFO service: bits of work served in order (< 0: max-min)
    lib.m4ray_fluid_catch_up.restype = ctypes.c_int
    lib.m4ray_fluid_catch_up.argtypes = [*common, *acks, *fifo]
    lib.m4ray_fluid_catch_up_frozen.restype = None
    lib.m4ray_fluid_catch_up_frozen.argtypes = [ptr, i64, i64, ptr, f64]
    lib.m4ray_fluid_advance.restype = ctypes.c_int
    lib.m4ray_fluid_advance.argtypes = [*common, ctypes.c_int, ptr, ptr, *acks, *fifo]
    # the engine core (NativeM4Engine)
    lib.m4ray_engine_new.restype = ptr
    lib.m4ray_engine_new.argtypes = [i64, i64, ptr, ptr, ptr, ptr, ctypes.c_int, ctypes.c_int]
    lib.m4ray_engine_new.argtypes += [f64] * 5
    lib.m4ray_engine_free.restype = None
    lib.m4ray_engine_free.argtypes = [ptr]
    lib.m4ray_engine_fifo.restype = None
    lib.m4ray_engine_fifo.argtypes = [ptr, f64]
    lib.m4ray_engine_batching.restype = None
    lib.m4ray_engine_batching.argtypes = [ptr, i64, f64, i64]
    lib.m4ray_engine_arrive.restype = i64
    lib.m4ray_engine_arrive.argtypes = [ptr, ptr, i64, f64, f64, f64, f64]
    lib.m4ray_engine_complete.restype = ctypes.c_int
    lib.m4ray_engine_complete.argtypes = [ptr, i64, f64]
    lib.m4ray_engine_pending.restype = None
    lib.m4ray_engine_pending.argtypes = [ptr, ptr]
    lib.m4ray_engine_prepare.restype = i64
    lib.m4ray_engine_prepare.argtypes = [ptr, f64] + [ptr] * 11
    lib.m4ray_engine_finish.restype = None
    lib.m4ray_engine_finish.argtypes = [ptr, f64, i64, ptr, i64, ptr, ptr, ptr, ptr, i64, ptr, ptr]
    lib.m4ray_engine_slowdown.restype = f64
    lib.m4ray_engine_slowdown.argtypes = [ptr, i64]
    lib.m4ray_engine_users.restype = i64
    lib.m4ray_engine_users.argtypes = [ptr, i64]
    lib.m4ray_engine_components.restype = i64
    lib.m4ray_engine_components.argtypes = [ptr]
    # an update in one call through the compiled pass (NativeM4Engine.use_compiled_pass)
    lib.m4ray_engine_model.restype = ctypes.c_int
    lib.m4ray_engine_model.argtypes = [ptr] * 6 + [i64] * 3
    lib.m4ray_engine_update.restype = i64
    lib.m4ray_engine_update.argtypes = [ptr, f64, ptr, ptr, ptr, ptr]
    return lib


__all__ = ["SOURCE", "library"]
