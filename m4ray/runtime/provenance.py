"""Provenance of a run: the git commit and package versions recorded in manifests and MLflow."""

from __future__ import annotations

import platform
import subprocess
from importlib import metadata
from pathlib import Path

PACKAGES = ("m4ray", "ray", "numpy", "pyarrow", "hydra-core")


def git_commit() -> str:
    """The checkout's commit, or ``unknown`` outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
            check=True,
            timeout=10,
        )
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def versions() -> dict[str, str | None]:
    """Python and the key packages' versions (None = not installed)."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for package in PACKAGES:
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = None
    return out
