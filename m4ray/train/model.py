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

Plain torch (``index_add_``), no graph library. Parameter names follow PyG's SAGEConv (``lin``,
``lin_l``, ``lin_r``) so released m4 weights map one to one.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import torch
from torch import nn


@dataclass(kw_only=True, slots=True)
class ModelConfig:
    """Sizes of the m4 model; the paper's are the defaults (``tiny()`` for tests)."""

    hidden: int = 200
    gnn_hidden: int = 300
    gnn_layers: int = 3
    n_params: int = 13
    dropout: float = 0.2

    def __post_init__(self) -> None:
        if min(self.hidden, self.gnn_hidden, self.gnn_layers, self.n_params) < 1:
            raise ValueError("hidden, gnn_hidden, gnn_layers and n_params must be >= 1")
        if self.hidden < 4:
            raise ValueError("hidden must be >= 4 (the initial states use 4 slots)")

    @classmethod
    def tiny(cls) -> ModelConfig:
        return cls(hidden=16, gnn_hidden=24, gnn_layers=3, dropout=0.0)


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
        self.gru_rate = nn.GRUCell(h + cfg.n_params, h)
        self.gru_rate_link = nn.GRUCell(h, h)
        self.head = _mlp(1 + cfg.n_params + h, h, cfg.dropout)
        self.remain_head = _mlp(h, h, cfg.dropout)
        self.queue_head = _mlp(h, h, cfg.dropout)

    # ------------------------------------------------------------ states
    def flow_state(self, size_bytes: torch.Tensor, n_links: torch.Tensor) -> torch.Tensor:
        """Initial flow states ``[F, H]``: ``[1, 0, log2(size/1000 + 1), n_links, 0, …]``."""
        h = torch.zeros(len(size_bytes), self.cfg.hidden, device=size_bytes.device)
        h[:, 0] = 1.0
        h[:, 2] = torch.log2(size_bytes.float() / 1000 + 1)
        h[:, 3] = n_links.float()
        return h

    def link_state(self, n: int, device: torch.device | None = None) -> torch.Tensor:
        """Initial (idle) link states ``[L, H]``: ``[0, 1, 1, 0, …]``."""
        h = torch.zeros(n, self.cfg.hidden, device=device)
        h[:, 1:3] = 1.0
        return h

    # ------------------------------------------------------------ one event
    def time_step(
        self, h_flow: torch.Tensor, h_link: torch.Tensor, dt_us: torch.Tensor | float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Advance the given flow and link states by Δt µs (one Δt for all of them)."""
        dt = torch.as_tensor(dt_us, dtype=h_flow.dtype, device=h_flow.device).reshape(1, 1)
        return (
            self.gru_time(dt.expand(len(h_flow), 1), h_flow),
            self.gru_time_link(dt.expand(len(h_link), 1), h_link),
        )

    def spatial_step(
        self,
        h_flow: torch.Tensor,
        h_link: torch.Tensor,
        incidence: torch.Tensor,
        params: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """GNN over the flow–link graph, then the rate cells.

        ``incidence [2, E]``: (flow row, link row) pairs into ``h_flow`` / ``h_link``;
        ``params [F, P]``: each flow's params13.
        """
        n_flow = len(h_flow)
        flow, link = incidence[0], incidence[1] + n_flow
        edges = torch.stack([torch.cat([flow, link]), torch.cat([link, flow])])
        x = torch.cat([h_flow, h_link])
        for layer in self.gnn:
            x = layer(x, edges)
        new_flow = self.gru_rate(torch.cat([x[:n_flow], params], dim=1), h_flow)
        new_link = self.gru_rate_link(x[n_flow:], h_link)
        return new_flow, new_link

    def forward(self, batch: list[PeriodSample]) -> dict[str, torch.Tensor]:
        """Losses of a batch of busy periods (the entry point DDP wraps): ``main`` = relative L1
        on slowdown, ``remain`` and ``queue`` = the dense-supervision errors, each averaged per
        period then over the batch; ``pred`` = the concatenated slowdown predictions."""
        main, remain, queue, preds = [], [], [], []
        for sample in batch:
            pred, r, q = forward_period(self, sample)
            main.append(relative_l1(pred, sample.slowdown))
            remain.append(r)
            queue.append(q)
            preds.append(pred)
        return {
            "main": torch.stack(main).mean(),
            "remain": torch.stack(remain).mean(),
            "queue": torch.stack(queue).mean(),
            "pred": torch.cat(preds),
        }

    def slowdown(
        self, h_flow: torch.Tensor, n_links: torch.Tensor, params: torch.Tensor
    ) -> torch.Tensor:
        """Predicted FCT slowdown ``[F]`` (unclamped; clamp at 1 for inference)."""
        features = torch.cat([n_links.float().unsqueeze(1), params, h_flow], dim=1)
        return self.head(features).squeeze(1)


@dataclass(kw_only=True, slots=True)
class PeriodSample:
    """One busy period as tensors (flows re-indexed 0..F−1, links 0..L−1 within the period).

    ``arrival``/``departure`` ``[F]``: event indices; ``dt_us [E]``: time since the previous event
    (0 for the first); ``incidence [2, ΣE]``: (flow, link) pairs; ``params [P]``; targets:
    ``slowdown [F]``, remaining fractions ``remain [R, 3]`` as (event, flow, fraction) rows and
    cube-root queue lengths ``queue [Q, 3]`` as (flow, link, value) rows at the flow's arrival.
    """

    size_bytes: torch.Tensor
    n_links: torch.Tensor
    arrival: torch.Tensor
    departure: torch.Tensor
    dt_us: torch.Tensor
    incidence: torch.Tensor
    n_link_rows: int
    params: torch.Tensor
    slowdown: torch.Tensor
    remain: torch.Tensor
    queue: torch.Tensor

    def to(self, device: torch.device | str) -> PeriodSample:
        fields = {
            name: getattr(self, name).to(device)
            for name in self.__slots__
            if isinstance(getattr(self, name), torch.Tensor)
        }
        return PeriodSample(n_link_rows=self.n_link_rows, **fields)


def forward_period(
    model: M4Model, s: PeriodSample
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Replay a busy period event by event (``reference/m4.md`` §4).

    Returns the predicted slowdown ``[F]`` (each flow read out from its state frozen at its
    departure) and the mean absolute errors of the remaining-size and queue heads.
    """
    n_flows = len(s.size_bytes)
    h_flow = model.flow_state(s.size_bytes, s.n_links)
    h_link = model.link_state(s.n_link_rows, h_flow.device)
    params = s.params.reshape(1, -1).expand(n_flows, -1)
    remain_err, queue_err = [], []
    for j in range(len(s.dt_us)):
        active = (s.arrival <= j) & (s.departure > j)
        if not bool(active.any()):
            continue
        flows = active.nonzero().squeeze(1)
        edges = s.incidence[:, active[s.incidence[0]]]
        links = torch.unique(edges[1])
        if float(s.dt_us[j]) > 0:
            new_flow, new_link = model.time_step(h_flow[flows], h_link[links], s.dt_us[j])
            h_flow = h_flow.index_copy(0, flows, new_flow)
            h_link = h_link.index_copy(0, links, new_link)
        rows = s.remain[s.remain[:, 0] == j]
        if len(rows):
            pred = model.remain_head(h_flow[rows[:, 1].long()]).squeeze(1)
            remain_err.append((pred - rows[:, 2]).abs())
        rows = s.queue[s.arrival[s.queue[:, 0].long()] == j]
        if len(rows):
            pred = model.queue_head(h_link[rows[:, 1].long()]).squeeze(1)
            queue_err.append((pred - rows[:, 2]).abs())
        flow_row = torch.full((n_flows,), -1, dtype=torch.long, device=flows.device)
        flow_row[flows] = torch.arange(len(flows), device=flows.device)
        link_row = torch.full((s.n_link_rows,), -1, dtype=torch.long, device=flows.device)
        link_row[links] = torch.arange(len(links), device=flows.device)
        local = torch.stack([flow_row[edges[0]], link_row[edges[1]]])
        new_flow, new_link = model.spatial_step(h_flow[flows], h_link[links], local, params[flows])
        h_flow = h_flow.index_copy(0, flows, new_flow)
        h_link = h_link.index_copy(0, links, new_link)
    zero = h_flow.new_zeros(())
    remain_loss = torch.cat(remain_err).mean() if remain_err else zero
    queue_loss = torch.cat(queue_err).mean() if queue_err else zero
    return model.slowdown(h_flow, s.n_links, params), remain_loss, queue_loss


def relative_l1(pred: torch.Tensor, true: torch.Tensor) -> torch.Tensor:
    """m4's main loss: mean ``|ŝ / s − 1|``."""
    return (pred / true - 1).abs().mean()


__all__ = ["M4Model", "ModelConfig", "PeriodSample", "SAGELayer", "forward_period", "relative_l1"]
