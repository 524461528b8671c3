"""The wire format: payload and header bytes per packet, which the simulators' ideal FCTs, the
fluid models and the learned models' anchors all packetise flows by (:mod:`m4ray.sim.routing`
states the FCT convention built on it)."""

from __future__ import annotations

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


__all__ = ["WireFormat"]
