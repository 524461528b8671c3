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
    "LocalStepper": "m4ray.models.step",
    "StepGraph": "m4ray.models.graph",
    "StepOut": "m4ray.models.graph",
}  # the neural step itself, its graphs and the model: the models layer (m4ray.models)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    home = _HOMES[name]
    return getattr(importlib.import_module(home if "." in home else f"{__name__}.{home}"), name)


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
