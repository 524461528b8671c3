"""Starting Ray: an embedded local instance by default, or an existing cluster.

``address: null`` starts a private local Ray (``address="local"``, so a stray ``ray start`` on the
machine is never joined by accident); ``address: auto`` or ``ray://…`` joins a cluster. The
environment defaults from ``reference/ray_stack.md`` §2.1 are set before Ray is imported.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

RAY_ENV_DEFAULTS = {
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",
    "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "300",
    "RAY_DEDUP_LOGS": "0",
    # glibc's per-thread malloc arenas fragment under Ray's many threads: with the default (8 per
    # core) a Serve replica's RSS kept growing under load while its Python objects did not
    # (bench/serve_load.py); two arenas hold it to what an idle Ray grows.
    "MALLOC_ARENA_MAX": "2",
}


@dataclass(kw_only=True, slots=True)
class RayConfig:
    """Where tasks run. ``task_cpus``: CPUs reserved per task; ``max_retries``: how often a task
    whose worker or node died is run again (its own errors are never retried)."""

    address: str | None = None
    num_cpus: int | None = None
    object_store_memory_mb: int = 256
    include_dashboard: bool = False
    task_cpus: float = 1.0
    max_retries: int = 2


def set_ray_env() -> None:
    for key, value in RAY_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)


def cluster_nodes() -> list[dict]:
    """The Ray nodes this process has seen (id, address, alive, resources); [] without Ray."""
    import ray

    if not ray.is_initialized():
        return []
    return [
        {
            "node_id": node["NodeID"],
            "address": node.get("NodeManagerAddress"),
            "alive": bool(node.get("Alive")),
            "resources": node.get("Resources", {}),
        }
        for node in ray.nodes()
    ]


def start_ray(cfg: RayConfig):
    """Initialise Ray once per process (idempotent) and return the ``ray`` module: the cluster
    at ``cfg.address``, else at ``$RAY_ADDRESS`` (Ray's own variable, as ``ray job submit`` and
    Ray's CLI read it), else a new local one (never a cluster found running on the machine)."""
    set_ray_env()
    import ray

    if ray.is_initialized():
        return ray
    if address := cfg.address or os.environ.get("RAY_ADDRESS"):
        ray.init(address=address, log_to_driver=True)
    else:
        ray.init(
            address="local",
            num_cpus=cfg.num_cpus,
            include_dashboard=cfg.include_dashboard,
            object_store_memory=cfg.object_store_memory_mb * 1024**2,
            log_to_driver=False,
        )
    return ray
