"""The ns-3 packet-level backend (PyPI ``ns3`` wheel, GPL-2.0-only), loaded only when used."""
