"""sg_jax: structural grokking, heuristic cores and syntactic attention in JAX.

Many random seeds of small transformer language models trained at once (vmapped over a seed axis),
with the analysis (tree projections, attention entropy, weight norms) vectorised over spans,
sentences, seeds and checkpoints. See README.md.
"""

__version__ = "0.1.0"
