"""Many m4 simulations in one process sharing the neural step (one forward pass per round).

A single simulation's update is a handful of tiny graphs: the forward pass costs about the same
whether it carries one flow or a hundred, so one simulation at a time is overhead-bound.
:func:`simulate_together` runs a group of scenarios as greenlets (cooperative stacks in one
thread): every m4 backend they build steps through one :class:`SharedStepper`, whose call
suspends the simulation and hands its graphs to the scheduler; once every live simulation is
suspended (or has ended), the scheduler advances all their graphs in **one**
:func:`~m4ray.models.step.step` and resumes each with its outputs. Graphs never interact in a
step, so each simulation's answers are those it gets alone (to float rounding of the larger
matrix products).

Why greenlets and not threads: with threads, every round woke all the simulations at once and
they fought over the GIL (2x slower than one at a time on 2 cores, though the forward passes
were 3.5x cheaper); greenlets switch in about a microsecond and run in a fixed order, so a
group's results are reproducible to the bit.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any

import greenlet

from m4ray.models.graph import StepGraph, StepOut
from m4ray.sim.m4.memo import StepMemo

# The shared stepper of the simulation running in this greenlet (set by simulate_together; read
# by M4Config.build). None: each backend steps alone.
CURRENT: contextvars.ContextVar[SharedStepper | None] = contextvars.ContextVar(
    "m4ray_shared_stepper", default=None
)


class _Request:
    """A suspended simulation's step request (what its greenlet hands the scheduler) and its
    graphs' memo keys."""

    __slots__ = ("graphs", "keys")

    def __init__(self, graphs: list[StepGraph], keys: list | None = None) -> None:
        self.graphs = graphs
        self.keys = keys


class _Failed:
    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class SharedStepper:
    """The stepper of a group of simulations (see the module docstring). Called from a
    simulation's greenlet, it suspends that simulation until the round's batched step; called
    from anywhere else, it steps alone."""

    def __init__(
        self,
        stepper: Callable[[list[StepGraph]], list[StepOut]],
        memo: StepMemo | None = None,
    ) -> None:
        self.stepper = stepper
        self.memo = memo  # answers graphs stepped before without a pass (m4ray.sim.m4.memo)
        self._scheduler: greenlet.greenlet | None = None
        self.n_passes = 0  # batched steps run
        self.n_calls = 0  # per-simulation step calls served (by a pass or the memo)
        self.n_known = 0  # of which the memo answered

    def __call__(self, graphs: list[StepGraph]) -> list[StepOut]:
        keys = None
        if self.memo is not None:
            known, keys = self.memo.answer(graphs)
            if known is not None:
                self.n_calls += 1
                self.n_known += 1
                return known
        scheduler = self._scheduler
        if scheduler is None or greenlet.getcurrent() is scheduler:
            self.n_passes += 1
            self.n_calls += 1
            outs = self.stepper(graphs)
            if keys is not None:
                self.memo.store(keys, outs)
            return outs
        # resumed by the scheduler with the outputs
        out = scheduler.switch(_Request(graphs, keys))
        if isinstance(out, _Failed):
            raise out.error
        return out

    def _step_all(self, requests: dict[int, _Request]) -> dict[int, Any]:
        """One batched step over every suspended simulation's graphs; outputs per simulation."""
        self.n_passes += 1
        self.n_calls += len(requests)
        try:
            outs = self.stepper([g for r in requests.values() for g in r.graphs])
        except Exception as err:  # every waiting simulation fails with it
            return dict.fromkeys(requests, _Failed(err))
        resumed, i = {}, 0
        for index, request in requests.items():
            resumed[index] = outs[i : i + len(request.graphs)]
            i += len(request.graphs)
            if request.keys is not None:
                self.memo.store(request.keys, resumed[index])
        return resumed


def simulate_together(
    scenarios: list[Any],
    stepper: SharedStepper,
    simulate: Callable[[Any], Any],
    on_done: Callable[[int, Any], None] | None = None,
) -> list[Any]:
    """``simulate(scenario)`` for every scenario, interleaved in greenlets sharing ``stepper``;
    results in input order. ``on_done(index, result)`` runs as soon as a scenario ends (to store
    it before the others end). An exception escaping ``simulate`` is raised here at once (the
    other simulations are abandoned)."""
    if stepper._scheduler is not None:
        raise RuntimeError("this SharedStepper is already running a group")
    results: list[Any] = [None] * len(scenarios)
    done: list[bool] = [False] * len(scenarios)

    def one(index: int) -> None:
        CURRENT.set(stepper)
        results[index] = simulate(scenarios[index])
        done[index] = True

    lets = {}
    for i in range(len(scenarios)):
        lets[i] = greenlet.greenlet(lambda i=i: one(i))
        lets[i].gr_context = contextvars.Context()  # its own CURRENT
    resume: dict[int, Any] = dict.fromkeys(lets)  # what each greenlet is resumed with
    stepper._scheduler = greenlet.getcurrent()
    try:
        while lets:
            requests: dict[int, _Request] = {}
            for index in list(lets):
                value = lets[index].switch(*(() if resume[index] is None else (resume[index],)))
                if isinstance(value, _Request):  # suspended until the batched step
                    requests[index] = value
                    continue
                if not done[index]:  # a greenlet switched here with something else: a bug
                    raise RuntimeError(f"simulation {index} suspended without a step request")
                del lets[index]
                if on_done is not None:
                    on_done(index, results[index])
            if requests:
                resume = stepper._step_all(requests)
    finally:
        stepper._scheduler = None
    return results


__all__ = ["CURRENT", "SharedStepper", "simulate_together"]
