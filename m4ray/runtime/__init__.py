"""The Ray runtime under the entry layer: cluster start/connect, resumable fan-out, provenance.

Imported by the sweeps, datagen, train, serve and workload experiments alike; it imports only
``m4ray.sim`` and the ground floor (``m4ray.errors``), never ``m4ray.sweeps``.
"""
