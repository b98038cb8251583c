"""Structured pruning of trained models and the heuristic core (Bhaskar, Friedman & Chen,
ACL 2024; docs/REFERENCE.md §2; docs/pruning.md).

Modules: `hard_concrete` (the gates and their closed forms, the final masks), `means` (the
mean-ablation means), `objective` (KL / task objectives, sparsity, the Lagrangian, the target
schedule), `run` (one pruning run, and every run of a checkpoint vmapped in one program),
`placement` (the runs laid out over a (seed, run) mesh of devices), `evaluate` (task metrics
and KL of subnetworks), `core` (effective size, the core, overlaps, forcing and ablation masks),
`table` (pruning.csv and the masks file), `core_table` (pruning_core.csv: the core analyses'
rows). The CLIs are `python -m sg_jax.prune` and
`python -m sg_jax.prune_core`.
"""
