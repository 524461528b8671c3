"""Shared pieces of the command-line entry points: user errors without tracebacks, and a clean
stop on Ctrl-C or SIGTERM."""

from __future__ import annotations

import contextlib
import signal
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


@contextmanager
def stops_cleanly(run_dir: str | None = None) -> Iterator[None]:
    """Ctrl-C (exit 130) and SIGTERM (exit 143) end a long run with one line instead of a
    traceback: what is still running is cancelled, Serve and Ray shut down, and finished results
    stay on disk for a re-run of the same command to resume from.

    SIGTERM becomes ``sys.exit(15)`` (what Ray's own driver handler does too, so it works
    whether or not Ray installed its handler after ours).
    """
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))
    try:
        yield
    except KeyboardInterrupt:
        _stop("interrupted (Ctrl-C)", run_dir, 130)
    except SystemExit as exit_:
        if exit_.code != signal.SIGTERM:
            raise
        _stop("terminated (SIGTERM)", run_dir, 143)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stop(what: str, run_dir: str | None, status: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not break the shutdown
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        import ray

        if ray.is_initialized():
            if "ray.serve" in sys.modules:  # this process started (or used) Serve
                with contextlib.suppress(Exception):  # gone already
                    sys.modules["ray.serve"].shutdown()
            ray.shutdown()
    except Exception:  # the shutdown is best effort: the process ends next either way
        pass
    kept = f"; finished results are kept in {run_dir}: re-run the same command to resume"
    print(f"{what}: stopped{kept if run_dir else ''}", file=sys.stderr)
    sys.exit(status)
