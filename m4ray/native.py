"""C sources compiled on first use with the system C compiler into a per-user cache named by the
source's hash, and loaded with ctypes: the compiled twins of hot Python loops (m3's path flowSim,
the m4 engine's core). The Python loops stay the reference and the fallback: where no compiler is
found, :func:`load` returns ``None`` and says why once per library.

``M4RAY_NATIVE=0`` forces the fallbacks; ``CC`` picks the compiler; ``M4RAY_CACHE_DIR`` moves the
cache (default ``~/.cache/m4ray``).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path


def cache_dir() -> Path:
    """Where built libraries live: ``$M4RAY_CACHE_DIR`` or ``~/.cache/m4ray``, else (not
    writable) the temp directory."""
    base = Path(os.environ.get("M4RAY_CACHE_DIR") or Path.home() / ".cache" / "m4ray") / "native"
    try:
        base.mkdir(parents=True, exist_ok=True)
        if os.access(base, os.W_OK):
            return base
    except OSError:
        pass
    return Path(tempfile.gettempdir()) / f"m4ray-native-{os.getuid()}"


def _build(source: Path, target: Path) -> None:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        raise OSError("no C compiler (set CC or install gcc)")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        out = Path(tmp) / target.name
        cmd = [
            compiler,
            "-O2",
            "-ffp-contract=off",
            "-fPIC",
            "-shared",
            "-o",
            str(out),
            str(source),
            "-lm",
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode:
            raise OSError(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
        out.replace(target)  # atomic: concurrent builders (Ray workers) race harmlessly


def load(source: Path, what: str, includes: tuple[Path, ...] = ()) -> ctypes.CDLL | None:
    """``source`` built (once per content, its ``includes`` counted in) and loaded, or ``None``
    with the warning "``what`` unavailable, using Python: <why>" (also when ``M4RAY_NATIVE=0``,
    silently)."""
    if os.environ.get("M4RAY_NATIVE", "1") == "0":
        return None
    content = hashlib.sha256(source.read_bytes())
    for path in includes:
        content.update(path.read_bytes())
    digest = content.hexdigest()[:12]
    target = cache_dir() / f"{source.stem.lstrip('_')}-{digest}.so"
    try:
        if not target.exists():
            _build(source, target)
        return ctypes.CDLL(str(target))
    except OSError as err:
        warnings.warn(f"{what} unavailable, using Python: {err}", stacklevel=3)
        return None


__all__ = ["cache_dir", "load"]
