"""A toy objective and a toy loss term registered from outside sg_jax, as a user adds their own
(docs/objectives.md): `prev_token` (predict the PREVIOUS input token) and `l2` (the squared L2
norm of the parameters, per-seed strengths and windows as every term)."""

import dataclasses

import jax
import jax.numpy as jnp

from sg_jax import objectives, terms


@objectives.register
@dataclasses.dataclass(frozen=True)
class PreviousToken(objectives.Objective):
  """Target at position t = input token t-1 (nothing at t = 0 and past the line's end)."""

  name = "prev_token"
  attention = "causal"

  def lines(self, inputs_BxL, targets_BxL, lengths_B, key):
    del targets_BxL, key
    pos = jnp.arange(inputs_BxL.shape[1])[None, :]
    previous = jnp.roll(inputs_BxL, 1, axis=1)
    return inputs_BxL, jnp.where((pos >= 1) & (pos < lengths_B[:, None]), previous, 0)


@terms.register
@dataclasses.dataclass(frozen=True)
class L2(terms.LossTerm):
  """lambda * sum of the squares of every parameter (option `scale` multiplies it)."""

  name = "l2"
  needs_intermediates = False
  scale: float = 1.0

  @classmethod
  def from_section(cls, section):
    return cls(scale=float(section.scale))

  def check(self, config):
    if not self.scale > 0:
      raise ValueError(f"invalid config: l2.scale must be > 0, got {self.scale}")

  def penalty(self, params, sown, data, idx_B, model_config):
    del sown, data, idx_B, model_config
    return self.scale * sum(jnp.sum(jnp.square(x)) for x in jax.tree_util.tree_leaves(params))
