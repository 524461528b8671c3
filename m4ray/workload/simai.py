"""SimAI / ASTRA-sim text workloads -> workload DAG (``reference/workloads.md`` §4.1).

Line 1: ``<POLICY> key: value ...`` with ``model_parallel_NPU_group`` (TP size), ``ep``, ``pp``,
``vpp``, ``ga``, ``all_gpus``, ``pp_comm`` … (AICB writes ``pp_comm`` without its colon; older
AICB files carry only the TP size and no ``all_gpus``: the job then spans the topology's GPUs, with
a warning); line 2: the number of layers (a count that disagrees with the lines is warned about:
the lines are trusted, as SimAI does); then one 12-column line per layer::

    name reserved fwd_compute fwd_comm_type fwd_comm_size ig_compute ig_comm_type ig_comm_size
    wg_compute wg_comm_type wg_comm_size wg_update

Compute times are ns ticks. Per iteration, every rank runs the forward pass (compute, then the
blocking collective), then the backward pass from the last layer: input-gradient compute and its
blocking collective, then weight-gradient compute and its non-blocking collective (the next
iteration's forward of that layer waits for it). Forward collectives smaller than 4096 B are
raised to 4096 B as SimAI does.

Communication types are ``ALLREDUCE``, ``ALLGATHER``, ``REDUCESCATTER``, ``ALLTOALL``,
``BROADCAST`` (from the group's first rank) or ``NONE``, with an optional suffix naming the group
(SimAI's ``MockNccl`` groups; ``D`` = the DP group's members in rank order):

=========  ==========================================  =========================================
suffix     fwd / input-grad column                     weight-grad column
=========  ==========================================  =========================================
(none)     TP: ``tp`` consecutive ranks                DP: the ranks with the rank's TP index
``_EP``    EP: the block of ``ep`` consecutive members of ``D`` holding the rank
``_DP_EP`` DP_EP: the members of ``D`` at the rank's position modulo ``ep``
=========  ==========================================  =========================================

Policies: ``MICRO`` files (AICB micro tests) run every collective over all ranks; ``DATA`` is
TP 1. With ``pp > 1`` the file holds one pipeline stage, as AICB writes it: ranks form ``pp``
stages of ``all_gpus / pp`` consecutive ranks, each stage runs the layers with its own TP/DP/EP
groups, and — as in SimAI — pipeline sends are not injected (SimAI adds the bubble and the exposed
``pp_comm`` analytically at report time; m4ray leaves them out and warns).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from m4ray.errors import InputError
from m4ray.fingerprint import added_field
from m4ray.sim.workload import Collective, CollectiveKind, Compute, Node, Workload, scaled_bytes
from m4ray.textio import parse_int, read_rows

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
log = logging.getLogger(__name__)
BASE_TYPES = {
    "ALLREDUCE": CollectiveKind.ALL_REDUCE,
    "ALLGATHER": CollectiveKind.ALL_GATHER,
    "REDUCESCATTER": CollectiveKind.REDUCE_SCATTER,
    "ALLTOALL": CollectiveKind.ALL_TO_ALL,
    "BROADCAST": CollectiveKind.BROADCAST,
}
SUFFIXES = {"": None, "_EP": "ep", "_DP_EP": "dp_ep"}  # None: the column's own group (TP / DP)
COMM_TYPES = ("NONE", *(base + suffix for base in BASE_TYPES for suffix in SUFFIXES))
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
class Comm:
    """One column's communication: kind (None = none), bytes, and the group named by its suffix
    (None = the column's own group: TP for fwd/ig, DP for wg)."""

    kind: CollectiveKind | None
    size_bytes: int
    group: str | None = None


@dataclass(frozen=True, slots=True)
class Layer:
    name: str
    compute_ns: tuple[int, int, int]  # fwd, input-grad, weight-grad
    comm: tuple[Comm, Comm, Comm]  # fwd, ig, wg


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
    if not layers:
        raise InputError("the file has no layer lines", file=path, line=count_no, field="layers")
    if len(layers) != int(count[0]):
        log.warning(
            "%s:%d: announces %s layers, the file has %d: replaying the %d lines (as SimAI does)",
            path,
            count_no,
            count[0],
            len(layers),
            len(layers),
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
        key = tokens[i].removesuffix(":")  # AICB writes `pp_comm <n>` without the colon
        if not key or key[0].isdigit() or i + 1 >= len(tokens):
            raise InputError(
                f"expected 'key: value' pairs, got '{tokens[i]}'", file=path, line=line
            )
        try:
            params[key] = int(tokens[i + 1])
        except ValueError:
            raise InputError(
                f"expected an integer, got '{tokens[i + 1]}'", file=path, line=line, field=key
            ) from None
        i += 2
        while i < len(tokens) and _is_int(tokens[i]):  # multi-valued keys (checkpoints)
            i += 1
    return fields[0], params


def _is_int(token: str) -> bool:
    return token.lstrip("-").isdigit()


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
        if name == "NONE" or size == 0:  # AICB writes some backward collectives with 0 bytes
            comm.append(Comm(None, 0))
            continue
        base = next(b for b in BASE_TYPES if name.startswith(b))
        comm.append(Comm(BASE_TYPES[base], size, SUFFIXES[name[len(base) :]]))
    return Layer(values["name"], compute, (comm[0], comm[1], comm[2]))


def build_workload(
    model: SimAIModel,
    *,
    scale: float = 1.0,
    compute_scale: float = 1.0,
    iterations: int = 1,
    name: str = "",
    source: str | Path | None = None,
    n_hosts: int | None = None,
) -> Workload:
    """Unroll a parsed SimAI model into a per-rank DAG.

    ``scale`` multiplies every message size (bytes, rounded up, at least 1); ``compute_scale``
    multiplies every compute time; ``n_hosts`` (the topology's GPUs) sizes a job whose header
    has no ``all_gpus``.
    """
    if scale <= 0 or compute_scale < 0 or iterations < 1:
        raise InputError("scale must be > 0, compute_scale >= 0, iterations >= 1", field="workload")
    groups = job_groups(model, source=source, n_hosts=n_hosts)
    builder = _Builder(groups, scale, compute_scale)
    for rank in range(groups.n):
        builder.rank_program(rank, model.layers, iterations)
    return Workload(n_ranks=groups.n, nodes=builder.nodes, name=name)


def job_groups(
    model: SimAIModel, *, source: str | Path | None = None, n_hosts: int | None = None
) -> SimAIGroups:
    """The job's size and parallelism from the header, checked (errors name the field)."""
    p = model.params
    n = p.get("all_gpus", 0)
    if n == 0:
        if not n_hosts:
            raise InputError(
                "the header has no all_gpus (old AICB format) and no topology gives the GPU count",
                file=source,
                line=1,
                field="all_gpus",
            )
        n = n_hosts
        log.warning(
            "%s: no all_gpus in the header (old AICB format): the job spans the topology's %d GPUs",
            source,
            n,
        )
    micro = model.policy in ("MICRO", "DATA")
    tp = 1 if micro else p.get("model_parallel_NPU_group", 1)
    pp, ep = max(1, p.get("pp", 1)), max(1, p.get("ep", 1))
    if n < 1 or tp < 1 or n % (tp * pp):
        raise InputError(
            f"all_gpus ({n}) must be a positive multiple of model_parallel_NPU_group ({tp}) x "
            f"pp ({pp})",
            file=source,
            line=1,
            field="all_gpus",
        )
    dp = n // (tp * pp)
    if dp % ep:
        raise InputError(
            f"ep ({ep}) must divide the data-parallel size all_gpus / (tp x pp) = {dp}",
            file=source,
            line=1,
            field="ep",
        )
    if pp > 1:
        log.warning(
            "%s: pp %d: %d stages of %d ranks replay the file's stage; pipeline sends and the "
            "bubble are not simulated (SimAI adds them analytically)",
            source,
            pp,
            pp,
            n // pp,
        )
    return SimAIGroups(n=n, tp=tp, pp=pp, ep=ep, micro=model.policy == "MICRO")


def rank_program(
    groups: SimAIGroups,
    layers: tuple[Layer, ...],
    *,
    scale: float = 1.0,
    compute_scale: float = 1.0,
    iterations: int = 1,
    rank: int = 0,
) -> tuple[list[Node], dict[int, tuple[str, str | None]]]:
    """One rank's nodes, and each collective node's group kind (``("tp" | "wg", suffix)``)."""
    builder = _Builder(groups, scale, compute_scale)
    builder.rank_program(rank, layers, iterations)
    return builder.nodes, builder.group_kind


@dataclass(frozen=True, slots=True)
class SimAIGroups:
    """SimAI's communication groups of a rank (the table in the module docstring)."""

    n: int
    tp: int
    pp: int = 1
    ep: int = 1
    micro: bool = False  # MICRO: every collective spans all ranks

    def of(self, rank: int, phase: str, suffix: str | None) -> tuple[int, ...]:
        if self.micro:
            return tuple(range(self.n))
        stage = self.n // self.pp
        base = rank - rank % stage
        local = rank - base
        if suffix is None and phase != "wg":  # TP
            start = rank - local % self.tp
            return tuple(range(start, start + self.tp))
        dp = [base + i for i in range(local % self.tp, stage, self.tp)]
        if suffix is None:
            return tuple(dp)
        at = dp.index(rank)
        if suffix == "ep":
            first = at - at % self.ep
            return tuple(dp[first : first + self.ep])
        return tuple(dp[at % self.ep :: self.ep])  # dp_ep


class _Builder:
    def __init__(self, groups: SimAIGroups, scale: float, compute_scale: float) -> None:
        self.groups, self.scale, self.compute_scale = groups, scale, compute_scale
        self.nodes: list[Node] = []
        self._group_of: dict[tuple[int, str, str | None], tuple[int, ...]] = {}
        self.group_kind: dict[int, tuple[str, str | None]] = {}  # collective node -> group kind

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

    def _comm(self, rank: int, phase: str, comm: Comm, deps, name) -> int | None:
        if comm.kind is None:
            return None
        key = (rank, "wg" if phase == "wg" else "tp", comm.group)  # every layer asks again
        group = self._group_of.get(key)
        if group is None:
            group = self._group_of[key] = self.groups.of(rank, phase, comm.group)
        if len(group) < 2:
            return None
        size = max(comm.size_bytes, MIN_FWD_COMM) if phase == "fwd" else comm.size_bytes
        size = scaled_bytes(size, self.scale)
        self.group_kind[len(self.nodes)] = key[1:]
        return self._add(
            Collective(
                id=len(self.nodes),
                rank=rank,
                kind=comm.kind,
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


class SimAIProgram:
    """A SimAI job's :class:`~m4ray.sim.lockstep.LockstepProgram`: rank 0's program from the
    parsed file (never unrolled per rank) and SimAI's groups of each kind. ``n_hosts`` sizes
    files without ``all_gpus``; ``scale``, ``compute_scale`` and ``iterations`` as the spec's."""

    def __init__(
        self,
        model: SimAIModel,
        *,
        n_hosts: int | None = None,
        scale: float = 1.0,
        compute_scale: float = 1.0,
        iterations: int = 1,
        source: str | Path | None = None,
    ) -> None:
        self.model, self.scale, self.compute_scale = model, scale, compute_scale
        self.iterations = iterations
        self.groups = job_groups(model, source=source, n_hosts=n_hosts)
        self.n_ranks = self.groups.n
        self._partitions: dict[tuple[str, str | None], list[tuple[int, ...]]] = {}

    def program(self) -> tuple[list[Node], dict[int, tuple[str, str | None]]]:
        return rank_program(
            self.groups,
            self.model.layers,
            scale=self.scale,
            compute_scale=self.compute_scale,
            iterations=self.iterations,
            rank=0,
        )

    def partition(self, key: tuple[str, str | None]) -> list[tuple[int, ...]]:
        """Every group of one kind (``("tp" | "wg", suffix)``): the ranks split by it."""
        if key not in self._partitions:
            phase = "wg" if key[0] == "wg" else "fwd"
            seen = [False] * self.n_ranks
            out = []
            for rank in range(self.n_ranks):
                if not seen[rank]:
                    group = self.groups.of(rank, phase, key[1])
                    for member in group:
                        seen[member] = True
                    out.append(group)
            self._partitions[key] = out
        return self._partitions[key]


@dataclass(kw_only=True, slots=True)
class SimAIWorkloadSpec:
    """A SimAI text workload: ``path`` is a file, or a name shipped in ``m4ray/data``.

    ``lockstep``: replay it by rank symmetry (:mod:`m4ray.sim.lockstep`: one rank's program,
    each collective as rounds of every group at once) instead of unrolling every rank — for jobs
    of thousands of GPUs; no per-flow table."""

    path: str
    scale: float = 1.0
    compute_scale: float = 1.0
    iterations: int = 1
    lockstep: bool = added_field(False, "lockstep replay (2026-11)")

    def resolve(self) -> Path:
        candidate = Path(self.path)
        if candidate.exists() or candidate.is_absolute() or "/" in self.path:
            return candidate
        return DATA_DIR / (self.path if self.path.endswith(".txt") else f"{self.path}.txt")

    def model(self) -> SimAIModel:
        return parse_simai(self.resolve())

    def lockstep_program(self, n_hosts: int | None = None) -> SimAIProgram:
        """The lockstep replay's program (a job of any size, never unrolled)."""
        return SimAIProgram(
            self.model(),
            n_hosts=n_hosts,
            scale=self.scale,
            compute_scale=self.compute_scale,
            iterations=self.iterations,
            source=str(self.resolve()),
        )

    def build(self, n_hosts: int | None = None) -> Workload:
        """The DAG; ``n_hosts`` (the topology's GPUs) sizes old files without ``all_gpus``."""
        path = self.resolve()
        model = parse_simai(path)
        return build_workload(
            model,
            scale=self.scale,
            compute_scale=self.compute_scale,
            iterations=self.iterations,
            name=path.stem,
            source=path,
            n_hosts=n_hosts,
        )
