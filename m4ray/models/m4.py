"""The m4 model: GRU time and rate cells over flow and link states, GraphSAGE over the flow–link
graph, an MLP head for FCT slowdown, and two training-only heads (``reference/m4.md`` §1–§5).

Shapes (H = ``hidden``, G = ``gnn_hidden``, P = ``n_params`` = 13):

* flow state ``[F, H]``, link state ``[L, H]``; Δt ``[N, 1]`` in µs;
* ``SAGELayer(d_in → d_out)``: ``x [N, d_in]``, ``edge_index [2, E]`` (row 0 source, row 1 target)
  → ``[N, d_out]``: ``out_i = W_l Σ_{j→i} ReLU(W_p x_j + b_p) + b_l + W_r x_i``, then LayerNorm;
* the GNN stacks ``H → G → … → G → H`` (``gnn_layers`` layers) over ``[h_flow ; h_link]`` with
  every flow–link incidence as two directed edges;
* ``gru_rate``: ``[gnn_flow ⊕ params13] (H + P) → H``; ``gru_rate_link``: ``H → H``;
* head: ``[n_links, params13, h_flow] (1 + P + H) → 1`` (slowdown); ``remain_head``: ``H → 1``
  (remaining-size fraction from flow states); ``queue_head``: ``H → 1`` (cube-root queue length from
  link states).

With ``fluid`` (our v2 models; off for m4's own design and ``m4-small``) every update also carries
flowSim's view of the updated flows (:mod:`m4ray.models.fluid`): ``fluid [F, 3]`` features enter
``gru_rate`` (``H + P + 3 → H``) and the head (``1 + P + 3 + H → 1``), and the head predicts a
correction: slowdown = ``base × (1 + head)``, ``base`` being flowSim's projected slowdown at the
flow's last update. The head's last layer starts at zero, so an untrained model is flowSim.
With ``flow_prior`` as well, ``params`` carries one more column per flow (P + 1): log2 of classic
flowSim's slowdown of that flow in a run of the whole scenario (its answer with every later
arrival known, where the anchor projects from the events so far).

Architecture only: what training replays the model over (busy periods, their losses) is
:mod:`m4ray.train.periods`; the engines step it through :mod:`m4ray.models.step` (torch) and
:mod:`m4ray.models.numpy_step`. Plain torch (``index_add_``), no graph library. Parameter
names follow PyG's SAGEConv (``lin``,
``lin_l``, ``lin_r``) so released m4 weights map one to one.
"""

from __future__ import annotations

from itertools import pairwise

import torch
from torch import nn

from m4ray.models.config import ModelConfig


class SAGELayer(nn.Module):
    """GraphSAGE with input projection, sum aggregation and root weight, then LayerNorm."""

    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        self.lin = nn.Linear(d_in, d_in)  # projection of neighbour features
        self.lin_l = nn.Linear(d_in, d_out)  # aggregated neighbours
        self.lin_r = nn.Linear(d_in, d_out, bias=False)  # root (un-projected own feature)
        self.norm = nn.LayerNorm(d_out)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        src, dst = edge_index
        messages = torch.relu(self.lin(x))[src]
        aggregated = torch.zeros_like(x).index_add_(0, dst, messages)
        return self.norm(self.lin_l(aggregated) + self.lin_r(x))


def _mlp(d_in: int, hidden: int, dropout: float) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(d_in, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, 1)
    )


class M4Model(nn.Module):
    """The m4 modules and the three steps an event applies to them."""

    def __init__(self, cfg: ModelConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg = cfg or ModelConfig()
        h, g = cfg.hidden, cfg.gnn_hidden
        dims = [h] + [g] * (cfg.gnn_layers - 1) + [h]
        self.gnn = nn.ModuleList(SAGELayer(a, b) for a, b in pairwise(dims))
        self.gru_time = nn.GRUCell(1, h)
        self.gru_time_link = nn.GRUCell(1, h)
        self.gru_rate = nn.GRUCell(h + cfg.n_inputs + cfg.n_fluid, h)
        self.gru_rate_link = nn.GRUCell(h, h)
        self.head = _mlp(1 + cfg.n_inputs + cfg.n_fluid + h, h, cfg.dropout)
        if cfg.fluid:  # start as flowSim: correction 0
            nn.init.zeros_(self.head[-1].weight)
            nn.init.zeros_(self.head[-1].bias)
        self.remain_head = _mlp(h, h, cfg.dropout)
        self.queue_head = _mlp(h, h, cfg.dropout)

    # ------------------------------------------------------------ states
    def flow_state(self, size_bytes: torch.Tensor, n_links: torch.Tensor) -> torch.Tensor:
        """Initial flow states ``[F, H]``: ``[1, 0, log2(size/1000 + 1), n_links, 0, …]``."""
        return initial_flow_state(self.cfg, size_bytes, n_links)

    def link_state(self, bandwidth_bps: torch.Tensor) -> torch.Tensor:
        """Initial (idle) link states ``[L, H]``: ``[0, 1, b, 0, …]``.

        m4 puts a constant 1 in slot 2 (its training links are all 10 Gbps). With
        ``link_bandwidth`` (our default) slot 2 is ``1 + log2(bandwidth / 10 Gbps)``: still 1 on
        10 Gbps links, and degraded or faster links become visible to the model."""
        return initial_link_state(self.cfg, bandwidth_bps)

    # ------------------------------------------------------------ one event
    def time_step(
        self,
        h_flow: torch.Tensor,
        h_link: torch.Tensor,
        dt_flow: torch.Tensor | float,
        dt_link: torch.Tensor | float | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Advance flow and link states by Δt µs: one Δt for all, or one per row (``[F]`` and
        ``[L]``). Rows whose Δt is 0 keep their state (m4 skips the time update then)."""
        dt_link = dt_flow if dt_link is None else dt_link
        return (
            _timed(self.gru_time, h_flow, dt_flow),
            _timed(self.gru_time_link, h_link, dt_link),
        )

    def spatial_step(
        self,
        h_flow: torch.Tensor,
        h_link: torch.Tensor,
        incidence: torch.Tensor,
        params: torch.Tensor,
        fluid: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """GNN over the flow–link graph, then the rate cells.

        ``incidence [2, E]``: (flow row, link row) pairs into ``h_flow`` / ``h_link``;
        ``params [F, P]``: each flow's params13; ``fluid [F, 3]`` with ``cfg.fluid``.
        """
        n_flow = len(h_flow)
        flow, link = incidence[0], incidence[1] + n_flow
        edges = torch.stack([torch.cat([flow, link]), torch.cat([link, flow])])
        x = torch.cat([h_flow, h_link])
        for layer in self.gnn:
            x = layer(x, edges)
        rate_in = [x[:n_flow], params] + ([fluid.to(x.dtype)] if self.cfg.fluid else [])
        new_flow = self.gru_rate(torch.cat(rate_in, dim=1), h_flow)
        new_link = self.gru_rate_link(x[n_flow:], h_link)
        return new_flow, new_link

    def slowdown(
        self,
        h_flow: torch.Tensor,
        n_links: torch.Tensor,
        params: torch.Tensor,
        fluid: torch.Tensor | None = None,
        base: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Predicted FCT slowdown ``[F]`` (unclamped; clamp at 1 for inference); with
        ``cfg.fluid``, ``base × (1 + head)`` from each flow's last ``fluid`` features and
        ``base``."""
        parts = [n_links.to(h_flow.dtype).unsqueeze(1), params.to(h_flow.dtype)]
        if self.cfg.fluid:
            parts.append(fluid.to(h_flow.dtype))
        out = self.head(torch.cat([*parts, h_flow], dim=1)).squeeze(1)
        return base.to(out.dtype) * (1 + out) if self.cfg.fluid else out


def initial_flow_state(
    cfg: ModelConfig, size_bytes: torch.Tensor, n_links: torch.Tensor
) -> torch.Tensor:
    """Initial flow states ``[F, H]`` (no weights involved, so engines build them locally)."""
    h = torch.zeros(len(size_bytes), cfg.hidden, device=size_bytes.device)
    h[:, 0] = 1.0
    h[:, 2] = torch.log2(size_bytes.float() / 1000 + 1)
    h[:, 3] = n_links.float()
    return h


def initial_link_state(cfg: ModelConfig, bandwidth_bps: torch.Tensor) -> torch.Tensor:
    """Initial (idle) link states ``[L, H]`` (see :meth:`M4Model.link_state`)."""
    h = torch.zeros(len(bandwidth_bps), cfg.hidden, device=bandwidth_bps.device)
    h[:, 1] = 1.0
    if cfg.link_bandwidth:
        h[:, 2] = 1.0 + torch.log2(bandwidth_bps.float() / 10e9)
    else:
        h[:, 2] = 1.0
    return h


def _timed(cell: nn.GRUCell, h: torch.Tensor, dt: torch.Tensor | float) -> torch.Tensor:
    dt = torch.as_tensor(dt, dtype=h.dtype, device=h.device).reshape(-1, 1).expand(len(h), 1)
    moving = dt > 0
    if not bool(moving.any()):
        return h
    return torch.where(moving, cell(dt, h), h)


__all__ = [
    "M4Model",
    "ModelConfig",
    "SAGELayer",
    "initial_flow_state",
    "initial_link_state",
]
