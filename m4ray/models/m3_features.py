"""m3's input tokens and targets (``reference/flowsim_m3.md`` B.5, B.7).

A path scenario becomes ``L + 1`` tokens of ``N_BUCKETS_IN × N_PCT + N_CONFIG`` floats: token 0
holds flowSim's slowdown percentiles of the foreground flows, token ``k`` (1..L) those of the
background flows crossing path link ``k - 1``; each is 10 size buckets × 100 percentiles
(bucket-major, numpy ``method="nearest"``) followed by the network/CC config vector. A bucket with
no flow is zeros in the token and flagged in ``empty`` (the model puts a learned vector there).
Targets are the foreground flows' packet-level slowdown percentiles in 4 output buckets (empty: 1.0,
masked). The bucket edges are m3's (MTU = 1 KB, BDP = 10 KB): they are the model's I/O contract.

Config vector (:data:`CONFIG_FIELDS`; scaled to order 1, unlike m3's raw values): hop-count one-hot
(2/4/6 links), path BDP in packets / 10, core/edge rate ratio / 4, buffer (MB), window (10 KB),
PFC on, CC one-hot (:data:`CCS`), DCTCP marking threshold K (10 KB).

Units: bytes.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from m4ray import native
from m4ray.errors import InputError, choice_error

IN_EDGES = np.array([250, 500, 750, 1000, 2000, 5000, 7500, 10000, 50000])  # bytes
OUT_EDGES = np.array([1000, 10000, 50000])  # bytes: (0,1K) [1K,10K) [10K,50K) [50K,inf)
N_BUCKETS_IN = len(IN_EDGES) + 1
N_BUCKETS_OUT = len(OUT_EDGES) + 1
N_PCT = 100
HOPS = (2, 4, 6)
CCS = ("dctcp", "dcqcn", "hpcc", "timely")  # m3's one-hot (m4ray.sim.ns3.cc runs all four)
CONFIG_FIELDS = (
    *(f"hops{h}" for h in HOPS),
    "bdp_pkts_10",
    "core_ratio_4",
    "buffer_mb",
    "window_10kb",
    "pfc",
    *(f"cc_{c}" for c in CCS),
    "ecn_k_10kb",
)
N_CONFIG = len(CONFIG_FIELDS)
TOKEN_DIM = N_BUCKETS_IN * N_PCT + N_CONFIG


@dataclass(kw_only=True, slots=True)
class NetConfig:
    """The network/CC settings a path was simulated under (bytes, bits/s)."""

    buffer_bytes: float
    window_bytes: float
    ecn_k_bytes: float
    pfc: bool = True
    cc: str = "dctcp"

    def __post_init__(self) -> None:
        if self.cc not in CCS:
            raise choice_error("congestion control", self.cc, CCS)

    def vector(self, n_links: int, capacity_bps: np.ndarray, bdp_bytes: float) -> np.ndarray:
        """The :data:`CONFIG_FIELDS` vector of this config on a path of ``n_links``."""
        if n_links not in HOPS:
            raise InputError(f"paths of {n_links} links; m3 knows {HOPS}", field="path")
        edge = min(capacity_bps[0], capacity_bps[-1])
        vec = np.zeros(N_CONFIG)
        vec[HOPS.index(n_links)] = 1.0
        vec[3] = bdp_bytes / 1000 / 10
        vec[4] = float(max(capacity_bps)) / edge / 4
        vec[5] = self.buffer_bytes / 1e6
        vec[6] = self.window_bytes / 1e4
        vec[7] = float(self.pfc)
        vec[8 + CCS.index(self.cc)] = 1.0
        vec[-1] = self.ecn_k_bytes / 1e4
        return vec


_QUANTILES = np.arange(1, N_PCT + 1) / 100


def nearest_ranks(n: np.ndarray | int) -> np.ndarray:
    """Indices into ``n`` sorted values of the 1st..100th percentiles, nearest rank: numpy's
    ``method='nearest'`` (round half to even), shape ``(*shape(n), 100)``."""
    n = np.asarray(n)
    return np.around((n[..., None] - 1) * _QUANTILES).astype(np.int64)


def percentiles(values: np.ndarray) -> np.ndarray:
    """The 1st..100th percentiles, nearest rank (m3's ``method='nearest'``)."""
    return np.sort(values)[nearest_ranks(len(values))]


@functools.cache
def library() -> ctypes.CDLL | None:
    """The compiled token percentiles (``_tokens.c``), or ``None`` (one warning) where they
    cannot be built: the numpy below is the reference and the fallback."""
    lib = native.load(Path(__file__).with_name("_tokens.c"), "compiled m3 tokens")
    if lib is None:
        return None
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.m4ray_grouped_pct.restype = ctypes.c_int
    lib.m4ray_grouped_pct.argtypes = [i64, ptr, ptr, i64, ptr, ptr]
    lib.m4ray_token_entries.restype = i64
    lib.m4ray_token_entries.argtypes = [i64, ptr, ptr, ptr, ptr, ptr, i64, ptr, ptr, ptr]
    return lib


def grouped_percentiles(values: np.ndarray, key: np.ndarray, n_keys: int, *, compiled: bool = True):
    """``(n_keys, 100)`` percentiles of ``values`` per integer ``key`` (``0 <= key < n_keys``),
    and the mask of keys with no value (their row is zeros). Compiled where it builds (a
    counting sort by key, then each key's values sorted: the same values as the numpy below,
    ``compiled=False``, which sorts once for all)."""
    values, key = np.asarray(values), np.asarray(key)
    lib = library() if compiled else None
    if lib is not None and not np.isnan(values).any():
        return _grouped_compiled(lib, values, key, n_keys)
    # by value, then stably by key (np.lexsort's order; ties are equal values, so any order
    # among them reads the same): a small-int key sorts by radix, 4x faster than lexsort
    by_value = np.argsort(values)
    small = key.astype(np.int16) if n_keys <= np.iinfo(np.int16).max else key
    ordered = values[by_value[np.argsort(small[by_value], kind="stable")]]
    count = np.bincount(key, minlength=n_keys)
    offset = np.concatenate([[0], np.cumsum(count)[:-1]])
    empty = count == 0
    out = np.zeros((n_keys, N_PCT))
    full = ~empty
    out[full] = ordered[offset[full, None] + nearest_ranks(count[full])]
    return out, empty


def _grouped_compiled(lib, values: np.ndarray, key: np.ndarray, n_keys: int):
    values = np.ascontiguousarray(values, dtype=np.float64)
    key = np.ascontiguousarray(key, dtype=np.int64)
    if len(key) and (key.min() < 0 or key.max() >= n_keys):
        raise InputError(f"keys must lie in 0..{n_keys - 1}", field="key")
    out = np.empty((n_keys, N_PCT))
    empty = np.empty(n_keys, dtype=np.uint8)
    rc = lib.m4ray_grouped_pct(
        len(values), values.ctypes.data, key.ctypes.data, n_keys, out.ctypes.data,
        empty.ctypes.data,
    )  # fmt: skip
    if rc:
        raise MemoryError("compiled m3 tokens: out of memory")
    return out, empty.astype(bool)


def bucket_percentiles(
    values: np.ndarray, size_bytes: np.ndarray, edges: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(len(edges)+1, 100)`` percentiles of ``values`` per size bucket, and the empty mask."""
    return grouped_percentiles(values, np.digitize(size_bytes, edges), len(edges) + 1)


def tokens(  # noqa: PLR0917 (the path's columns, in their natural order)
    slowdown: np.ndarray,
    size_bytes: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
    foreground: np.ndarray,
    config: np.ndarray,
    *,
    compiled: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """The ``(L+1, TOKEN_DIM)`` tokens and ``(L+1, N_BUCKETS_IN)`` empty flags of one path.

    ``slowdown``/``size_bytes``/``a``/``b``/``foreground``: per (pseudo-)flow of the path scenario
    (flowSim slowdowns); ``config``: :meth:`NetConfig.vector`. Compiled where it builds
    (``compiled=False``: the numpy reference, equal value for value).
    """
    if not foreground.any():
        raise InputError("the path has no foreground flow", field="foreground")
    n_links = int(b[foreground][0])
    n_keys = (n_links + 1) * N_BUCKETS_IN
    lib = library() if compiled else None
    if lib is not None and not np.isnan(slowdown).any():
        values, keys = _token_entries(lib, slowdown, size_bytes, a, b, foreground=foreground)
        pct, empty = _grouped_compiled(lib, values, keys, n_keys)
    else:
        pct, empty = _tokens_numpy(slowdown, size_bytes, a, b, foreground=foreground, n_keys=n_keys)
    out = np.empty((n_links + 1, TOKEN_DIM), dtype=np.float32)
    out[:, : N_BUCKETS_IN * N_PCT] = pct.reshape(n_links + 1, -1)
    out[:, N_BUCKETS_IN * N_PCT :] = config
    return out, empty.reshape(n_links + 1, N_BUCKETS_IN)


def _token_entries(lib, slowdown, size_bytes, a, b, *, foreground):
    """(value, key) per (flow, token), compiled (:func:`_tokens_numpy`'s, in another order)."""
    columns = [
        np.ascontiguousarray(slowdown, dtype=np.float64),
        np.ascontiguousarray(size_bytes, dtype=np.int64),
        np.ascontiguousarray(a, dtype=np.int64),
        np.ascontiguousarray(b, dtype=np.int64),
        np.ascontiguousarray(foreground, dtype=np.uint8),
    ]
    bg = columns[4] == 0
    n_entries = int(np.count_nonzero(~bg) + (columns[3][bg] - columns[2][bg]).sum())
    values, keys = np.empty(n_entries), np.empty(n_entries, dtype=np.int64)
    written = lib.m4ray_token_entries(
        len(columns[0]), *(c.ctypes.data for c in columns), len(IN_EDGES),
        _IN_EDGES_F64.ctypes.data, values.ctypes.data, keys.ctypes.data,
    )  # fmt: skip
    assert written == n_entries
    return values, keys


_IN_EDGES_F64 = IN_EDGES.astype(np.float64)


def _tokens_numpy(slowdown, size_bytes, a, b, *, foreground, n_keys):
    """The reference grouping: one entry per (flow, token), token 0 for the foreground, k + 1
    for each link k a background (pseudo-)flow crosses, keyed by token and size bucket."""
    bg = np.flatnonzero(~foreground)
    span = b[bg] - a[bg]
    row = np.concatenate([np.flatnonzero(foreground), np.repeat(bg, span)])
    step = np.arange(span.sum()) - np.repeat(np.cumsum(span) - span, span)
    token = np.concatenate(
        [np.zeros(foreground.sum(), dtype=np.int64), a[bg].repeat(span) + step + 1]
    )
    bucket = np.digitize(size_bytes[row], IN_EDGES)
    return grouped_percentiles(slowdown[row], token * N_BUCKETS_IN + bucket, n_keys, compiled=False)


def targets(slowdown: np.ndarray, size_bytes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(4, 100)`` per-bucket percentiles of the foreground's slowdowns (empty: 1.0) and the
    ``(4,)`` mask of buckets that have flows."""
    pct, empty = bucket_percentiles(slowdown, size_bytes, OUT_EDGES)
    pct[empty] = 1.0
    return pct.astype(np.float32), ~empty
