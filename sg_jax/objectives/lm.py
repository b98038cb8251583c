"""The causal language-modelling objective (`lm`): next-token prediction on every line, the
objective of Murty et al. (ACL 2023, §3): inputs `SOS w1 ... wn`, targets `w1 ... wn EOS`, causal
attention, mean token cross-entropy over the targets."""

from __future__ import annotations

import dataclasses

from sg_jax.objectives import base


@base.register
@dataclasses.dataclass(frozen=True)
class LanguageModeling(base.Objective):
  """Next-token prediction with causal attention (the stored inputs and targets as they are)."""

  name = "lm"
  attention = "causal"
