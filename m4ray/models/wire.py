"""The wire format: payload and header bytes per packet, which the simulators' ideal FCTs, the
fluid models and the learned models' anchors all packetise flows by (:mod:`m4ray.sim.routing`
states the FCT convention built on it)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class WireFormat:
    """Packetisation for ideal FCTs and fluid models: payload and header bytes per packet."""

    mtu_bytes: int = 1000
    header_bytes: int = 48

    def wire_bytes(self, size_bytes):
        """Payload plus one header per packet; exact integer ceiling, so it also takes an
        integer numpy array."""
        return size_bytes + -(-size_bytes // self.mtu_bytes) * self.header_bytes


def wire_window(window_bytes: int, wire: WireFormat) -> float:
    """A window of payload on the wire (bytes: whole packets with their headers); none (0):
    unbounded, so a full link's queue stands at its cap."""
    if window_bytes <= 0:
        return math.inf
    return math.ceil(window_bytes / wire.mtu_bytes) * float(wire.mtu_bytes + wire.header_bytes)


__all__ = ["WireFormat", "wire_window"]
