"""A memo of the neural step across passes: an update graph whose every input byte was stepped
before gets the outputs it got then, without a forward pass.

A collective's steps repeat: on the gray-failure grid at full scale, 86 % of the graphs a group
of 53 scenarios hands the step are byte for byte one handed earlier (a fresh flow's initial
state on idle links, the same Δt, parameters and anchor features, the same wiring). The step is
a pure function of a graph's rows and wiring (graphs never interact in a pass; the numpy step's
products may round the last bit differently with a batch's shape, far below the picosecond the
engine rounds predicted times to), so the memo's answer is the pass's, and a simulation whose
request is all known is answered at once, without waiting for the round's pass
(:class:`~m4ray.sim.m4.shared.SharedStepper`).

A graph's key is its sizes and the bytes of every input array (cheap: one ``tobytes`` each; a
per-component key found more repeats but cost as much to build as the passes it saved). Only
graphs of at most ``max_flows`` flows are kept, and the memo forgets everything when its arrays
pass ``max_bytes`` (memory stays bounded; the answers do not depend on it).
"""

from __future__ import annotations

import numpy as np

from m4ray.models.graph import StepGraph, StepOut


def _frozen(a) -> np.ndarray:
    """A read-only copy (answers are handed to many simulations)."""
    copy = (a.numpy() if hasattr(a, "numpy") else np.asarray(a)).copy()  # numpy, or torch's
    copy.flags.writeable = False
    return copy


# graphs of at most this many flows are kept, up to this many bytes (the compiled engine's memo
# of components too: NativeM4Engine.use_compiled_pass)
MAX_FLOWS = 64
MAX_BYTES = 64 << 20


class StepMemo:
    """Step outputs by the bytes of their graphs (see the module docstring)."""

    def __init__(self, *, max_flows: int = MAX_FLOWS, max_bytes: int = MAX_BYTES) -> None:
        self.max_flows = max_flows
        self.max_bytes = max_bytes
        self.table: dict[bytes, StepOut] = {}
        self.bytes = 0
        self.hits = self.misses = 0

    def key(self, g: StepGraph) -> bytes | None:
        """The graph's key (None: too large to keep)."""
        if len(g.h_flow) > self.max_flows:
            return None
        arrays = [g.h_flow, g.dt_flow_us, g.params, g.n_links, g.h_link, g.dt_link_us]
        arrays.append(g.incidence)
        if g.base is not None:
            arrays += [g.base, g.fluid]
        arrays = [np.asarray(a) for a in arrays]
        head = repr([(a.dtype.str, a.shape) for a in arrays]).encode()
        return b"".join([head, *(a.tobytes() for a in arrays)])

    def answer(self, graphs: list[StepGraph]) -> tuple[list[StepOut] | None, list]:
        """The outputs of ``graphs`` when all are in the memo (else None), and their keys (for
        :meth:`store` after the pass)."""
        keys = [self.key(g) for g in graphs]
        found = [self.table.get(k) if k is not None else None for k in keys]
        if any(f is None for f in found):
            return None, keys
        self.hits += len(found)
        return found, keys

    def store(self, keys: list, outs: list[StepOut]) -> None:
        """Remember a pass's outputs of the keyed graphs."""
        for key, out in zip(keys, outs, strict=True):
            if key is None:
                continue
            if key in self.table:
                self.hits += 1
                continue
            self.misses += 1
            arrays = (out.h_flow, out.h_link, out.slowdown)
            size = len(key) + sum(np.asarray(a).nbytes for a in arrays)
            if size > self.max_bytes:  # never kept
                continue
            kept = [_frozen(a) for a in arrays]
            if self.bytes + size > self.max_bytes:
                self.table.clear()
                self.bytes = 0
            self.table[key] = StepOut(h_flow=kept[0], h_link=kept[1], slowdown=kept[2])
            self.bytes += size


__all__ = ["MAX_BYTES", "MAX_FLOWS", "StepMemo"]
