"""The hyper-parameters of a model (`ModelConfig`), built from the run config's `model`
section by `ModelConfig.from_config`; every registered model reads them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sg_jax.models import layers
from sg_jax.models.attention_masks import ATTENTIONS


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Hyper-parameters of `TransformerLM` (keyword-only, so nothing lands in the wrong slot).

  Attributes:
    vocab_size: rows of the embedding and output layers (`<pad>`=0, words, EOS, SOS).
    num_layers: number of transformer layers ("depth" in the paper).
    d_model: residual width.
    num_heads: attention heads; must divide `d_model`.
    d_ff: feed-forward hidden width (2048 in the released code: 4 x 512).
    dropout: dropout rate on attention probabilities, residual branches, feed-forward hidden
      layer and the input embedding + position sum. A run with one rate per seed builds its
      model with the largest (dropout on when any seed has it) and hands each seed's rate in
      as `dropout_keep`.
    dropout_keep: None (the rate is `dropout`, compiled in), or this seed's rate as data:
      (scale float32 [] = 1 / keep probability, uint32 [] hash threshold) from
      `per_seed.hparam_arrays` ('dropout_scale', 'dropout_threshold'); set inside the traced
      training step (`step.total_loss`), never from a config.
    init_scale: the initial weight matrices and embeddings are multiplied by it (Omnigrok's
      initialisation scale, Liu et al., ICLR 2023 §3); applied by `training.state.init_state`,
      per seed.
    tied_embeddings: use the transposed input embedding as the output layer (the paper's
      description) instead of a separate linear layer (the released code).
    max_len: longest sequence the sinusoidal position table covers.
    dtype: computation dtype ("float32" or "bfloat16"); parameters stay float32.
    layer_norm_eps: LayerNorm epsilon (PyTorch's default 1e-5).
    layer_impl: "tuned" (`layers.py`'s CPU layers), "plain" (Flax's) or "auto" (tuned on CPU,
      plain on GPU/TPU); same parameters either way (`layers.layer_set`).
    matmul_precision: "default", "high" or "highest" for every matmul (`layers.MATMUL_PRECISIONS`).
    attention: "causal", "bidirectional" or "prefix" (`attention_masks`): set by the training
      objective (`objectives`), not by `config.model`.
    prefix_end_ids: the ids that end a line's prefix under `prefix` attention (the task
      tokens), else ().
    name: the model's name in `sg_jax.models` (`models.build` makes the module): this
      decoder-only `transformer_lm` (the default), or e.g. `encoder_decoder`. Set from the run
      config's `model.name`, or from the objective when that is ''
      (`objectives.model_config_from_config`).
  """

  vocab_size: int
  num_layers: int = 6
  d_model: int = 512
  num_heads: int = 8
  d_ff: int = 2048
  dropout: float = 0.1
  init_scale: float = 1.0
  tied_embeddings: bool = False
  max_len: int = 512
  dtype: str = "float32"
  layer_norm_eps: float = 1e-5
  layer_impl: str = "auto"
  matmul_precision: str = "default"
  attention: str = "causal"
  prefix_end_ids: tuple = ()
  dropout_keep: Any = None
  name: str = "transformer_lm"

  def __post_init__(self):
    # The one statement of the model fields' rules: config_checks.validate checks a run config's
    # `model` section by building a ModelConfig from it.
    rules = (
        (self.num_layers >= 1, "num_layers", "(depth) must be >= 1"),
        (self.d_model >= 1, "d_model", "must be >= 1"),
        (self.num_heads >= 1, "num_heads", "must be >= 1"),
        (self.d_model % max(self.num_heads, 1) == 0, "d_model",
         f"must be divisible by model.num_heads={self.num_heads}"),
        (self.d_ff >= 1, "d_ff", "must be >= 1"),
        (0.0 <= self.dropout < 1.0, "dropout", "must be in [0, 1)"),
        (self.init_scale > 0.0, "init_scale", "must be > 0"),
        (self.dtype in ("float32", "bfloat16"), "dtype", "must be float32 or bfloat16"),
        (self.layer_impl in layers.LAYER_IMPLS, "layer_impl", "must be auto, tuned or plain"),
        (self.matmul_precision in layers.MATMUL_PRECISIONS, "matmul_precision",
         "must be default, high or highest"),
        (self.attention in ATTENTIONS, "attention", f"must be one of {tuple(ATTENTIONS)}"),
        (self.attention != "prefix" or bool(self.prefix_end_ids), "prefix_end_ids",
         "must name the task tokens for prefix attention"),
    )
    for ok, name, rule in rules:
      if not ok:
        raise ValueError(f"invalid config: model.{name} {rule} (got {getattr(self, name)!r})")

  @property
  def head_dim(self) -> int:
    return self.d_model // self.num_heads

  @classmethod
  def from_config(cls, model_cfg: Any, vocab_size: int, max_len: int = 512,
                  attention: str = "causal", prefix_end_ids: tuple = (),
                  model_name: str = "transformer_lm") -> "ModelConfig":
    """Builds a ModelConfig from the `model` section of an ml_collections config.

    Each field of `model_cfg` sets the ModelConfig field of the same name (cast to the type of
    its default); fields it does not set keep their defaults. Its `name` is not read here: the
    model's name is `model_name` (`objectives.model_config_from_config` resolves it).

    Raises:
      ValueError: `model_cfg` has a field ModelConfig lacks (or sets `vocab_size`, `max_len`,
        `attention` or `prefix_end_ids`, which come from the arguments), or a value breaks a
        rule of `__post_init__`.
    """
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in _FROM_ARGUMENTS}
    values = {}
    for name, value in model_cfg.items():
      if name == "name":  # the model's name is `model_name`
        continue
      if name in _PER_SEED and isinstance(value, (list, tuple)):
        # One value per seed: each rule holds for every value (the largest and the smallest
        # are checked); the model is built with the largest (`dropout`: on when any seed has
        # it); each seed's own value is handed in by the training step.
        for extreme in (min(value), max(value)):
          cls(vocab_size=1, **{name: float(extreme)})
        value = max(value)
      if name not in fields:
        raise ValueError(f"invalid config: model.{name} is not a model field (fields: "
                         f"{', '.join(fields)})")
      default = fields[name].default
      values[name] = type(default)(value) if isinstance(default, (bool, int, float, str)) else value
    return cls(vocab_size=vocab_size, max_len=max_len, attention=attention,
               prefix_end_ids=tuple(int(i) for i in prefix_end_ids), name=str(model_name),
               **values)


_FROM_ARGUMENTS = ("vocab_size", "max_len", "attention", "prefix_end_ids", "dropout_keep", "name")


# Model fields that take one value or one per seed (`per_seed.HPARAM_FIELDS`).
_PER_SEED = ("dropout", "init_scale")
