"""Content hashes that name scenarios, runs and output files (never wall-clock time)."""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from typing import Any

# A field added to a hashed record after ids were published carries ``metadata={SINCE: "<why>"}``:
# at its default it is left out of the hash, so every existing scenario, run and dataset keeps its
# id (and a resumed sweep its finished rows).
SINCE = "m4ray.fingerprint.added"


def added_field(default: Any, why: str) -> Any:
    """A dataclass field that leaves ids unchanged while it holds ``default``."""
    return dataclasses.field(default=default, metadata={SINCE: why})


def canonical(obj: Any) -> Any:
    """A JSON-able form of dataclasses, enums, mappings and sequences, tagged with class names."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = {
            f.name: canonical(getattr(obj, f.name))
            for f in dataclasses.fields(obj)
            if not (f.metadata.get(SINCE) and getattr(obj, f.name) == f.default)
        }
        return {"__type__": type(obj).__qualname__, **fields}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, dict):
        return {str(k): canonical(v) for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))}
    if isinstance(obj, list | tuple):
        return [canonical(v) for v in obj]
    if isinstance(obj, float) and obj.is_integer():
        return int(obj)  # 1.0 and 1 name the same configuration
    return obj


def fingerprint(obj: Any, length: int = 12) -> str:
    """Hex digest of the canonical JSON of ``obj``."""
    text = json.dumps(canonical(obj), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:length]
