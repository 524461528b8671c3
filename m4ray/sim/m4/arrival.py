"""A flow arriving at an m4 engine (a plain record: importing it needs no torch)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Arrival:
    """A flow entering the network now: ``id`` unique within the simulation, host ids, bytes."""

    id: int
    src: int
    dst: int
    size_bytes: int


__all__ = ["Arrival"]
