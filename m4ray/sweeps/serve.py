"""The serve experiment: the m4 (or m3) backend on Ray Serve, self-checked over HTTP."""

from __future__ import annotations

import time
from typing import Any

from m4ray.serve.job import ServeSettings, app_args, self_check, start

SECTIONS = {"serve": ServeSettings}  # checked before run


def run(sweep, raw_config: dict[str, Any]) -> str:
    settings: ServeSettings = sweep.serve
    t0 = time.perf_counter()
    url = start(settings, sweep.ray)
    predictions = self_check(url, settings)
    print(
        f"m4 backend serving at {url} (checkpoint {app_args(settings).checkpoint}), "
        f"ready in {time.perf_counter() - t0:.1f} s"
    )
    print(f"  API docs: {url}/docs   schema: {url}/openapi.json")
    print(
        "  self-check: 2 flows -> predicted finish (us): "
        + ", ".join(f"{f}: {t * 1e6:.2f}" for f, t in sorted(predictions.items()))
    )
    print(
        f"  simulate through it: python -m m4ray.sweeps +experiment=gray_failure "
        f"'backends=[m4_served]' backend_options.m4_served.url={url}"
    )
    if settings.hold:  # Ctrl-C / SIGTERM: the entry point shuts Serve and Ray down cleanly
        print("serving; Ctrl-C to stop", flush=True)
        while True:
            time.sleep(3600)
    from ray import serve

    serve.shutdown()
    return url


__all__ = ["SECTIONS", "run"]
