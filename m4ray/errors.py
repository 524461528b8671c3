"""Exceptions shown to people.

Every user mistake (a malformed file, an unknown name, an impossible value) raises an
:class:`InputError` that names the file, line and field when they exist; entry points print its
message and exit with status 2 instead of a traceback. :class:`SimulationError` is for a run that
cannot finish (a deadlocked workload, a backend failure) and is recorded as a failed row by sweeps.
"""

from __future__ import annotations

from pathlib import Path


class M4rayError(Exception):
    """Base class of every error m4ray raises on purpose."""


class InputError(M4rayError, ValueError):
    """Bad user input, located as precisely as possible.

    ``str(err)`` reads ``<file>:<line>: field '<field>': <message>``, leaving out what is unknown.
    """

    def __init__(
        self,
        message: str,
        *,
        file: str | Path | None = None,
        line: int | None = None,
        field: str | None = None,
    ) -> None:
        self.message = message
        self.file = None if file is None else str(file)
        self.line = line
        self.field = field
        super().__init__(self._render())

    def _render(self) -> str:
        where = ""
        if self.file is not None:
            where = self.file if self.line is None else f"{self.file}:{self.line}"
            where += ": "
        what = f"field '{self.field}': " if self.field else ""
        return f"{where}{what}{self.message}"

    def __reduce__(self):  # keep the location when the error crosses a Ray/pickle boundary
        return (_rebuild_input_error, (self.message, self.file, self.line, self.field))


def _rebuild_input_error(message, file, line, field) -> InputError:
    return InputError(message, file=file, line=line, field=field)


class SimulationError(M4rayError, RuntimeError):
    """A simulation that cannot complete (deadlock, backend failure, time limit)."""


def choice_error(kind: str, name: str, valid: list[str] | tuple[str, ...]) -> InputError:
    """The error for an unknown name, listing the valid choices."""
    return InputError(f"unknown {kind} '{name}'; valid choices: {', '.join(sorted(valid))}")
