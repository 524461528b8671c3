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

from dataclasses import dataclass

import numpy as np

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


def grouped_percentiles(values: np.ndarray, key: np.ndarray, n_keys: int):
    """``(n_keys, 100)`` percentiles of ``values`` per integer ``key`` (one sort for all), and the
    mask of keys with no value (their row is zeros)."""
    values, key = np.asarray(values), np.asarray(key)
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
) -> tuple[np.ndarray, np.ndarray]:
    """The ``(L+1, TOKEN_DIM)`` tokens and ``(L+1, N_BUCKETS_IN)`` empty flags of one path.

    ``slowdown``/``size_bytes``/``a``/``b``/``foreground``: per (pseudo-)flow of the path scenario
    (flowSim slowdowns); ``config``: :meth:`NetConfig.vector`.
    """
    if not foreground.any():
        raise InputError("the path has no foreground flow", field="foreground")
    n_links = int(b[foreground][0])
    # one entry per (flow, token): token 0 for the foreground, k + 1 for each link k a
    # background (pseudo-)flow crosses
    bg = np.flatnonzero(~foreground)
    span = b[bg] - a[bg]
    row = np.concatenate([np.flatnonzero(foreground), np.repeat(bg, span)])
    step = np.arange(span.sum()) - np.repeat(np.cumsum(span) - span, span)
    token = np.concatenate(
        [np.zeros(foreground.sum(), dtype=np.int64), a[bg].repeat(span) + step + 1]
    )
    bucket = np.digitize(size_bytes[row], IN_EDGES)
    pct, empty = grouped_percentiles(
        slowdown[row], token * N_BUCKETS_IN + bucket, (n_links + 1) * N_BUCKETS_IN
    )
    out = np.empty((n_links + 1, TOKEN_DIM), dtype=np.float32)
    out[:, : N_BUCKETS_IN * N_PCT] = pct.reshape(n_links + 1, -1)
    out[:, N_BUCKETS_IN * N_PCT :] = config
    return out, empty.reshape(n_links + 1, N_BUCKETS_IN)


def targets(slowdown: np.ndarray, size_bytes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(4, 100)`` per-bucket percentiles of the foreground's slowdowns (empty: 1.0) and the
    ``(4,)`` mask of buckets that have flows."""
    pct, empty = bucket_percentiles(slowdown, size_bytes, OUT_EDGES)
    pct[empty] = 1.0
    return pct.astype(np.float32), ~empty
