"""Analysis of trained models, one module per quantity (Murty et al., ACL 2023, §5).

Quantities (each registers its metric groups with `registry`, which `sg_jax.analyze` and
`sg_jax.report` loop over):
* `weight_norm`: global L2 norm of sg_jax's parameters (and / num_layers); the released global
  norm (with the original's unused decoder) for converted checkpoints.
* `attention_entropy`: per-head entropies, the paper's negative mean entropy, the released code's
  variant (each on an input the caller names: `pipeline.ENTROPY_INPUTS`).
* `tree_projection`: tscore and tparseval over a sentence set, from the SCI charts of
  `sci_chart` and the projected trees of `projected_trees`.
* `training_dynamics`: minibatch linear CKA (`cka`) and next-token TVD of every checkpoint with
  the previous and the final one (`references`), and the TwoNN intrinsic dimension (`twonn`)
  of each layer; `phase_onsets` locates the transitions of these and the other curves (one
  curve's onset: `onset_detection`; a run's onsets per seed: `onsets`).
* `uas_quantity`: the UAS of attention heads against gold dependencies (`uas`), beside the
  positional-head baselines (`uas_positional`); `uas_eval` is the same score at every training
  evaluation (the `uas` evaluator).

Helpers: `parseval` (bracketing precision / recall / F1), `packing` (rows that share one SOS),
`pipeline` (which lines and words are read, and their batches), `registry` (the registry,
`over_seeds` and seed chunks).

Every quantity is written for one seed and vmapped over a leading seed axis of the parameters
(`registry.over_seeds`).
"""
