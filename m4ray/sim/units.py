"""Parsing and printing of rates and times as they appear in topology files.

Internally m4ray uses bits/s for bandwidth, seconds for time and bytes for sizes. Topology files
write ``400Gbps`` / ``10000000000bps`` and ``0.0005ms`` / ``1000ns``; these helpers convert both
ways and raise ``ValueError`` with the accepted units on anything else (callers add file/line).
"""

from __future__ import annotations

import re
from decimal import Decimal

_RATE_UNITS = {"bps": 1, "kbps": 10**3, "mbps": 10**6, "gbps": 10**9, "tbps": 10**12}
_TIME_PER_SECOND = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9, "ps": 10**12}
_NUMBER = re.compile(r"^([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)([A-Za-z]*)$")


def _split(text: str) -> tuple[Decimal, str]:
    """Exact decimal value and lower-case unit: scaling in Decimal keeps ``0.000025ms`` -> 25e-9."""
    match = _NUMBER.match(text.strip())
    if match is None:
        raise ValueError(f"'{text}' is not a number with a unit")
    return Decimal(match.group(1)), match.group(2).lower()


def parse_rate(text: str) -> float:
    """``'400Gbps'`` -> 4e11 bits/s. Units: bps, Kbps, Mbps, Gbps, Tbps (case-insensitive)."""
    value, unit = _split(text)
    if unit not in _RATE_UNITS:
        raise ValueError(f"'{text}' has no rate unit; use one of bps, Kbps, Mbps, Gbps, Tbps")
    return float(value * Decimal(_RATE_UNITS[unit]))


def parse_time(text: str) -> float:
    """``'0.0005ms'`` -> 5e-7 s. Units: s, ms, us, ns, ps."""
    value, unit = _split(text)
    if unit not in _TIME_PER_SECOND:
        raise ValueError(f"'{text}' has no time unit; use one of s, ms, us, ns, ps")
    return float(value / Decimal(_TIME_PER_SECOND[unit]))


def format_rate_gbps(bps: float) -> str:
    """4e11 -> ``'400Gbps'`` (SimAI style; fractional Gbps keep up to 6 decimals)."""
    return f"{_trim(bps / 1e9)}Gbps"


def format_time_ms(seconds: float) -> str:
    """5e-7 -> ``'0.0005ms'`` (SimAI style)."""
    return f"{_trim(float(Decimal(repr(seconds)) * 1000), digits=9)}ms"


def _trim(value: float, digits: int = 6) -> str:
    text = f"{value:.{digits}f}".rstrip("0").rstrip(".")
    return text or "0"
