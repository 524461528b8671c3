"""The RDMA transport's congestion controls beside DCTCP: DCQCN, HPCC and TIMELY, each as the
field's reference simulator (HPCC's ns-3, behind m4, m3 and SimAI) runs it, with its parameters
in plain words (the reference's config key in each comment). The C++ is ``rdma.py``'s.

* **DCTCP** (``CC_MODE 8``, the default): its settings stay on :class:`RdmaConfig` itself
  (``ecn_k_bytes``, ``dctcp_gain``, ``rate_ai_bps``) and it takes no ``cc_params``.
* **DCQCN** (``CC_MODE 1``, Mellanox's NIC version): switches mark ECN by RED on the egress queue
  (none up to K_min, probability rising to P_max at K_max, all beyond); the receiver echoes every
  mark on its ACK (a CNP). The sender's first CNP starts three timers: α ← (1−g)α + g·[CNP since
  the last tick]; on a CNP since the last decrease tick, target ← rate (clamped) and
  rate ← max(min, rate·(1−α/2)) and the increase stage restarts; every increase tick,
  ``fast_recovery_steps`` times rate ← (rate + target)/2, then once more with target + AI, then
  with target + hyper AI.
* **HPCC** (``CC_MODE 3``): every switch egress appends in-band telemetry to each data packet as it
  leaves (time, bytes sent, queue left, line rate); the ACK echoes it. Per ACK the sender takes
  the most utilised hop, u = tx rate / line rate + min(queue, last queue)·line rate of the NIC /
  (line rate · window), smooths it over the base RTT T, and sets rate ← current/(u/η) + AI
  (or + AI only, below η for fewer than ``max_stage`` rounds), from the rate of its last full
  update (once per window of data); with ``fast_react`` every ACK does so, else only the full
  updates. INT adds ``int_bytes`` to every data packet and ``ack_int_bytes`` to every ACK.
* **TIMELY** (``CC_MODE 7``): once per window, the RTT of the ACKed packet (its echoed send time):
  below T_low increase, above T_high cut by β·(1 − T_high/RTT), else follow the EWMA RTT
  gradient (normalised by the minimum RTT): increase if ≤ 0, else cut by β·gradient. Five
  increases of AI, then hyper AI. The timestamp adds ``int_bytes`` to every data packet.

Where the reference's switches queue ACKs with the data (its upstream always; the m3 fork with
``ACK_HIGH_PRIO 0``) set ``RdmaConfig.ack_high_priority`` false; the default keeps them in the
high-priority queue.

Defaults follow the reference's scripts at 100 Gbit/s (``run.py``: DCQCN AI 40 Mbit/s, hyper AI
100 Mbit/s, K_min/K_max 4/16 KB per Gbit/s; HPCC η 0.95, AI 50 Mbit/s; TIMELY AI 50 Mbit/s, hyper
250 Mbit/s and its built-in thresholds). Units: bytes, bits/s, seconds.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from m4ray.errors import InputError


def interpolate(points: list[list[float]], rate_bps: float) -> float:
    """A per-rate setting ``[[rate_bps, value], ...]``: linear between points, held beyond."""
    points = sorted(points)
    return float(np.interp(rate_bps, [p[0] for p in points], [p[1] for p in points]))


def check_points(points, name: str) -> None:
    if not points or any(len(p) != 2 or p[0] <= 0 or p[1] <= 0 for p in points):
        raise InputError("expected [[rate_bps, bytes], ...] with positive values", field=name)


@dataclass(kw_only=True, slots=True)
class DcqcnParams:
    """DCQCN (reference ``CC_MODE 1``)."""

    k_min_bytes: list[list[float]] = field(  # KMIN_MAP (KB there)
        default_factory=lambda: [[25e9, 100e3], [100e9, 400e3]]
    )
    k_max_bytes: list[list[float]] = field(  # KMAX_MAP (KB there)
        default_factory=lambda: [[25e9, 400e3], [100e9, 1600e3]]
    )
    p_max: float = 0.2  # PMAX_MAP
    gain: float = 1 / 256  # EWMA_GAIN
    alpha_interval_s: float = 1e-6  # ALPHA_RESUME_INTERVAL (µs there)
    decrease_interval_s: float = 4e-6  # RATE_DECREASE_INTERVAL (µs there)
    increase_interval_s: float = 900e-6  # RP_TIMER (µs there)
    fast_recovery_steps: int = 1  # FAST_RECOVERY_TIMES
    rate_ai_bps: float = 40e6  # RATE_AI
    rate_hai_bps: float = 100e6  # RATE_HAI
    clamp_target_rate: bool = False  # CLAMP_TARGET_RATE
    rate_on_first_cnp: float = 1.0  # RdmaHw::RateOnFirstCnp

    def check(self, at: str) -> None:
        check_points(self.k_min_bytes, f"{at}.k_min_bytes")
        check_points(self.k_max_bytes, f"{at}.k_max_bytes")
        rules = [
            (0 < self.p_max <= 1, "p_max", "in (0, 1]"),
            (0 < self.gain <= 1, "gain", "in (0, 1]"),
            (self.alpha_interval_s > 0, "alpha_interval_s", "> 0"),
            (self.decrease_interval_s > 0, "decrease_interval_s", "> 0"),
            (self.increase_interval_s > 0, "increase_interval_s", "> 0"),
            (self.fast_recovery_steps >= 0, "fast_recovery_steps", ">= 0"),
            (self.rate_ai_bps >= 0, "rate_ai_bps", ">= 0"),
            (self.rate_hai_bps >= 0, "rate_hai_bps", ">= 0"),
            (0 < self.rate_on_first_cnp <= 1, "rate_on_first_cnp", "in (0, 1]"),
        ]
        _check(rules, at)

    def red(self, rate_bps: float) -> tuple[int, int]:
        """(K_min, K_max) bytes of a port sending at ``rate_bps``."""
        kmin = round(interpolate(self.k_min_bytes, rate_bps))
        return kmin, max(kmin + 1, round(interpolate(self.k_max_bytes, rate_bps)))


@dataclass(kw_only=True, slots=True)
class HpccParams:
    """HPCC (reference ``CC_MODE 3``)."""

    target_utilization: float = 0.95  # U_TARGET (η)
    rate_ai_bps: float = 50e6  # RATE_AI (W_AI as a rate)
    max_stage: int = 0  # MI_THRESH: rounds of additive-only increase below η
    fast_react: bool = True  # FAST_REACT: adjust on every ACK, not once per window only
    base_rtt_s: float | None = None  # T; None: the largest base RTT of any host pair (GLOBAL_T)
    int_bytes: int = 42  # wire bytes of INT on a data packet (5 hops of 8 B + 2 B)
    ack_int_bytes: int = 28  # ... and on an ACK (88 B there, against 60 B without INT)

    def check(self, at: str) -> None:
        rules = [
            (0 < self.target_utilization <= 1, "target_utilization", "in (0, 1]"),
            (self.rate_ai_bps >= 0, "rate_ai_bps", ">= 0"),
            (self.max_stage >= 0, "max_stage", ">= 0"),
            (self.base_rtt_s is None or self.base_rtt_s > 0, "base_rtt_s", "> 0 or null"),
            (self.int_bytes >= 0, "int_bytes", ">= 0"),
            (self.ack_int_bytes >= 0, "ack_int_bytes", ">= 0"),
        ]
        _check(rules, at)


@dataclass(kw_only=True, slots=True)
class TimelyParams:
    """TIMELY (reference ``CC_MODE 7``)."""

    t_low_s: float = 50e-6  # TIMELY_T_LOW (ns there; built in upstream)
    t_high_s: float = 500e-6  # TIMELY_T_HIGH
    beta: float = 0.8  # TIMELY_BETA
    ewma: float = 0.875  # α of the RTT-difference EWMA (weight of the new sample)
    min_rtt_s: float = 20e-6  # the gradient's normaliser
    rate_ai_bps: float = 50e6  # RATE_AI
    rate_hai_bps: float = 250e6  # RATE_HAI
    int_bytes: int = 8  # wire bytes of the send timestamp on a data packet

    def check(self, at: str) -> None:
        rules = [
            (0 < self.t_low_s < self.t_high_s, "t_low_s", "in (0, t_high_s)"),
            (self.int_bytes >= 0, "int_bytes", ">= 0"),
            (0 < self.beta <= 1, "beta", "in (0, 1]"),
            (0 < self.ewma <= 1, "ewma", "in (0, 1]"),
            (self.min_rtt_s > 0, "min_rtt_s", "> 0"),
            (self.rate_ai_bps >= 0, "rate_ai_bps", ">= 0"),
            (self.rate_hai_bps >= 0, "rate_hai_bps", ">= 0"),
        ]
        _check(rules, at)


def _check(rules, at: str) -> None:
    for ok, name, rule in rules:
        if not ok:
            raise InputError(f"must be {rule}", field=f"{at}.{name}")


# name -> (the C++ enum, its parameters; None: DCTCP's live on RdmaConfig)
CCS: dict[str, tuple[int, type | None]] = {
    "dctcp": (0, None),
    "dcqcn": (1, DcqcnParams),
    "hpcc": (2, HpccParams),
    "timely": (3, TimelyParams),
}


def cc_params(cc: str, given: dict[str, Any] | None, at: str = "ns3.rdma"):
    """The parameters of congestion control ``cc`` from ``given`` (None: its defaults), checked;
    an unknown CC, or a parameter this CC does not have, is an error naming the field."""
    if cc not in CCS:
        raise InputError(f"unknown congestion control {cc!r} ({', '.join(CCS)})", field=f"{at}.cc")
    kind = CCS[cc][1]
    given = dict(given or {})
    if kind is None:
        if given:
            raise InputError(
                f"dctcp takes no cc_params (its settings are ecn_k_bytes, dctcp_gain, "
                f"rate_ai_bps): got {', '.join(sorted(given))}",
                field=f"{at}.cc_params.{sorted(given)[0]}",
            )
        return None
    names = [f.name for f in dataclasses.fields(kind)]
    for key in given:
        if key not in names:
            raise InputError(
                f"{cc} has no parameter {key!r} (its parameters: {', '.join(names)})",
                field=f"{at}.cc_params.{key}",
            )
    params = kind(**given)
    params.check(f"{at}.cc_params")
    return params


__all__ = [
    "CCS",
    "DcqcnParams",
    "HpccParams",
    "TimelyParams",
    "cc_params",
    "check_points",
    "interpolate",
]
