"""Which config fields may change when a workdir is resumed: the rules.

`classify_config_change` sorts a changed field into 'free' (never changes the trained
parameters), 'flag' (needs --allow_config_change) or 'never'; `with_new_fields` fills a stored
config's missing fields with the defaults runs had before those fields existed. Used by the
resume check (`resume_check`), by checkpoint restoring (`checkpointing`, which checkpoints a
changed config may still read) and by `step` (which fields a compiled program depends on). Imports
nothing of sg_jax, so that `checkpointing` can use it.
"""

from __future__ import annotations

# Config fields (dotted prefixes) that may differ between a run and its resumption without
# --allow_config_change: they never change the trained parameters. train.num_steps is one of them
# unless the learning-rate schedule ends at it (optim.decay_steps = 0).
RESUMABLE_CHANGES = ("num_devices", "train.num_steps", "train.steps_per_call",
                     "train.max_call_seconds", "train.log_every", "eval.", "evals.",
                     "checkpoint.")
# Fields --allow_config_change may change: they change the training from the resumed step on but
# neither a parameter shape nor what a step is (its data, batch, seeds, model, optimiser state).
CHANGEABLE_WITH_FLAG = ("train.num_steps", "optim.learning_rate", "optim.schedule",
                        "optim.warmup_steps", "optim.decay_steps", "optim.cooldown_steps",
                        "train.packing", "train.packing_buckets",
                        # same parameters and computation, other float rounding (docs/model.md)
                        "model.layer_impl", "model.matmul_precision")


def config_change_help() -> str:
  """The `--allow_config_change` flag's help, built from RESUMABLE_CHANGES and
  CHANGEABLE_WITH_FLAG so that the text and the resume rules cannot disagree."""
  flag = ", ".join(CHANGEABLE_WITH_FLAG)
  free = ", ".join(f"{p}*" if p.endswith(".") else p for p in RESUMABLE_CHANGES)
  return ("Resume a workdir whose config differs in fields that change the training from the "
          "resumed step on (or only its float rounding) but neither a parameter shape nor what a "
          f"step is: {flag} (train.num_steps needs this flag only when optim.decay_steps is 0, "
          "i.e. the schedule ends at it). These may change without the flag: "
          f"{free}. Every other field (the model's shape, task, data, seeds, objective, loss "
          "terms, train.batch_size, the other optim fields) can never change on resume (refused "
          "even with this flag): use another --workdir.")


def classify_config_change(name: str, old: dict, new: dict) -> str:
  """How resuming may treat a change of config field `name` (dotted) from `old` to `new`.

  Returns:
    'free' (never changes the trained parameters: RESUMABLE_CHANGES), 'flag' (needs
    --allow_config_change: CHANGEABLE_WITH_FLAG) or 'never' (changes parameter shapes or what a
    step is: model, task, data, seeds, batch size, the optimiser's other fields).
  """
  schedule_ends_at_num_steps = any(
      c.get("optim", {}).get("decay_steps", 1) == 0 for c in (old, new))
  if name == "train.num_steps" and schedule_ends_at_num_steps:
    return "flag"
  if name.startswith(RESUMABLE_CHANGES):
    return "free"
  if name.startswith(CHANGEABLE_WITH_FLAG):
    return "flag"
  return "never"


def with_new_fields(old: dict, defaults: dict) -> dict:
  """`old` (a stored config) with the fields it lacks taken from `defaults` (the task's
  `configlib.base_config`), recursively.

  A field added to sg_jax after a run was written defaults to what runs did before it existed
  (e.g. `model.layer_impl`, `config.sas`, the data composition), so a run from before the field
  resumes unchanged, and only a new value that differs from that default counts as a change.
  """
  out = dict(old)
  for key, value in defaults.items():
    if key not in out:
      out[key] = value
    elif isinstance(value, dict) and isinstance(out[key], dict):
      out[key] = with_new_fields(out[key], value)
  return out
