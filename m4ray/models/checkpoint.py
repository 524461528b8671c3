"""Exported m4 checkpoints: ``checkpoints/<name>/`` with ``model.pt`` (a state dict),
``model.json`` (format, model config, dataset version, metrics) and ``model_card.md``.

Loading checks everything it can and says what does not match: a missing file, an unknown format,
a config the code cannot build, missing/unexpected weights, or a weight of the wrong shape.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from m4ray.errors import InputError

FORMAT = "m4ray-m4-v1"


@dataclass(frozen=True, slots=True)
class Kind:
    """What a checkpoint directory holds: its format tag and how to build the model (module and
    class names, imported on use so that loading m3 never imports m4 and vice versa)."""

    format: str
    module: str
    model: str
    config: str

    def build(self, model_cfg: dict):
        import importlib

        mod = importlib.import_module(self.module)
        return getattr(mod, self.model)(getattr(mod, self.config)(**model_cfg))


M4 = Kind(format=FORMAT, module="m4ray.models.m4", model="M4Model", config="ModelConfig")
M3 = Kind(format="m4ray-m3-v1", module="m4ray.models.m3", model="M3Model", config="M3ModelConfig")


def export(
    model, directory: str | Path, meta: dict[str, Any], card: str, *, kind: Kind = M4
) -> Path:
    """Write the weights, the config + ``meta`` and the model card; returns the directory."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    torch.save(state, directory / "model.pt")
    info = {"format": kind.format, "model": dataclasses.asdict(model.cfg), **meta}
    (directory / "model.json").write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
    (directory / "model_card.md").write_text(card)
    return directory


def load(directory: str | Path, device: str | torch.device = "cpu", *, kind: Kind = M4):
    """The model (eval mode) and its ``model.json`` contents."""
    directory = Path(directory)
    info_path, weights = directory / "model.json", directory / "model.pt"
    for path in (info_path, weights):
        if not path.exists():
            raise InputError("missing checkpoint file", file=path)
    try:
        info = json.loads(info_path.read_text())
    except json.JSONDecodeError as err:
        raise InputError(f"not valid JSON: {err.msg}", file=info_path, line=err.lineno) from None
    if info.get("format") != kind.format:
        raise InputError(
            f"format {info.get('format')!r}, this loader reads {kind.format!r}",
            file=info_path,
            field="format",
        )
    try:
        model = kind.build(info["model"]).to(device)
    except (KeyError, TypeError, ValueError) as err:
        raise InputError(f"cannot build the model: {err}", file=info_path, field="model") from None
    try:
        state = torch.load(weights, map_location=device, weights_only=True)
    except Exception as err:  # a truncated or foreign file
        raise InputError(
            f"unreadable weights ({type(err).__name__}: {err})", file=weights
        ) from None
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise InputError(
            f"weights do not match the config: missing {missing[:5]}, unexpected {unexpected[:5]}",
            file=weights,
        )
    for name, tensor in expected.items():
        if tuple(state[name].shape) != tuple(tensor.shape):
            raise InputError(
                f"weight {name} has shape {tuple(state[name].shape)}, the config "
                f"({info_path.name}) needs {tuple(tensor.shape)}",
                file=weights,
                field=name,
            )
    model.load_state_dict(state)
    return model.eval(), info


__all__ = ["FORMAT", "M3", "M4", "Kind", "export", "load"]
