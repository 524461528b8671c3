"""From per-path percentile predictions to network-wide slowdown distributions
(``reference/flowsim_m3.md`` B.8).

Each sampled path ``p`` (drawn ``n_p`` times) contributes its 100 predicted percentiles per output
bucket ``b`` where it has foreground flows (``cnt[p, b] >= 1``); within bucket ``b`` each
percentile point is one equally likely sample, weighted by ``n_p``. Bucket ``b`` weighs
``w_b = Σ_p cnt[p, b] / Σ_{p,b} cnt[p, b]`` in the network-wide mixture. m3 draws 200,000 values
from that mixture and takes their quantiles; this module computes the mixture's quantiles exactly
(a weighted inverse CDF), which is what the draws estimate, without sampling noise.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from m4ray.errors import InputError
from m4ray.models.m3_features import N_BUCKETS_OUT, N_PCT, OUT_EDGES

BUCKET_NAMES = ("<1KB", "1-10KB", "10-50KB", ">=50KB")
assert len(BUCKET_NAMES) == len(OUT_EDGES) + 1


@dataclass(kw_only=True, slots=True)
class Mixture:
    """A discrete distribution: ``values`` with ``weights`` summing to 1."""

    values: np.ndarray
    weights: np.ndarray

    def quantile(self, q: float | np.ndarray) -> np.ndarray:
        """Smallest value whose cumulative weight reaches ``q`` (0 < q <= 1)."""
        order = np.argsort(self.values, kind="stable")
        cum = np.cumsum(self.weights[order])
        index = np.searchsorted(cum, np.asarray(q) * cum[-1] - 1e-12, side="left")
        return self.values[order][np.minimum(index, len(order) - 1)]


@dataclass(kw_only=True, slots=True)
class Estimate:
    """Network-wide (``overall``) and per-output-bucket slowdown distributions."""

    overall: Mixture
    buckets: dict[str, Mixture]
    bucket_weight: dict[str, float]


def aggregate(pred: np.ndarray, counts: np.ndarray, draws: np.ndarray) -> Estimate:
    """``pred`` ``(P, 4, 100)`` per-path percentiles, ``counts`` ``(P, 4)`` foreground flows per
    output bucket, ``draws`` ``(P,)`` sampling counts of each unique path."""
    pred, counts, draws = np.asarray(pred), np.asarray(counts), np.asarray(draws, dtype=float)
    if pred.ndim != 3 or pred.shape[1:] != (N_BUCKETS_OUT, N_PCT) or len(pred) == 0:
        raise InputError(
            f"expected (paths > 0, 4, 100) predictions, got {pred.shape}", field="pred"
        )
    if counts.shape != pred.shape[:2] or draws.shape != pred.shape[:1]:
        raise InputError("counts must be (paths, 4) and draws (paths,)", field="counts")
    total = counts.sum()
    if total <= 0:
        raise InputError("no foreground flow on any sampled path", field="counts")
    values, weights = [], []
    buckets, bucket_weight = {}, {}
    for b, name in enumerate(BUCKET_NAMES):
        used = counts[:, b] >= 1
        if not used.any():
            continue
        w_b = counts[:, b].sum() / total
        point = np.repeat(draws[used] / (draws[used].sum() * N_PCT), N_PCT)
        buckets[name] = Mixture(values=pred[used, b].reshape(-1), weights=point)
        bucket_weight[name] = float(w_b)
        values.append(pred[used, b].reshape(-1))
        weights.append(point * w_b)
    overall = Mixture(values=np.concatenate(values), weights=np.concatenate(weights))
    return Estimate(overall=overall, buckets=buckets, bucket_weight=bucket_weight)


def empirical(slowdown: np.ndarray, size_bytes: np.ndarray) -> Estimate:
    """The same summary of measured per-flow slowdowns (ns-3, flowSim): equal weight per flow."""
    bucket = np.digitize(size_bytes, OUT_EDGES)
    n = len(slowdown)
    if n == 0:
        raise InputError("no flows", field="slowdown")
    buckets, bucket_weight = {}, {}
    for b, name in enumerate(BUCKET_NAMES):
        mask = bucket == b
        if mask.any():
            buckets[name] = Mixture(
                values=slowdown[mask], weights=np.full(mask.sum(), 1 / mask.sum())
            )
            bucket_weight[name] = float(mask.sum() / n)
    overall = Mixture(values=np.asarray(slowdown, float), weights=np.full(n, 1 / n))
    return Estimate(overall=overall, buckets=buckets, bucket_weight=bucket_weight)
