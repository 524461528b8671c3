"""Fan-out: run tasks as Ray tasks, resumably, with a progress bar.

A task runs one record (a Scenario, a datagen scenario, a study point: anything with a
``run_id``) in a Ray worker, writes its outputs and then its result row (``runs/<run_id>.json``,
written last and atomically) into the run directory; the driver only collects small rows. A
record whose stored row says it succeeded is skipped on a re-run, so an interrupted fan-out
resumes where it stopped; failed records are retried. A task that raises returns a failed row;
one whose worker process dies becomes a row with ``status == "failed"`` and the reason.

Records that gain from sharing a process (m4 scenarios batching their forward passes) can be
run in groups: ``group(record)`` gives a key and a largest size; records with the same key are
split into groups of about equal size (at least as many as there are worker slots, when there
are enough records), each one Ray task running ``task_group``; groups are queued spread among
the single runs (:func:`groups`).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from m4ray.runtime.cluster import RayConfig, start_ray
from m4ray.textio import atomic_write_text

Row = dict[str, Any]


def row_path(run_dir: Path, record: Any) -> Path:
    return run_dir / "runs" / f"{record.run_id}.json"


def read_row(run_dir: Path, record: Any) -> Row | None:
    """The stored row of a record, or None if absent or unreadable (an interrupted write)."""
    path = row_path(run_dir, record)
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        return None


def read_ok_row(run_dir: Path, record: Any) -> Row | None:
    """The stored row of a record that succeeded, else None (``run_many``'s ``load`` for tasks
    whose row is their whole output)."""
    row = read_row(run_dir, record)
    return row if row is not None and row.get("status") == "ok" else None


def store_row(run_dir: Path, record: Any, row: Row) -> None:
    """Write a record's row (atomically), stamped with the Ray node that wrote it."""
    import ray

    if ray.is_initialized():
        row.setdefault("node_id", ray.get_runtime_context().get_node_id())
    atomic_write_text(row_path(run_dir, record), json.dumps(row, indent=1, default=float))


def _stored_since(run_dir: Path, record: Any, since_ns: int) -> bool:
    """Whether the record's row was written after ``since_ns`` (by a task still running)."""
    try:
        return row_path(run_dir, record).stat().st_mtime_ns >= since_ns
    except OSError:
        return False


def _once(
    task: Callable[[Any, str], Row], load: Callable[[Path, Any], Row | None], record, run_dir
):
    """The task, unless an earlier attempt finished it: a retry after the worker or its node died
    must not run (or write) a finished record again."""
    done = load(Path(run_dir), record)
    return done if done is not None else task(record, run_dir)


def _once_many(
    task_group: Callable[[list[Any], str], list[Row]],
    load: Callable[[Path, Any], Row | None],
    records: list[Any],
    run_dir: str,
) -> list[Row]:
    """:func:`_once` for a group: only the records no earlier attempt finished run (together)."""
    rows: list[Row | None] = [load(Path(run_dir), r) for r in records]
    todo = [i for i, row in enumerate(rows) if row is None]
    if todo:
        for i, row in zip(todo, task_group([records[i] for i in todo], run_dir), strict=True):
            rows[i] = row
    return rows  # type: ignore[return-value]


def _unit(fn: Callable, load: Callable[[Path, Any], Row | None], what, run_dir: str, grouped: bool):
    """One Ray task for a record (:func:`_once`) or a group (:func:`_once_many`): one remote
    function for both, so all units wait in one queue, in the order they were submitted."""
    return _once_many(fn, load, what, run_dir) if grouped else _once(fn, load, what, run_dir)


Grouping = Callable[[Any], tuple[Hashable, int] | None]


def groups(records: list[Any], todo: list[int], group: Grouping | None, slots: int) -> list:
    """``todo`` as lists of indices (run together) spread evenly among single indices (run
    alone), the first group first: groups are the long units, so one starts at once and the
    others a share of the single runs later, and the slots finish together (queued last, a
    group starts late and runs alone at the end; all queued first, the bar stands still until
    they end)."""
    alone: list = []
    keyed: dict[Hashable, tuple[int, list[int]]] = {}
    for i in todo:
        spec = group(records[i]) if group is not None else None
        if spec is None:
            alone.append(i)
        else:
            key, size = spec
            keyed.setdefault(key, (size, []))[1].append(i)
    together: list = []
    for size, members in keyed.values():
        n = max(math.ceil(len(members) / size), min(slots, len(members)))
        together += [members[k::n] for k in range(n)]  # interleaved: mixed grid points per group
    if not together:
        return alone
    cut = [len(alone) * j // len(together) for j in range(len(together) + 1)]
    out: list = []
    for j, unit in enumerate(together):  # group j, then its share of the single runs
        out += [unit, *alone[cut[j] : cut[j + 1]]]
    return out


def run_many(
    records: list[Any],
    run_dir: Path,
    ray_cfg: RayConfig,
    progress: bool = True,
    *,
    task: Callable[[Any, str], Row],
    load: Callable[[Path, Any], Row | None],
    crashed: Callable[[Any, BaseException], Row] | None = None,
    group: Grouping | None = None,
    task_group: Callable[[list[Any], str], list[Row]] | None = None,
) -> list[Row]:
    """Rows for every record, in input order; runs only those not already done.

    ``task(record, run_dir)`` runs in a Ray worker, stores its outputs and returns the row (a
    failure it catches is a failed row, never retried); ``load`` returns the stored row of a
    record that already succeeded. A task whose worker or node dies is retried by Ray up to
    ``ray_cfg.max_retries`` times; then ``crashed`` makes its failed row. Records need a
    ``run_id``. On Ctrl-C, tasks still running end with the driver; finished rows stay on disk
    for the re-run. ``group``/``task_group``: records run together (module docstring);
    ``task_group(records, run_dir)`` stores and returns their rows like ``task``.
    """
    if group is not None and task_group is None:
        raise ValueError("group needs task_group")
    crashed = crashed or crashed_row
    rows: dict[int, Row] = {}
    todo = []
    for index, record in enumerate(records):
        done = load(run_dir, record)
        if done is not None:
            rows[index] = done
        else:
            todo.append(index)
    bar = tqdm(
        total=len(records),
        initial=len(rows),
        desc="scenarios",
        unit="run",
        disable=not progress,
        dynamic_ncols=True,
    )
    try:
        if todo:
            ray = start_ray(ray_cfg)
            options = {
                "num_cpus": ray_cfg.task_cpus,
                "max_retries": ray_cfg.max_retries,
                "retry_exceptions": False,
            }
            unit_task = ray.remote(_unit).options(**options)
            slots = max(1, int(ray.cluster_resources().get("CPU", 1) // ray_cfg.task_cpus))
            pending = {}
            for unit in groups(records, todo, group, slots):
                if isinstance(unit, list):
                    members = [records[i] for i in unit]
                    ref = unit_task.remote(task_group, load, members, str(run_dir), True)
                    pending[ref] = (unit, True)
                else:
                    ref = unit_task.remote(task, load, records[unit], str(run_dir), False)
                    pending[ref] = ([unit], False)
            started_ns = time.time_ns()
            while pending:
                # a group stores each row as its scenario ends: the bar counts those meanwhile
                in_groups = [i for unit, grouped in pending.values() if grouped for i in unit]
                ready, _ = ray.wait(
                    list(pending), num_returns=1, timeout=1.0 if in_groups else None
                )
                if not ready:
                    bar.n = len(rows) + sum(
                        _stored_since(run_dir, records[i], started_ns) for i in in_groups
                    )
                    bar.refresh()
                    continue
                indices, grouped = pending.pop(ready[0])
                try:
                    result = ray.get(ready[0])
                    for index, row in zip(indices, result if grouped else [result], strict=True):
                        rows[index] = row
                except Exception as err:  # the worker died (native crash, OOM, node lost) too often
                    for index in indices:
                        rows[index] = crashed(records[index], err)
                        store_row(run_dir, records[index], rows[index])
                bar.n = len(rows)
                bar.refresh()
                bar.set_postfix(failed=sum(r["status"] != "ok" for r in rows.values()))
    finally:  # on Ctrl-C the entry point shuts Ray down: tasks die with their owner, this
        bar.close()  # driver (ray.cancel(force=True) here races with finishing tasks in Ray 2.60)
    return [rows[i] for i in range(len(records))]


def crash_reason(err: BaseException) -> str:
    reason = str(err).strip().splitlines()
    return f"worker failed: {type(err).__name__}: {reason[-1] if reason else ''}"


def crashed_row(record: Any, err: BaseException) -> Row:
    """The default failed row of a record whose task crashed: what it describes, failed, with
    the reason (a job whose rows carry result columns passes its own ``crashed``)."""
    row = record.describe()
    row.update(status="failed", error=crash_reason(err), wall_s=float("nan"))
    return row


__all__ = [
    "crash_reason",
    "crashed_row",
    "read_ok_row",
    "read_row",
    "row_path",
    "run_many",
    "store_row",
]
