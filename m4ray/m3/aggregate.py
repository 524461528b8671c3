"""From per-path percentile predictions to network-wide slowdown distributions
(``reference/flowsim_m3.md`` B.8), with the sampling noise of the estimate.

Paths are drawn ∝ their foreground flows (``RoutedFlows.sample``, with replacement): path ``p``
drawn ``n_p`` times, with ``N_p`` foreground flows of which ``cnt[p, b]`` fall in output bucket
``b``. Each draw stands for ``1 / n`` of the network's flows and brings its path's foreground
distribution, so within bucket ``b`` path ``p`` weighs ``n_p · cnt[p, b] / N_p`` (its 100
percentiles equally), and bucket ``b`` weighs ``w_b``: the network's own share of flows in
``b`` where the caller knows it (``bucket_share``: the estimate routes every flow, so it does),
else the draws' estimate ``Σ_p n_p · cnt[p, b] / N_p / n``. m3 draws 200,000 values from that
mixture and takes their quantiles; this module computes the mixture's quantiles exactly (a
weighted inverse CDF), which is what the draws estimate, without that extra noise.

Departure from m3 (B.8), which weighs a path within every bucket by ``n_p`` alone: that counts
a path's few flows of a bucket as if all its ``N_p`` flows were in it (a path with nine large
flows and one small one weighed ten times one with a single small flow in the small-flow
bucket), and it weighed buckets by the sampled paths' flows counted once per path.

:func:`bootstrap` gives the estimate's sampling noise: the draws resampled (multinomial, as
they were drawn) and the quantiles recomputed, without new paths.
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
    # what a sampled estimate was made of (:func:`aggregate`'s arguments), for :func:`bootstrap`
    sample: tuple | None = None


def _checked(pred, counts, draws, bucket_share):
    pred, counts, draws = np.asarray(pred), np.asarray(counts), np.asarray(draws, dtype=float)
    if pred.ndim != 3 or pred.shape[1:] != (N_BUCKETS_OUT, N_PCT) or len(pred) == 0:
        raise InputError(
            f"expected (paths > 0, 4, 100) predictions, got {pred.shape}", field="pred"
        )
    if counts.shape != pred.shape[:2] or draws.shape != pred.shape[:1]:
        raise InputError("counts must be (paths, 4) and draws (paths,)", field="counts")
    if counts.sum() <= 0:
        raise InputError("no foreground flow on any sampled path", field="counts")
    if (draws < 0).any() or draws.sum() <= 0:
        raise InputError("draws must be >= 0 and not all 0", field="draws")
    if bucket_share is not None:
        bucket_share = np.asarray(bucket_share, dtype=float)
        if bucket_share.shape != (N_BUCKETS_OUT,) or (bucket_share < 0).any():
            raise InputError(f"expected {N_BUCKETS_OUT} shares >= 0", field="bucket_share")
    return pred, counts.astype(float), draws, bucket_share


def _path_weights(counts: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """``(P, 4)``: each path's weight in each bucket, ``n_p · cnt[p, b] / N_p``."""
    n_fg = counts.sum(axis=1, keepdims=True)
    return draws[:, None] * counts / np.maximum(n_fg, 1)


def aggregate(
    pred: np.ndarray,
    counts: np.ndarray,
    draws: np.ndarray,
    bucket_share: np.ndarray | None = None,
) -> Estimate:
    """``pred`` ``(P, 4, 100)`` per-path percentiles, ``counts`` ``(P, 4)`` foreground flows per
    output bucket, ``draws`` ``(P,)`` sampling counts of each unique path; ``bucket_share``
    ``(4,)`` the network's flows per bucket (any scale; None: estimated from the draws)."""
    pred, counts, draws, share = _checked(pred, counts, draws, bucket_share)
    weight = _path_weights(counts, draws)
    if share is None:
        share = weight.sum(axis=0)
    share = share / share.sum()
    values, weights = [], []
    buckets, bucket_weight = {}, {}
    for b, name in enumerate(BUCKET_NAMES):
        used = counts[:, b] >= 1
        if not used.any() or share[b] <= 0:
            continue
        w = weight[used, b]
        point = np.repeat(w / (w.sum() * N_PCT), N_PCT)
        buckets[name] = Mixture(values=pred[used, b].reshape(-1), weights=point)
        bucket_weight[name] = float(share[b])
        values.append(pred[used, b].reshape(-1))
        weights.append(point * share[b])
    overall = Mixture(values=np.concatenate(values), weights=np.concatenate(weights))
    return Estimate(
        overall=overall,
        buckets=buckets,
        bucket_weight=bucket_weight,
        sample=(pred, counts, draws, bucket_share),
    )


def bootstrap(
    pred: np.ndarray,
    counts: np.ndarray,
    draws: np.ndarray,
    bucket_share: np.ndarray | None = None,
    *,
    levels: tuple[float, ...] = (0.5, 0.9, 0.99),
    n: int = 200,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """The estimate's quantiles at ``levels`` over ``n`` bootstrap replicates of its draws
    (multinomial over the sampled paths with the draws' frequencies, the same number of draws):
    ``{"overall" | bucket name: (n, len(levels))}``. Their spread is the sampling noise of
    :func:`aggregate`'s answer for these paths (not the model's error); for tail quantiles of
    few paths it is a rough guide (``bench/m3_sampling.py`` measures how rough)."""
    pred, counts, draws, share = _checked(pred, counts, draws, bucket_share)
    if n < 1:
        raise InputError(f"must be >= 1, got {n}", field="n")
    q = np.asarray(levels, dtype=float)
    # every pool (each bucket's, and all of them) sorted once: a replicate only reweighs points
    used = counts >= 1
    path, bucket = np.nonzero(used)  # one (path, bucket) per pool entry of 100 points
    values = pred[path, bucket].reshape(-1)
    path, bucket = np.repeat(path, N_PCT), np.repeat(bucket, N_PCT)
    order = np.argsort(values, kind="stable")
    values, path, bucket = values[order], path[order], bucket[order]
    in_bucket = {
        name: (b, np.flatnonzero(bucket == b))
        for b, name in enumerate(BUCKET_NAMES)
        if used[:, b].any()
    }
    rng = np.random.default_rng(seed)
    total = round(float(draws.sum()))
    out = {name: np.zeros((n, len(q))) for name in ("overall", *in_bucket)}

    def quantiles(v: np.ndarray, w: np.ndarray) -> np.ndarray:
        cum = np.cumsum(w)
        index = np.searchsorted(cum, q * cum[-1] - 1e-12, side="left")
        return v[np.minimum(index, len(v) - 1)]

    for r in range(n):
        weight = _path_weights(counts, rng.multinomial(total, draws / draws.sum()).astype(float))
        per_bucket = weight.sum(axis=0)
        rshare = per_bucket if share is None else share
        point = weight[path, bucket] / np.maximum(per_bucket[bucket], 1e-300)
        point = point * (rshare / rshare.sum())[bucket]
        for name, (b, at) in in_bucket.items():
            out[name][r] = quantiles(values[at], point[at]) if per_bucket[b] > 0 else np.nan
        out["overall"][r] = quantiles(values, point)
    return out


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


def bucket_counts(size_bytes: np.ndarray) -> np.ndarray:
    """``(4,)``: the flows per output bucket (a path's foreground counts; over every flow, the
    network's own shares for :func:`aggregate`)."""
    return np.bincount(np.digitize(size_bytes, OUT_EDGES), minlength=N_BUCKETS_OUT)
