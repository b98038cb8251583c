"""Analysis of trained models, one module per quantity (Murty et al., ACL 2023, §5).

* `weight_norm`: global L2 norm of the parameters (and / num_layers).
* `attention_entropy`: per-head entropies, the paper's negative mean entropy, the released code's
  variant.
* `tree_projection`: SCI charts, greedy / CKY projected trees, tscore.
* `parseval`: bracketing precision / recall / F1 (tparseval).
* `pipeline`: batching of sentences and drivers over a whole split, for every seed.

Every quantity is written for one seed and vmapped over a leading seed axis of the parameters.
"""
