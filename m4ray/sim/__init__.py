"""Simulation layer: topology, routing, workloads, the replay engine and network backends."""
