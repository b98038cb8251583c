"""Models: the registry (`registry.py`) and the registered models.

* `transformer_lm` (family 'decoder'): the decoder-only LM of Murty et al. (ACL 2023),
  `sg_jax.models.transformer.TransformerLM`; every objective but `seq2seq` trains it.
* `encoder_decoder` (family 'encoder_decoder'): `encoder_decoder.EncoderDecoder`, trained by the
  `seq2seq` objective (Ahuja et al. 2024).

docs/model.md says how to add one.
"""

from sg_jax.models import encoder_decoder  # noqa: F401  (registers `encoder_decoder`)
from sg_jax.models.registry import build, entry, family, init_params, names, register  # noqa: F401
