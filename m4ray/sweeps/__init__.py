"""Sweeps: Hydra experiments that expand a grid into Scenarios and fan them out on Ray."""
