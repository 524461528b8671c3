"""The m4 neural step, separable from the simulation state.

A :class:`StepGraph` is one connected component of one simulation at one update: the states of its
active flows and links, the Δt since the component's last update, the flow–link incidence and
the per-flow features the head reads. :func:`step` advances any number of graphs (from one or
many simulations) in **one** forward pass over their disjoint union, exactly as training replays a
busy period (``m4ray.train.model.forward_batch``): GRU time cells, three GraphSAGE layers, GRU rate
cells, then the slowdown head (clamped at 1).

Everything here is plain tensors, so a batch of graphs can be pickled to a Ray Serve replica and
back; the model deployment in ``m4ray.serve`` calls the same :func:`step`.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import torch

from m4ray.train.model import M4Model


@dataclass(kw_only=True, slots=True)
class StepGraph:
    """One component to update: ``h_flow [F, H]``, ``h_link [L, H]``, ``dt_us`` (scalar, µs),
    ``incidence [2, E]`` local (flow row, link row) pairs, ``params [F, P]``, ``n_links [F]``."""

    h_flow: torch.Tensor
    h_link: torch.Tensor
    dt_us: float
    incidence: torch.Tensor
    params: torch.Tensor
    n_links: torch.Tensor

    @property
    def n_flows(self) -> int:
        return len(self.h_flow)


@dataclass(kw_only=True, slots=True)
class StepOut:
    """New states of a :class:`StepGraph`'s rows and each flow's slowdown ``[F]`` (≥ 1)."""

    h_flow: torch.Tensor
    h_link: torch.Tensor
    slowdown: torch.Tensor


def step(model: M4Model, graphs: list[StepGraph]) -> list[StepOut]:
    """Advance ``graphs`` together (one forward pass); outputs in the same order."""
    if not graphs:
        return []
    n_flow = [g.n_flows for g in graphs]
    n_link = [len(g.h_link) for g in graphs]
    flow_off = [0, *accumulate(n_flow)]
    link_off = [0, *accumulate(n_link)]
    h_flow = torch.cat([g.h_flow for g in graphs])
    h_link = torch.cat([g.h_link for g in graphs])
    dt = torch.tensor([g.dt_us for g in graphs], dtype=h_flow.dtype)
    dt_flow = dt.repeat_interleave(torch.tensor(n_flow))
    dt_link = dt.repeat_interleave(torch.tensor(n_link))
    incidence = torch.cat(
        [
            g.incidence + torch.tensor([[f], [lk]])
            for g, f, lk in zip(graphs, flow_off, link_off, strict=False)
        ],
        dim=1,
    )
    params = torch.cat([g.params for g in graphs])
    n_links = torch.cat([g.n_links for g in graphs])
    with torch.inference_mode():
        h_flow, h_link = model.time_step(h_flow, h_link, dt_flow, dt_link)
        h_flow, h_link = model.spatial_step(h_flow, h_link, incidence, params)
        slowdown = model.slowdown(h_flow, n_links, params).clamp(min=1.0)
    return [
        StepOut(
            h_flow=h_flow[flow_off[i] : flow_off[i + 1]],
            h_link=h_link[link_off[i] : link_off[i + 1]],
            slowdown=slowdown[flow_off[i] : flow_off[i + 1]],
        )
        for i in range(len(graphs))
    ]


def chunks(graphs: list[StepGraph], max_flows: int) -> list[list[StepGraph]]:
    """Split ``graphs`` (in order) into runs of at most ``max_flows`` flows (a big one alone)."""
    out: list[list[StepGraph]] = [[]]
    total = 0
    for g in graphs:
        if out[-1] and total + g.n_flows > max_flows:
            out.append([])
            total = 0
        out[-1].append(g)
        total += g.n_flows
    return [c for c in out if c]


class LocalStepper:
    """Runs :func:`step` in this process (the in-process backend)."""

    def __init__(self, model: M4Model, *, max_flows: int = 4096) -> None:
        self.model = model.eval()
        self.max_flows = max_flows

    def __call__(self, graphs: list[StepGraph]) -> list[StepOut]:
        out: list[StepOut] = []
        for chunk in chunks(graphs, self.max_flows):
            out += step(self.model, chunk)
        return out


__all__ = ["LocalStepper", "StepGraph", "StepOut", "chunks", "step"]
