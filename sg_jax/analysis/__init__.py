"""Analysis of trained models, one module per quantity (Murty et al., ACL 2023, §5).

* `weight_norm`: global L2 norm of sg_jax's parameters (and / num_layers); the released global
  norm (with the original's unused decoder) for converted checkpoints.
* `attention_entropy`: per-head entropies, the paper's negative mean entropy, the released code's
  variant (each on an input the caller names: `pipeline.ENTROPY_INPUTS`).
* `tree_projection`: SCI charts, greedy / CKY projected trees, tscore.
* `parseval`: bracketing precision / recall / F1 (tparseval).
* `pipeline`: batching of sentences and drivers over a whole split, for every seed.

Every quantity is written for one seed and vmapped over a leading seed axis of the parameters.
"""
