"""The model registry: which flax module a `model.ModelConfig` builds (`ModelConfig.name`).

A model is a flax module built from a `ModelConfig` alone, written for ONE seed (the training
step vmaps it), with the call signature of `model.TransformerLM`: `apply({'params': p},
tokens [B, L], deterministic=..., positions_BxL=..., token_ids_BxL=..., lines=...)` ->
logits float32 [B, L, vocab]. So the training step (`step.py`), the evaluations (greedy decoding
by full forward passes, the minimal-pair preference) and the analyses that read the sown
intermediates (`intermediates.apply_with_intermediates`: 'hidden', per layer `layer_<i>`) run it
unchanged.

Each model has a *family*; an objective names the family it needs (`Objective.model_family`) and
the model it trains by default (`Objective.default_model`); `objectives.model_config_from_config`
checks that a run's `model.name` belongs to that family (docs/model.md: how to add a model).
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from sg_jax.models import transformer as model_lib


@dataclasses.dataclass(frozen=True)
class Entry:
  """A registered model: its module class and its family ('decoder', 'encoder_decoder')."""

  cls: type
  family: str


_REGISTRY: dict[str, Entry] = {}


def register(name: str, family: str):
  """Class decorator (or call `register(name, family)(cls)`): registers a model module class.

  Raises:
    ValueError: an empty name or family, or the name is taken by another class.
  """

  def wrap(cls: type) -> type:
    if not name or not family:
      raise ValueError(f"model class {cls.__name__}: a model needs a name and a family")
    old = _REGISTRY.get(name)
    if old is not None and (old.cls.__module__, old.cls.__qualname__) != (cls.__module__,
                                                                          cls.__qualname__):
      raise ValueError(f"model {name!r} is already registered ({old.cls})")
    _REGISTRY[name] = Entry(cls, family)
    return cls

  return wrap


def names() -> tuple[str, ...]:
  """The registered models' names, in registration order."""
  return tuple(_REGISTRY)


def entry(name: str) -> Entry:
  """The registered model `name`.

  Raises:
    ValueError: an unregistered name (one line naming the registered ones).
  """
  if name not in _REGISTRY:
    raise ValueError(f"invalid config: model.name {name!r} is not a registered model "
                     f"(registered: {', '.join(_REGISTRY)}; docs/model.md says how to add one)")
  return _REGISTRY[name]


def family(name: str) -> str:
  """The family of the registered model `name` (raises ValueError as `entry`)."""
  return entry(name).family


def build(config) -> nn.Module:
  """The flax module of a `model.ModelConfig` (`config.name` picks the class)."""
  return entry(config.name).cls(config)


def init_params(config, key: jax.Array, length: int = 8):
  """Initial parameters of one seed of the model of `config` (a pytree of float32 arrays).

  Args:
    config: a `model.ModelConfig`.
    key: a typed PRNG key (the seed's PARAMS_KEY stream).
    length: the dummy input's length (the parameters do not depend on it).
  """
  tokens = jnp.zeros((1, length), jnp.int32)
  return build(config).init({"params": key}, tokens, deterministic=True)["params"]


register("transformer_lm", "decoder")(model_lib.TransformerLM)
