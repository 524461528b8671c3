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
# ... and where the field's default changed later, the value the ids were made with (left out
# of the hash, so old ids still name what they ran; the new default is hashed)
BEFORE = "m4ray.fingerprint.before"


def added_field(default: Any, why: str, *, ids_had: Any = dataclasses.MISSING) -> Any:
    """A dataclass field that leaves ids unchanged while it holds ``default``, or ``ids_had``
    where given: the value every id was made with before the default changed to ``default``."""
    metadata = {SINCE: why}
    if ids_had is not dataclasses.MISSING:
        metadata[BEFORE] = ids_had
    return dataclasses.field(default=default, metadata=metadata)


def _left_out(field: dataclasses.Field, value: Any) -> bool:
    """Whether ``value`` of ``field`` stays out of the hash (module docstring)."""
    if not field.metadata.get(SINCE):
        return False
    return value == field.metadata.get(BEFORE, field.default)


def canonical(obj: Any) -> Any:
    """A JSON-able form of dataclasses, enums, mappings and sequences, tagged with class names."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = {
            f.name: canonical(getattr(obj, f.name))
            for f in dataclasses.fields(obj)
            if not _left_out(f, getattr(obj, f.name))
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
