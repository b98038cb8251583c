"""Config values given once for all seeds or once per seed: `(v,)` or `(v_0, ..., v_{S-1})`.

Every per-seed field of sg_jax (a loss term's strengths and step windows, `sg_jax.terms`; the
data composition, `sg_jax.composition`) is read here, so that "one value for all seeds, or one
per seed" means the same everywhere and is refused with the same one-line error.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def values(value: Any, num_seeds: int, field: str) -> list:
  """`value` as one entry per seed: a scalar or a 1-sequence is repeated `num_seeds` times.

  Args:
    value: a scalar, or a tuple/list of 1 or `num_seeds` entries.
    num_seeds: S, the run's `num_seeds`.
    field: the dotted config field, for the error (e.g. 'sas.lambdas').

  Returns:
    a list of S entries.

  Raises:
    ValueError: a sequence whose length is neither 1 nor `num_seeds`.
  """
  if not isinstance(value, (list, tuple)):
    return [value] * num_seeds
  if len(value) == 1:
    return list(value) * num_seeds
  if len(value) != num_seeds:
    raise ValueError(f"invalid config: {field} needs one value or one per seed: got "
                     f"{len(value)} values for {num_seeds} seeds: {tuple(value)}")
  return list(value)


def array(value: Any, num_seeds: int, field: str, dtype) -> np.ndarray:
  """`values(value, num_seeds, field)` as a numpy array [S] of `dtype`."""
  return np.asarray(values(value, num_seeds, field), dtype=dtype)


def as_tuple(value: Any) -> tuple:
  """`value` as a tuple (a scalar becomes a 1-tuple)."""
  return tuple(value) if isinstance(value, (tuple, list)) else (value,)
