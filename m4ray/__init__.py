"""m4ray: GPU-cluster network simulation with packet-level, analytical and learned
backends, on Ray."""

__version__ = "0.1.0"
