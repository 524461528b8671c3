"""The engine's component bookkeeping (``m4ray/models/components.py``): the merge rule, idle
links, touched components, and the compiled core (``_core.c``) as its twin, event for event."""

from __future__ import annotations

import numpy as np

from m4ray.models import core
from m4ray.models.components import Batching, Components
from m4ray.models.config import ModelConfig
from m4ray.sim.m4.engine import M4Engine, NativeM4Engine


def test_arrivals_merge_into_the_largest_component_which_keeps_the_oldest_time():
    c = Components(6)
    a = c.join(0, [0, 1], t=1.0)
    c.join(1, [1], t=2.0)  # joins a
    b = c.join(2, [3], t=3.0)
    assert (a, b) == (0, 1) and c.take_touched() == [0, 1]
    merged = c.join(3, [1, 3, 5], t=4.0)  # owners {a (2 flows), b (1)}: a wins
    assert merged == a and len(c) == 1 and c.take_touched() == [a]
    comp = c.of(2)
    assert list(comp.flows) == [0, 1, 2, 3] and comp.links == {0, 1, 3, 5}
    assert comp.t_last == 1.0 and c.owner[3] == a and c.users[1] == 3


def test_a_tie_goes_to_the_lowest_id_and_leaving_idles_links_and_ends_components():
    c = Components(4)
    c.join(0, [0], 0.0)
    c.join(1, [1], 0.0)
    assert c.join(2, [0, 1], 0.0) == 0  # one flow each: the lowest id
    c.take_touched()
    assert c.leave(2, [0, 1]) == []  # both links still carry a flow
    assert c.leave(0, [0]) == [0] and c.owner[0] == -1 and c.of(1).links == {1}
    assert c.take_touched() == [0]
    assert c.leave(1, [1]) == [1] and len(c) == 0 and c.take_touched() == []


def test_the_compiled_core_keeps_the_same_components_event_for_event():
    """Random arrivals and completions on 24 links: after every event the compiled engine and
    the Python one (built on :class:`Components`) count the same components, and an update
    steps the same flows, in the same order."""
    assert core.library() is not None
    rng = np.random.default_rng(3)
    cfg = ModelConfig(hidden=8, gnn_hidden=8, gnn_layers=1, dropout=0.0)
    bw = np.full(24, 1e11)
    engines = [M4Engine(bw, cfg, [0.1] * cfg.n_params, native=n) for n in (False, True)]
    assert isinstance(engines[1], NativeM4Engine)
    assert not isinstance(engines[0], NativeM4Engine)
    active: list[int] = []
    for step in range(400):
        t = step * 1e-6
        if active and (rng.random() < 0.45 or len(active) > 30):
            f = active.pop(int(rng.integers(len(active))))
            for e in engines:
                e.complete(f, t)
        else:
            links = rng.choice(24, size=int(rng.integers(1, 4)), replace=False).tolist()
            for e in engines:
                e.arrive_path(step, links, 1000, 1e-6, t)
            active.append(step)
        assert engines[0].n_components == engines[1].n_components
        if step % 7 == 0:
            pending = [e.prepare(t) for e in engines]
            if pending[0] is None:
                assert pending[1] is None
                continue
            ids = [np.asarray(p.flow_ids).tolist() for p in pending]
            assert ids[0] == ids[1]
            assert np.asarray(pending[0].comps).tolist() == np.asarray(pending[1].comps).tolist()


def test_batching_holds_a_large_component_until_an_arrival_or_enough_completions():
    """Components of more than ``above_flows`` flows wait for an arrival or for completions
    numbering ``fraction`` of their flows; smaller ones are due at every event."""
    c = Components(12, Batching(above_flows=4, fraction=0.5))
    for f in range(10):
        c.join(f, [f, 10], t=0.0)  # one component of 10 flows over link 10
    c.join(10, [11], t=0.0)  # a small one
    assert c.take_touched() == [0, 1]  # arrivals: both due
    c.leave(0, [0, 10])
    c.leave(10, [11])  # the small one ends
    assert c.take_touched() == []  # 1 of 9 completed: waits, still touched
    for f in range(1, 5):
        c.leave(f, [f, 10])
    assert c.take_touched() == [0]  # 5 completions >= 0.5 x 5 flows
    c.leave(5, [5, 10])
    assert c.take_touched() == [0]  # 4 flows: not large any more
    c.leave(6, [6, 10])
    c.join(11, [11, 10], t=1.0)
    assert c.take_touched() == [0] and c.take_touched() == []
