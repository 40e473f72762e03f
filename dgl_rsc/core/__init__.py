"""The RSC algorithm: the config, the operator (exact forward, pluggable backward), the
controller with its per-layer states and step records, the greedy budget solver, the guard and
the statistics. Framework-free: the DGL and PyG front ends sit above it."""
