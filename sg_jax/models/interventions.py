"""Interventions on the model's units: mean (or zero) ablation of attention heads and MLP
blocks, `x <- (x - mu) * z + mu` (the heuristic-core pruning of Bhaskar et al., ACL 2024;
docs/REFERENCE.md §2), and the checks of the arrays that drive them (`model.TransformerLM`'s
`head_mask`, `head_means`, `mlp_mask`, `mlp_means`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def mean_ablate(x: Array, mask: Array, means: Array | None) -> Array:
  """Mean ablation `(x - mu) * z + mu` (docs/REFERENCE.md §2), or zero ablation `x * z`.

  Args:
    x: activations, e.g. [B, L, H, P] head outputs or [B, L, D] MLP outputs.
    mask: z, broadcastable to x (e.g. [H, 1] per head, [] per MLP block); 1 keeps the unit,
      0 replaces it by mu; values in between interpolate (hard-concrete gates).
    means: mu broadcastable to x (e.g. [H, P], or [B, L, H, P] per position), or None.

  Returns:
    x's shape and dtype (z and mu are cast to it).
  """
  z = mask.astype(x.dtype)
  if means is None:
    return x * z
  mu = means.astype(x.dtype)
  return (x - mu) * z + mu


def check_interventions(cfg, head_mask, head_means, mlp_mask, mlp_means):
  """One-line errors for intervention arrays of the wrong shape (shapes are static).

  Args:
    cfg: the `model.ModelConfig`.
    head_mask, head_means, mlp_mask, mlp_means: `model.TransformerLM`'s arguments (or None).

  Raises:
    ValueError: naming the array, the shape it needs and the shape it has.
  """
  n, h, p, d = cfg.num_layers, cfg.num_heads, cfg.head_dim, cfg.d_model
  checks = (
      (head_mask, "head_mask", lambda s: s == (n, h), f"[num_layers, num_heads] = {(n, h)}"),
      (head_means, "head_means", lambda s: len(s) in (3, 5) and s[0] == n and s[-2:] == (h, p),
       f"[num_layers, num_heads, head_dim] = {(n, h, p)} or [num_layers, batch, length, "
       f"num_heads, head_dim]"),
      (mlp_mask, "mlp_mask", lambda s: s == (n,), f"[num_layers] = {(n,)}"),
      (mlp_means, "mlp_means", lambda s: len(s) in (2, 4) and s[0] == n and s[-1] == d,
       f"[num_layers, d_model] = {(n, d)} or [num_layers, batch, length, d_model]"),
  )
  for value, name, ok, want in checks:
    if value is not None and not ok(tuple(jnp.shape(value))):
      raise ValueError(f"{name} must have shape {want} (per run; vmap any leading axes), got "
                       f"{tuple(jnp.shape(value))}")
  for means, mask, names in ((head_means, head_mask, "head_means needs head_mask"),
                             (mlp_means, mlp_mask, "mlp_means needs mlp_mask")):
    if means is not None and mask is None:
      raise ValueError(f"{names} (the means replace masked units; pass a mask of zeros and ones)")
