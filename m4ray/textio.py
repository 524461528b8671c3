"""Small helpers shared by the text-format readers and writers: rows with line numbers, checked
integers, and atomic writes (a reader never sees a partial file)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from m4ray.errors import InputError


def read_rows(path: Path, kind: str) -> list[tuple[int, list[str]]]:
    """Whitespace-split non-empty lines of ``path`` with their 1-based line numbers."""
    try:
        text = path.read_text()
    except OSError as err:
        raise InputError(f"cannot read {kind} file: {err.strerror}", file=path) from None
    return split_rows(text)


def split_rows(text: str) -> list[tuple[int, list[str]]]:
    """Whitespace-split non-empty lines of ``text`` with their 1-based line numbers."""
    lines = text.splitlines()
    return [(no, line.split()) for no, line in enumerate(lines, start=1) if line.strip()]


def parse_int(text: str, path: Path, line: int, field: str, minimum: int = 0) -> int:
    """``int(text)``, at least ``minimum``, or an :class:`InputError` naming file, line, field."""
    try:
        value = int(text)
    except ValueError:
        raise InputError(
            f"expected an integer, got '{text}'", file=path, line=line, field=field
        ) from None
    if value < minimum:
        raise InputError(f"must be >= {minimum}, got {value}", file=path, line=line, field=field)
    return value


def atomic_write_text(path: Path, text: str) -> Path:
    """Write ``text`` to a temporary file next to ``path`` and rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
