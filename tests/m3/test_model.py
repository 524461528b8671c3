"""m3 model: shapes, padding invariance, the loss, and overfitting one batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from m4ray.models.m3 import M3Model, M3ModelConfig, loss_fn
from m4ray.models.m3_features import N_BUCKETS_IN, TOKEN_DIM

TINY = M3ModelConfig(dim=32, layers=2, heads=2, ffn=64, mlp=64)


def _batch(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    b, t = len(lengths), max(lengths)
    links = torch.rand(b, t, TOKEN_DIM, generator=g) * 3 + 1
    empty = torch.rand(b, t, N_BUCKETS_IN, generator=g) < 0.3
    for i, n in enumerate(lengths):
        links[i, n:] = 0
    fg = torch.rand(b, TOKEN_DIM, generator=g) * 3 + 1
    fg_empty = torch.rand(b, N_BUCKETS_IN, generator=g) < 0.3
    baseline = 1 + torch.rand(b, 4, 100, generator=g)
    return fg, fg_empty, links, empty, torch.tensor(lengths), baseline


def test_shapes_and_offset():
    torch.manual_seed(0)
    model = M3Model(TINY).eval()
    out = model(*_batch([2, 4, 6]))
    assert out.shape == (3, 4, 100)
    assert torch.isfinite(out).all()


def test_padding_does_not_change_a_path():
    torch.manual_seed(0)
    model = M3Model(TINY).eval()
    fg, fg_empty, links, empty, lengths, base = _batch([2, 6])
    together = model(fg, fg_empty, links, empty, lengths, base)
    alone = model(fg[:1], fg_empty[:1], links[:1, :2], empty[:1, :2], lengths[:1], base[:1])
    torch.testing.assert_close(together[:1], alone, rtol=1e-5, atol=1e-5)


def test_empty_buckets_use_the_learned_vector():
    torch.manual_seed(0)
    model = M3Model(TINY).eval()
    fg, fg_empty, links, empty, lengths, baseline = _batch([4])
    base = model(fg, fg_empty, links, empty, lengths, baseline)
    scrambled = links.clone().view(1, 4, -1)
    block = scrambled[..., : N_BUCKETS_IN * 100].view(1, 4, N_BUCKETS_IN, 100)
    block[empty] = 123.0  # whatever sits in an empty bucket is ignored
    torch.testing.assert_close(model(fg, fg_empty, scrambled, empty, lengths, baseline), base)


def test_residual_scales_path_flowsim_and_plain_m3_does_not_need_it():
    torch.manual_seed(0)
    batch = _batch([2, 4])
    residual = M3Model(TINY).eval()
    with torch.no_grad():
        ratio = residual(*batch) / batch[-1]
        torch.testing.assert_close(residual(*batch[:-1], 2 * batch[-1]) / (2 * batch[-1]), ratio)
    plain = M3Model(M3ModelConfig(**{**TINY.to_dict(), "residual": False})).eval()
    assert plain(*batch[:-1]).shape == (2, 4, 100)


def test_loss_masks_buckets_but_keeps_the_denominator():
    pred = torch.full((1, 4, 100), 2.0)
    target = torch.ones(1, 4, 100)
    mask = torch.tensor([[True, False, False, False]])
    assert loss_fn(pred, target, mask).item() == 0.25


def test_overfits_one_batch():
    torch.manual_seed(0)
    np.random.seed(0)
    model = M3Model(TINY)
    batch = _batch([2, 4, 6, 4])
    target = (
        1 + torch.rand(4, 4, 100, generator=torch.Generator().manual_seed(1)).sort(-1).values * 5
    )
    mask = torch.tensor([[1, 1, 0, 1]] * 4, dtype=torch.bool)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = loss_fn(model(*batch), target, mask).item()
    for _ in range(300):
        opt.zero_grad()
        loss = loss_fn(model(*batch), target, mask)
        loss.backward()
        opt.step()
    assert loss.item() < 0.05 < first


def test_mixture_loss_compares_the_mixtures_not_each_path():
    """The mixture loss is zero when the predicted mixture is the target's, even though every
    path is wrong (two paths swapped), is positive when the tail shrinks, and its gradient
    reaches the predictions; its quantiles are the estimate's (Mixture.quantile)."""
    from m4ray.m3.aggregate import Mixture
    from m4ray.models.m3 import MIXTURE_LEVELS, loss_fn, mixture_loss, mixture_quantiles

    rng = np.random.default_rng(0)
    target = torch.from_numpy(np.sort(rng.uniform(1, 5, (6, 4, 100)), axis=-1))
    mask = torch.ones(6, 4, dtype=torch.bool)
    weight = torch.full((6,), 3.0)
    swapped = target[[1, 0, 2, 3, 4, 5]]
    assert float(mixture_loss(swapped, target, mask, weight)) == 0.0
    assert float(loss_fn(swapped, target, mask)) > 0.01  # per path it is wrong
    shrunk = (target * 0.8).requires_grad_()
    loss = mixture_loss(shrunk, target, mask, weight)
    assert float(loss) == pytest.approx(-np.log(0.8), rel=1e-6)
    loss.backward()
    assert shrunk.grad is not None and float(shrunk.grad.abs().sum()) > 0
    w = torch.from_numpy(rng.uniform(1, 10, 6))
    values = target[:, 0]
    levels = torch.tensor(MIXTURE_LEVELS, dtype=values.dtype)
    ours = mixture_quantiles(values, w, levels).numpy()
    points = np.repeat(w.numpy() / 100, 100)
    theirs = Mixture(values=values.reshape(-1).numpy(), weights=points).quantile(
        np.array(MIXTURE_LEVELS)
    )
    np.testing.assert_allclose(ours, theirs)


def test_mixture_loss_weighs_paths_per_bucket():
    """A ``(P, 4)`` weight weighs each path in each bucket on its own: equal columns give the
    ``(P,)`` loss; a path weighted out of a bucket no longer counts there."""
    from m4ray.models.m3 import mixture_loss

    rng = np.random.default_rng(1)
    target = torch.from_numpy(np.sort(rng.uniform(1, 5, (5, 4, 100)), axis=-1))
    mask = torch.ones(5, 4, dtype=torch.bool)
    weight = torch.from_numpy(rng.uniform(1, 4, 5))
    pred = target * torch.from_numpy(rng.uniform(0.7, 1.3, (5, 4, 1)))
    flat = mixture_loss(pred, target, mask, weight)
    assert float(mixture_loss(pred, target, mask, weight[:, None].expand(5, 4))) == float(flat)
    # path 0 wrong by 2x in bucket 0 only, then weighted out of it
    wrong = target.clone()
    wrong[0, 0] *= 2
    per_bucket = weight[:, None].repeat(1, 4)
    assert float(mixture_loss(wrong, target, mask, per_bucket)) > 0.01
    per_bucket[0, 0] = 0.0
    assert float(mixture_loss(wrong, target, mask, per_bucket)) < 1e-6


def test_a_soup_is_the_mean_of_its_members_weights():
    from m4ray.models.m3 import M3Model, M3ModelConfig
    from m4ray.sweeps.train_m3 import mean_state

    cfg = M3ModelConfig(dim=16, layers=1, heads=2, ffn=16, mlp=16)
    torch.manual_seed(0)
    a, b = M3Model(cfg).state_dict(), M3Model(cfg).state_dict()
    soup = M3Model(cfg)
    soup.load_state_dict(mean_state([a, b]))
    for name, value in soup.state_dict().items():
        torch.testing.assert_close(value, (a[name] + b[name]) / 2)
    assert not torch.equal(a["embed.weight"], b["embed.weight"])
