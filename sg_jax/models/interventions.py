"""Interventions on the model's units: mean (or zero) ablation of attention heads and MLP
blocks, `x <- (x - mu) * z + mu` (the heuristic-core pruning of Bhaskar et al., ACL 2024;
docs/REFERENCE.md §2), the checks of the arrays that drive them (`model.TransformerLM`'s and
`encoder_decoder.EncoderDecoder`'s `head_mask`, `head_means`, `mlp_mask`, `mlp_means`) and the
names of their rows (`unit_rows`).

A head mask has one row per attention block (its heads), an MLP mask one entry per MLP block:

* family 'decoder' (`transformer_lm`): head rows `l0 .. l{n-1}` (layer i's self-attention),
  MLP rows `l0 .. l{n-1}`;
* family 'encoder_decoder': head rows `enc_l0 .. enc_l{n-1}` (encoder self-attention), then
  `dec_l0 ..` (decoder causal self-attention), then `cross_l0 ..` (decoder cross-attention),
  3n rows; MLP rows `enc_l0 ..`, then `dec_l0 ..`, 2n rows.

A unit is named `<row>_h<head>` or `<row>_mlp` (`pruning.core.unit_names`): `l2_h1`,
`cross_l0_h3`, `dec_l1_mlp`.
"""

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


# The row prefixes of each model family's head and MLP masks, in row order (module docstring).
_ROW_PREFIXES = {"decoder": (("l",), ("l",)),
                 "encoder_decoder": (("enc_l", "dec_l", "cross_l"), ("enc_l", "dec_l"))}


def unit_rows(family: str, num_layers: int) -> tuple[list[str], list[str]]:
  """(head-mask row names [R_h], MLP-mask row names [R_m]) of a model family (module docstring).

  Raises:
    ValueError: a family without head/MLP interventions.
  """
  if family not in _ROW_PREFIXES:
    raise ValueError(f"models of family {family!r} take no head/MLP interventions (families "
                     f"with them: {', '.join(_ROW_PREFIXES)})")
  heads, mlp = _ROW_PREFIXES[family]
  return ([f"{p}{i}" for p in heads for i in range(num_layers)],
          [f"{p}{i}" for p in mlp for i in range(num_layers)])


def rows_of_shape(num_head_rows: int, num_mlp_rows: int) -> tuple[list[str], list[str]]:
  """`unit_rows` of masks read from a file: the family whose R_h / R_m fit the counts (equal:
  'decoder'; 3n / 2n: 'encoder_decoder').

  Raises:
    ValueError: counts no family has.
  """
  for family, (heads, mlp) in _ROW_PREFIXES.items():
    n, rest = divmod(num_head_rows, len(heads))
    if not rest and n > 0 and num_mlp_rows == n * len(mlp):
      return unit_rows(family, n)
  raise ValueError(f"no model has {num_head_rows} head-mask rows and {num_mlp_rows} MLP-mask "
                   "rows (n and n: decoder-only; 3n and 2n: encoder-decoder)")


def check_interventions(cfg, head_mask, head_means, mlp_mask, mlp_means,
                        family: str = "decoder"):
  """One-line errors for intervention arrays of the wrong shape (shapes are static).

  Args:
    cfg: the `model.ModelConfig`.
    head_mask, head_means, mlp_mask, mlp_means: the model's arguments (or None).
    family: the model's family (`unit_rows`: R_h head rows, R_m MLP rows; 'decoder': both
      num_layers).

  Raises:
    ValueError: naming the array, the shape it needs and the shape it has.
  """
  h, p, d = cfg.num_heads, cfg.head_dim, cfg.d_model
  n, m = (len(rows) for rows in unit_rows(family, cfg.num_layers))
  head_rows, mlp_rows = (("num_layers", "num_layers") if family == "decoder"
                         else (f"{n} head rows", f"{m} MLP rows"))
  checks = (
      (head_mask, "head_mask", lambda s: s == (n, h), f"[{head_rows}, num_heads] = {(n, h)}"),
      (head_means, "head_means", lambda s: len(s) in (3, 5) and s[0] == n and s[-2:] == (h, p),
       f"[{head_rows}, num_heads, head_dim] = {(n, h, p)} or [{head_rows}, batch, length, "
       f"num_heads, head_dim]"),
      (mlp_mask, "mlp_mask", lambda s: s == (m,), f"[{mlp_rows}] = {(m,)}"),
      (mlp_means, "mlp_means", lambda s: len(s) in (2, 4) and s[0] == m and s[-1] == d,
       f"[{mlp_rows}, d_model] = {(m, d)} or [{mlp_rows}, batch, length, d_model]"),
  )
  for value, name, ok, want in checks:
    if value is not None and not ok(tuple(jnp.shape(value))):
      raise ValueError(f"{name} must have shape {want} (per run; vmap any leading axes), got "
                       f"{tuple(jnp.shape(value))}")
  for means, mask, names in ((head_means, head_mask, "head_means needs head_mask"),
                             (mlp_means, mlp_mask, "mlp_means needs mlp_mask")):
    if means is not None and mask is None:
      raise ValueError(f"{names} (the means replace masked units; pass a mask of zeros and ones)")
