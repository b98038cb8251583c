"""Shared config defaults, the `key=value` config-string parser and its presets (`sg_jax.config.presets`).

Every file in `configs/` calls `base_config(task)` and `apply_config_string(config, arg)`, so
`--config=configs/tense.py:depth=8,seeds=4,quick` works the same for every task (in the style of
big_vision's parameter strings). Any field can still be overridden afterwards with
`--config.section.field=value` (ml_collections' config_flags). Values derived from other values
(e.g. a default warm-up) are resolved in `train.py`, after command-line overrides. A resolved
config is checked by `sg_jax.config.checks.validate` (each feature's rules live in its module).
This module imports no JAX (config files import it before JAX starts; tested).

Defaults reproduce the *released* structural-grokking code (Murty et al., ACL 2023;
`docs/REFERENCE.md` §1): d_model 512, 8 heads, feed-forward 2048, untied output layer,
clipping at 1.0, AdamW lr 1e-4 / eps 1e-7, warm-up 10k then linear decay to 0 at 2M, batch 8.
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import os
from typing import Any

import ml_collections
import numpy as np

from sg_jax.data import composition
from sg_jax import evaluation as evals_lib
from sg_jax.config import per_seed
from sg_jax import tasks as tasks_lib
from sg_jax.config.presets import GROK_CPU, PAPER, PRESETS, QUICK, TINY  # noqa: F401

# Shorthand keys accepted in the config string, mapped to config fields.
ALIASES = {
    "depth": "model.num_layers",
    "layers": "model.num_layers",
    "num_layers": "model.num_layers",
    "d_model": "model.d_model",
    "heads": "model.num_heads",
    "num_heads": "model.num_heads",
    "d_ff": "model.d_ff",
    "dropout": "model.dropout",
    "tied": "model.tied_embeddings",
    "dtype": "model.dtype",
    "seeds": "num_seeds",
    "first_seed": "first_seed",
    "steps": "train.num_steps",
    "batch": "train.batch_size",
    "batch_size": "train.batch_size",
    "lr": "optim.learning_rate",
    "clip": "optim.grad_clip_norm",
    "warmup": "optim.warmup_steps",
    "eval_every": "eval.every",
    "checkpoint_every": "checkpoint.every",
    "num_train": "data.num_train",
    "weight_decay": "optim.weight_decay",
    "wd": "optim.weight_decay",
    "init_scale": "model.init_scale",
    "label_smoothing": "train.label_smoothing",
}


def per_seed_field(value: Any) -> ml_collections.FieldReference:
  """A config field that takes one value or one per seed (`per_seed.HPARAM_FIELDS`): typed
  `object`, so that `--config.optim.weight_decay=0.1` and
  `--config.optim.weight_decay="(0,0,0.1,0.1)"` both parse (ml_collections' literal parser),
  while config.json keeps a single value as it was (`0.1`, not `[0.1]`)."""
  return ml_collections.FieldReference(value, field_type=object)


def base_config(task: str) -> ml_collections.ConfigDict:
  """Reference defaults shared by all tasks (see module docstring).

  Raises:
    ValueError: unknown task name.
  """
  if task not in tasks_lib.names():
    raise ValueError(f"unknown task {task!r}; expected one of {tasks_lib.names()}")
  c = ml_collections.ConfigDict()
  # Which task to train on: a registered task name (sg_jax.tasks.names()), e.g. question.
  c.task = task
  # Training objective (sg_jax/objectives, docs/objectives.md): "lm" = next-token prediction.
  c.objective = "lm"
  # Seeds first_seed .. first_seed + num_seeds - 1 train at once (vmapped). Seed s initialises
  # its parameters, dropout and data order from jax.random.key(s) only, so a seed trained in a
  # group equals the same seed trained alone.
  c.first_seed = 0
  c.num_seeds = 10
  # The seed of each seed's initialisation and of its data order (with its dropout and masking
  # draws), one value or one per seed; -1 = the seed's own id (first_seed + i). Crossing them
  # separates where a seed starts from what it sees, e.g. 2 inits x 2 data orders as 4 seeds:
  # --config.seeds.init="(0,1,0,1)" --config.seeds.data="(0,0,1,1)" (docs/usage.md).
  c.seeds = ml_collections.ConfigDict()
  c.seeds.init = (-1,)
  c.seeds.data = (-1,)
  # Devices the seed axis is sharded over (0 = as many available devices as divide num_seeds).
  c.num_devices = 0

  c.data = ml_collections.ConfigDict()
  # Folder with the split files; '' = generate them into WORKDIR/data (deterministic in data.seed).
  c.data.dir = ""
  # Seed of the data generator (independent of the model seeds).
  c.data.seed = 0
  # Number of generated training lines (0 = the task's default, e.g. 100,000 for question).
  c.data.num_train = 0
  # Training-data composition, one value for all seeds or one per seed (sg_jax/data/composition.py,
  # docs/data.md "Composition"): num_disambiguating, exclude_identity, num_types, subject_mix,
  # subset_fraction; the defaults train on the split as generated.
  composition.add_defaults(c.data)

  c.model = ml_collections.ConfigDict()
  # Depth ("num_layers" in the paper's figures).
  c.model.num_layers = 6
  c.model.d_model = 512
  # Released code: 8 heads (the paper states 4; use heads=4 for the paper's variant).
  c.model.num_heads = 8
  # Released code: 4 x 512 = 2048.
  c.model.d_ff = 2048
  # Dropout rate, one value or one per seed (per_seed.HPARAM_FIELDS; as are the optim fields
  # below from learning_rate to grad_clip_norm, init_scale and train.label_smoothing).
  c.model.dropout = per_seed_field(0.1)
  # Initial weight matrices and embeddings multiplied by this (Omnigrok's alpha; 1 = as drawn).
  c.model.init_scale = per_seed_field(1.0)
  # Released code: untied output layer (the paper describes tied embeddings: tied=True).
  c.model.tied_embeddings = False
  # Computation dtype: float32 (default, for fidelity) or bfloat16 (fp32 master weights).
  c.model.dtype = "float32"
  # Layers: "tuned" (CPU-tuned custom VJPs), "plain" (Flax's) or "auto" (tuned on CPU only).
  c.model.layer_impl = "auto"
  # Matmul precision of float32 matmuls: "default" (TF32 on recent GPUs), "high" or "highest".
  c.model.matmul_precision = "default"
  # The model (`sg_jax.models`): '' = the objective's (`transformer_lm`, the decoder-only LM, for
  # lm / mlm / prefix_lm; `encoder_decoder` for seq2seq). docs/model.md.
  c.model.name = ""

  c.optim = ml_collections.ConfigDict()
  # Peak learning rate, Adam's b1, b2, eps and AdamW's decoupled weight decay (multiplied by the
  # learning rate, as optax.adamw): one value or one per seed, e.g.
  # --config.optim.weight_decay="(0,0,0.1,0.1)".
  c.optim.learning_rate = per_seed_field(1e-4)
  c.optim.b1 = per_seed_field(0.9)
  c.optim.b2 = per_seed_field(0.999)
  c.optim.eps = per_seed_field(1e-7)
  c.optim.weight_decay = per_seed_field(0.0)
  # Learning-rate schedule: "linear" = warm-up then linear decay to 0 at decay_steps (reference);
  # "constant" = warm-up then constant; "wsd" = warm-up, constant, then linear cool-down to 0
  # over the last cooldown_steps steps before decay_steps.
  c.optim.schedule = "linear"
  c.optim.warmup_steps = per_seed_field(10_000)
  # Step at which the linear decay reaches 0 (reference: 2M, so lr is ~0.85e-4 at 300k);
  # 0 = train.num_steps.
  c.optim.decay_steps = 2_000_000
  # "wsd" only: length of the final linear cool-down (ends at decay_steps).
  c.optim.cooldown_steps = 0
  # Global-norm gradient clipping (released code 1.0; the paper states 10). 0 disables.
  c.optim.grad_clip_norm = per_seed_field(1.0)

  c.train = ml_collections.ConfigDict()
  c.train.num_steps = 300_000
  # Sentences per step per seed.
  c.train.batch_size = 8
  # Optimisation steps per compiled call (lax.scan), at most. A call is shortened when a log,
  # evaluation or checkpoint falls inside it, so intervals need not be multiples of it.
  c.train.steps_per_call = 100
  # Longest wanted duration of one compiled call (seconds; 0 = always steps_per_call). A stop
  # signal is handled after the current call, so this bounds the time from SIGTERM to the
  # checkpoint. Steps per call are lowered to a divisor of steps_per_call from the measured
  # speed; results are bit-identical whatever the call sizes.
  c.train.max_call_seconds = 10.0
  # Train-metric logging interval (steps).
  c.train.log_every = 500
  # Pack each step's lines into one row (per-line positions; attention runs within each line,
  # on the lines gathered into the padded layout) instead of padding every line to the longest
  # line of the data set for the dense layers. Same losses and gradients up to float
  # reassociation, same dropout masks; far less padding (1.2-1.3x the padded layout's speed at the
  # reference size on a CPU, 1.1x at the quick size). False: padded batches [batch, length].
  c.train.packing = True
  # Packing: most row-capacity buckets (each compiles one branch of the train step), sized from
  # the training lengths; fewer are used where they cost under 2% more positions
  # (sg_jax.data.packing.packing_capacities): question formation gets 4-6 (3-4% padding).
  c.train.packing_buckets = 8
  # Label smoothing of the training loss (one value or one per seed): the gradient is that of
  # (1 - e) x cross-entropy + e x the cross-entropy against the uniform distribution over the
  # vocabulary; train/loss stays the plain cross-entropy. 0 = off.
  c.train.label_smoothing = per_seed_field(0.0)
  # The optimiser's per-seed fields and the dropout rate as data of the compiled step (one
  # program for any values: a second run with other values loads it from the compilation
  # cache). Automatic when one of them holds one value per seed; False with one value each
  # compiles them in as before, bit-identical to runs from before (docs/usage.md).
  c.train.hparams_as_data = False

  c.eval = ml_collections.ConfigDict()
  # Evaluation interval (steps); the reference logs every 3k steps.
  c.eval.every = 3_000
  # Lines per evaluation batch (per seed).
  c.eval.batch_size = 250
  # Lines evaluated per split (0 = all). Tense decodes at most 2,000 lines (reference).
  c.eval.max_lines = 0
  # Tense: greedy decoding with a key/value cache (the same tokens as False, which runs a full
  # forward pass per decoded token and is kept for comparison).
  c.eval.kv_cache = True
  # Dense-early schedule: also evaluate every `dense_every` steps up to step `dense_until`
  # (0 = off, the default: only every `eval.every` steps).
  c.eval.dense_until = 0
  c.eval.dense_every = 100
  # The training-time evaluators (docs/evaluation.md), one section each from its declared
  # options (`sg_jax.evaluation`): evals.task (loss, task metric), evals.uas (UAS of attention;
  # lines 0 = off), evals.preference (minimal-pair preference; lines 0 = off); every section
  # has `enabled`. eval.uas_lines / eval.preference_lines are the old names of
  # evals.uas.lines / evals.preference.lines (one field, either name sets it).
  c.evals = evals_lib.sections(c.eval)

  # SAS regulariser (Chen et al. 2024; docs/sas.md, sg_jax/terms/sas.py): loss + lambda * the mean
  # attention on gold arcs. Per-seed tuples (one value for all, or one per seed), e.g.
  # --config.sas.lambdas="(0.0,0.0,0.01,-0.01)"; all 0 = off (nothing is built). The original's
  # README run: lambda 0.001 with variant "max"; its code's default: 0.01 with "sum".
  c.sas = ml_collections.ConfigDict()
  c.sas.lambdas = (0.0,)
  c.sas.starts = (0,)  # first step of each seed's window
  c.sas.ends = (0,)  # end (exclusive) of each seed's window; 0 = until the end of training
  c.sas.variant = "sum"  # "sum" over (layer, head) or "max"
  c.sas.p = 1.0  # sum variant: (sum of A^p)^(1/p)
  c.sas.direction = "both"  # "both", "head" (dependent -> head only), "children"

  # Tree regulariser (TreeReg; docs/tree_regularisation.md): per-seed tuples as for sas; lambda > 0
  # promotes the gold trees of the declaratives, < 0 penalises them; all 0 = off (nothing built).
  c.tree = ml_collections.ConfigDict()
  c.tree.lambdas = (0.0,)
  c.tree.starts = (0,)  # first step of each seed's window
  c.tree.ends = (0,)  # end (exclusive) of each seed's window; 0 = until the end of training
  c.tree.layer = -1  # hidden states after this many layers (1..num_layers); -1 = the last
  c.tree.dims = 0.25  # fraction of the d_model components used (the first ones; TreeReg: 0.25)
  c.tree.normalise = False  # True: chart of unit vectors (bounded loss); False: TreeReg's chart

  c.checkpoint = ml_collections.ConfigDict()
  c.checkpoint.every = 3_000  # interval (steps); the analysis reads these
  c.checkpoint.max_to_keep = 0  # 0 = keep all: the analysis needs the whole trajectory
  # Preservation policy (docs/performance.md, checkpointing/policy.py): N > 0 keeps full states
  # of the newest N saves only (WORKDIR/full_states/) and parameter-only checkpoints in
  # checkpoints/ (max_to_keep unused); 0 = every checkpoint a full state (the layout before).
  c.checkpoint.keep_full = 0
  # Under the policy: parameter-only checkpoints at multiples of this (a multiple of
  # checkpoint.every; 0 = checkpoint.every) and at the last step.
  c.checkpoint.params_every = 0
  # Fields only one task reads, declared by the task (`Task.config_fields`: Dyck's
  # data.max_length, eval.dyck_min_distance, eval.dyck_bracket_arcs); every registered task's,
  # so that the configs of all tasks (and old runs' config.json) have the same fields.
  for task_class in tasks_lib.REGISTRY.values():
    for dotted, default in task_class.config_fields.items():
      section, name = dotted.rsplit(".", 1)
      c[section][name] = default
  return c


def _parse_value(text: str) -> Any:
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    low = text.lower()
    if low in ("true", "false"):
      return low == "true"
    return text


def set_field(config: ml_collections.ConfigDict, dotted: str, value: Any) -> None:
  """Sets `config.a.b = value`, converting ints to floats where the field is a float.

  Raises:
    ValueError: the field does not exist, or the value has the wrong type.
  """
  parts = dotted.split(".")
  node = config
  for p in parts[:-1]:
    if p not in node or not isinstance(node[p], ml_collections.ConfigDict):
      raise ValueError(unknown_field_message(config, dotted))
    node = node[p]
  leaf = parts[-1]
  if leaf not in node:
    raise ValueError(unknown_field_message(config, dotted))
  old = node[leaf]
  if isinstance(old, bool) and not isinstance(value, bool):
    raise ValueError(f"config field {dotted!r} expects true/false, got {value!r}")
  if isinstance(old, float) and isinstance(value, int) and not isinstance(value, bool):
    value = float(value)
  if isinstance(old, (int, float)) and not isinstance(old, bool) and isinstance(value, str):
    raise ValueError(f"config field {dotted!r} expects a number, got {value!r}")
  if isinstance(old, str) and not isinstance(value, str):
    value = str(value)
  if dotted in per_seed.HPARAM_FIELDS:  # one value or one per seed, kept as given
    floats = per_seed.HPARAM_FIELDS[dotted] == np.float32
    conv = lambda v: float(v) if floats and isinstance(v, int) and not isinstance(v, bool) else v
    node[leaf] = tuple(map(conv, value)) if isinstance(value, (tuple, list)) else conv(value)
    return
  if isinstance(old, tuple) and not isinstance(value, (tuple, list)):
    value = (value,)  # a per-seed field given one value for all seeds
  elif isinstance(old, tuple):
    value = tuple(value)
  node[leaf] = value


def field_names(config: ml_collections.ConfigDict, prefix: str = "") -> list[str]:
  """Dotted names of every leaf field of `config` (e.g. 'eval.every'), in definition order."""
  names = []
  for key, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      names += field_names(value, f"{prefix}{key}.")
    else:
      names.append(f"{prefix}{key}")
  return names


def has_field(config: ml_collections.ConfigDict, dotted: str) -> bool:
  """Whether `dotted` (e.g. 'train.num_steps') names a field or section of `config`."""
  node = config
  for p in dotted.split("."):
    if not isinstance(node, ml_collections.ConfigDict) or p not in node:
      return False
    node = node[p]
  return True


def nearest_fields(config: ml_collections.ConfigDict, dotted: str, n: int = 3,
                   aliases: bool = False) -> list[str]:
  """Valid field names closest to a mistyped `dotted` one (best first, at most `n`).

  The field an alias of the last component stands for (`train.eval_every` -> `eval.every`, from
  `ALIASES`) comes first; then difflib's closest matches on the whole name and on its last
  component. `aliases`: also offer the config string's alias names (`depht` -> `depth`).
  """
  names = field_names(config)
  leaf = dotted.split(".")[-1]
  found = [ALIASES[leaf]] if leaf in ALIASES else []
  if aliases:
    found += difflib.get_close_matches(dotted, list(ALIASES), n=n, cutoff=0.6)
  found += difflib.get_close_matches(dotted, names, n=n, cutoff=0.6)
  leaves = {}
  for name in names:
    leaves.setdefault(name.split(".")[-1], []).append(name)
  for close in difflib.get_close_matches(leaf, list(leaves), n=n, cutoff=0.75):
    found += leaves[close]
  unique = []
  for name in found:
    if name not in unique and name != dotted:
      unique.append(name)
  return unique[:n]


def unknown_field_message(config: ml_collections.ConfigDict, dotted: str,
                          aliases: bool = False) -> str:
  """One line naming an unknown field and the nearest valid ones (see `nearest_fields`)."""
  near = nearest_fields(config, dotted, aliases=aliases)
  hint = f"; did you mean {' or '.join(near)}?" if near else ""
  return f"unknown config field {dotted!r}{hint}"


def differences(old: dict, new: dict, prefix: str = "") -> list[tuple[str, Any, Any]]:
  """(dotted field, old value, new value) of every field that differs between two config dicts
  (a field missing on one side has the value None there), sorted by name."""
  diffs = []
  for key in sorted(set(old) | set(new)):
    a, b = old.get(key), new.get(key)
    if isinstance(a, dict) and isinstance(b, dict):
      diffs += differences(a, b, f"{prefix}{key}.")
    elif a != b:
      diffs.append((f"{prefix}{key}", a, b))
  return diffs


def apply_config_string(config: ml_collections.ConfigDict, arg: str | None,
                        presets: dict[str, dict[str, Any]] | None = None
                        ) -> ml_collections.ConfigDict:
  """Applies a comma-separated config string such as `depth=8,seeds=4,quick`.

  Bare words name presets (`presets[name]` maps dotted fields to values) and are applied first,
  in order; `key=value` pairs (aliases from `ALIASES` or dotted field names) are applied after,
  so `quick,depth=3` gives the quick preset with 3 layers.

  Raises:
    ValueError: unknown preset, unknown key, or a value of the wrong type (naming it).
  """
  presets = presets or {}
  if not arg:
    return config
  items = [s.strip() for s in arg.split(",") if s.strip()]
  pairs = []
  for item in items:
    if "=" in item:
      key, value = item.split("=", 1)
      pairs.append((key.strip(), _parse_value(value.strip())))
    elif item in presets:
      for field, value in presets[item].items():
        set_field(config, field, value)
    else:
      near = difflib.get_close_matches(item, list(presets) + list(ALIASES), n=1, cutoff=0.6)
      hint = f"did you mean {near[0]}{'=...' if near[0] in ALIASES else ''}? " if near else ""
      raise ValueError(f"unknown preset {item!r} in config string {arg!r}; {hint}"
                       f"presets: {sorted(presets)}")
  for key, value in pairs:
    if key not in ALIASES and not has_field(config, key):
      raise ValueError(unknown_field_message(config, key, aliases=True))
    set_field(config, ALIASES.get(key, key), value)
  return config


def _config_args(args: list[str]) -> tuple[str | None, list[str]]:
  """(--config value or None, dotted fields of the --config.<field> overrides) in `args`."""
  value, overrides = None, []
  for i, arg in enumerate(args):
    if arg == "--":
      break
    name = arg.lstrip("-")
    if not arg.startswith("-"):
      continue
    if name == "config" and i + 1 < len(args):
      value = args[i + 1]
    elif name.startswith("config="):
      value = name[len("config="):]
    elif name.startswith(("config.", "noconfig.")):
      overrides.append(name.split(".", 1)[1].split("=", 1)[0])
  return value, overrides


def check_command_line(args: list[str]) -> str | None:
  """One line on what is wrong with the `--config=FILE[:STRING]` and `--config.<field>=value`
  arguments of a command line (None if nothing): a missing config file, a config string its
  `get_config` rejects, or an unknown field (with the nearest valid ones). ml_collections'
  config_flags would report these as a traceback or name internal objects."""
  value, overrides = _config_args(args)
  if value is None:
    return None
  path, _, arg = value.partition(":")
  if not os.path.isfile(path):
    return f"config file {path!r} not found (--config={value})"
  if not arg and not overrides:
    return None
  # The config string is checked even without overrides: config_flags would report its
  # ValueError (a misspelled preset or alias) as a traceback ending in "ValueError: ...".
  try:
    spec = importlib.util.spec_from_file_location("_sg_jax_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config(arg or None)
  except ValueError as e:
    return f"{e} (--config={value})"
  except Exception:  # pylint: disable=broad-except  (absl's own parsing reports it)
    return None
  for field in overrides:
    if not has_field(config, field):
      return f"{unknown_field_message(config, field)} (--config.{field})"
  return None
