"""The m4 model's sizes and options (:class:`ModelConfig`), apart from the model so that the
inference engine and its numpy step (:mod:`m4ray.models.numpy_step`) read it without torch."""

from __future__ import annotations

import math
from dataclasses import dataclass

from m4ray.errors import InputError
from m4ray.models.fluid import N_FEATURES as N_FLUID


@dataclass(kw_only=True, slots=True)
class ModelConfig:
    """Sizes of the m4 model; the paper's are the defaults (``tiny()`` for tests)."""

    hidden: int = 200
    gnn_hidden: int = 300
    gnn_layers: int = 3
    n_params: int = 13
    dropout: float = 0.2
    link_bandwidth: bool = True  # bandwidth in the initial link state (m4: a constant 1)
    fluid: bool = False  # flowSim's projection as features and as the base of the slowdown
    fluid_hold: bool = True  # a drained, active flow's projection is >= now (Fluid's `hold`)
    fluid_window: bool = False  # the anchor drains each flow as its sender's window allows
    fluid_acks: bool = False  # the anchor's links also carry RDMA's ACKs (Fluid's `acks`)
    # the anchor serves flows of at most the sender's window in order of arrival (flowSim's
    # service="fifo", fifo_bytes: window; Fluid's `fifo_bits`); every flow where none is set
    fluid_fifo: bool = False
    # classic flowSim's slowdown of each flow (a flowSim run of the whole scenario) as one more
    # per-flow input beside params13, log2: what the rate cell and the head read with the
    # anchor's features (training replays only for now: the engines refuse such a model)
    flow_prior: bool = False

    @property
    def n_fluid(self) -> int:
        return N_FLUID if self.fluid else 0

    @property
    def n_inputs(self) -> int:
        """Per-flow inputs beside the state: params13 and, with ``flow_prior``, the prior."""
        return self.n_params + int(self.flow_prior)

    @property
    def anchor(self) -> str | None:
        """The fluid anchor's kind for :func:`collate` (None: off): ``hold`` or ``drain``, and
        ``+window`` with ``fluid_window``, ``+acks`` with ``fluid_acks``, ``+fifo`` with
        ``fluid_fifo``."""
        if not self.fluid:
            return None
        return (
            ("hold" if self.fluid_hold else "drain")
            + ("+window" if self.fluid_window else "")
            + ("+acks" if self.fluid_acks else "")
            + ("+fifo" if self.fluid_fifo else "")
        )

    def __post_init__(self) -> None:
        if min(self.hidden, self.gnn_hidden, self.gnn_layers, self.n_params) < 1:
            raise ValueError("hidden, gnn_hidden, gnn_layers and n_params must be >= 1")
        if self.hidden < 4:
            raise ValueError("hidden must be >= 4 (the initial states use 4 slots)")
        if self.fluid_fifo and not self.fluid:
            raise ValueError("fluid_fifo needs fluid (it is the anchor's service)")
        if self.flow_prior and not self.fluid:
            raise ValueError("flow_prior needs fluid (the prior is read beside the anchor)")

    @classmethod
    def tiny(cls) -> ModelConfig:
        return cls(hidden=16, gnn_hidden=24, gnn_layers=3, dropout=0.0)


@dataclass(frozen=True, slots=True)
class ParamsRange:
    """The span of each network parameter (m4's params13: buffer, window, CC one-hot, CC
    parameters) over a checkpoint's training scenarios, recorded in its ``model.json`` as
    ``params_range``. The network reads the parameters raw, so a value far outside what it saw
    (the SimAI study's 100 MB buffers against training's 1-16 MB) is extrapolated: an input the
    model never learned a response to. :meth:`fit` brings such values to the nearest edge."""

    low: tuple[float, ...]
    high: tuple[float, ...]
    source: str = ""

    @classmethod
    def of(cls, info: dict, *, file: str = "model.json") -> ParamsRange | None:
        """The range in a checkpoint's ``model.json`` contents (None: it recorded none)."""
        raw = info.get("params_range")
        if raw is None:
            return None
        try:
            low = tuple(float(x) for x in raw["low"])
            high = tuple(float(x) for x in raw["high"])
        except (KeyError, TypeError, ValueError):
            raise InputError(
                "needs 'low' and 'high', lists of numbers", file=file, field="params_range"
            ) from None
        if len(low) != len(high) or not all(
            math.isfinite(a) and math.isfinite(b) and a <= b
            for a, b in zip(low, high, strict=False)
        ):
            raise InputError(
                "'low' and 'high' need one finite entry per parameter, low <= high",
                file=file,
                field="params_range",
            )
        return cls(low, high, str(raw.get("source", "")))

    @classmethod
    def spanning(cls, rows, source: str = "") -> ParamsRange:
        """The range of ``rows`` (one params13 vector per training scenario)."""
        rows = [list(map(float, r)) for r in rows]
        if not rows:
            raise InputError("no scenarios to take a range from", field="params_range")
        columns = list(zip(*rows, strict=True))
        return cls(tuple(map(min, columns)), tuple(map(max, columns)), source)

    def to_json(self) -> dict:
        return {"low": list(self.low), "high": list(self.high), "source": self.source}

    def fit(self, params, names) -> tuple[list[float], list[str]]:
        """``params`` with every value outside the range set to its nearest edge, and one note
        per value moved (``names``: the parameters' names, in order)."""
        if len(params) != len(self.low):
            raise InputError(
                f"{len(params)} network parameters, the range has {len(self.low)}",
                field="params13",
            )
        fitted, notes = [], []
        for name, value, low, high in zip(names, params, self.low, self.high, strict=True):
            kept = min(max(float(value), low), high)
            if kept != value:
                notes.append(f"{name} {value:g} read as {kept:g} (trained on {low:g}..{high:g})")
            fitted.append(kept)
        return fitted, notes


__all__ = ["ModelConfig", "ParamsRange"]
