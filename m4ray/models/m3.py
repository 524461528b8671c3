"""m3's model: a causal llama-style transformer over a path's link tokens and an MLP that maps the
foreground token plus the path context to the foreground's slowdown percentiles
(``reference/flowsim_m3.md`` B.6). Architecture only.

Shapes: ``links`` ``(B, L, TOKEN_DIM)`` right-padded with ``lengths`` ``(B,)``; ``links_empty``
``(B, L, 10)``; ``fg`` ``(B, TOKEN_DIM)``; ``fg_empty`` ``(B, 10)``; ``baseline`` ``(B, 4, 100)``
(path flowSim's foreground percentiles in the output buckets, empty = 1). Output ``(B, 4, 100)``.

Empty input buckets get a learned 100-vector; the context is the mean of the transformer outputs
over a path's real link tokens (causal attention on right-padded sequences never looks at the
padding, so one padded batch gives every path the answer it gets alone); prediction = MLP + 1
(m3), or by default ``baseline × (MLP + 1)``: a correction of path flowSim, which learns from
few lots what m3 learns from 120,000 (:class:`M3ModelConfig`).
The paper's sizes are ``dim 576, layers 4, heads 4, ffn 1536, mlp 512``; :class:`M3ModelConfig`
defaults to a CPU-sized flavour.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch import nn
from torch.nn import functional

from m4ray.models.m3_features import N_BUCKETS_IN, N_BUCKETS_OUT, N_PCT, TOKEN_DIM


@dataclass(kw_only=True, slots=True)
class M3ModelConfig:
    """Model sizes (the paper: 576 / 4 / 4 / 1536 / 512, dropout 0.2)."""

    dim: int = 128
    layers: int = 2
    heads: int = 4
    ffn: int = 384
    mlp: int = 256
    dropout: float = 0.0
    max_links: int = 16
    # predict path flowSim's foreground percentiles × (1 + MLP) instead of m3's 1 + MLP: measured
    # on held-out lots (1,600 training lots, same model and epochs) p99 error 0.165 vs 0.201
    residual: bool = True

    def to_dict(self) -> dict:
        return asdict(self)


class RMSNorm(nn.Module):
    r"""``x / rms(x) * w`` over the last dimension (eps 1e-5)."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """Rotary position embedding of ``(B, H, T, D)`` (``D`` even), positions ``0..T-1``."""
    _, _, t, d = x.shape
    freq = theta ** (-torch.arange(0, d, 2, dtype=x.dtype, device=x.device) / d)
    angle = torch.arange(t, dtype=x.dtype, device=x.device)[:, None] * freq[None, :]
    cos, sin = angle.cos(), angle.sin()
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


class Block(nn.Module):
    r"""``h = x + Attn(RMSNorm(x))``, ``out = h + SwiGLU(RMSNorm(h))`` with causal RoPE attention.

    **Shapes:** ``(B, T, dim) -> (B, T, dim)``.
    """

    def __init__(self, cfg: M3ModelConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.attn_norm, self.ffn_norm = RMSNorm(cfg.dim), RMSNorm(cfg.dim)
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim, bias=False)
        self.wo = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.w1 = nn.Linear(cfg.dim, cfg.ffn, bias=False)
        self.w2 = nn.Linear(cfg.ffn, cfg.dim, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.ffn, bias=False)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(b, t, 3, self.heads, -1).unbind(2)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        drop = self.dropout if self.training else 0.0
        att = functional.scaled_dot_product_attention(
            rope(q), rope(k), v, is_causal=True, dropout_p=drop
        )
        h = x + functional.dropout(
            self.wo(att.transpose(1, 2).reshape(b, t, d)), drop, self.training
        )
        z = self.ffn_norm(h)
        return h + functional.dropout(
            self.w2(functional.silu(self.w1(z)) * self.w3(z)), drop, self.training
        )


class M3Model(nn.Module):
    """Transformer over link tokens + MLP head (see the module docstring)."""

    def __init__(self, cfg: M3ModelConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg = cfg or M3ModelConfig()
        if cfg.dim % cfg.heads or (cfg.dim // cfg.heads) % 2:
            raise ValueError("dim must split into heads of even size")
        self.empty_vec = nn.Parameter(torch.zeros(N_PCT))
        self.embed = nn.Linear(TOKEN_DIM, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.dim)
        self.out = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.head = nn.Sequential(
            nn.Linear(TOKEN_DIM + cfg.dim, cfg.mlp),
            nn.ReLU(),
            nn.Linear(cfg.mlp, cfg.mlp),
            nn.ReLU(),
            nn.Linear(cfg.mlp, N_BUCKETS_OUT * N_PCT),
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = (
                    0.02 / math.sqrt(2 * self.cfg.layers)
                    if name.endswith(("wo.weight", "w3.weight"))
                    else 0.02
                )
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
        nn.init.ones_(self.empty_vec)

    def _fill(self, tok: torch.Tensor, empty: torch.Tensor) -> torch.Tensor:
        """Tokens with every empty bucket's 100 percentiles set to the learned vector."""
        shape = tok.shape[:-1]
        pct = tok[..., : N_BUCKETS_IN * N_PCT].reshape(*shape, N_BUCKETS_IN, N_PCT)
        pct = torch.where(empty[..., None], self.empty_vec.to(tok.dtype), pct)
        return torch.cat([pct.reshape(*shape, -1), tok[..., N_BUCKETS_IN * N_PCT :]], dim=-1)

    def forward(  # noqa: PLR0917 (the tensors of Lots.tensors, in order)
        self,
        fg: torch.Tensor,
        fg_empty: torch.Tensor,
        links: torch.Tensor,
        links_empty: torch.Tensor,
        lengths: torch.Tensor,
        baseline: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x = self.embed(self._fill(links, links_empty))
        x = functional.dropout(x, self.cfg.dropout, self.training)
        for block in self.blocks:
            x = block(x)
        x = self.out(self.norm(x))
        valid = torch.arange(x.shape[1], device=x.device)[None, :] < lengths[:, None]
        context = (x * valid[..., None]).sum(1) / lengths[:, None].to(x.dtype)
        y = self.head(torch.cat([self._fill(fg, fg_empty), context], dim=-1))
        y = y.view(-1, N_BUCKETS_OUT, N_PCT) + 1.0
        if not self.cfg.residual:
            return y
        if baseline is None:
            raise ValueError("a residual m3 needs path flowSim's foreground percentiles")
        return baseline.to(y.dtype) * y


# the mixture's quantiles a mixture loss compares (the tail the estimate reports, and its body)
MIXTURE_LEVELS = (0.5, 0.75, 0.9, 0.95, 0.99, 0.995)


def mixture_quantiles(values: torch.Tensor, weight: torch.Tensor, levels: torch.Tensor):
    """Quantiles of a mixture of paths: ``values`` ``(P, 100)`` each path's percentiles (100
    equal points), ``weight`` ``(P,)`` each path's weight; the smallest point whose cumulative
    weight reaches each level (:meth:`m4ray.m3.aggregate.Mixture.quantile`), differentiable in
    the values."""
    flat = values.reshape(-1)
    point = (weight[:, None] / values.shape[1]).expand_as(values).reshape(-1)
    ordered, order = torch.sort(flat)
    cum = torch.cumsum(point[order], 0)
    index = torch.searchsorted(cum, levels * cum[-1] - 1e-12).clamp(max=len(ordered) - 1)
    return ordered[index]


def mixture_loss(
    pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor, weight: torch.Tensor
) -> torch.Tensor:
    """One network's paths as the estimate mixes them: per output bucket, the mean |log ratio|
    of the predicted mixture's quantiles (:data:`MIXTURE_LEVELS`) to the same mixture of the
    paths' ns-3 percentiles, paths weighted by ``weight``: ``(P, 4)`` per bucket (as the
    estimate mixes them), or ``(P,)`` the same in every bucket. Unlike :func:`loss_fn` it does
    not pull each path toward the conditional median (which shrinks the tail the mixture is made
    of)."""
    levels = torch.tensor(MIXTURE_LEVELS, dtype=pred.dtype, device=pred.device)
    total, n = pred.new_zeros(()), 0
    for b in range(pred.shape[1]):
        used = mask[:, b]
        if not bool(used.any()):
            continue
        w = (weight[:, b] if weight.ndim == 2 else weight)[used]
        ours = mixture_quantiles(pred[used, b], w, levels).clamp_min(1e-3)
        theirs = mixture_quantiles(target[used, b], w, levels)
        total = total + (ours.log() - theirs.log()).abs().mean()
        n += 1
    return total / max(n, 1)


def loss_fn(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """m3's masked relative L1: ``mean(|pred / target - 1| * mask)`` over every cell (masked cells
    count in the denominator). ``mask``: ``(B, 4)`` buckets with foreground flows."""
    return ((pred / target - 1).abs() * mask[..., None]).mean()
