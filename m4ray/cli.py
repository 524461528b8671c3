"""Shared pieces of the command-line entry points: user errors without tracebacks."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from hydra.errors import InstantiationException

from m4ray.errors import M4rayError


@contextmanager
def user_errors() -> Iterator[None]:
    """Print an :class:`M4rayError` (or a bad config value) as one line and exit with status 2."""
    try:
        yield
    except M4rayError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except InstantiationException as err:
        cause = err.__cause__ if err.__cause__ is not None else err
        print(f"error: invalid configuration: {cause}", file=sys.stderr)
        sys.exit(2)
