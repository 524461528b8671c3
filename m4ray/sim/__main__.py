"""``python -m m4ray.sim trace.topology=<file> trace.flows=<file> [backend=flowsim]``.

Replays a flow trace (m4 ``flows.txt``) on a topology (SimAI or ns-3 text format) and writes one
row per flow. Without ``trace.output`` the file is named by the inputs' content and the backend.
"""

from __future__ import annotations

from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from m4ray.cli import user_errors
from m4ray.config import CONF_DIR, register_configs
from m4ray.fingerprint import fingerprint
from m4ray.sim.flows import read_flows
from m4ray.sim.routing import Routing
from m4ray.sim.topology import read_topology
from m4ray.sim.trace import run_trace, write_table

register_configs()


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="trace")
def main(cfg: DictConfig) -> None:
    with user_errors():
        topo = read_topology(cfg.trace.topology)
        flows = read_flows(cfg.trace.flows, hosts=frozenset(topo.hosts))
        backend, wire = instantiate(cfg.backend, _convert_="all"), instantiate(cfg.wire)
        table = run_trace(topo, flows, backend, Routing(topo, seed=cfg.seed, wire=wire))
        output = cfg.trace.output or default_output(cfg)
        write_table(table, output)
        slowdown = table.column("slowdown").to_numpy()
        print(
            f"{table.num_rows} flows, mean slowdown {slowdown.mean():.3f}, "
            f"max {slowdown.max():.3f} -> {Path(output).resolve()}"
        )


def default_output(cfg: DictConfig) -> Path:
    inputs = [
        Path(cfg.trace.topology).read_text(),
        Path(cfg.trace.flows).read_text(),
        OmegaConf.to_container(cfg.backend),
        OmegaConf.to_container(cfg.wire),
        cfg.seed,
    ]
    backend = HydraConfig.get().runtime.choices.get("backend", "backend")
    name = f"{Path(cfg.trace.flows).stem}.{backend}.{fingerprint(inputs, 8)}.csv"
    return Path(cfg.paths.output_dir) / "trace" / name


if __name__ == "__main__":
    main()
