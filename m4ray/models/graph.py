"""What one simulation's update hands the neural step, and what comes back: plain arrays, so
the engine builds them without torch, a batch of them pickles to a Ray Serve replica and back,
and either step (:func:`m4ray.models.step.step` in torch, :class:`~m4ray.models.numpy_step.
NumpyStepper` in numpy) takes them. Fields are numpy arrays from the engine; the torch step
takes tensors too and returns tensors (``np.asarray`` reads either)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Array = Any  # a numpy array or a torch tensor


@dataclass(kw_only=True, slots=True)
class StepGraph:
    """Flows and links to update (one or more components of one simulation): ``h_flow [F, H]``,
    ``h_link [L, H]``, the Δt of each since its component's last update ``dt_flow_us [F]`` and
    ``dt_link_us [L]`` (µs), ``incidence [2, E]`` local (flow row, link row) pairs,
    ``params [F, P]``, ``n_links [F]``; for a model with the fluid anchor, flowSim's view of
    the flows (:mod:`m4ray.models.fluid`): ``base [F]`` and ``fluid [F, 3]``."""

    h_flow: Array
    h_link: Array
    dt_flow_us: Array
    dt_link_us: Array
    incidence: Array
    params: Array
    n_links: Array
    base: Array | None = None
    fluid: Array | None = None
    # the engine's components, in row order: flows and links of each (None: one component)
    comp_flows: Array | None = None
    comp_links: Array | None = None

    @property
    def n_flows(self) -> int:
        return len(self.h_flow)


@dataclass(kw_only=True, slots=True)
class StepOut:
    """New states of a :class:`StepGraph`'s rows and each flow's slowdown ``[F]`` (≥ 1)."""

    h_flow: Array
    h_link: Array
    slowdown: Array


def split(h_flow: Array, h_link: Array, slowdown: Array, flow_off, link_off) -> list[StepOut]:
    """A union's outputs cut back into its graphs' (``*_off``: each graph's first row, then
    the total)."""
    return [
        StepOut(
            h_flow=h_flow[flow_off[i] : flow_off[i + 1]],
            h_link=h_link[link_off[i] : link_off[i + 1]],
            slowdown=slowdown[flow_off[i] : flow_off[i + 1]],
        )
        for i in range(len(flow_off) - 1)
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


__all__ = ["StepGraph", "StepOut", "chunks", "split"]
