"""The m4 neural step in numpy: the in-process backend's forward pass, without torch.

The same arithmetic as :func:`m4ray.models.step.step` over :class:`~m4ray.models.m4.M4Model`
(GRU time cells, GraphSAGE layers with sum aggregation and LayerNorm, GRU rate cells, the
slowdown head, clamped at 1), in float64 from the checkpoint's float32 weights, as
:func:`~m4ray.sim.m4.backend.load_model` runs torch. Why: a sweep task's m4 scenarios then never
import torch (~1.3 s per worker process), and numpy's per-operation cost is a few µs where
torch's is ~10, which is most of a small graph's step. The torch step stays the reference (a
test holds the two within 1e-12) and what Serve and training run.

Neighbour sums add each node's messages in edge order (a stable sort by target, then
``np.add.reduceat``), as torch's ``index_add_`` does, so they do not depend on the other graphs
of a batch. Matrix products may round by the last bit differently with the batch's shape (the
BLAS kernels), as torch's do; in float64 that is far below the picosecond the engine rounds
predicted times to (see ``load_model``), so grouped and alone answer alike (the sweep bench and
the fan-out test check it flow by flow).

Identical components in a batch (the engine says where each graph's components are: a
collective's steps touch many alike, and a group's scenarios run the same rings) are stepped once
and share their outputs: every byte of their rows and wiring is compared, so the answers are the
plain pass's (a test holds them equal to the bit); on the default sweep's groups a pass then
carries ~24 % of the rows.

The pass runs compiled (``_step.c``, built on first use like the engine's core;
``M4RAY_NATIVE=0`` or :data:`NATIVE_MAX_ROWS` ``= 0`` keeps numpy's, the reference): the same
arithmetic with each row summed in a fixed order (no BLAS blocking, no fused multiply-add), its
own vectorised exp, so a graph's answers are the same bits alone or in any batch on a machine,
and within the type's rounding of numpy's (~1e-12 in float64; a test holds both).

``precision="float32"`` (``backend_options.m4.precision``) runs the forward pass in float32, as
the model was trained (its weights are float32 values): twice the lanes per vector and half the
weights' bytes, 1.5x faster on a pass of 5 rows, 2.1x from 300 rows, ~1.8x on a whole replay
(the full-size gray-failure grid). Compiled, it keeps the property above (the same bits alone
or in any batch); numpy's float32 (without a compiler) does not. Its answers are not float64's
to the bit: float32 rounding (~1e-7 of a slowdown) is above the picosecond the engine rounds
times to, so some flows finish a picosecond apart and the order of later events changes. On
the full-size grid's 14 points (SimAI's collectives) the iteration moved by 1.0 % on average,
5.3 % at most, against float64; nudging float64's weights by 1e-7 of themselves moves it by
0.7 % and 2.2 % (by 1e-15: not at all), so that is how far m4's answers there are defined by
its float32-valued weights in the first place. The mean error against ns-3 on that grid: 14.4 %
in float32, 14.9 % in float64. Deduplication compares the float64 rows, and the slowdown is
formed in float64 from the anchor.

Weights are read from the checkpoint's ``model.pt`` once per content and kept as ``.npz`` in
the native cache (:func:`m4ray.native.cache_dir`); only that first read imports torch.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from itertools import pairwise
from pathlib import Path

import numpy as np
import scipy.sparse

from m4ray import native
from m4ray.errors import InputError
from m4ray.models.config import ModelConfig
from m4ray.models.fluid import offsets
from m4ray.models.graph import StepGraph, StepOut, chunks, split

_LN_EPS = 1e-5  # torch.nn.LayerNorm's default


def initial_link_state(cfg: ModelConfig, bandwidth_bps: np.ndarray) -> np.ndarray:
    """:func:`m4ray.models.m4.initial_link_state` in numpy, as float64 ``[L, H]``: float32
    arithmetic as there, the log2 taken in float64 and rounded (numpy's float32 log2 differs
    from torch's by an ulp on 1.4 % of random rates, this on 0.01 %; a test holds the two equal
    on every rate the templates and gray failures make)."""
    bw = np.asarray(bandwidth_bps, dtype=np.float64)
    h = np.zeros((len(bw), cfg.hidden), dtype=np.float32)
    h[:, 1] = 1.0
    if cfg.link_bandwidth:
        ratio = bw.astype(np.float32) / np.float32(10e9)
        h[:, 2] = np.float32(1.0) + np.log2(ratio.astype(np.float64)).astype(np.float32)
    else:
        h[:, 2] = 1.0
    return h.astype(np.float64)


def _expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    h, g, p = cfg.hidden, cfg.gnn_hidden, cfg.n_inputs
    dims = [h] + [g] * (cfg.gnn_layers - 1) + [h]
    shapes: dict[str, tuple[int, ...]] = {}
    for i, (a, b) in enumerate(pairwise(dims)):
        shapes |= {
            f"gnn.{i}.lin.weight": (a, a),
            f"gnn.{i}.lin.bias": (a,),
            f"gnn.{i}.lin_l.weight": (b, a),
            f"gnn.{i}.lin_l.bias": (b,),
            f"gnn.{i}.lin_r.weight": (b, a),
            f"gnn.{i}.norm.weight": (b,),
            f"gnn.{i}.norm.bias": (b,),
        }
    for name, d_in in (
        ("gru_time", 1),
        ("gru_time_link", 1),
        ("gru_rate", h + p + cfg.n_fluid),
        ("gru_rate_link", h),
    ):
        shapes |= {
            f"{name}.weight_ih": (3 * h, d_in),
            f"{name}.weight_hh": (3 * h, h),
            f"{name}.bias_ih": (3 * h,),
            f"{name}.bias_hh": (3 * h,),
        }
    d_head = 1 + p + cfg.n_fluid + h
    shapes |= {
        "head.0.weight": (h, d_head),
        "head.0.bias": (h,),
        "head.3.weight": (1, h),
        "head.3.bias": (1,),
    }
    return shapes


def _weights_npz(directory: Path) -> Path:
    """The checkpoint's weights as float64 ``.npz`` in the cache (written once per content)."""
    source = directory / "model.pt"
    if not source.exists():
        raise InputError(
            f"{source}: no such file (a checkpoint holds model.pt)", field="checkpoint"
        )
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    target = native.cache_dir() / "weights" / f"m4-{digest}.npz"
    if target.exists():
        return target
    import torch  # the one place the numpy step needs it: reading model.pt the first time

    state = torch.load(source, map_location="cpu", weights_only=True)
    arrays = {k: v.detach().double().numpy() for k, v in state.items()}
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".npz")
    os.close(fd)
    np.savez(tmp, **arrays)
    Path(tmp).replace(target)  # atomic: concurrent workers race harmlessly
    return target


PRECISIONS = {"float64": np.float64, "float32": np.float32}


def float_type(precision: str) -> type:
    """The numpy type of a ``precision`` setting (a clear error for an unknown one)."""
    if precision not in PRECISIONS:
        raise InputError(
            f"unknown precision {precision!r} ({', '.join(PRECISIONS)})", field="precision"
        )
    return PRECISIONS[precision]


class NumpyModel:
    """The m4 weights (arrays of ``precision``, transposed for ``x @ W``) and the step over
    them."""

    def __init__(
        self, cfg: ModelConfig, weights: dict[str, np.ndarray], precision: str = "float64"
    ) -> None:
        self.dtype = dtype = float_type(precision)
        self.precision = precision
        self.cfg = cfg
        for name, shape in _expected_shapes(cfg).items():
            if name not in weights:
                raise InputError(f"the checkpoint has no weight '{name}'", field="model.pt")
            if tuple(weights[name].shape) != shape:
                raise InputError(
                    f"weight '{name}' has shape {tuple(weights[name].shape)}, the config "
                    f"builds {shape}",
                    field="model.pt",
                )
        self.w = {
            k: np.ascontiguousarray(np.asarray(v, dtype=dtype).T)
            if k.endswith(("weight", "weight_ih", "weight_hh")) and "norm" not in k
            else np.asarray(v, dtype=dtype)
            for k, v in weights.items()
        }

    @classmethod
    def load(cls, directory: str | Path, precision: str = "float64") -> NumpyModel:
        directory = Path(directory)
        info = json.loads((directory / "model.json").read_text())
        cfg = ModelConfig(**info["model"])
        with np.load(_weights_npz(directory)) as data:
            return cls(cfg, {k: data[k] for k in data.files}, precision)

    @functools.cached_property
    def _packed(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The weights as the compiled pass reads them: one buffer of the model's float type
        (matrices in strips of 2 vectors' columns: :func:`_strips`), each tensor's offset in
        :func:`native_layout`'s order, and the dims (hidden, GNN hidden, layers, per-flow
        inputs, fluid inputs)."""
        names = native_layout(self.cfg)
        width = STRIP_COLUMNS[self.precision]
        parts = [
            _strips(self.w[name], width) if self.w[name].ndim == 2 else self.w[name]
            for name in names
        ]
        offsets_ = np.concatenate([[0], np.cumsum([len(p) for p in parts])[:-1]])
        cfg = self.cfg
        dims = [cfg.hidden, cfg.gnn_hidden, cfg.gnn_layers, cfg.n_inputs, cfg.n_fluid]
        return (
            np.concatenate(parts).astype(self.dtype),
            offsets_.astype(np.int64),
            np.asarray(dims, dtype=np.int64),
        )

    def pass_function(self, lib):
        """This model's compiled pass in ``lib`` (:func:`native_step_library`): float64's or
        float32's, as :attr:`_packed` lays the weights out for it."""
        return getattr(lib, PASS_FUNCTIONS[self.precision])

    def _alone(self, g: StepGraph) -> StepOut | None:
        """One graph too small to look for identical components in, through :meth:`_forward`
        on its own arrays (no union to build: the pass is the same, row for row); None where
        :meth:`step`'s general path applies."""
        if (
            len(g.h_flow) >= DEDUP_MIN_FLOWS
            or (self.cfg.fluid and (g.base is None or g.fluid is None))  # refused there
        ):
            return None
        f64 = np.float64
        anchor = (np.asarray(g.base, f64), np.asarray(g.fluid, f64)) if self.cfg.fluid else ()
        new_flow, new_link, slowdown = self._forward(
            np.asarray(g.h_flow, f64), np.asarray(g.h_link, f64), np.asarray(g.dt_flow_us, f64),
            np.asarray(g.dt_link_us, f64), np.asarray(g.incidence, np.int64),
            np.asarray(g.params, f64), np.asarray(g.n_links, f64), *(anchor or (None, None)),
        )  # fmt: skip
        return StepOut(h_flow=new_flow, h_link=new_link, slowdown=slowdown)

    def _compiled_pass(  # noqa: PLR0917 (the step's arrays)
        self, lib, h_flow, h_link, dt_flow, dt_link, incidence, params, n_links, base, fluid
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`_pass` in C (``_step.c``, in the model's float type): the same arithmetic,
        each row's sums in a fixed order whatever the batch; float64 arrays in and out."""
        wbuf, offs, dims = self._packed
        n_f, n_l = len(h_flow), len(h_link)
        c = np.ascontiguousarray
        arrays = [
            c(h_flow, dtype=np.float64),
            c(h_link, dtype=np.float64),
            c(dt_flow, dtype=np.float64),
            c(dt_link, dtype=np.float64),
            c(incidence[0], dtype=np.int64),
            c(incidence[1], dtype=np.int64),
            c(params, dtype=np.float64),
            c(n_links, dtype=np.float64),
            c(base, dtype=np.float64) if base is not None else None,
            c(fluid, dtype=np.float64) if fluid is not None else None,
        ]
        new_flow = np.empty((n_f, self.cfg.hidden))
        new_link = np.empty((n_l, self.cfg.hidden))
        slowdown = np.empty(n_f)
        ptrs = [None if a is None else a.ctypes.data for a in arrays]
        rc = self.pass_function(lib)(
            dims.ctypes.data, wbuf.ctypes.data, offs.ctypes.data, n_f, n_l, *ptrs[:4],
            incidence.shape[1], *ptrs[4:], new_flow.ctypes.data, new_link.ctypes.data,
            slowdown.ctypes.data,
        )  # fmt: skip
        if rc:
            raise MemoryError("compiled m4 step: out of memory")
        return new_flow, new_link, slowdown

    # ------------------------------------------------------------ pieces
    def _linear(self, name: str, x: np.ndarray, bias: bool = True) -> np.ndarray:
        y = x @ self.w[f"{name}.weight"]
        if bias:
            y += self.w[f"{name}.bias"]
        return y

    def _gru(self, name: str, x: np.ndarray, h: np.ndarray) -> np.ndarray:
        w = self.w
        gi = x @ w[f"{name}.weight_ih"]
        gi += w[f"{name}.bias_ih"]
        gh = h @ w[f"{name}.weight_hh"]
        gh += w[f"{name}.bias_hh"]
        n_h = h.shape[1]
        r = _sigmoid(gi[:, :n_h] + gh[:, :n_h])
        z = _sigmoid(gi[:, n_h : 2 * n_h] + gh[:, n_h : 2 * n_h])
        n = np.tanh(gi[:, 2 * n_h :] + r * gh[:, 2 * n_h :])
        return (1 - z) * n + z * h

    def _timed(self, name: str, h: np.ndarray, dt: np.ndarray) -> np.ndarray:
        moving = dt > 0
        if not moving.any():
            return h
        return np.where(moving[:, None], self._gru(name, dt[:, None], h), h)

    def _sage(self, i: int, x: np.ndarray, adjacency: _Adjacency) -> np.ndarray:
        """One GraphSAGE layer; row ``t`` of ``adjacency`` holds a 1 per edge into node ``t``
        (at its source's column), so its product with the messages sums each node's."""
        messages = np.maximum(self._linear(f"gnn.{i}.lin", x), 0.0)
        aggregated = adjacency @ messages
        y = self._linear(f"gnn.{i}.lin_l", aggregated) + self._linear(
            f"gnn.{i}.lin_r", x, bias=False
        )
        n = y.shape[1]  # ndarray.mean's own arithmetic (add.reduce, then / n), minus its wrapper
        mean = np.add.reduce(y, axis=1, keepdims=True) / n
        var = np.add.reduce((y - mean) ** 2, axis=1, keepdims=True) / n
        return (y - mean) / np.sqrt(var + _LN_EPS) * self.w[f"gnn.{i}.norm.weight"] + self.w[
            f"gnn.{i}.norm.bias"
        ]

    # ------------------------------------------------------------ the step
    def step(self, graphs: list[StepGraph]) -> list[StepOut]:
        """:func:`m4ray.models.step.step` in numpy: ``graphs`` advanced in one pass."""
        if not graphs:
            return []
        if len(graphs) == 1 and (alone := self._alone(graphs[0])) is not None:
            return [alone]
        cfg = self.cfg
        n_flow = [len(g.h_flow) for g in graphs]
        n_link = [len(g.h_link) for g in graphs]
        flow_off = np.cumsum([0, *n_flow])
        link_off = np.cumsum([0, *n_link])
        cat = np.concatenate
        f64 = np.float64
        h_flow = cat([g.h_flow for g in graphs], dtype=f64)
        h_link = cat([g.h_link for g in graphs], dtype=f64)
        dt_flow = cat([g.dt_flow_us for g in graphs], dtype=f64)
        dt_link = cat([g.dt_link_us for g in graphs], dtype=f64)
        incidence = cat([g.incidence for g in graphs], axis=1, dtype=np.int64)
        if len(graphs) > 1:  # each graph's local rows, shifted to its place in the union
            n_edges = [np.shape(g.incidence)[1] for g in graphs]
            incidence += np.repeat(np.stack([flow_off[:-1], link_off[:-1]]), n_edges, axis=1)
        params = cat([g.params for g in graphs], dtype=f64)
        n_links = cat([g.n_links for g in graphs], dtype=f64)
        fluid = base = None
        if cfg.fluid:
            if any(g.fluid is None for g in graphs):
                raise ValueError(
                    "this m4 model is fluid-anchored: every graph needs base and fluid"
                )
            base = cat([g.base for g in graphs], dtype=f64)
            fluid = cat([g.fluid for g in graphs], dtype=f64)

        # identical components (same states, features and wiring: a collective's steps, the
        # same ring in many scenarios of a group) are stepped once and their outputs shared, in
        # a pass big enough for that to pay (:data:`DEDUP_MIN_FLOWS`)
        flow_rows = [h_flow, dt_flow, params, n_links] + ([base, fluid] if cfg.fluid else [])
        same = None
        if len(h_flow) >= DEDUP_MIN_FLOWS:
            comps = _component_sizes(graphs, n_flow, n_link, n_links)
            same = _distinct(comps, flow_rows, [h_link, dt_link], incidence)
        if same is not None:
            keep_flows, keep_links, incidence, flow_map, link_map = same
            h_flow, dt_flow, params, n_links, *anchor = (a[keep_flows] for a in flow_rows)
            base, fluid = anchor or (None, None)
            h_link, dt_link = h_link[keep_links], dt_link[keep_links]
        new_flow, new_link, slowdown = self._forward(
            h_flow, h_link, dt_flow, dt_link, incidence, params, n_links, base, fluid
        )
        if same is not None:
            new_flow, new_link, slowdown = (
                new_flow[flow_map],
                new_link[link_map],
                slowdown[flow_map],
            )
        return split(new_flow, new_link, slowdown, flow_off, link_off)

    def _forward(  # noqa: PLR0917 (the step's arrays)
        self, h_flow, h_link, dt_flow, dt_link, incidence, params, n_links, base, fluid
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The forward pass over one union graph (float64 arrays): new flow and link states and
        slowdowns, compiled or in numpy, in the model's float type."""
        if (
            len(h_flow) + len(h_link) <= NATIVE_MAX_ROWS
            and (lib := native_step_library()) is not None
        ):
            return self._compiled_pass(
                lib, h_flow, h_link, dt_flow, dt_link, incidence, params, n_links, base, fluid
            )
        if self.dtype is not np.float64:  # the anchor's base stays float64 (the slowdown is
            # formed in it)
            h_flow, h_link, dt_flow, dt_link, params, n_links = (
                a.astype(self.dtype) for a in (h_flow, h_link, dt_flow, dt_link, params, n_links)
            )
            fluid = None if fluid is None else fluid.astype(self.dtype)
        with np.errstate(over="ignore"):  # the gates' exp(-x) (_sigmoid), once per pass
            return self._pass(
                h_flow, h_link, dt_flow, dt_link, incidence, params, n_links, base, fluid
            )

    def _pass(  # noqa: PLR0917 (the step's arrays)
        self, h_flow, h_link, dt_flow, dt_link, incidence, params, n_links, base, fluid
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        cfg, cat = self.cfg, np.concatenate
        h_flow = self._timed("gru_time", h_flow, dt_flow)
        h_link = self._timed("gru_time_link", h_link, dt_link)
        n_f = len(h_flow)
        flow, link = incidence[0], incidence[1] + n_f
        src, dst = cat([flow, link]), cat([link, flow])
        x = cat([h_flow, h_link])
        # sums into each node as a sparse product (np.add.reduceat over gathered messages took
        # 10x as long): each node's edges in edge order, so the sums run in the same order
        # whether this graph is stepped alone or beside others (alone = batched, to the bit)
        order = np.argsort(dst, kind="stable")
        starts = offsets(np.bincount(dst, minlength=len(x)))
        adjacency = _Adjacency(np.ones(len(dst), dtype=self.dtype), src[order], starts, len(x))
        for i in range(cfg.gnn_layers):
            x = self._sage(i, x, adjacency)
        rate_in = [x[:n_f], params] + ([fluid] if cfg.fluid else [])
        new_flow = self._gru("gru_rate", cat(rate_in, axis=1), h_flow)
        new_link = self._gru("gru_rate_link", x[n_f:], h_link)
        parts = [n_links[:, None], params] + ([fluid] if cfg.fluid else []) + [new_flow]
        hidden = np.maximum(self._linear("head.0", cat(parts, axis=1)), 0.0)
        out = np.asarray(self._linear("head.3", hidden)[:, 0], dtype=np.float64)
        slowdown = np.maximum(base * (1 + out) if cfg.fluid else out, 1.0)
        if self.dtype is not np.float64:  # the engine keeps states in float64
            new_flow, new_link = new_flow.astype(np.float64), new_link.astype(np.float64)
        return new_flow, new_link, slowdown


# passes of at most this many rows (flows + links) run compiled (``_step.c``), which in float64
# on this 2-core machine is at least as fast as numpy at every size measured, 1 to 2,600 rows
# (2-3x on the few-row passes of a collective's steps, where numpy's few µs per operation are
# most of the cost; ~1-2x from 40 rows up: bench/m4_step_native.py). A smaller value sends the
# larger passes to numpy's BLAS products (a machine whose BLAS is far faster than this one's);
# 0 runs numpy throughout (the reference the tests compare against).
NATIVE_MAX_ROWS = 1_000_000

_STEP_SOURCE = Path(__file__).with_name("_step.c")
_STEP_INCLUDES = (Path(__file__).with_name("_step_pass.h"),)
# the compiled pass of each precision, and its weights' strip width (2 AVX vectors of the type)
PASS_FUNCTIONS = {"float64": "m4ray_m4_pass", "float32": "m4ray_m4_pass_f32"}
STRIP_COLUMNS = {"float64": 8, "float32": 16}


@functools.cache
def native_step_library():
    """The compiled pass (``_step.c``) with its signature, or ``None`` (one warning; also with
    ``M4RAY_NATIVE=0``): numpy then runs every pass."""
    import ctypes

    lib = native.load(_STEP_SOURCE, "compiled m4 step", _STEP_INCLUDES)
    if lib is None:
        return None
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    for name in PASS_FUNCTIONS.values():
        function = getattr(lib, name)
        function.restype = ctypes.c_int
        function.argtypes = [ptr, ptr, ptr, i64, i64, ptr, ptr, ptr, ptr, i64, *[ptr] * 9]
    return lib


def _strips(w: np.ndarray, width: int = 8) -> np.ndarray:
    """An (in, out) matrix as ``_step.c`` reads it: strips of ``width`` columns (the last
    zero-padded), each as ``in`` rows of ``width``, one after another."""
    n_in, n_out = w.shape
    padded = np.zeros((n_in, -(-n_out // width) * width), dtype=w.dtype)
    padded[:, :n_out] = w
    return np.ascontiguousarray(padded.reshape(n_in, -1, width).transpose(1, 0, 2)).ravel()


def native_layout(cfg: ModelConfig) -> list[str]:
    """The weight tensors in the order ``_step.c`` reads them."""
    names = [
        f"{cell}.{w}"
        for cell in ("gru_time", "gru_time_link")
        for w in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
    ]
    for i in range(cfg.gnn_layers):
        names += [
            f"gnn.{i}.{w}"
            for w in (
                "lin.weight",
                "lin.bias",
                "lin_l.weight",
                "lin_l.bias",
                "lin_r.weight",
                "norm.weight",
                "norm.bias",
            )
        ]
    names += [
        f"{cell}.{w}"
        for cell in ("gru_rate", "gru_rate_link")
        for w in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
    ]
    return [*names, "head.0.weight", "head.0.bias", "head.3.weight", "head.3.bias"]


# Passes of fewer flows step every component, identical or not: finding the identical ones
# costs more than the rows it saves there (a group of 10 default gray-failure scenarios: 3.1 s
# of finding under 128 flows for 85,000 rows saved, in 11,800 passes of ~50 rows; the 512-GPU
# MoE job saves 88,000 rows in 376 passes of 512-2,048 flows for 0.23 s). Stepping a component
# twice gives each copy its answer to float64's rounding (the products' shapes differ; on this
# machine the smoke sweep's answers stayed equal to the bit).
DEDUP_MIN_FLOWS = 128


def _component_sizes(graphs: list[StepGraph], n_flow, n_link, n_links: np.ndarray):
    """Flows, links and edges of each component of the union, in row order (a graph without
    ``comp_flows`` is one component)."""

    def sizes(field: str, totals) -> np.ndarray:
        parts = [
            [n] if (c := getattr(g, field)) is None else c
            for g, n in zip(graphs, totals, strict=True)
        ]
        return np.concatenate(parts, dtype=np.int64).ravel()

    cf, cl = sizes("comp_flows", n_flow), sizes("comp_links", n_link)
    fo = offsets(cf)
    ce = np.add.reduceat(n_links.astype(np.int64), fo[:-1]) if len(cf) else cf
    return cf, cl, ce


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``concatenate([arange(s, s + c) for s, c in zip(starts, counts)])``."""
    off = offsets(counts)
    return np.repeat(starts - off[:-1], counts) + np.arange(off[-1])


def _mix(n: int) -> np.ndarray:
    """``n`` fixed odd 64-bit multipliers (the fingerprint's)."""
    return np.random.default_rng(0x6D34).integers(1, 2**63, n, dtype=np.uint64) * 2 + 1


_MIX = _mix(4096)


def _distinct(comps, flow_rows: list, link_rows: list, incidence: np.ndarray):
    """The union's distinct components: None when all are distinct, else the rows of flows,
    links and edges to step (one component of each set of identical ones, in order), their
    incidence renumbered, and per original flow and link row its stepped row. Components are
    identical when their sizes and every byte of their rows (states, Δt, features) and of
    their local wiring are."""
    cf, cl, ce = comps
    n = len(cf)
    if n < 2:
        return None
    fo, lo, eo = offsets(cf), offsets(cl), offsets(ce)
    rep = np.arange(n)
    big = int(max(cf.max(), cl.max(), ce.max())) + 1
    if big < 2**21:  # the three sizes as one int64 (a 1-d unique is far cheaper than rows')
        shapes, shape_of = np.unique((cf * big + cl) * big + ce, return_inverse=True)
    else:
        shapes, shape_of = np.unique(np.stack([cf, cl, ce], 1), axis=0, return_inverse=True)
    if len(shapes) == n:
        return None
    for k in range(len(shapes)):
        members = np.flatnonzero(shape_of == k)
        m = len(members)
        if m < 2:
            continue
        nf, nl, ne = (int(cf[members[0]]), int(cl[members[0]]), int(ce[members[0]]))
        f = fo[members, None] + np.arange(nf)
        li = lo[members, None] + np.arange(nl)
        e = eo[members, None] + np.arange(ne)
        local = [incidence[0][e] - fo[members, None], incidence[1][e] - lo[members, None]]
        parts = [a[f].reshape(m, -1) for a in flow_rows] + [a[li].reshape(m, -1) for a in link_rows]
        # every part is 8-byte words: a component's key is its words; a multiply-sum
        # fingerprint groups candidates, then each is compared word for word with its group's
        # first (a fingerprint collision only costs a missed sharing, never a wrong answer)
        words = np.concatenate([p.view(np.uint64) for p in [*parts, *local]], axis=1)
        mix = _MIX[: words.shape[1]] if words.shape[1] <= len(_MIX) else _mix(words.shape[1])
        _, first, inverse = np.unique(
            (words * mix).sum(axis=1), return_index=True, return_inverse=True
        )
        head = first[inverse]
        same = (words == words[head]).all(axis=1)
        rep[members] = np.where(same, members[head], members)
    kept = rep == np.arange(n)
    if kept.all():
        return None
    keep = np.flatnonzero(kept)
    new_fo, new_lo = offsets(cf[keep]), offsets(cl[keep])
    keep_flows, keep_links = _ranges(fo[keep], cf[keep]), _ranges(lo[keep], cl[keep])
    edges = _ranges(eo[keep], ce[keep])
    shift = np.stack([new_fo[:-1] - fo[keep], new_lo[:-1] - lo[keep]])
    renumbered = incidence[:, edges] + np.repeat(shift, ce[keep], axis=1)
    slot = np.cumsum(kept) - 1  # a kept component's place among the kept
    flow_map = _ranges(new_fo[slot[rep]], cf)
    link_map = _ranges(new_lo[slot[rep]], cl)
    return keep_flows, keep_links, renumbered, flow_map, link_map


class _Adjacency:
    """A node-by-node CSR matrix of ones (row ``t``: a 1 at each edge's source into ``t``) whose
    product with a matrix runs scipy's own kernel (``csr_matvecs``, what ``csr_matrix @ dense``
    calls) without building a ``csr_matrix`` per pass (its checks cost more than the product on
    the small graphs m4 steps); the same sums in the same order. Falls back to ``csr_matrix``
    where scipy's kernel module is not found."""

    def __init__(self, data: np.ndarray, indices: np.ndarray, indptr: np.ndarray, n: int):
        self.data, self.indices, self.indptr, self.n = data, indices, indptr, n

    def __matmul__(self, other: np.ndarray) -> np.ndarray:
        other = np.ascontiguousarray(other, dtype=self.data.dtype)
        if _matvecs is None:
            matrix = scipy.sparse.csr_matrix(
                (self.data, self.indices, self.indptr), shape=(self.n, self.n)
            )
            return matrix @ other
        result = np.zeros((self.n, other.shape[1]), dtype=self.data.dtype)
        _matvecs(
            self.n,
            self.n,
            other.shape[1],
            self.indptr,
            self.indices,
            self.data,
            other.ravel(),
            result.ravel(),
        )
        return result


try:  # scipy's CSR kernel (private, pinned with scipy; csr_matrix is the fallback)
    from scipy.sparse._sparsetools import csr_matvecs as _matvecs
except ImportError:  # pragma: no cover
    _matvecs = None


def _sigmoid(x: np.ndarray) -> np.ndarray:
    """exp(-x) = inf below x ~ -709: the gate is then 0, exactly (callers ignore the overflow:
    :meth:`NumpyModel._forward` sets ``np.errstate`` once for the whole pass)."""
    return 1.0 / (1.0 + np.exp(-x))


@functools.lru_cache(maxsize=4)
def load_numpy_model(directory: str, precision: str = "float64") -> NumpyModel:
    """The checkpoint in ``directory`` as a :class:`NumpyModel`, loaded once per process (and
    precision)."""
    return NumpyModel.load(directory, precision)


@functools.cache
def limit_blas_threads(threads: int) -> None:
    """Cap this process's BLAS threads (once per value; 0 leaves them). A step's products are
    small: with two OpenBLAS threads on 2 cores the default sweep's m4 took 196 ms per scenario,
    with one 121 ms (Ray workers already get one through ``OMP_NUM_THREADS``)."""
    if threads > 0:
        from threadpoolctl import threadpool_limits

        threadpool_limits(threads, user_api="blas")


class NumpyStepper:
    """Runs the numpy step in this process (the in-process backend's stepper); ``threads``:
    the process's BLAS threads (:func:`limit_blas_threads`)."""

    def __init__(self, model: NumpyModel, *, max_flows: int = 4096, threads: int = 1) -> None:
        self.model = model
        self.max_flows = max_flows
        limit_blas_threads(threads)

    def __call__(self, graphs: list[StepGraph]) -> list[StepOut]:
        out: list[StepOut] = []
        for chunk in chunks(graphs, self.max_flows):
            out += self.model.step(chunk)
        return out


__all__ = [
    "NumpyModel",
    "NumpyStepper",
    "initial_link_state",
    "limit_blas_threads",
    "load_numpy_model",
]
