"""m3 (SIGCOMM'24): network-wide flow-slowdown distributions from a few hundred sampled paths —
path decomposition (:mod:`.paths`), per-path parking lots (:mod:`.lot`) simulated by a path flowSim
(:mod:`.pathsim`), feature tokens (:mod:`.features`), a transformer + MLP correction
(:mod:`.model`) and the aggregation back to the network (:mod:`.aggregate`).
Facts: ``reference/flowsim_m3.md`` part B."""
