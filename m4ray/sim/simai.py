"""SimAI / ASTRA-sim text workloads -> workload DAG (``reference/workloads.md`` §4.1).

Line 1: ``<POLICY> key: value ...`` with ``model_parallel_NPU_group`` (TP size), ``pp``, ``ep``,
``all_gpus`` …; line 2: the number of layers; then one 12-column line per layer::

    name reserved fwd_compute fwd_comm_type fwd_comm_size ig_compute ig_comm_type ig_comm_size
    wg_compute wg_comm_type wg_comm_size wg_update

Compute times are ns ticks. Per iteration, every rank runs the forward pass (compute, then the
blocking TP collective), then the backward pass from the last layer: input-gradient compute and
its blocking TP collective, then weight-gradient compute and its non-blocking DP collective (the
next iteration's forward of that layer waits for it). TP groups are blocks of consecutive ranks,
DP groups the ranks with the same TP index. Forward collectives smaller than 4096 B are raised to
4096 B as SimAI does. Only ``pp: 1`` is replayed (SimAI models pipelines analytically).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from m4ray.errors import InputError
from m4ray.sim.textio import parse_int, read_rows
from m4ray.sim.workload import Collective, CollectiveKind, Compute, Node, Workload

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
POLICIES = (
    "DATA",
    "MODEL",
    "HYBRID_TRANSFORMER",
    "HYBRID_TRANSFORMER_FWD_IN_BCKWD",
    "HYBRID_DATA_MODEL",
    "HYBRID_MODEL_DATA",
    "HYBRID_DLRM",
    "HYBRID_DLRM_ENHANCED",
    "HYBRID_CUSTOMIZED",
    "MICRO",
)
COMM_TYPES = {
    "NONE": None,
    "ALLREDUCE": CollectiveKind.ALL_REDUCE,
    "ALLGATHER": CollectiveKind.ALL_GATHER,
    "REDUCESCATTER": CollectiveKind.REDUCE_SCATTER,
    "ALLTOALL": CollectiveKind.ALL_TO_ALL,
}
LAYER_FIELDS = (
    "name",
    "reserved",
    "fwd_compute",
    "fwd_comm_type",
    "fwd_comm_size",
    "ig_compute",
    "ig_comm_type",
    "ig_comm_size",
    "wg_compute",
    "wg_comm_type",
    "wg_comm_size",
    "wg_update",
)
MIN_FWD_COMM = 4096


@dataclass(frozen=True, slots=True)
class Layer:
    name: str
    compute_ns: tuple[int, int, int]  # fwd, input-grad, weight-grad
    comm: tuple[tuple[CollectiveKind | None, int], ...]  # (kind, bytes) for fwd, ig, wg


@dataclass(frozen=True, slots=True)
class SimAIModel:
    policy: str
    params: dict[str, int]
    layers: tuple[Layer, ...]


def parse_simai(path: str | Path) -> SimAIModel:
    """Parse a SimAI workload file; errors name the file, line and field."""
    path = Path(path)
    rows = read_rows(path, "workload")
    if len(rows) < 2:
        raise InputError("a SimAI workload needs a header line and a layer count", file=path)
    policy, params = _parse_header(rows[0][1], path, rows[0][0])
    count_no, count = rows[1]
    if len(count) != 1 or not count[0].isdigit() or int(count[0]) < 1:
        raise InputError(
            "expected the number of layers (an integer >= 1)",
            file=path,
            line=count_no,
            field="layers",
        )
    layers = tuple(_parse_layer(fields, path, no) for no, fields in rows[2:])
    if len(layers) != int(count[0]):
        raise InputError(
            f"announces {count[0]} layers, file has {len(layers)}",
            file=path,
            line=count_no,
            field="layers",
        )
    return SimAIModel(policy=policy, params=params, layers=layers)


def _parse_header(fields: list[str], path: Path, line: int) -> tuple[str, dict[str, int]]:
    if not fields or fields[0] not in POLICIES:
        raise InputError(
            f"unknown parallelism policy '{fields[0] if fields else ''}'; valid "
            f"choices: {', '.join(POLICIES)}",
            file=path,
            line=line,
            field="policy",
        )
    params: dict[str, int] = {}
    tokens = fields[1:]
    i = 0
    while i < len(tokens):
        key = tokens[i]
        if not key.endswith(":") or i + 1 >= len(tokens):
            raise InputError(f"expected 'key: value' pairs, got '{key}'", file=path, line=line)
        try:
            params[key[:-1]] = int(tokens[i + 1])
        except ValueError:
            raise InputError(
                f"expected an integer, got '{tokens[i + 1]}'", file=path, line=line, field=key[:-1]
            ) from None
        i += 2
        while i < len(tokens) and not tokens[i].endswith(":"):  # multi-valued keys (checkpoints)
            i += 1
    return fields[0], params


def _parse_layer(fields: list[str], path: Path, line: int) -> Layer:
    if len(fields) != len(LAYER_FIELDS):
        raise InputError(
            f"a layer line has {len(LAYER_FIELDS)} columns "
            f"({' '.join(LAYER_FIELDS)}), got {len(fields)}",
            file=path,
            line=line,
        )
    values = dict(zip(LAYER_FIELDS, fields, strict=True))
    compute = tuple(
        parse_int(values[f"{p}_compute"], path, line, f"{p}_compute") for p in ("fwd", "ig", "wg")
    )
    comm = []
    for phase in ("fwd", "ig", "wg"):
        name = values[f"{phase}_comm_type"]
        if name not in COMM_TYPES:
            raise InputError(
                f"unsupported communication type '{name}'; valid choices: {', '.join(COMM_TYPES)}",
                file=path,
                line=line,
                field=f"{phase}_comm_type",
            )
        size = parse_int(values[f"{phase}_comm_size"], path, line, f"{phase}_comm_size")
        kind = COMM_TYPES[name]
        if kind is not None and size == 0:
            raise InputError(f"{name} of 0 bytes", file=path, line=line, field=f"{phase}_comm_size")
        comm.append((kind, size))
    return Layer(values["name"], compute, tuple(comm))


def build_workload(
    model: SimAIModel,
    *,
    scale: float = 1.0,
    compute_scale: float = 1.0,
    iterations: int = 1,
    name: str = "",
    source: str | Path | None = None,
) -> Workload:
    """Unroll a parsed SimAI model into a per-rank DAG.

    ``scale`` multiplies every message size (bytes, rounded up, at least 1); ``compute_scale``
    multiplies every compute time.
    """
    p = model.params
    n = p.get("all_gpus", 0)
    tp = p.get("model_parallel_NPU_group", 1)
    pp = p.get("pp", 1)
    if n < 1 or tp < 1 or n % tp:
        raise InputError(
            f"all_gpus ({n}) must be a positive multiple of model_parallel_NPU_group ({tp})",
            file=source,
            line=1,
            field="all_gpus",
        )
    if pp != 1:
        raise InputError(
            "only pp: 1 is replayed from SimAI files; use a Chakra trace for pipelines",
            file=source,
            line=1,
            field="pp",
        )
    if scale <= 0 or compute_scale < 0 or iterations < 1:
        raise InputError("scale must be > 0, compute_scale >= 0, iterations >= 1", field="workload")
    builder = _Builder(n, tp, scale, compute_scale)
    for rank in range(n):
        builder.rank_program(rank, model.layers, iterations)
    return Workload(n_ranks=n, nodes=builder.nodes, name=name)


class _Builder:
    def __init__(self, n: int, tp: int, scale: float, compute_scale: float) -> None:
        self.n, self.tp, self.scale, self.compute_scale = n, tp, scale, compute_scale
        self.nodes: list[Node] = []

    def _group(self, rank: int, phase: str) -> tuple[int, ...]:
        if phase == "wg":  # data parallel: same TP index
            return tuple(range(rank % self.tp, self.n, self.tp))
        start = rank - rank % self.tp
        return tuple(range(start, start + self.tp))

    def _add(self, node: Node) -> int:
        self.nodes.append(node)
        return node.id

    def _compute(self, rank: int, ns: int, deps: tuple[int, ...], name: str) -> int:
        return self._add(
            Compute(
                id=len(self.nodes),
                rank=rank,
                deps=deps,
                name=name,
                duration_s=ns * 1e-9 * self.compute_scale,
            )
        )

    def _comm(self, rank, phase, comm, deps, name) -> int | None:
        kind, size = comm
        group = self._group(rank, phase)
        if kind is None or len(group) < 2:
            return None
        if phase == "fwd":
            size = max(size, MIN_FWD_COMM)
        size = max(1, math.ceil(size * self.scale))
        return self._add(
            Collective(
                id=len(self.nodes),
                rank=rank,
                kind=kind,
                size_bytes=size,
                group=group,
                deps=deps,
                name=name,
            )
        )

    def rank_program(self, rank: int, layers: tuple[Layer, ...], iterations: int) -> None:
        last: tuple[int, ...] = ()
        wg_pending: dict[int, int] = {}  # layer -> weight-gradient collective of the last iteration
        for it in range(iterations):
            for i, layer in enumerate(layers):
                deps = last + ((wg_pending.pop(i),) if i in wg_pending else ())
                last = (self._compute(rank, layer.compute_ns[0], deps, f"{layer.name}.fwd.{it}"),)
                comm = self._comm(rank, "fwd", layer.comm[0], last, f"{layer.name}.fwd_comm.{it}")
                last = (comm,) if comm is not None else last
            for i in reversed(range(len(layers))):
                layer = layers[i]
                last = (self._compute(rank, layer.compute_ns[1], last, f"{layer.name}.ig.{it}"),)
                comm = self._comm(rank, "ig", layer.comm[1], last, f"{layer.name}.ig_comm.{it}")
                last = (comm,) if comm is not None else last
                last = (self._compute(rank, layer.compute_ns[2], last, f"{layer.name}.wg.{it}"),)
                comm = self._comm(rank, "wg", layer.comm[2], last, f"{layer.name}.wg_comm.{it}")
                if comm is not None:
                    wg_pending[i] = comm


@dataclass(kw_only=True, slots=True)
class SimAIWorkloadSpec:
    """A SimAI text workload: ``path`` is a file, or a name shipped in ``m4ray/data``."""

    path: str
    scale: float = 1.0
    compute_scale: float = 1.0
    iterations: int = 1

    def resolve(self) -> Path:
        candidate = Path(self.path)
        if candidate.exists() or candidate.is_absolute() or "/" in self.path:
            return candidate
        return DATA_DIR / (self.path if self.path.endswith(".txt") else f"{self.path}.txt")

    def build(self) -> Workload:
        path = self.resolve()
        model = parse_simai(path)
        return build_workload(
            model,
            scale=self.scale,
            compute_scale=self.compute_scale,
            iterations=self.iterations,
            name=path.stem,
            source=path,
        )
