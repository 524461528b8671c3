"""Ray Serve application for m3: batched path corrections over HTTP.

A client (another simulator, or :mod:`m4ray.m3.estimate` on a machine without the model) computes
each sampled path's flowSim feature tokens and posts them; ``@serve.batch`` gathers the paths of
concurrent requests into one forward pass. ``POST /predict`` returns every path's 4 × 100
foreground percentiles; when every path also carries its foreground counts per output bucket and
its draw count, the response also holds the network-wide estimate (p50/p90/p99 overall and per
bucket, :func:`m4ray.m3.aggregate.aggregate`). ``GET /health`` names the checkpoint, the CCs it
was trained on and whether its path flowSim runs with standing queues (``path_flowsim_queues``,
``path_flowsim_first_windows``: HPCC's first windows queued, ``path_flowsim_bursts``: first
windows over the level, and ``path_flowsim_route_rtt``: at each flow's route round trip; the
client's tokens must be computed so, :func:`m4ray.m3.estimate.checkpoint_queues`); a request for
another CC gets 400 (as do tokens of the wrong shape), nothing else changes. Run with
``python -m m4ray.sweeps +experiment=serve serve.m3_checkpoint=<dir>`` (route ``/m3``) or
``serve run m4ray.serve.m3:app``.
"""

# no `from __future__ import annotations`: FastAPI resolves the route types of the pickled
# ingress class at runtime (as in m4ray/serve/app.py)
import itertools
from typing import Any

import numpy as np
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, ConfigDict, Field
from ray import serve

from m4ray.errors import InputError
from m4ray.models.m3_features import N_BUCKETS_IN, N_BUCKETS_OUT, N_PCT, TOKEN_DIM


class PathFeatures(BaseModel):
    """One sampled path: ``L + 1`` tokens (foreground first) and their empty-bucket flags."""

    tokens: list[list[float]] = Field(min_length=2, max_length=17)
    empty: list[list[bool]]
    baseline: list[list[float]] | None = Field(
        None, description="path flowSim's foreground percentiles, 4 x 100 (residual models)"
    )
    counts: list[int] | None = Field(None, description="foreground flows per output bucket (4)")
    draws: int | None = Field(None, ge=1, description="how often sampling drew this path")


class PredictRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cc: str = "dctcp"
    paths: list[PathFeatures] = Field(min_length=1, max_length=10_000)


class M3Args(BaseModel):
    model_config = ConfigDict(extra="forbid")

    checkpoint: str = "checkpoints/m3-v2"
    max_batch_requests: int = Field(32, ge=1)
    batch_wait_s: float = Field(0.002, ge=0)
    threads: int = Field(1, ge=1)


def _arrays(paths: list[PathFeatures], residual: bool) -> tuple[np.ndarray, ...]:
    """Padded tokens ``(P, T, TOKEN_DIM)``, flags, link counts and baselines; a bad shape raises
    InputError."""
    lmax = max(len(p.tokens) for p in paths)
    tok = np.zeros((len(paths), lmax, TOKEN_DIM), dtype=np.float32)
    empty = np.ones((len(paths), lmax, N_BUCKETS_IN), dtype=bool)
    for i, p in enumerate(paths):
        t = np.asarray(p.tokens, dtype=np.float32)
        e = np.asarray(p.empty, dtype=bool)
        if t.shape != (len(p.tokens), TOKEN_DIM) or e.shape != (len(p.tokens), N_BUCKETS_IN):
            raise InputError(
                f"tokens must be (L+1) x {TOKEN_DIM} and empty (L+1) x {N_BUCKETS_IN}, got "
                f"{t.shape} and {e.shape}",
                field=f"paths[{i}]",
            )
        tok[i, : len(t)], empty[i, : len(e)] = t, e
    base = np.ones((len(paths), N_BUCKETS_OUT, N_PCT), dtype=np.float32)
    if residual:
        for i, p in enumerate(paths):
            b = np.asarray(p.baseline if p.baseline is not None else [], dtype=np.float32)
            if b.shape != (N_BUCKETS_OUT, N_PCT):
                raise InputError(
                    f"this checkpoint corrects path flowSim: baseline must be "
                    f"{N_BUCKETS_OUT} x {N_PCT}, got {b.shape}",
                    field=f"paths[{i}].baseline",
                )
            base[i] = b
    return tok, empty, np.array([len(p.tokens) - 1 for p in paths]), base


api = FastAPI(title="m4ray m3", version="1")


@serve.deployment(ray_actor_options={"num_cpus": 1}, max_ongoing_requests=256)
@serve.ingress(api)
class M3Service:
    """The checkpoint, one forward pass per batch of requests."""

    def __init__(self, args: M3Args) -> None:
        import torch

        from m4ray.m3.estimate import load_model

        torch.set_num_threads(args.threads)
        self.model, self.info = load_model(args.checkpoint, "dctcp")
        self.checkpoint = args.checkpoint
        self.predict_batch.set_max_batch_size(args.max_batch_requests)
        self.predict_batch.set_batch_wait_timeout_s(args.batch_wait_s)
        self.batches = 0

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.002)
    async def predict_batch(self, requests: list[tuple]) -> list[np.ndarray]:
        import torch

        self.batches += 1
        lmax = max(r[0].shape[1] for r in requests)
        tok = np.concatenate(
            [np.pad(r[0], ((0, 0), (0, lmax - r[0].shape[1]), (0, 0))) for r in requests]
        )
        empty = np.concatenate(
            [
                np.pad(r[1], ((0, 0), (0, lmax - r[1].shape[1]), (0, 0)), constant_values=True)
                for r in requests
            ]
        )
        lengths = torch.from_numpy(np.concatenate([r[2] for r in requests]))
        base = torch.from_numpy(np.concatenate([r[3] for r in requests]))
        t, e = torch.from_numpy(tok), torch.from_numpy(empty)
        with torch.no_grad():
            out = self.model(t[:, 0], e[:, 0], t[:, 1:], e[:, 1:], lengths, base).numpy()
        sizes = np.cumsum([0] + [len(r[2]) for r in requests])
        return [out[a:b] for a, b in itertools.pairwise(sizes.tolist())]

    @api.get("/health")
    async def health(self) -> dict[str, Any]:
        from m4ray.m3.lot import PATH_MODES

        return {
            "ok": True,
            "checkpoint": self.checkpoint,
            "supported_cc": self.info.get("supported_cc", []),
            # the tokens and baseline a client must send: path flowSim with standing queues
            # (m4ray.m3.lot.lot_queues) or without, as the checkpoint was trained
            **{
                key: bool(self.info.get(key, False))
                for key in ("path_flowsim_queues", *PATH_MODES.values())
            },
            "batches": self.batches,
        }

    @api.post("/predict")
    async def predict(self, request: PredictRequest) -> dict[str, Any]:
        from m4ray.m3.aggregate import aggregate

        supported = self.info.get("supported_cc", [])
        if request.cc not in supported:
            raise HTTPException(
                400, f"the checkpoint was trained on {supported}, not {request.cc!r}"
            )
        try:
            arrays = _arrays(request.paths, self.model.cfg.residual)
        except InputError as err:
            raise HTTPException(400, str(err)) from None
        pred = await self.predict_batch(arrays)
        body: dict[str, Any] = {"percentiles": pred.round(6).tolist()}
        paths = request.paths
        if all(p.counts is not None and p.draws is not None for p in paths):
            counts = np.array([p.counts for p in paths])
            if counts.shape != (len(paths), N_BUCKETS_OUT):
                raise HTTPException(400, f"counts must have {N_BUCKETS_OUT} entries per path")
            try:
                est = aggregate(pred, counts, np.array([p.draws for p in paths]))
            except InputError as err:
                raise HTTPException(400, str(err)) from None
            body["estimate"] = {
                name: {f"p{q}": float(mix.quantile(q / 100)) for q in (50, 90, 99)}
                for name, mix in [("overall", est.overall), *est.buckets.items()]
            }
        return body


def build(args: M3Args):
    return M3Service.bind(args)


app = build(M3Args())

__all__ = ["M3Args", "M3Service", "PredictRequest", "app", "build"]
