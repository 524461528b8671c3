"""Resident memory of this process (Linux ``/proc``): now, and its high-water mark over a block
(a Ray worker runs many tasks, so ``ru_maxrss`` would carry earlier ones)."""

from __future__ import annotations

import resource
import threading


def rss_mb() -> float:
    """Resident memory of this process now (MB)."""
    with open("/proc/self/statm") as statm:  # resident pages are the second field
        return int(statm.read().split()[1]) * resource.getpagesize() / 2**20


class PeakRss:
    """``with PeakRss() as m:`` — ``m.start`` and ``m.peak`` (MB), sampled every 20 ms."""

    def __enter__(self) -> PeakRss:
        self.peak = self.start = rss_mb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, rss_mb())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_mb())


__all__ = ["PeakRss", "rss_mb"]
