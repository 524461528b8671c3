"""The m4 neural step, separable from the simulation state.

A :class:`StepGraph` is what one simulation updates at once: the states of the active flows and
links of the components it touched (they share no link, so one graph can carry several), the Δt
since each component's last update, the flow–link incidence and the per-flow features the head
reads. :func:`step` advances any number of graphs (from one or
many simulations) in **one** forward pass over their disjoint union, exactly as training replays a
busy period (``m4ray.models.m4.forward_batch``): GRU time cells, three GraphSAGE layers, GRU rate
cells, then the slowdown head (clamped at 1).

Everything here is plain tensors, so a batch of graphs can be pickled to a Ray Serve replica and
back; the model deployment in ``m4ray.serve`` calls the same :func:`step`.
"""

from __future__ import annotations

from itertools import accumulate

import torch

from m4ray.models.graph import StepGraph, StepOut, chunks, split
from m4ray.models.m4 import M4Model


def step(model: M4Model, graphs: list[StepGraph]) -> list[StepOut]:
    """Advance ``graphs`` together (one forward pass); outputs in the same order."""
    if not graphs:
        return []
    n_flow = [g.n_flows for g in graphs]
    n_link = [len(g.h_link) for g in graphs]
    flow_off = [0, *accumulate(n_flow)]
    link_off = [0, *accumulate(n_link)]
    dtype = model.gru_time.weight_hh.dtype  # float64 from load_model; states follow it
    device = model.gru_time.weight_hh.device  # inputs go where the model is, outputs to the CPU

    def t(x):  # graphs carry numpy arrays (the engine's) or tensors
        return torch.as_tensor(x, device=device)

    h_flow = torch.cat([t(g.h_flow) for g in graphs]).to(dtype)
    h_link = torch.cat([t(g.h_link) for g in graphs]).to(dtype)
    dt_flow = torch.cat([t(g.dt_flow_us) for g in graphs]).to(dtype)
    dt_link = torch.cat([t(g.dt_link_us) for g in graphs]).to(dtype)
    incidence = torch.cat([t(g.incidence) for g in graphs], dim=1)
    if len(graphs) > 1:  # each graph's local rows, shifted to its place in the union
        n_edges = t([g.incidence.shape[1] for g in graphs])
        shift = t([flow_off[:-1], link_off[:-1]]).repeat_interleave(n_edges, dim=1)
        incidence = incidence + shift
    params = torch.cat([t(g.params) for g in graphs]).to(dtype)
    n_links = torch.cat([t(g.n_links) for g in graphs])
    base = fluid = None
    if model.cfg.fluid:
        if any(g.fluid is None for g in graphs):
            raise ValueError("this m4 model is fluid-anchored: every graph needs base and fluid")
        base = torch.cat([t(g.base) for g in graphs]).to(dtype)
        fluid = torch.cat([t(g.fluid) for g in graphs]).to(dtype)
    with torch.inference_mode():
        h_flow, h_link = model.time_step(h_flow, h_link, dt_flow, dt_link)
        h_flow, h_link = model.spatial_step(h_flow, h_link, incidence, params, fluid)
        slowdown = model.slowdown(h_flow, n_links, params, fluid, base).clamp(min=1.0)
    if device.type != "cpu":  # one copy back each, not one per graph
        h_flow, h_link, slowdown = h_flow.cpu(), h_link.cpu(), slowdown.cpu()
    return split(h_flow, h_link, slowdown, flow_off, link_off)


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
