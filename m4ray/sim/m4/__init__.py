"""The learned m4 backend: online engine (state), neural step and the NetworkBackend clock."""

from m4ray.sim.m4.backend import M4Backend, M4Config, checkpoint_dir, load_model
from m4ray.sim.m4.engine import Arrival, M4Engine
from m4ray.sim.m4.step import LocalStepper, StepGraph, StepOut, step

__all__ = [
    "Arrival",
    "LocalStepper",
    "M4Backend",
    "M4Config",
    "M4Engine",
    "StepGraph",
    "StepOut",
    "checkpoint_dir",
    "load_model",
    "step",
]
