"""Busy periods of a datagen dataset as training samples, with m4's balanced sampling.

Scenarios, not periods, are split into train / validation / test, so held-out metrics come from
simulations the model never saw. Within a split, periods with one flow (nothing to learn about
contention) or with ``max_active`` or more flows active at once are dropped (m4 drops ≥ 150), and
``n_samples`` periods are drawn without replacement with equal total weight per occupied size bin
(``reference/m4.md`` §6.2; we give the smallest occupied bin its share instead of weight 0, since
single-flow periods are already excluded).

With ``components`` the chosen periods (up to ``max_period_flows`` flows, whatever their peak)
are cut into the engine's components (:func:`~m4ray.train.periods.split_components`) and those
become the samples, filtered by ``max_flows`` and ``max_active`` in turn: a busy period of
thousands of flows across a cluster is mostly hundreds of independent components, which the
model steps apart online, and lockstep over the whole period costs memory and time that grow
with the period (at 3,054 flows, 24 GB and 95 s a step), not the component.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import torch

from m4ray.errors import InputError
from m4ray.models.fairshare import ACK_BYTES, Window, ack_fraction
from m4ray.models.wire import WireFormat, wire_window
from m4ray.train.periods import PeriodSample, split_components

SIZE_BINS = (2, 4, 6, 8, 10, 15, 20, 30, 40, 50, 75, 100)
TABLES = ("flows", "events", "remaining", "queues", "periods", "links")


@dataclass(kw_only=True, slots=True)
class DataConfig:
    """Which periods become samples (``n_samples`` per split: train, val, test)."""

    dataset: str = "outputs/datagen/dataset"
    val_fraction: float = 0.15
    test_fraction: float = 0.15
    max_active: int = 150
    max_flows: int = 400
    n_samples: list[int] | None = None  # None: every eligible period
    seed: int = 0
    # cut periods into the engine's components (module docstring); periods up to this many
    # flows are chosen, their components then filtered by max_flows and max_active
    components: bool = False
    max_period_flows: int = 4000

    def __post_init__(self) -> None:
        if not 0 <= self.val_fraction < 1 or not 0 <= self.test_fraction < 1:
            raise InputError("fractions must be in [0, 1)", field="data.val_fraction")
        if self.val_fraction + self.test_fraction >= 1:
            raise InputError("val + test fractions must leave training data", field="data")


@dataclass(kw_only=True, slots=True)
class Sample:
    """A period sample plus what evaluation needs (flowSim's slowdown for the same flows)."""

    scenario_id: str
    period_id: int
    period: PeriodSample
    flowsim_slowdown: torch.Tensor
    component: int = -1  # its index among the period's components (DataConfig.components)

    @property
    def n_flows(self) -> int:
        return len(self.period.size_bytes)


def dataset_version(path: str | Path) -> str:
    version = Path(path) / "VERSION"
    if not version.exists():
        raise InputError(
            "not a datagen dataset (no VERSION file); make one with `make datagen` or "
            "`python -m m4ray.sweeps +experiment=datagen`",
            file=path,
        )
    return version.read_text().strip()


def split_scenarios(path: str | Path, cfg: DataConfig) -> dict[str, list[str]]:
    """Scenario ids of the ok scenarios per split, shuffled by ``cfg.seed``."""
    dataset_version(path)
    frame = pq.read_table(Path(path) / "scenarios.parquet").to_pandas()
    ids = sorted(frame[frame.status == "ok"].scenario_id)
    if len(ids) < 2:
        raise InputError(f"need at least 2 ok scenarios, found {len(ids)}", file=path)
    order = np.random.default_rng(cfg.seed).permutation(len(ids))
    n_test = round(len(ids) * cfg.test_fraction)
    n_val = max(1, round(len(ids) * cfg.val_fraction)) if cfg.val_fraction > 0 else 0
    n_test = min(n_test, len(ids) - n_val - 1)
    picked = [ids[i] for i in order]
    return {
        "test": sorted(picked[:n_test]),
        "val": sorted(picked[n_test : n_test + n_val]),
        "train": sorted(picked[n_test + n_val :]),
    }


def _read(path: Path, table: str, scenario_id: str) -> pd.DataFrame:
    return pq.read_table(path / table / f"scenario_id={scenario_id}" / "part-0.parquet").to_pandas()


def eligible_periods(path: str | Path, scenario_id: str, cfg: DataConfig) -> pd.DataFrame:
    """The busy periods of one scenario that become samples (``period_id``, ``n_flows``), in
    the order :func:`scenario_samples` returns them."""
    return _eligible(_read(Path(path), "periods", scenario_id), cfg)


def _eligible(periods: pd.DataFrame, cfg: DataConfig) -> pd.DataFrame:
    if cfg.components:  # their components are filtered once cut (components_of)
        keep = periods[(periods.n_flows >= 2) & (periods.n_flows <= cfg.max_period_flows)]
        return keep[["period_id", "n_flows"]]
    keep = periods[(periods.n_flows >= 2) & (periods.n_flows <= cfg.max_flows)]
    return keep[keep.max_active < cfg.max_active][["period_id", "n_flows"]]


def components_of(sample: Sample, cfg: DataConfig, anchor: str | None = None) -> list[Sample]:
    """``sample``'s period cut into the engine's components (with ``anchor``'s schedule, the
    model's :attr:`~m4ray.models.config.ModelConfig.anchor`), those with 2 to ``max_flows``
    flows and fewer than ``max_active`` active at once, as samples."""
    out = []
    for k, (flows, part) in enumerate(split_components(sample.period, anchor)):
        if not 2 <= len(flows) <= cfg.max_flows or peak_active(part) >= cfg.max_active:
            continue
        out.append(
            Sample(
                scenario_id=sample.scenario_id,
                period_id=sample.period_id,
                period=part,
                flowsim_slowdown=sample.flowsim_slowdown[flows],
                component=k,
            )
        )
    return out


def peak_active(period: PeriodSample) -> int:
    """The most flows active at once in ``period``."""
    delta = np.zeros(len(period.dt_us) + 1, dtype=np.int64)
    np.add.at(delta, period.arrival.cpu().numpy(), 1)
    np.add.at(delta, period.departure.cpu().numpy(), -1)
    return int(np.cumsum(delta).max())


def scenario_samples(
    path: str | Path, scenario_id: str, cfg: DataConfig, periods: set[int] | None = None
) -> list[Sample]:
    """Every eligible busy period of one scenario (or those of ``periods``) as a
    :class:`Sample`."""
    path = Path(path)
    t = {name: _read(path, name, scenario_id) for name in TABLES}
    scenarios = pq.read_table(path / "scenarios.parquet").to_pandas().set_index("scenario_id")
    params = torch.tensor(np.asarray(scenarios.loc[scenario_id, "params13"]), dtype=torch.float32)
    keep = _eligible(t["periods"], cfg)
    if periods is not None:
        keep = keep[keep.period_id.isin(periods)]
    groups = {name: dict(tuple(t[name].groupby("period_id"))) for name in ("flows", "events")}
    remaining = dict(tuple(t["remaining"].groupby("period_id")))
    queues = t["queues"].set_index("flow_id")
    link_table = t["links"].set_index("link")
    bandwidth = link_table.bandwidth_bps
    wire = _wire(scenarios.loc[scenario_id, "params"])
    window = _window(scenarios.loc[scenario_id, "params"], link_table, wire)
    acks = _ack_fraction(scenarios.loc[scenario_id, "params"], wire)
    fifo_bits = _fifo_bits(scenarios.loc[scenario_id, "params"], wire)
    return [
        _sample(
            scenario_id,
            int(p),
            groups=groups,
            remaining=remaining,
            queues=queues,
            params=params,
            bandwidth=bandwidth,
            wire=wire,
            window=window,
            acks=acks,
            fifo_bits=fifo_bits,
        )
        for p in keep.period_id
    ]


def _sample(
    scenario_id,
    period,
    *,
    groups,
    remaining,
    queues,
    params,
    bandwidth,
    wire,
    window,
    acks,
    fifo_bits,
) -> Sample:
    flows = groups["flows"][period].sort_values("flow_id")
    events = groups["events"][period].sort_values("event")
    local = pd.Series(np.arange(len(flows)), index=flows.flow_id.to_numpy())
    k = pd.Series(np.arange(len(events)), index=events.event.to_numpy())
    arrival = np.zeros(len(flows), dtype=np.int64)
    departure = np.zeros(len(flows), dtype=np.int64)
    rows = local.loc[events.flow_id].to_numpy()
    is_arrival = events.kind.to_numpy() == 0
    arrival[rows[is_arrival]] = np.flatnonzero(is_arrival)
    departure[rows[~is_arrival]] = np.flatnonzero(~is_arrival)
    dt_us = np.diff(events.time_s.to_numpy(), prepend=events.time_s.iloc[0]) * 1e6
    paths = flows.path.to_list()
    links = np.unique(np.concatenate(paths))
    link_row = pd.Series(np.arange(len(links)), index=links)
    inc_flow = np.repeat(np.arange(len(flows)), [len(p) for p in paths])
    inc_link = link_row.loc[np.concatenate(paths)].to_numpy()
    # each link row's reverse (the cable's other direction) among the period's rows, or -1
    reverse = link_row.reindex(links ^ 1).fillna(-1).to_numpy().astype(np.int64)
    size = flows.size_bytes.to_numpy()
    ideal = flows.ideal_fct_s.to_numpy()
    rem = remaining.get(period)
    remain = np.stack(
        [
            k.loc[rem.event].to_numpy(),
            local.loc[rem.flow_id].to_numpy(),
            rem.remaining_bytes.to_numpy() / size[local.loc[rem.flow_id].to_numpy()],
        ],
        axis=1,
    )
    q = queues.loc[flows.flow_id]
    queue = np.stack(
        [
            local.loc[q.index].to_numpy(),
            link_row.loc[q.link].to_numpy(),
            np.cbrt(q.queue_bytes.to_numpy() / 1000),  # cube root of KB (m4's target shape)
        ],
        axis=1,
    )
    sample = PeriodSample(
        size_bytes=torch.tensor(size),
        n_links=torch.tensor(flows.n_links.to_numpy(), dtype=torch.long),
        arrival=torch.tensor(arrival),
        departure=torch.tensor(departure),
        dt_us=torch.tensor(dt_us, dtype=torch.float32),
        incidence=torch.tensor(np.stack([inc_flow, inc_link])),
        link_bandwidth=torch.tensor(bandwidth.loc[links].to_numpy(), dtype=torch.float32),
        params=params,
        # m4's head predicts slowdowns >= 1 (reference/m4.md): raw targets below 1 are clamped
        # here and only here (the datagen summary counts them)
        slowdown=torch.tensor(np.maximum(flows.slowdown.to_numpy(), 1.0), dtype=torch.float32),
        remain=torch.tensor(remain, dtype=torch.float32),
        queue=torch.tensor(queue, dtype=torch.float32),
        ideal_s=torch.tensor(ideal, dtype=torch.float64),
        wire_bytes=torch.tensor(wire.wire_bytes(size)),
        window=torch.tensor(
            [window(p, b * 8.0) for p, b in zip(paths, wire.wire_bytes(size), strict=True)],
            dtype=torch.float64,
        ),
        link_reverse=torch.tensor(reverse),
        ack_fraction=acks,
        fifo_bits=fifo_bits,
    )
    flowsim = np.maximum(flows.flowsim_fct_s.to_numpy() / ideal, 1.0)
    sample.prior = torch.tensor(flowsim, dtype=torch.float32)
    return Sample(
        scenario_id=scenario_id,
        period_id=period,
        period=sample,
        flowsim_slowdown=torch.tensor(flowsim, dtype=torch.float32),
    )


def _wire(params_json: str) -> WireFormat:
    """The scenario's packetisation (datasets before ``header_bytes`` was recorded: the
    default header)."""
    params = json.loads(params_json)
    default = WireFormat()
    return WireFormat(
        mtu_bytes=int(params.get("mtu_bytes", default.mtu_bytes)),
        header_bytes=int(params.get("header_bytes", default.header_bytes)),
    )


def _ack_fraction(params_json: str, wire: WireFormat) -> float:
    """The scenario's :func:`~m4ray.models.fairshare.ack_fraction`: RDMA's ACK per packet
    (datasets before ``ack_bytes`` was recorded: the default ACK); 0 for TCP."""
    params = json.loads(params_json)
    if params.get("transport", "rdma") != "rdma":
        return 0.0
    return ack_fraction(int(params.get("ack_bytes", ACK_BYTES)), wire)


def _fifo_bits(params_json: str, wire: WireFormat) -> float:
    """The scenario's sender window on the wire, in bits (inf: none; TCP's is no fixed
    window): the flows a ``fluid_fifo`` anchor serves in order, as the engine's
    ``anchor_fifo`` takes it from ``Window.of``."""
    params = json.loads(params_json)
    if params.get("transport", "rdma") != "rdma" or not params.get("window_bytes"):
        return math.inf
    return wire_window(int(params["window_bytes"]), wire) * 8.0


def _window(params_json: str, links: pd.DataFrame, wire: WireFormat):
    """Per flow (path, wire bits) -> (rate cap, bits to drain) under the scenario's sender window
    (RDMA's recorded ``window_bytes``; TCP and datasets without one: no window), over the
    links table's rates (degradations applied) and latencies."""
    params = json.loads(params_json)
    window = None
    if params.get("transport", "rdma") == "rdma" and params.get("window_bytes"):
        window = Window(int(params["window_bytes"]))
    latency, bandwidth = links.latency_s, links.bandwidth_bps

    def limit(path, bits: float) -> tuple[float, float]:
        if window is None:
            return np.inf, bits
        return window.limit_links(wire, latency.loc[path].to_numpy(), bandwidth.loc[path], bits)

    return limit


def balanced(samples: list[Sample], n: int | None, seed: int) -> list[Sample]:
    """``n`` samples without replacement, equal total weight per occupied size bin."""
    return [samples[i] for i in balanced_choice([s.n_flows for s in samples], n, seed)]


def balanced_choice(n_flows: list[int], n: int | None, seed: int) -> list[int]:
    """Indices of :func:`balanced`'s choice among items of these flow counts (ascending)."""
    if n is None or n >= len(n_flows):
        return list(range(len(n_flows)))
    bins = np.digitize(n_flows, SIZE_BINS)
    counts = np.bincount(bins)
    weight = 1.0 / counts[bins]
    picked = np.random.default_rng(seed).choice(
        len(n_flows), size=n, replace=False, p=weight / weight.sum()
    )
    return sorted(picked.tolist())


def load_splits(cfg: DataConfig, anchor: str | None = None) -> dict[str, list[Sample]]:
    """Samples per split (train, val, test), balanced-sampled when ``n_samples`` is set: the
    choice is made on the periods table, so only the chosen periods are built (and, with
    ``components``, cut with ``anchor``'s schedule, which the samples then carry)."""
    splits = split_scenarios(cfg.dataset, cfg)
    out = {}
    for index, name in enumerate(("train", "val", "test")):
        periods = [
            (sid, int(p), int(n))
            for sid in splits[name]
            for p, n in eligible_periods(cfg.dataset, sid, cfg).itertuples(index=False)
        ]
        n = None if cfg.n_samples is None else cfg.n_samples[index]
        chosen = [periods[i] for i in balanced_choice([p[2] for p in periods], n, cfg.seed + index)]
        wanted: dict[str, set[int]] = {}
        for sid, p, _ in chosen:
            wanted.setdefault(sid, set()).add(p)
        out[name] = [
            sample
            for sid in splits[name]
            if sid in wanted
            for sample in scenario_samples(cfg.dataset, sid, cfg, wanted[sid])
        ]
        if cfg.components:
            out[name] = [p for sample in out[name] for p in components_of(sample, cfg, anchor)]
    return out


__all__ = [
    "DataConfig",
    "Sample",
    "balanced",
    "balanced_choice",
    "components_of",
    "dataset_version",
    "eligible_periods",
    "load_splits",
    "split_scenarios",
]
