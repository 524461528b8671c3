"""The learned m4 backend: online engine (state), neural step and the NetworkBackend clock.

Names are imported on first use, so a driver that only reads an :class:`M4Config` does not
import torch."""

import importlib

_HOMES = {
    "Arrival": "arrival",
    "M4Backend": "backend",
    "M4Config": "backend",
    "checkpoint_dir": "backend",
    "load_model": "backend",
    "M4Engine": "engine",
    "LocalStepper": "step",
    "StepGraph": "step",
    "StepOut": "step",
}  # the function step: m4ray.sim.m4.step.step (the package's ``step`` is that module)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)


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
]
