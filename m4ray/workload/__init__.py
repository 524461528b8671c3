"""Synthetic ML training workloads (MLSynth-style) and Chakra execution traces."""
