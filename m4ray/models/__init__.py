"""The models layer, under the simulators (sim), training (train) and serving (serve), which share
it and never import each other: model configs (:mod:`~m4ray.models.config`), the m4 network
(:mod:`~m4ray.models.m4`) with its torch and numpy steps (:mod:`~m4ray.models.step`,
:mod:`~m4ray.models.numpy_step`) over step graphs (:mod:`~m4ray.models.graph`), the fluid anchor
(:mod:`~m4ray.models.fluid`) and the fair share it and flowSim drain by
(:mod:`~m4ray.models.fairshare`), the wire format (:mod:`~m4ray.models.wire`), the m4 engine's
compiled core (:mod:`~m4ray.models.core`), the m3 network and its tokens
(:mod:`~m4ray.models.m3`, :mod:`~m4ray.models.m3_features`) and checkpoint I/O
(:mod:`~m4ray.models.checkpoint`). Importing the package imports nothing."""
