"""Config values given once for all seeds or once per seed: `(v,)` or `(v_0, ..., v_{S-1})`.

Every per-seed field of sg_jax (a loss term's strengths and step windows, `sg_jax.terms`; the
data composition, `sg_jax.data.composition`; the scalar hyperparameters, `HPARAM_FIELDS`; the
initialisation and data seeds, `seed_ids`) is read here, so that "one value for all seeds, or one
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


# The scalar hyperparameters that take one value or one per seed (docs/usage.md "Per-seed
# hyperparameters and split seeds"): dotted config field -> numpy dtype of its per-seed array. Their values
# ride beside the training data (`hparam_arrays`); when `as_data`, the compiled training program
# reads them there, so one program serves any values. Each field whose 0 means "off" (weight
# decay, clipping, dropout, label smoothing) compiles its computation only when some seed's
# value is nonzero (`switches`): all-zero runs keep the program of before the field was per seed.
HPARAM_FIELDS = {
    "optim.learning_rate": np.float32,
    "optim.weight_decay": np.float32,
    "optim.b1": np.float32,
    "optim.b2": np.float32,
    "optim.eps": np.float32,
    "optim.grad_clip_norm": np.float32,
    "optim.warmup_steps": np.int32,
    "model.dropout": np.float32,
    "model.init_scale": np.float32,
    "train.label_smoothing": np.float32,
}
# Fields of HPARAM_FIELDS whose all-zero value turns their computation off (`switches`).
SWITCHED = ("optim.weight_decay", "optim.grad_clip_norm", "model.dropout",
            "train.label_smoothing")
# The seeds of the initialisation and of the data order (`seed_ids`); -1 = the seed id.
SEED_FIELDS = ("seeds.init", "seeds.data")


def get(config: Any, dotted: str, default: Any = None) -> Any:
  """The value of a dotted field of a config (ConfigDict or the dict of a config.json), or
  `default` where a section or the field is missing (a run written before the field existed)."""
  node = config
  for part in dotted.split("."):
    try:
      node = node[part]
    except (KeyError, AttributeError, TypeError):
      return default
  return node


# What a run written before a field existed did: the value of the field for it.
_DEFAULTS = {"model.init_scale": 1.0, "train.label_smoothing": 0.0}


def hparam_values(config: Any, num_seeds: int | None = None) -> dict[str, np.ndarray]:
  """{dotted field of HPARAM_FIELDS: its value per seed, an array [S] of the field's dtype}.

  Raises:
    ValueError: a field with neither one value nor one per seed (`values`).
  """
  n = int(get(config, "num_seeds")) if num_seeds is None else num_seeds
  return {field: array(get(config, field, _DEFAULTS.get(field)), n, field, dtype)
          for field, dtype in HPARAM_FIELDS.items()}


def switches(config: Any) -> dict[str, bool]:
  """{field of SWITCHED: whether some seed's value is nonzero}: the static on/off of each
  zero-means-off computation of the compiled step."""
  return {field: any(float(v) != 0.0 for v in as_tuple(get(config, field, 0.0)))
          for field in SWITCHED}


def as_data(config: Any) -> bool:
  """Whether the training step takes the optimiser's hyperparameters and the dropout rate as
  data (one compiled program for any values of them): when one of them holds several values
  (one per seed), or `train.hparams_as_data` is true. Otherwise (one value each, every run
  from before these fields were per seed) they are compiled in as they always were, which
  keeps those runs bit-identical: as data, XLA fuses the step otherwise and a 40-step `tiny`
  run ended 1 float32 ulp away (docs/usage.md "Per-seed hyperparameters and split seeds").
  Label smoothing and the initialisation scale are data whenever used."""
  if bool(get(config, "train.hparams_as_data", False)):
    return True
  return any(varies(config, field) for field in HPARAM_FIELDS
             if field not in ("model.init_scale", "train.label_smoothing"))


def varies(config: Any, field: str) -> bool:
  """Whether the per-seed `field` holds two or more distinct values."""
  return len(set(as_tuple(get(config, field, _DEFAULTS.get(field))))) > 1


def hparam_arrays(config: Any) -> dict[str, np.ndarray]:
  """The per-seed hyperparameters as the training step reads them: {name: array [S]}.

  Names: 'learning_rate', 'weight_decay', 'b1', 'b2', 'eps', 'grad_clip_norm', 'init_scale',
  'label_smoothing' (float32), 'warmup_steps' (int32); 'one_minus_b1' and 'one_minus_b2'
  (float32 of 1 - b computed in float64, as optax computes `1 - decay` from a Python float, so
  that a value handed in as data gives the bits of the same value compiled in);
  'dropout_scale' (float32 1 / (1 - rate), the factor on kept units, as XLA computes it for
  `layers.CoordinateDropout`'s compiled-in rate) and 'dropout_threshold' (uint32: a unit is
  kept where its hash is below it).
  """
  raw = hparam_values(config)
  out = {field.split(".")[-1]: value for field, value in raw.items()}
  for b in ("b1", "b2"):
    out[f"one_minus_{b}"] = np.asarray(
        [1 - float(v) for v in values(get(config, f"optim.{b}"), len(raw["optim.b1"]),
                                      f"optim.{b}")], np.float32)
  rates = values(get(config, "model.dropout"), len(raw["model.dropout"]), "model.dropout")
  keep = [1.0 - float(r) for r in rates]
  # 1 / keep as XLA folds it from the constant of a compiled-in rate: a float32 division.
  out["dropout_scale"] = np.float32(1.0) / np.asarray(keep, np.float32)
  out["dropout_threshold"] = np.asarray([min(int(k * 2.0 ** 32), 2 ** 32 - 1) for k in keep],
                                        np.uint32)
  del out["dropout"]
  return out


def seed_ids(config: Any, which: str) -> list[int]:
  """The seed of each seed's initialisation (`which` = 'init') or of its data order, dropout
  and masking draws ('data'): `seeds.<which>`, one value or one per seed, -1 (the default)
  meaning the seed's own id (`first_seed + i`), so a run that sets neither is unchanged.

  Raises:
    ValueError: `which` is neither 'init' nor 'data', a field with neither one value nor one
      per seed, or a value below -1.
  """
  if which not in ("init", "data"):
    raise ValueError(f"seed_ids: which must be 'init' or 'data', got {which!r}")
  n, first = int(get(config, "num_seeds")), int(get(config, "first_seed"))
  field = f"seeds.{which}"
  chosen = values(get(config, field, (-1,)), n, field)
  out = []
  for i, s in enumerate(chosen):
    if int(s) != s or int(s) < -1:
      raise ValueError(f"invalid config: {field} needs integers >= 0 (or -1 = the seed id): "
                       f"got {tuple(chosen)}")
    out.append(first + i if int(s) == -1 else int(s))
  return out
