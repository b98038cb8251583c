"""What a training objective is: how a step's lines become model inputs and targets, which
attention the model uses, and how the loss is reduced (docs/objectives.md).

An objective is a small frozen (hashable) object: it is static in the compiled training step
(`step.make_chunk_fn`), so each objective compiles its own step and a field read inside it can
never reuse a step compiled for another. It is written for ONE seed's batch of lines; the seed
axis is added by the step, as for everything per seed.

The convention shared by every objective: the loss is the mean token cross-entropy over the
target positions whose id is not 0 (`<pad>`): an objective that scores only some positions (a
masked LM) sets the other targets to 0. That keeps packed rows (`packing.pack_lines`) working
for every objective, since packing moves inputs and targets together.

Registering an objective (`register`) makes it selectable as `config.objective`.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import optax

from sg_jax import models
from sg_jax.evaluation import minimal_pairs
from sg_jax.models import transformer as model_lib
from sg_jax.models.attention_masks import ATTENTIONS

Array = jax.Array


def token_losses(logits_BxLxV: Array, targets_BxL: Array) -> tuple[Array, Array]:
  """Per-line summed cross-entropy (nats) and number of scored target tokens.

  Args:
    logits_BxLxV: float logits [batch, length, vocab].
    targets_BxL: int32 [batch, length] target ids; id 0 (`<pad>`) is not scored.

  Returns:
    (loss_sum [batch] float32, count [batch] float32).
  """
  ce = optax.softmax_cross_entropy_with_integer_labels(logits_BxLxV, targets_BxL)
  mask = (targets_BxL != 0).astype(jnp.float32)
  return jnp.sum(ce * mask, axis=-1), jnp.sum(mask, axis=-1)


def mean_token_loss(logits_BxLxV: Array, targets_BxL: Array) -> Array:
  """Mean token cross-entropy (nats, float32 []) over the scored targets of a batch (0 for a
  batch without any)."""
  loss_sum, count = token_losses(logits_BxLxV, targets_BxL)
  return jnp.sum(loss_sum) / jnp.maximum(jnp.sum(count), 1.0)


def smoothing_gap(logits_BxLxV: Array, targets_BxL: Array) -> Array:
  """float32 []: the label-smoothing term of a batch, uniform cross-entropy minus cross-entropy
  averaged over the scored targets (id != 0) as `mean_token_loss` averages (0 without any).

  Label smoothing with strength e (Szegedy et al., CVPR 2016 §7) trains on the cross-entropy
  against the target mixed with the uniform distribution over the V vocabulary entries:
  (1 - e) CE + e U = CE + e (U - CE), U = -(1/V) sum_v log p_v. `step.total_loss` adds
  e x this gap, so e = 0 adds exactly 0 and a run's objective loss is unchanged.
  """
  log_p = jax.nn.log_softmax(logits_BxLxV.astype(jnp.float32), axis=-1)
  uniform = -jnp.mean(log_p, axis=-1)
  ce = optax.softmax_cross_entropy_with_integer_labels(logits_BxLxV, targets_BxL)
  mask = (targets_BxL != 0).astype(jnp.float32)
  return jnp.sum((uniform - ce) * mask) / jnp.maximum(jnp.sum(mask), 1.0)


@dataclasses.dataclass(frozen=True)
class Objective:
  """Base class of the training objectives (a subclass is a frozen dataclass).

  Class attributes:
    name: the `config.objective` value that selects it.
    attention: the model's attention within a line (`attention_masks`): 'causal' (a token
      attends to itself and the tokens before it), 'bidirectional' (to every token of its
      line) or 'prefix' (bidirectional over the line's input part up to its task token, causal
      after it; `prefix_end_ids`); `<pad>` keys are never attended in packed rows, and in
      padded rows they only matter to padding queries.
    extra_tokens: ids the objective adds after the task's vocabulary (a masked LM's `[MASK]`
      is id `vocab.size`): the model has `vocab.size + extra_tokens` embedding rows.
    metric_names: what `metrics` returns; logged as `train/<name>` (means since the last log).
    teacher_forced_metrics: whether the task's metric (the next-token ranking at the task token
      and greedy decoding) means anything for a model trained so (False for a masked LM, whose
      evaluation reads the minimal-pair preference instead).
    model_family: the family of models it trains (`models.family`): 'decoder' (the
      decoder-only LM) or 'encoder_decoder' (`seq2seq`); a run's `model.name` must be one.
    default_model: the model it trains when `model.name` is '' (the default).
  """

  name: ClassVar[str] = ""
  attention: ClassVar[str] = "causal"
  extra_tokens: ClassVar[int] = 0
  metric_names: ClassVar[tuple[str, ...]] = ()
  teacher_forced_metrics: ClassVar[bool] = True
  model_family: ClassVar[str] = "decoder"
  default_model: ClassVar[str] = "transformer_lm"

  @property
  def prefix_end_ids(self) -> tuple[int, ...]:
    """The ids that end a line's prefix under 'prefix' attention (else ())."""
    return ()

  @classmethod
  def from_config(cls, config) -> "Objective":
    """The objective of a run config (override to read options); raises ValueError naming a
    bad field."""
    del config
    return cls()

  def lines(self, inputs_BxL: Array, targets_BxL: Array, lengths_B: Array, key: Array
            ) -> tuple[Array, Array]:
    """The model inputs and targets of one seed's lines (default: the stored ones).

    Args:
      inputs_BxL: int32 [batch, length] stored inputs (`SOS w1 ... wn`, then 0).
      targets_BxL: int32 [batch, length] stored targets (`w1 ... wn EOS`, then 0).
      lengths_B: int32 [batch] non-padding positions of each line.
      key: this seed's and step's key for the objective's own randomness (a typed PRNG key;
        a pure function of the seed and the step, so resumed and grouped runs draw alike).

    Returns:
      (inputs, targets), int32 [batch, length] each; target 0 = not scored. Positions past a
      line's length must stay 0 in both.
    """
    del lengths_B, key
    return inputs_BxL, targets_BxL

  def loss(self, logits_BxLxV: Array, targets_BxL: Array) -> Array:
    """The loss of a batch (float32 []): `mean_token_loss` unless overridden."""
    return mean_token_loss(logits_BxLxV, targets_BxL)

  def sentence_scores(self, apply_fn, inputs_NxL: Array, targets_NxL: Array, task_pos_N: Array,
                      lengths_N: Array, num_positions: int) -> Array:
    """float32 [N]: how much the model trained so likes each line's output given its input
    (nats), for the minimal-pair preference (`sg_jax.evaluation.minimal_pairs`). Default: the conditional
    log-probability (`preference.conditional_log_probs`).

    Args:
      apply_fn: `tokens [N, L] -> logits [N, L, V]`, deterministic.
      num_positions: static; the longest output of the lines (words + EOS).
    """
    del num_positions
    return minimal_pairs.conditional_log_probs(apply_fn(inputs_NxL), targets_NxL, task_pos_N,
                                            lengths_N)

  def metrics(self, logits_BxLxV: Array, targets_BxL: Array) -> dict[str, Array]:
    """{name: float32 []} for each of `metric_names`, of one step's batch (default none)."""
    del logits_BxLxV, targets_BxL
    return {}


_REGISTRY: dict[str, type[Objective]] = {}


def register(cls: type[Objective]) -> type[Objective]:
  """Registers an objective class under `cls.name` (usable as a class decorator).

  Raises:
    ValueError: no name, an unknown `attention`, or the name is taken by another class (a
      class of the same module and name, e.g. a config file loaded again, replaces its
      earlier self).
  """
  if not cls.name:
    raise ValueError(f"objective class {cls.__name__} has no name")
  if cls.attention not in ATTENTIONS:
    raise ValueError(f"objective {cls.name!r}: attention must be one of {tuple(ATTENTIONS)}, got "
                     f"{cls.attention!r}")
  old = _REGISTRY.get(cls.name, cls)
  if (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__):
    raise ValueError(f"objective {cls.name!r} is already registered ({_REGISTRY[cls.name]})")
  _REGISTRY[cls.name] = cls
  return cls


def names() -> tuple[str, ...]:
  """The registered objectives' names, in registration order."""
  return tuple(_REGISTRY)


def from_config(config) -> Objective:
  """The objective of a run config (`config.objective`, default 'lm').

  Raises:
    ValueError: an unregistered name (naming the registered ones) or bad options.
  """
  name = str(config.get("objective", "lm"))
  if name not in _REGISTRY:
    raise ValueError(f"invalid config: objective {name!r} is not registered (registered: "
                     f"{', '.join(_REGISTRY)}; docs/objectives.md says how to add one)")
  return _REGISTRY[name].from_config(config)


def model_name(objective: Objective, requested: str = "") -> str:
  """The model a run trains: `requested` (the config's `model.name`), or the objective's
  `default_model` when that is '' (the default, and runs from before the field).

  Raises:
    ValueError: an unregistered model, or one not of the objective's `model_family` (one line
      naming both).
  """
  name = requested or objective.default_model
  if models.family(name) != objective.model_family:
    raise ValueError(f"invalid config: objective {objective.name!r} trains a model of family "
                     f"{objective.model_family!r}; model.name {name!r} is of family "
                     f"{models.family(name)!r} (leave model.name empty for "
                     f"{objective.default_model!r})")
  return name


def model_config_from_config(config, vocab_size: int, max_len: int = 512):
  """The `model.ModelConfig` of a run config (built once at the top: what the step, the
  evaluators and the analyses take): its `model` section, with the model name (`model_name`),
  the attention, the prefix-end ids and the extra vocabulary rows of its objective
  (`from_config(config)`). `models.build` makes the module of it.

  Args:
    vocab_size: the task vocabulary's size (`Vocab.size`); the objective's `extra_tokens` are
      added to it.

  Raises:
    ValueError: a bad model field, model name or objective.
  """
  objective = from_config(config)
  return model_lib.ModelConfig.from_config(
      config.model, vocab_size + objective.extra_tokens, max_len, attention=objective.attention,
      prefix_end_ids=objective.prefix_end_ids,
      model_name=model_name(objective, str(config.model.get("name", ""))))


def masked_accuracy(logits_BxLxV: Array, targets_BxL: Array) -> Array:
  """Fraction (float32 []) of the scored targets (id != 0) whose argmax prediction is right (0
  for a batch without any)."""
  scored = targets_BxL != 0
  right = (jnp.argmax(logits_BxLxV, axis=-1) == targets_BxL) & scored
  return jnp.sum(right) / jnp.maximum(jnp.sum(scored), 1)
