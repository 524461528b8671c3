"""The m4 model's sizes and options (:class:`ModelConfig`), apart from the model so that the
inference engine and its numpy step (:mod:`m4ray.models.numpy_step`) read it without torch."""

from __future__ import annotations

from dataclasses import dataclass

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

    @property
    def n_fluid(self) -> int:
        return N_FLUID if self.fluid else 0

    @property
    def anchor(self) -> str | None:
        """The fluid anchor's kind for :func:`collate` (None: off): ``hold`` or ``drain``, and
        ``+window`` with ``fluid_window``, ``+acks`` with ``fluid_acks``."""
        if not self.fluid:
            return None
        return (
            ("hold" if self.fluid_hold else "drain")
            + ("+window" if self.fluid_window else "")
            + ("+acks" if self.fluid_acks else "")
        )

    def __post_init__(self) -> None:
        if min(self.hidden, self.gnn_hidden, self.gnn_layers, self.n_params) < 1:
            raise ValueError("hidden, gnn_hidden, gnn_layers and n_params must be >= 1")
        if self.hidden < 4:
            raise ValueError("hidden must be >= 4 (the initial states use 4 slots)")

    @classmethod
    def tiny(cls) -> ModelConfig:
        return cls(hidden=16, gnn_hidden=24, gnn_layers=3, dropout=0.0)


__all__ = ["ModelConfig"]
