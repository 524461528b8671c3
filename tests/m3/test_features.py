"""Feature tokens, targets and the aggregation of per-path percentiles."""

from __future__ import annotations

import numpy as np
import pytest

from m4ray.errors import InputError
from m4ray.m3.aggregate import aggregate, bootstrap, empirical
from m4ray.models.m3_features import (
    CONFIG_FIELDS,
    IN_EDGES,
    N_BUCKETS_IN,
    N_CONFIG,
    N_PCT,
    TOKEN_DIM,
    NetConfig,
    percentiles,
    targets,
    tokens,
)


def test_nearest_percentiles():
    values = np.arange(1, 11, dtype=float)  # 10 values
    pct = percentiles(values)
    assert pct.shape == (100,)
    assert pct[0] == 1 and pct[-1] == 10 and pct[49] == np.percentile(values, 50, method="nearest")
    assert set(pct) <= set(values)  # nearest rank: only observed values


def _path():
    # L = 4: fg (0,4); background (0,1) small, (1,3) mid, (2,4) big
    a = np.array([0, 0, 0, 1, 2])
    b = np.array([4, 4, 1, 3, 4])
    size = np.array([300, 20_000, 600, 4000, 60_000])
    slowdown = np.array([1.5, 2.0, 3.0, 4.0, 5.0])
    fg = np.array([True, True, False, False, False])
    return slowdown, size, a, b, fg


def test_token_shapes_and_empty_buckets():
    config = NetConfig(buffer_bytes=3e5, window_bytes=1.5e4, ecn_k_bytes=1e4).vector(
        4, np.array([10e9, 40e9, 40e9, 10e9]), 15_000
    )
    assert config.shape == (N_CONFIG,) == (len(CONFIG_FIELDS),)
    tok, empty = tokens(*_path(), config)
    assert tok.shape == (5, TOKEN_DIM) and empty.shape == (5, N_BUCKETS_IN)
    # token 0: fg flows of 300 B (bucket 1) and 20 KB (bucket 8)
    assert np.flatnonzero(~empty[0]).tolist() == [1, 8]
    assert (tok[0, 100:200] == 1.5).all() and (tok[0, 800:900] == 2.0).all()
    assert (tok[0, :100] == 0).all()  # empty bucket: zeros, flagged
    # link 0: the (0,1) 600 B flow; link 1: the (1,3) flow; link 2: (1,3) and (2,4); link 3: (2,4)
    assert np.flatnonzero(~empty[1]).tolist() == [2]
    assert np.flatnonzero(~empty[3]).tolist() == [5, 9]
    assert np.flatnonzero(~empty[4]).tolist() == [9] and (tok[4, 900:1000] == 5.0).all()
    assert (tok[:, N_BUCKETS_IN * N_PCT :] == config.astype(np.float32)).all()
    assert (
        config[CONFIG_FIELDS.index("hops4")] == 1 and config[CONFIG_FIELDS.index("cc_dctcp")] == 1
    )


def test_tokens_equal_per_token_numpy_percentiles():
    """The one-sort token builder against numpy's own nearest-rank percentiles, token by token."""
    rng = np.random.default_rng(5)
    n_links, n = 6, 4000
    a = rng.integers(0, n_links, n)
    b = np.array([rng.integers(x + 1, n_links + 1) for x in a])
    fg = (a == 0) & (b == n_links)
    size = rng.integers(50, 120_000, n)
    slowdown = 1 + rng.pareto(1.5, n)
    tok, empty = tokens(slowdown, size, a, b, fg, np.zeros(N_CONFIG))
    groups = [fg] + [~fg & (a <= k) & (k < b) for k in range(n_links)]
    for t, mask in enumerate(groups):
        bucket = np.digitize(size[mask], IN_EDGES)
        for k in range(N_BUCKETS_IN):
            values = slowdown[mask][bucket == k]
            assert empty[t, k] == (len(values) == 0)
            expected = (
                np.percentile(values, np.arange(1, 101), method="nearest") if len(values) else 0
            )
            np.testing.assert_array_equal(tok[t, k * N_PCT : (k + 1) * N_PCT], np.float32(expected))


def test_targets_mask_empty_output_buckets():
    target, mask = targets(np.array([1.2, 1.4, 3.0]), np.array([500, 700, 70_000]))
    assert target.shape == (4, 100) and mask.tolist() == [True, False, False, True]
    assert (target[1] == 1.0).all() and target[3, -1] == 3.0 and target[0, 0] == 1.2


def test_bad_inputs():
    with pytest.raises(InputError, match="congestion control 'cubic'"):
        NetConfig(buffer_bytes=1, window_bytes=1, ecn_k_bytes=1, cc="cubic")
    with pytest.raises(InputError, match="3 links"):
        NetConfig(buffer_bytes=1, window_bytes=1, ecn_k_bytes=1).vector(3, np.ones(3), 1.0)
    slowdown, size, a, b, _ = _path()
    with pytest.raises(InputError, match="no foreground"):
        tokens(slowdown, size, a, b, np.zeros(5, dtype=bool), np.zeros(N_CONFIG))


def test_aggregation_gives_the_mixture_quantiles():
    """Path A: 3 fg flows < 1 KB, percentiles 1..100; path B: 1 fg flow in 1-10 KB, 101..200.
    With the network's bucket shares (3:1), the overall mixture = 0.75 × U{1..100} + 0.25 ×
    U{101..200}."""
    pred = np.ones((2, 4, 100))
    pred[0, 0] = np.arange(1, 101)
    pred[1, 1] = np.arange(101, 201)
    counts = np.array([[3, 0, 0, 0], [0, 1, 0, 0]])
    est = aggregate(pred, counts, draws=np.array([5, 1]), bucket_share=np.array([3, 1, 0, 0]))
    assert est.bucket_weight == {"<1KB": 0.75, "1-10KB": 0.25}
    assert est.overall.quantile(0.5) == 67  # 0.5 / 0.75 of the first pool
    assert est.overall.quantile(0.99) == 196  # (0.99 - 0.75) / 0.25 = 0.96 of the second
    assert est.buckets["1-10KB"].quantile(0.99) == 199 and est.buckets["1-10KB"].quantile(1) == 200
    # without them, the draws estimate the shares: 5 draws of A's flows, 1 of B's
    drawn = aggregate(pred, counts, draws=np.array([5, 1]))
    assert drawn.bucket_weight == pytest.approx({"<1KB": 5 / 6, "1-10KB": 1 / 6})
    # draws weight paths within a bucket: A twice as likely as C in bucket 0
    pred2 = np.ones((2, 4, 100))
    pred2[0, 0], pred2[1, 0] = 1.0, 3.0
    est2 = aggregate(pred2, np.array([[1, 0, 0, 0], [1, 0, 0, 0]]), draws=np.array([2, 1]))
    assert est2.overall.quantile(0.66) == 1.0 and est2.overall.quantile(0.67) == 3.0


def test_a_path_weighs_in_a_bucket_by_its_flows_there():
    """Path A: 9 flows >= 50 KB and 1 < 1 KB (slowdown 5), drawn 10 times (∝ its 10 flows);
    path B: 1 flow < 1 KB (slowdown 1), drawn once. The network's small flows are one of each,
    so the small-flow bucket is half 5, half 1 (weighing A by its draws alone made it 10:1)."""
    pred = np.ones((2, 4, 100))
    pred[0, 0], pred[0, 3], pred[1, 0] = 5.0, 2.0, 1.0
    counts = np.array([[1, 0, 0, 9], [1, 0, 0, 0]])
    small = aggregate(pred, counts, draws=np.array([10, 1])).buckets["<1KB"]
    assert small.quantile(0.5) == 1.0 and small.quantile(0.51) == 5.0


def test_bootstrap_resamples_the_draws():
    pred = np.ones((3, 4, 100))
    pred[:, 0] = np.arange(1, 101) * np.array([1.0, 2.0, 4.0])[:, None]
    counts = np.array([[2, 0, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0]])
    draws = np.array([4, 2, 2])
    boot = bootstrap(pred, counts, draws, n=300, seed=7)
    assert set(boot) == {"overall", "<1KB"} and boot["overall"].shape == (300, 3)
    np.testing.assert_array_equal(
        boot["overall"], bootstrap(pred, counts, draws, n=300, seed=7)["overall"]
    )
    p99 = float(aggregate(pred, counts, draws).overall.quantile(0.99))
    spread = boot["overall"][:, 2]
    assert spread.min() < p99 < spread.max()  # the replicates move around the estimate
    assert np.all(spread >= 99) and np.all(spread <= 400)  # within the paths' values
    # one path: nothing to resample
    one = bootstrap(pred[:1], counts[:1], draws[:1], n=20)
    assert np.all(
        one["<1KB"]
        == aggregate(pred[:1], counts[:1], draws[:1])
        .buckets["<1KB"]
        .quantile(np.array([0.5, 0.9, 0.99]))
    )
    with pytest.raises(InputError, match="draws"):
        bootstrap(pred, counts, np.zeros(3))


def test_empirical_matches_nearest_rank():
    values = np.arange(1.0, 101.0)
    est = empirical(values, np.full(100, 500))
    assert est.overall.quantile(0.99) == 99 and est.buckets["<1KB"].quantile(1.0) == 100


def test_aggregate_rejects_empty_samples():
    with pytest.raises(InputError, match="paths > 0"):
        aggregate(np.zeros((0, 4, 100)), np.zeros((0, 4)), np.zeros(0))
    with pytest.raises(InputError, match="no foreground"):
        aggregate(np.ones((1, 4, 100)), np.zeros((1, 4)), np.ones(1))


def test_summary_gives_the_sampling_range_of_sampled_estimates():
    from m4ray.m3.estimate import summary

    rng = np.random.default_rng(3)
    pred = np.sort(1 + rng.exponential(size=(40, 4, 100)), axis=2)
    counts = rng.integers(0, 3, size=(40, 4))
    counts[:, 0] += 1
    sampled = aggregate(pred, counts, rng.integers(1, 4, size=40), np.array([5, 3, 2, 1]))
    measured = empirical(1 + rng.exponential(size=500), rng.integers(50, 200_000, size=500))
    frame = summary({"m3": sampled, "ns3": measured}, {}, replicates=50, seed=1)
    mine = frame[frame.method == "m3"]
    assert (mine.p99_lo <= mine.p99_hi).all() and mine.p99_lo.notna().all()
    assert frame[frame.method == "ns3"].p99_lo.isna().all()  # measured: nothing was sampled
    ref = frame[frame.method == "ns3"].set_index("bucket").p99
    np.testing.assert_allclose(mine.err_lo, mine.p99_lo / mine.bucket.map(ref) - 1)
    again = summary({"m3": sampled, "ns3": measured}, {}, replicates=50, seed=1)
    assert frame.equals(again)  # a seeded bootstrap
    assert "p99_lo" not in summary({"m3": sampled}, {}, replicates=0)
