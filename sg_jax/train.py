"""Training loop: many seeds of the structural-grokking LM at once (Murty et al., ACL 2023).

Everything is written for ONE seed (`init_state`, `train_step`, `epoch_permutation`,
`pack_lines`); the seed axis is added with `jax.vmap` only where the functions of a run are
built (`make_chunk_fn`, `make_train_fns`), and `make_train_fns` shards it over devices
(`sharding.per_device`, each device training its own seeds). A compiled call runs
`train.steps_per_call` optimisation steps with `lax.scan`; the training set lives on device and
each seed draws its own epoch permutations from its own key. Every random quantity of seed `s` at
step `t` is a pure function of (`jax.random.key(s)`, `t`), so a resumed run equals an
uninterrupted one and a seed trained in a group equals the same seed trained alone.

The loop blocks on the result of every compiled call before dispatching the next one, so a stop
signal is acted on after the current call: calls are sized to take at most
`train.max_call_seconds` (`_CallSizer`). Metrics reach the host only at logging, evaluation and
checkpoint intervals.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import threading
import time
from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from sg_jax import checkpointing
from sg_jax import configlib
from sg_jax import evaluation
from sg_jax import metric_logging
from sg_jax import model as model_lib
from sg_jax import sharding

Array = jax.Array
log = logging.getLogger("sg_jax")
EXIT_PREEMPTED = 75  # exit code after a SIGTERM/SIGINT-triggered checkpoint (EX_TEMPFAIL)

# Config fields (dotted prefixes) that may differ between a run and its resumption without
# --allow_config_change: they never change the trained parameters. train.num_steps is one of them
# unless the learning-rate schedule ends at it (optim.decay_steps = 0).
RESUMABLE_CHANGES = ("num_devices", "train.num_steps", "train.steps_per_call",
                     "train.max_call_seconds", "train.log_every", "eval.", "checkpoint.every",
                     "checkpoint.max_to_keep")
# Fields --allow_config_change may change: they change the training from the resumed step on but
# neither a parameter shape nor what a step is (its data, batch, seeds, model, optimiser state).
CHANGEABLE_WITH_FLAG = ("train.num_steps", "optim.learning_rate", "optim.schedule",
                        "optim.warmup_steps", "optim.decay_steps", "optim.cooldown_steps",
                        "train.packing", "train.packing_buckets")


class Preempted(Exception):
  """Raised when a SIGTERM/SIGINT stopped the run; `main` exits with EXIT_PREEMPTED.

  Attributes:
    step: the step of the latest checkpoint (a resumed run continues from it; None if the run
      stopped before its first checkpoint).
  """

  def __init__(self, message: str, step: int | None = None):
    super().__init__(message)
    self.step = step


@flax.struct.dataclass
class TrainState:
  """State of one seed (stacked: every leaf gets a leading [seed] axis).

  Attributes:
    step: int32 [] optimisation steps taken.
    params: model parameters (float32).
    opt_state: optax state (AdamW moments, schedule count).
    key: uint32 [2] key data of the seed's root key `jax.random.key(seed)`.
    diverged: bool [] True once the loss or gradient norm was non-finite. The parameters then
      freeze at their last finite values; the optimiser state is not guarded (it takes the
      non-finite step and may hold NaN moments from then on: a diverged seed never trains again).
    diverged_step: int32 [] step at which it diverged (-1 if never).
    sums: running sums since the last log: loss, grad_norm (before clipping) and steps.
  """

  step: Array
  params: Any
  opt_state: Any
  key: Array
  diverged: Array
  diverged_step: Array
  sums: dict


def make_schedule(optim: ml_collections.ConfigDict, num_steps: int) -> optax.Schedule:
  """Learning rate per step (a function of the 0-based step), one of `optim.schedule`:

  * "linear" (reference, docs/REFERENCE.md §1): linear warm-up from 0 over `warmup_steps`, then
    linear decay to 0 at `decay_steps`;
  * "constant": warm-up, then `learning_rate` forever;
  * "wsd" (warm-up, stable, decay): warm-up, constant, then a linear cool-down to 0 over the
    last `cooldown_steps` steps before `decay_steps` (0 after it).

  `decay_steps` = 0 means `num_steps` (the run's train.num_steps): the decay ends at the last step.
  """
  lr, warmup = optim.learning_rate, optim.warmup_steps
  decay_steps = optim.decay_steps or num_steps
  if optim.schedule == "constant":
    after = optax.constant_schedule(lr)
  elif optim.schedule == "wsd":
    stable = decay_steps - optim.cooldown_steps - warmup
    after = optax.join_schedules(
        [optax.constant_schedule(lr), optax.linear_schedule(lr, 0.0, optim.cooldown_steps)],
        [stable])
  else:
    after = optax.linear_schedule(lr, 0.0, decay_steps - warmup)
  if warmup == 0:
    return after
  return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup), after], [warmup])


def make_optimizer(optim: ml_collections.ConfigDict, num_steps: int
                   ) -> optax.GradientTransformation:
  """Clipping at global norm `grad_clip_norm` (0 = off), then AdamW (docs/REFERENCE.md §1) with
  the learning rate of `make_schedule(optim, num_steps)`."""
  adamw = optax.adamw(make_schedule(optim, num_steps), b1=optim.b1, b2=optim.b2, eps=optim.eps,
                      weight_decay=optim.weight_decay)
  if optim.grad_clip_norm > 0:
    return optax.chain(optax.clip_by_global_norm(optim.grad_clip_norm), adamw)
  return adamw


def seed_keys(seeds: list[int]) -> Array:
  """uint32 [num_seeds, 2] key data of `jax.random.key(s)` for each seed id."""
  return jnp.stack([jax.random.key_data(jax.random.key(s)) for s in seeds])


def _subkey(key_data: Array, purpose: int) -> Array:
  return jax.random.fold_in(jax.random.wrap_key_data(key_data), purpose)


PARAMS_KEY, DROPOUT_KEY, DATA_KEY = 0, 1, 2


def init_state(key_data: Array, model: model_lib.TransformerLM,
               tx: optax.GradientTransformation) -> TrainState:
  """Initial state of one seed from its key data (uint32 [2])."""
  params = model_lib.init_params(model.config, _subkey(key_data, PARAMS_KEY))
  zero = jnp.zeros((), jnp.float32)
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                    key=key_data, diverged=jnp.zeros((), bool),
                    diverged_step=jnp.full((), -1, jnp.int32),
                    sums={"loss": zero, "grad_norm": zero, "steps": zero})


def lm_loss(params, model: model_lib.TransformerLM, inputs_BxL: Array, targets_BxL: Array,
            dropout_key: Array | None, **model_kwargs) -> Array:
  """Mean token cross-entropy (nats) over the non-padding target positions of a batch.

  `model_kwargs` (positions_BxL, token_ids_BxL, lines) describe packed rows (`pack_lines`).
  """
  logits = model.apply({"params": params}, inputs_BxL, deterministic=dropout_key is None,
                       rngs=None if dropout_key is None else {"dropout": dropout_key},
                       **model_kwargs)
  loss_sum, count = evaluation.token_losses(logits, targets_BxL)
  return jnp.sum(loss_sum) / jnp.maximum(jnp.sum(count), 1.0)


def loss_and_grads(params, key_data: Array, inputs_BxL: Array, targets_BxL: Array, step: Array,
                   model: model_lib.TransformerLM, **model_kwargs) -> tuple[Array, Any]:
  """(loss [], gradients like `params`) of one seed's step, with that step's dropout masks.

  `key_data` is the seed's uint32 [2] key data; `model_kwargs` describe packed rows (see
  `pack_lines`); the default is a padded batch.
  """
  dropout_key = jax.random.fold_in(_subkey(key_data, DROPOUT_KEY), step)
  return jax.value_and_grad(lm_loss)(params, model, inputs_BxL, targets_BxL, dropout_key,
                                     **model_kwargs)


def apply_gradients(state: TrainState, loss: Array, grads, step: Array,
                    tx: optax.GradientTransformation) -> TrainState:
  """The optimiser update of one seed from `loss_and_grads`; a non-finite loss/gradient freezes
  its parameters for good (marks the seed diverged; see `TrainState.diverged`)."""
  grad_norm = optax.tree.norm(grads)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  ok = finite & ~state.diverged
  # Only the parameters are guarded. Selecting the old optimiser state as well made XLA copy the
  # AdamW moments every step (the parameter update re-reads the old moments after the guarded
  # ones overwrite them in place): ~10% of a depth-2 step (README, Performance).
  params = jax.tree_util.tree_map(lambda new, old: jnp.where(ok, new, old),
                                  optax.apply_updates(state.params, updates), state.params)
  sums = {"loss": state.sums["loss"] + loss, "grad_norm": state.sums["grad_norm"] + grad_norm,
          "steps": state.sums["steps"] + 1.0}
  return state.replace(
      step=state.step + 1, params=params, opt_state=opt_state,
      diverged=state.diverged | ~finite,
      diverged_step=jnp.where(state.diverged | finite, state.diverged_step, step),
      sums=sums)


def train_step(state: TrainState, inputs_BxL: Array, targets_BxL: Array, step: Array,
               model: model_lib.TransformerLM, tx: optax.GradientTransformation,
               **model_kwargs) -> TrainState:
  """One AdamW step of one seed: `loss_and_grads`, then `apply_gradients`.

  `model_kwargs` describe packed rows (see `pack_lines`); the default is a padded batch.
  """
  loss, grads = loss_and_grads(state.params, state.key, inputs_BxL, targets_BxL, step, model,
                               **model_kwargs)
  return apply_gradients(state, loss, grads, step, tx)


def batch_indices(perm: Array, step: Array, batch_size: int, steps_per_epoch: int) -> Array:
  """Line indices [batch] of `step` within the epoch permutation `perm` [num_lines]."""
  return jax.lax.dynamic_slice(perm, ((step % steps_per_epoch) * batch_size,), (batch_size,))


def epoch_permutation(key_data: Array, step: Array, num_lines: int, steps_per_epoch: int
                      ) -> Array:
  """The seed's permutation [num_lines] of the epoch containing `step`.

  Each epoch of `num_lines // batch_size` steps visits a fresh permutation drawn from
  `fold_in(data_key(seed), epoch)`; the remainder lines of an epoch are skipped.
  """
  return jax.random.permutation(
      jax.random.fold_in(_subkey(key_data, DATA_KEY), step // steps_per_epoch), num_lines)


def pack_lines(inputs_NxL: Array, targets_NxL: Array, lengths_N: Array, idx_B: Array,
               capacity: int) -> dict:
  """Packs the lines `idx_B` of a padded set into ONE row of `capacity` token positions.

  Lines are laid out one after another; each keeps its own positions (0..n-1 for a line of n
  tokens) and attends only to itself: the model gathers each line's queries, keys and values
  into the padded layout [batch, length] for attention and the result back into the row
  (`lines`, see `model.MultiHeadAttention`), so attention costs what it costs on the padded
  batch while the dense layers run on the row's positions only. Each token keeps the identity it has in the
  padded layout (line slot x padded length + position) so dropout masks are unchanged
  (`model.CoordinateDropout`). The loss over the row therefore equals the loss of the padded
  batch [batch, length] up to float reassociation, with far fewer padding positions.

  Args:
    inputs_NxL, targets_NxL: the padded training set [num_lines, length].
    lengths_N: non-padding positions per line.
    idx_B: int32 [batch] lines of this step.
    capacity: static row length; must be >= the lines' total length (else the tokens past it
      are silently dropped from the row and the loss; `packing_capacities` always provides a
      bucket that fits).

  Returns:
    dict with `inputs`, `targets` [1, capacity] and model keyword arguments `positions_BxL`,
    `token_ids_BxL` [1, capacity] and `lines` = (unpack_index [1, batch, length]: row position
    of token o of slot j, clipped to the row; repack_index [1, capacity]: j * length + o of the
    token at each row position, 0 for padding positions).
  """
  batch = idx_B.shape[0]
  length = inputs_NxL.shape[1]
  lens = lengths_N[idx_B]
  ends = jnp.cumsum(lens)
  q = jnp.arange(capacity, dtype=jnp.int32)
  slot = jnp.searchsorted(ends, q, side="right").astype(jnp.int32)  # [C] in 0..batch
  valid = slot < batch
  slot_c = jnp.minimum(slot, batch - 1)
  pos = jnp.clip(q - (ends - lens)[slot_c], 0, length - 1)
  line = idx_B[slot_c]
  inputs = jnp.where(valid, inputs_NxL[line, pos], 0)
  targets = jnp.where(valid, targets_NxL[line, pos], 0)
  unpack = jnp.minimum((ends - lens)[:, None] + jnp.arange(length, dtype=jnp.int32)[None, :],
                       capacity - 1)
  repack = jnp.where(valid, slot_c * length + pos, 0)
  return {"inputs": inputs[None], "targets": targets[None],
          "positions_BxL": jnp.where(valid, pos, 0)[None],
          "token_ids_BxL": (slot_c.astype(jnp.uint32) * jnp.uint32(length)
                            + pos.astype(jnp.uint32))[None],
          "lines": (unpack.astype(jnp.int32)[None], repack.astype(jnp.int32)[None])}


def packed_loss_and_grads(params, key_data: Array, data: dict, idx_B: Array, capacity: int,
                          step: Array, model: model_lib.TransformerLM) -> tuple[Array, Any]:
  """`loss_and_grads` of one seed on the lines `idx_B` of `data` ({'inputs', 'targets': int32
  [num_lines, length], 'lengths': int32 [num_lines]}) packed into one row of `capacity` token
  positions (`pack_lines`)."""
  rows = pack_lines(data["inputs"], data["targets"], data["lengths"], idx_B, capacity)
  inputs, targets = rows.pop("inputs"), rows.pop("targets")
  return loss_and_grads(params, key_data, inputs, targets, step, model, **rows)


def packing_capacities(lengths: np.ndarray, batch_size: int, num_seeds: int, padded_length: int,
                       num_buckets: int, samples: int = 4000, seed: int = 0) -> tuple[int, ...]:
  """Row capacities (token positions) for packed training, smallest first.

  A step uses the smallest capacity that holds the longest of its seeds' batches. The buckets
  are quantiles of that maximum, estimated by sampling random batches of the training lengths,
  rounded up to multiples of 8; the last bucket, batch_size * padded_length, always fits.
  """
  rng = np.random.default_rng(seed)
  lengths = np.asarray(lengths)
  draws = rng.integers(0, len(lengths), size=(samples, num_seeds, batch_size))
  need = lengths[draws].sum(-1).max(-1)
  qs = np.quantile(need, np.arange(1, num_buckets + 1) / (num_buckets + 1))
  caps = sorted({int(np.ceil(c / 8) * 8) for c in qs} | {batch_size * padded_length})
  return tuple(c for c in caps if c <= batch_size * padded_length)


def padding_fraction(config: ml_collections.ConfigDict, lengths: np.ndarray, num_seeds: int,
                     padded_length: int, num_steps: int = 2000, seed: int = 1) -> float:
  """Expected fraction of computed token positions that are padding during training.

  Padded layout: 1 - mean(length) / padded_length. Packed layout: capacity chosen per step as in
  training (smallest bucket holding the batch of every seed that shares it: `num_seeds` = seeds
  per device when training on a mesh), estimated over `num_steps` random steps.
  """
  lengths = np.asarray(lengths)
  batch = int(config.train.batch_size)
  if not config.train.packing:
    return float(1.0 - lengths.mean() / padded_length)
  caps = np.asarray(packing_capacities(lengths, batch, num_seeds, padded_length,
                                       config.train.packing_buckets))
  rng = np.random.default_rng(seed)
  totals = lengths[rng.integers(0, len(lengths), size=(num_steps, num_seeds, batch))].sum(-1)
  chosen = caps[np.searchsorted(caps, totals.max(-1))]
  return float(1.0 - totals.sum() / (chosen.sum() * num_seeds))


def make_chunk_fn(model: model_lib.TransformerLM, tx: optax.GradientTransformation,
                  batch_size: int, capacities: tuple[int, ...] | None) -> Callable:
  """`chunk(state [S], data, start_step, num_steps) -> state`: `num_steps` steps of every seed.

  The per-seed functions (`epoch_permutation`, `batch_indices`, `loss_and_grads` or
  `packed_loss_and_grads`, `apply_gradients`) get the seed axis here, with `jax.vmap`; the step
  loop is a `lax.scan` outside the vmap, so the epoch-boundary `cond` and the packing bucket
  `switch` are real branches (not selects).

  Args of `chunk`:
    state: stacked TrainState [S, ...].
    data: {'inputs', 'targets': int32 [num_lines, length], 'lengths': int32 [num_lines]} on
      device, shared by all seeds.
    start_step: int32 [] global step of the first step.
    num_steps: static.
  """

  def chunk(state, data, start_step, num_steps):
    n = data["inputs"].shape[0]
    spe = n // batch_size
    perms = lambda step: jax.vmap(lambda k: epoch_permutation(k, step, n, spe))(state.key)

    # Only the gradients depend on the layout; the optimiser update runs outside the bucket
    # `switch`, whose branches then read the parameters and return fresh buffers (an update
    # inside the branches made XLA copy parameters and both moments every step).
    def padded(params, keys, idx_SxB, step):
      def one(p, k, idx):
        return loss_and_grads(p, k, data["inputs"][idx], data["targets"][idx], step, model)
      return jax.vmap(one)(params, keys, idx_SxB)

    def packed(capacity):
      def run(params, keys, idx_SxB, step):
        def one(p, k, idx):
          return packed_loss_and_grads(p, k, data, idx, capacity, step, model)
        return jax.vmap(one)(params, keys, idx_SxB)
      return run

    def body(carry, t):
      state, perm = carry
      step = start_step + t
      perm = jax.lax.cond(step % spe == 0, lambda: perms(step), lambda: perm)
      idx = jax.vmap(lambda p: batch_indices(p, step, batch_size, spe))(perm)
      if capacities is None:
        loss, grads = padded(state.params, state.key, idx, step)
      else:
        need = jnp.max(jnp.sum(data["lengths"][idx], axis=-1))
        bucket = jnp.searchsorted(jnp.asarray(capacities), need)
        loss, grads = jax.lax.switch(bucket, [packed(c) for c in capacities], state.params,
                                     state.key, idx, step)
      state = jax.vmap(lambda s, l, g: apply_gradients(s, l, g, step, tx))(state, loss, grads)
      return (state, perm), None

    (state, _), _ = jax.lax.scan(body, (state, perms(start_step)),
                                 jnp.arange(num_steps, dtype=jnp.int32))
    return state

  return chunk


@dataclasses.dataclass
class TrainFns:
  """The compiled, seed-vmapped functions of a run."""

  init: Callable  # key_data [S, 2] -> TrainState [S, ...]
  chunk: Callable  # (state, data, start_step, num_steps) -> state
  model: model_lib.TransformerLM
  tx: optax.GradientTransformation
  capacities: tuple[int, ...] | None  # packed-row buckets (None = padded batches)


_TRAIN_FNS_CACHE: dict = {}


def make_train_fns(config: ml_collections.ConfigDict, vocab_size: int,
                   capacities: tuple[int, ...] | None = None,
                   mesh: jax.sharding.Mesh | None = None) -> TrainFns:
  """Builds the model, the optimiser and the jitted functions vmapped over the seed axis.

  Args:
    config: the run config.
    vocab_size: rows of the embedding/output layers.
    capacities: packed-row buckets from `packing_capacities` (None = padded batches).
    mesh: the seed mesh (`sharding.seed_mesh`) or None. With a mesh, `chunk` runs under
      `jax.shard_map`: each device trains its own seeds with no communication at all, so each
      device also picks its own packing bucket (from its seeds only: less padding) and devices
      never wait for one another inside a call. The state must then be sharded over the mesh
      (`sharding.seed_sharding`) and the data replicated.

  Cached on the fields that define them, so repeated runs in one process (tests, sweeps,
  notebooks) reuse the compiled functions.
  """
  cache_key = (config.model.to_json(), config.optim.to_json(), int(config.train.batch_size),
               int(config.train.num_steps) if not config.optim.decay_steps else None,
               int(vocab_size), capacities, mesh)
  if cache_key not in _TRAIN_FNS_CACHE:
    model = model_lib.TransformerLM(model_lib.ModelConfig.from_config(config.model, vocab_size))
    tx = make_optimizer(config.optim, int(config.train.num_steps))
    init = jax.jit(jax.vmap(lambda k: init_state(k, model, tx)))
    chunk_fn = make_chunk_fn(model, tx, int(config.train.batch_size), capacities)
    if mesh is not None:
      chunk_fn = sharding.per_device(chunk_fn, mesh, static_argnums=(3,))
    chunk = jax.jit(chunk_fn, static_argnums=(3,), donate_argnums=(0,))
    _TRAIN_FNS_CACHE[cache_key] = TrainFns(init=init, chunk=chunk, model=model, tx=tx,
                                           capacities=capacities)
  return _TRAIN_FNS_CACHE[cache_key]


def make_train_data(config: ml_collections.ConfigDict, split, seeds_per_device: int
                    ) -> tuple[dict, tuple[int, ...] | None]:
  """Host arrays of the training split and the packing buckets (None when packing is off).

  Args:
    seeds_per_device: seeds that share one packing bucket per step (those of one device when
      `make_train_fns` gets the mesh; all seeds otherwise).

  Returns:
    ({'inputs', 'targets': int32 [N, L], 'lengths': int32 [N]}, capacities).
  """
  data = {"inputs": np.asarray(split.inputs, np.int32),
          "targets": np.asarray(split.targets, np.int32),
          "lengths": np.asarray(split.lengths, np.int32)}
  capacities = None
  if config.train.packing:
    capacities = packing_capacities(data["lengths"], int(config.train.batch_size),
                                    seeds_per_device,
                                    data["inputs"].shape[1], int(config.train.packing_buckets))
  return data, capacities


# ----------------------------------------------------------------------------------------------
# Data and evaluation set-up.


def load_data(config: ml_collections.ConfigDict, workdir: str):
  """Generates (if needed) and encodes the task's splits.

  Question/tense splits are read from the bracketed files (`question_bracket.train`, ...; they
  hold the trees), each checked against its plain twin (`question.train`) when both exist; the
  files read are logged.

  Returns:
    (task, vocab, {'train': EncodedSplit, 'in_domain': ..., 'out_of_domain': ...}).

  Raises:
    DataError: a malformed line, a plain file that differs from its bracketed twin, or a word
      outside the vocabulary (file and line in the message).
    ValueError: the batch is larger than the training split.
  """
  from sg_jax import tasks  # local import: keeps `import sg_jax.train` light

  options = {"max_length": config.data.max_length or None} if config.task == "dyck" else {}
  task = tasks.get_task(config.task, **options)
  data_dir = config.data.dir or os.path.join(workdir, "data")
  task.ensure_data(data_dir, seed=config.data.seed, num_train=config.data.num_train or None)
  vocab = task.vocab()
  splits = {}
  for name, split in (("train", "train"), ("in_domain", task.in_domain_split),
                      ("out_of_domain", task.out_of_domain_split)):
    examples = task.read_split(data_dir, split)
    path = _split_file(data_dir, task, split)
    plain = os.path.join(data_dir, task.file_names(split)[0])
    checked = f" (checked against {plain})" if path != plain and os.path.exists(plain) else ""
    log.info("%s data: %d lines from %s%s", name, len(examples), path, checked)
    check_vocabulary(examples, vocab, path, task.name)
    splits[name] = task.encode(examples, vocab)
  if len(splits["train"]) < config.train.batch_size:
    raise ValueError(f"invalid config: train.batch_size ({config.train.batch_size}) exceeds the "
                     f"number of training lines ({len(splits['train'])})")
  return task, vocab, splits


def _split_file(data_dir: str, task, split: str) -> str:
  """The file `task.read_split(data_dir, split)` returns the lines of: the bracketed variant
  when present (the plain one is then only checked against it), else the plain file."""
  names = [n for n in task.file_names(split) if n]
  for n in reversed(names):
    if os.path.exists(os.path.join(data_dir, n)):
      return os.path.join(data_dir, n)
  return os.path.join(data_dir, names[0])


def check_vocabulary(examples, vocab, path: str, task_name: str) -> None:
  """Raises DataError naming file, line and word if a line uses a word the model does not know."""
  from sg_jax import tasks  # local import: keeps `import sg_jax.train` light

  known = set(vocab.words)
  for line, ex in enumerate(examples, start=1):
    for word in tuple(ex.source) + tuple(ex.target):
      if word not in known:
        raise tasks.DataError(path, line, f"word {word!r} is not in the {task_name} vocabulary "
                              f"({len(known)} words)")


EVAL_FIELDS = ("inputs", "targets", "lengths", "task_pos", "transformed", "main_verb_pos",
               "close_mask", "close_distance")


def prepare_eval_batches(split, batch_size: int, max_lines: int) -> dict:
  """Host arrays [num_batches, batch, ...] of an encoded split (first `max_lines` lines)."""
  n = len(split) if not max_lines else min(max_lines, len(split))
  arrays = {f: np.asarray(getattr(split, f))[:n] for f in EVAL_FIELDS}
  batch_size = min(batch_size, n)
  arrays, _ = evaluation.pad_to_multiple(arrays, batch_size)
  return {k: v.reshape((-1, batch_size) + v.shape[1:]) for k, v in arrays.items()}


def make_eval_fn(config, fns: TrainFns, vocab, eval_data: dict,
                 batch_callback: Callable[[str, int, int], None] | None = None) -> Callable:
  """`params [S, ...] -> {split: {'loss': [S], 'accuracy': [S], ...}}`, seed-vmapped.

  Each split runs one jitted, seed-vmapped call per batch of `eval_data[split]` ([num_batches,
  batch, ...] arrays, `prepare_eval_batches`), driven from Python so that an evaluation longer
  than a few seconds logs its progress (`evaluation.ProgressLog`: lines done, rate, time left).
  Tense decodes with the key/value cache unless `config.eval.kv_cache` is False.

  Args:
    batch_callback: optional `(split, batch index, real lines)`, called once a batch is done
      (the benchmarks time batches with it).
  """
  apply_fn = lambda p, t: fns.model.apply({"params": p}, t, deterministic=True)
  kv_cache_fns = None
  if config.task == "tense" and config.eval.get("kv_cache", True):
    kv_cache_fns = (lambda p, t, pos, c: model_lib.apply_cached(fns.model, p, t, pos, c),
                    lambda p, b, n: model_lib.init_cache(fns.model, p, b, n))
  per_split = {}
  for name, batches in eval_data.items():
    lengths, task_pos = np.asarray(batches["lengths"]), np.asarray(batches["task_pos"])
    tense = config.task == "tense"
    split = evaluation.make_split_evaluator(
        config.task, apply_fn, vocab,
        decode_steps=int(np.max(lengths - task_pos)) if tense else 0,
        dyck_min_distance=config.eval.dyck_min_distance, kv_cache_fns=kv_cache_fns)
    one_batch = lambda p, data, i, split=split: split.batch_sums(
        p, jax.tree_util.tree_map(lambda x: x[i], data))
    stack = lambda sums: jax.tree_util.tree_map(lambda *x: jnp.stack(x, axis=1), *sums)
    summarize = lambda sums, split=split: jax.vmap(split.summarize)(stack(sums))
    per_split[name] = (jax.jit(jax.vmap(one_batch, in_axes=(0, None, None))),
                       jax.jit(summarize), np.asarray(batches["valid"]).sum(axis=1))

  def evaluate(params):
    num_seeds = jax.tree_util.tree_leaves(params)[0].shape[0]
    progress = evaluation.ProgressLog(sum(int(v[2].sum()) for v in per_split.values()),
                                      num_seeds)
    results = {}
    for name, (one_batch, summarize, lines) in per_split.items():
      sums = []
      for i, n in enumerate(lines):
        sums.append(jax.block_until_ready(one_batch(params, eval_data[name], np.int32(i))))
        progress.update(n, name)
        if batch_callback is not None:
          batch_callback(name, i, int(n))
      results[name] = summarize(sums)
    progress.close()
    return results

  return evaluate


# ----------------------------------------------------------------------------------------------
# Workdir bookkeeping.


def config_differences(old: dict, new: dict, prefix: str = "") -> list[str]:
  """'field: old -> new' for every field whose value differs between two config dicts."""
  return [f"{name}: {a!r} -> {b!r}" for name, a, b in configlib.differences(old, new, prefix)]


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


def _stored_config(workdir: str) -> dict | None:
  """The config a workdir was written with: config.json, else the newest checkpoint's."""
  path = os.path.join(workdir, "config.json")
  if os.path.exists(path):
    with open(path) as f:
      return json.load(f)
  steps = checkpointing.all_steps(workdir)
  if not steps:
    return None
  manager = checkpointing.make_manager(workdir, create=False, asynchronous=False)
  try:
    return checkpointing.read_meta(manager, steps[-1])["config"]
  except Exception:  # pylint: disable=broad-except  (unreadable: restore_latest_good decides)
    return None
  finally:
    manager.close()


def check_workdir_config(workdir: str, config: ml_collections.ConfigDict,
                         allow_config_change: bool) -> None:
  """Refuses to resume a workdir written with a different config, in one line naming the fields.

  Fields are classified by `classify_config_change`: 'free' ones may differ; 'flag' ones only
  with `allow_config_change`; 'never' ones are refused even then. Nothing in the workdir is
  touched.

  Raises:
    ValueError: naming the differing fields and what to do.
  """
  old = _stored_config(workdir)
  if old is None:
    return
  new = json.loads(config.to_json())
  diffs = configlib.differences(old, new)
  kinds = {name: classify_config_change(name, old, new) for name, _, _ in diffs}
  fmt = lambda wanted: ", ".join(f"{name} {a!r} -> {b!r}" for name, a, b in diffs
                                 if kinds[name] == wanted)
  if "never" in kinds.values():
    raise ValueError(
        f"workdir {workdir} was written with another config: {fmt('never')} (these change "
        f"parameter shapes or what a step is; --allow_config_change cannot change them); use "
        f"another --workdir")
  if "flag" in kinds.values() and not allow_config_change:
    raise ValueError(
        f"workdir {workdir} was written with another config: {fmt('flag')}; pass "
        f"--allow_config_change to resume with the new values, or use another --workdir")
  if "flag" in kinds.values():
    log.warning("resuming %s with changed config fields (--allow_config_change): %s", workdir,
                fmt("flag"))


def check_writable(workdir: str) -> None:
  """Creates `workdir` and checks a file can be written there.

  Raises:
    checkpointing.WorkdirError: naming the workdir and the OS error.
  """
  try:
    os.makedirs(workdir, exist_ok=True)
    probe = os.path.join(workdir, f".write_probe.{os.getpid()}")
    with open(probe, "w") as f:
      f.write("ok")
    os.remove(probe)
  except OSError as e:
    raise checkpointing.WorkdirError(f"workdir {workdir} is not writable: {e}") from e


def _write_json_atomic(path: str, text: str) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


class _StopNow(BaseException):
  """Raised by `_StopSignal`'s handler when stopping at once loses nothing a checkpoint lacks.

  A BaseException, like KeyboardInterrupt, so that the `except Exception` of data or checkpoint
  code (which treats an unreadable checkpoint as corrupt) never mistakes it for a failure.
  """

  def __init__(self, signum: int, where: str):
    super().__init__(signum, where)
    self.signum, self.where = signum, where


class _StopSignal:
  """SIGTERM/SIGINT handling for the whole of a run, from its first second.

  While the run holds nothing a checkpoint lacks (`immediate`: start-up, i.e. data generation,
  compilation and the step-0 evaluation, and every compiled call that starts from the step just
  checkpointed), the handler stops the run at once by raising `_StopNow` in the main thread.
  Otherwise it records the signal (`received`) and the loop checkpoints after the current call;
  a second signal stops at once without that checkpoint.

  The handler runs only when the main thread executes Python, not during one long native call (an
  XLA compilation, a device computation). With `exit_after` > 0 (the command line) a watchdog
  thread, woken by `signal.set_wakeup_fd`, ends the process with EXIT_PREEMPTED and one line when
  a signal that should stop the run at once has not reached the main thread within `exit_after`
  seconds; nothing is lost that a rerun does not redo, as after kill -9.
  """

  def __init__(self, exit_after: float = 0.0):
    self.exit_after = exit_after
    self.received: int | None = None
    self.immediate = True
    self.where = "during start-up (data, compilation or the step-0 evaluation)"
    self._count = 0
    self._handled = 0
    self._stopping = False
    self._old: dict = {}
    self._pipe = None
    self._old_wakeup = -1
    self._closed = False

  def __enter__(self):
    if threading.current_thread() is not threading.main_thread():
      return self  # signal handlers can only be installed from the main thread
    for sig in (signal.SIGTERM, signal.SIGINT):
      self._old[sig] = signal.signal(sig, self._handle)
    if self.exit_after > 0:
      read_fd, write_fd = os.pipe()
      os.set_blocking(write_fd, False)
      self._pipe = (read_fd, write_fd)
      self._old_wakeup = signal.set_wakeup_fd(write_fd)
      threading.Thread(target=self._watch, args=(read_fd,), daemon=True,
                       name="sg_jax-stop-watchdog").start()
    return self

  def set_immediate(self, immediate: bool, where: str | None = None) -> None:
    """Whether a signal now stops the run at once (`where` says when, for the message)."""
    if where is not None:
      self.where = where
    self.immediate = immediate

  def _handle(self, signum, frame):
    del frame
    self._handled += 1
    if self._stopping:
      return  # already stopping at once
    first = self.received is None
    self.received = signum
    if self.immediate or not first:
      self._stopping = True
      raise _StopNow(signum, self.where if first else
                     "by a second signal, without a checkpoint of the current step")
    log.warning("received signal %d: checkpointing after the current call, then exiting",
                signum)

  def _watch(self, read_fd: int) -> None:
    stops = (signal.SIGTERM, signal.SIGINT)
    while True:
      try:
        data = os.read(read_fd, 64)
      except OSError:
        return
      if not data or self._closed:
        return
      for signum in data:
        if signum not in stops:
          continue
        self._count += 1
        if not (self.immediate or self._count > 1):
          continue
        deadline = time.monotonic() + self.exit_after
        while time.monotonic() < deadline and not self._closed:
          time.sleep(0.05)
        if self._closed or self._handled >= self._count:
          continue  # the main thread got it and is stopping
        where = self.where if self._count == 1 else "by a second signal"
        os.write(2, f"{time.strftime('%H:%M:%S')} stopped by signal {signum} {where}; rerun "
                    f"the same command to resume\n".encode())
        os._exit(EXIT_PREEMPTED)

  def __exit__(self, *exc):
    self._closed = True
    for sig, old in self._old.items():
      signal.signal(sig, old)
    if self._pipe is not None:
      signal.set_wakeup_fd(self._old_wakeup)
      os.close(self._pipe[1])  # the watchdog reads end-of-file and returns
    return False


class _CallSizer:
  """Steps per compiled call, so that one call takes at most `max_seconds`.

  The size is the largest divisor of `steps_per_call` whose call is expected to fit (divisors
  keep calls aligned with intervals that are multiples of `steps_per_call`, so few sizes get
  compiled). The first guess comes from `guess_seconds_per_step`; after that from the measured
  duration of calls of a size already compiled (a size's first call includes its compilation).
  A new size takes effect at a step that is a multiple of it. Results do not depend on the call
  sizes (every step is a pure function of the seed and the step number; tested bit for bit).

  Args:
    steps_per_call: the most steps per call (train.steps_per_call).
    max_seconds: the longest wanted call (train.max_call_seconds); 0 = always steps_per_call.
    guess_seconds_per_step: estimate before any call has been measured.
  """

  def __init__(self, steps_per_call: int, max_seconds: float, guess_seconds_per_step: float):
    self.max_steps = int(steps_per_call)
    self.max_seconds = float(max_seconds)
    self.sizes = [d for d in range(1, self.max_steps + 1) if self.max_steps % d == 0]
    self.compiled: set[int] = set()
    self.current = self._fit(guess_seconds_per_step) if self.max_seconds > 0 else self.max_steps
    self.wanted = self.current

  def _fit(self, seconds_per_step: float) -> int:
    fits = [d for d in self.sizes if d * seconds_per_step <= self.max_seconds]
    return max(fits) if fits else 1

  def size_at(self, step: int) -> int:
    """Steps of the call that starts at `step` (before the log/eval/checkpoint cut)."""
    if self.wanted != self.current and step % self.wanted == 0:
      self.current = self.wanted
    return self.current

  def observe(self, num_steps: int, seconds: float) -> None:
    """Records that a call of `num_steps` steps took `seconds` (dispatch to result)."""
    first = num_steps not in self.compiled
    self.compiled.add(num_steps)
    if self.max_seconds <= 0 or first:
      return
    per_step = seconds / num_steps
    fit = self._fit(per_step)
    # Shrink as soon as the current size overruns by a fifth; grow only by 2x or more, so that
    # timing noise does not compile sizes back and forth.
    if self.current * per_step > 1.2 * self.max_seconds or fit >= 2 * self.current:
      self.wanted = fit


# Rough training speed per device before anything is measured (FLOP/s of 6 x parameters x
# tokens per step): only the first call's size depends on it.
_GUESSED_FLOPS_PER_SECOND = {"cpu": 2e10}
_GUESSED_ACCELERATOR_FLOPS = 1e13


def _guess_seconds_per_step(num_params: int, config, host_data: dict, per_device: int) -> float:
  lengths = np.asarray(host_data["lengths"])
  tokens = config.train.batch_size * (float(lengths.mean()) if config.train.packing
                                      else host_data["inputs"].shape[1])
  speed = _GUESSED_FLOPS_PER_SECOND.get(jax.default_backend(), _GUESSED_ACCELERATOR_FLOPS)
  return 6.0 * num_params * tokens * per_device / speed


# ----------------------------------------------------------------------------------------------
# The main loop.


def _next_boundary(step: int, config, steps: int | None = None) -> int:
  """End of the next compiled call: at most `steps` (default train.steps_per_call), and never
  past a log/eval/checkpoint step."""
  end = min(step + (steps or config.train.steps_per_call), config.train.num_steps)
  for every in (config.train.log_every, config.eval.every, config.checkpoint.every):
    end = min(end, (step // every + 1) * every)
  return end


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       allow_config_change: bool = False,
                       state_hook: Callable[[TrainState, int], TrainState] | None = None,
                       tensorboard: bool = True, signal_exit_seconds: float = 0.0) -> dict:
  """Trains `config.num_seeds` seeds at once in `workdir`, resuming from its latest checkpoint.

  SIGTERM/SIGINT are handled from the first line: before the first compiled training call (data
  generation, compilation, the step-0 evaluation) and during a call that starts from the latest
  checkpoint they stop the run at once; otherwise the run checkpoints after the current call
  (at most about `train.max_call_seconds`) and stops. Either way `Preempted` is raised.

  Args:
    config: resolved config (see `configs/`); validated before any compute.
    workdir: run directory (created); receives config.json, vocab.json, data/ (generated),
      checkpoints/, metrics.csv and tensorboard/.
    allow_config_change: resume a workdir written with another value of a field in
      `CHANGEABLE_WITH_FLAG` (see `check_workdir_config`).
    state_hook: test hook `(state, step) -> state` called before every compiled call (e.g. to
      poison one seed's parameters).
    tensorboard: also write TensorBoard summaries (clu).
    signal_exit_seconds: the command line's bound on stopping at once (see `_StopSignal`): after
      this many seconds the process exits with EXIT_PREEMPTED if the main thread is still inside
      a native call; 0 = never (in-process callers keep their interpreter).

  Returns:
    {'step': final step, 'seeds': seed ids [S], 'eval': the last evaluation as
    {'in_domain/accuracy': np [S], ...} (NaN for diverged seeds), 'state': the stacked
    TrainState, 'trained_steps': steps trained by this call (0 when the run was complete)}.

  Raises:
    ValueError: invalid config or data (message names the field / file / line), or a workdir
      written with another config.
    checkpointing.CheckpointMismatch: a checkpoint's shapes do not fit the config (nothing moved).
    checkpointing.WorkdirError: the workdir cannot be written (unwritable, disk full; a failed
      checkpoint save stops the run at once); the checkpoints before it are intact and
      metrics.csv ends at the last of them.
    Preempted: a SIGTERM/SIGINT arrived (`Preempted.step`: the checkpoint to resume from).
  """
  with _StopSignal(exit_after=signal_exit_seconds) as stop:
    try:
      return _train_and_evaluate(config, workdir, stop, allow_config_change=allow_config_change,
                                 state_hook=state_hook, tensorboard=tensorboard)
    except _StopNow as e:
      try:
        steps = checkpointing.all_steps(workdir)
      except Exception:  # pylint: disable=broad-except  (only for the message)
        steps = []
      latest = steps[-1] if steps else None
      resume = (f"the latest checkpoint is step {latest}" if latest is not None
                else "no checkpoint yet")
      raise Preempted(f"stopped by signal {e.signum} {e.where} ({resume})", latest) from None


def _train_and_evaluate(config, workdir, stop: _StopSignal, *, allow_config_change, state_hook,
                        tensorboard) -> dict:
  configlib.validate(config)
  check_writable(workdir)
  check_workdir_config(workdir, config, allow_config_change)
  _, vocab, splits = load_data(config, workdir)

  seeds = list(range(config.first_seed, config.first_seed + config.num_seeds))
  mesh = sharding.seed_mesh(len(seeds), config.num_devices)
  per_device = len(seeds) // mesh.devices.size
  host_data, capacities = make_train_data(config, splits["train"], per_device)
  fns = make_train_fns(config, vocab.size, capacities, mesh)
  train_data = sharding.put_replicated(host_data, mesh)
  waste = padding_fraction(config, host_data["lengths"], per_device, host_data["inputs"].shape[1])
  log.info("training batches: %s; expected padding %.1f%% of computed token positions",
           f"packed rows, capacities {capacities}" if capacities else "padded", 100 * waste)
  eval_data = sharding.put_replicated(
      {name: prepare_eval_batches(splits[name], config.eval.batch_size, config.eval.max_lines)
       for name in ("in_domain", "out_of_domain")}, mesh)
  evaluate = make_eval_fn(config, fns, vocab, eval_data)

  writer = sharding.is_writer()
  meta = checkpointing.make_meta(config, vocab.to_json(), seeds)
  state = jax.jit(fns.init, out_shardings=sharding.seed_sharding(mesh))(
      sharding.put_replicated(np.asarray(seed_keys(seeds)), mesh))
  ckpt = checkpointing.CheckpointWriter(workdir, max_to_keep=config.checkpoint.max_to_keep)
  summaries = None
  failed = False
  try:
    latest, restored = checkpointing.restore_latest_good(
        ckpt.manager, workdir, sharding.abstract_like(state, mesh), config=config)
    # The workdir's own files change only once its checkpoints are known to fit this config.
    _write_json_atomic(os.path.join(workdir, "config.json"), config.to_json(indent=2))
    _write_json_atomic(os.path.join(workdir, "vocab.json"), vocab.to_json())
    table = metric_logging.MetricsTable(os.path.join(workdir, "metrics.csv"), enabled=writer)
    summaries = metric_logging.SummaryWriter(os.path.join(workdir, "tensorboard"),
                                             tensorboard and writer)
    # Rows logged after the checkpoint we resume from (or by an attempt killed before its first
    # checkpoint) are dropped, so the table equals an uninterrupted run's.
    dropped = table.truncate_after(-1 if latest is None else latest)
    if latest is not None:
      state = restored
      log.info("resumed from checkpoint step %d (dropped %d later metric rows)", latest,
               dropped)
    step = int(latest or 0)
    log.info("%s", sharding.describe(mesh, len(seeds)))

    def log_eval(step, state, write=True):
      results = sharding.to_host(evaluate(state.params))
      diverged = np.asarray(sharding.to_host(state.diverged))
      flat = {}
      for split, metrics in results.items():
        for name, values in metrics.items():
          flat[f"{split}/{name}"] = np.where(diverged, np.nan, np.asarray(values))
      if write:
        table.write(step, seeds, flat)
        summaries.write(step, seeds, flat)
      log.info("step %d eval: %s", step, _fmt_metrics(flat))
      return flat

    def save(step, state):
      # Not stopped at once inside orbax's save: a signal now is acted on right after it.
      immediate, stop.immediate = stop.immediate, False
      try:
        ckpt.save(step, state, meta)
      finally:
        stop.immediate = immediate

    last_eval = {}
    if latest is None:
      last_eval = log_eval(0, state)
      save(0, state)
    saved = step  # the state at `saved` is in a checkpoint (written or being written)

    num_params = model_lib.num_params(jax.tree_util.tree_map(lambda x: x[0], state.params))
    if step >= config.train.num_steps:
      log.info("the run in %s is complete: its checkpoint is at step %d and train.num_steps is "
               "%d, so there is nothing to train (pass a larger --config.train.num_steps to train "
               "longer)", workdir, step, config.train.num_steps)
    else:
      log.info("training %d seeds %s of %s (%d parameters each) from step %d to %d in %s",
               len(seeds), seeds, config.task, num_params, step, config.train.num_steps,
               workdir)
    sizer = _CallSizer(config.train.steps_per_call, config.train.get("max_call_seconds", 0.0),
                       _guess_seconds_per_step(num_params, config, host_data, per_device))
    t0, step0 = time.time(), step
    while step < config.train.num_steps:
      if stop.received is not None and step == saved:
        ckpt.wait()
        raise Preempted(f"signal {stop.received}: checkpoint written at step {step}", step)
      end = _next_boundary(step, config, sizer.size_at(step))
      if state_hook is not None:
        state = state_hook(state, step)
      # A call from the step just checkpointed loses nothing when a signal stops it at once.
      stop.set_immediate(step == saved, f"at step {step}")
      started = time.perf_counter()
      state = fns.chunk(state, train_data, jnp.asarray(step, jnp.int32), end - step)
      jax.block_until_ready(state)  # the signal and the saves are checked after every call
      stop.set_immediate(False)
      sizer.observe(end - step, time.perf_counter() - started)
      step = end
      # A failed save stops the run before any metric row of a later step is written: rows are
      # written at log/eval steps only, and there the pending save is waited for (it has
      # usually long finished); between them a failure is picked up as soon as it is known.
      if any(step % every == 0 for every in (config.train.log_every, config.eval.every,
                                             config.checkpoint.every)):
        ckpt.wait()
      else:
        ckpt.check()
      if step % config.train.log_every == 0 or step == config.train.num_steps:
        state = _log_train(step, state, seeds, fns, config, table, summaries, t0, step0)
      if step % config.eval.every == 0 or step == config.train.num_steps:
        last_eval = log_eval(step, state)
      if (step % config.checkpoint.every == 0 or step == config.train.num_steps
          or stop.received is not None):
        save(step, state)
        saved = step
      if stop.received is not None and step < config.train.num_steps:
        ckpt.wait()
        raise Preempted(f"signal {stop.received}: checkpoint written at step {step}", step)
    ckpt.wait()
  except checkpointing.CheckpointWriteError as e:
    failed = True
    ckpt.abandon()
    good = checkpointing.all_steps(workdir)
    last_good = good[-1] if good else None
    if writer:
      metric_logging.MetricsTable(os.path.join(workdir, "metrics.csv")).truncate_after(
          -1 if last_good is None else last_good)
    ends = (f"the last good checkpoint is step {last_good} and metrics.csv ends there"
            if last_good is not None else "there is no checkpoint and metrics.csv is empty")
    raise checkpointing.WorkdirError(f"{e}; the run stopped: {ends}") from e
  finally:
    if not failed:
      try:
        ckpt.close()
      except checkpointing.CheckpointWriteError:
        ckpt.abandon()  # only while another exception propagates: ckpt.wait() ran otherwise
    if summaries is not None:
      summaries.close()
  if not last_eval:  # the run had already finished: report its final evaluation again
    last_eval = _logged_eval(table, step, seeds) or log_eval(step, state, write=False)
  return {"step": step, "seeds": seeds, "eval": last_eval, "state": state,
          "trained_steps": step - step0}


def _logged_eval(table: metric_logging.MetricsTable, step: int, seeds: list[int]) -> dict:
  """The evaluation rows of `step` already in metrics.csv, as {name: [S]} ({} if incomplete)."""
  if not table.enabled or not os.path.exists(table.path):
    return {}
  values: dict = {}
  for row in table.rows():
    if row["step"] == step and row["name"].startswith(("in_domain/", "out_of_domain/")):
      values.setdefault(row["name"], {})[row["seed"]] = row["value"]
  if not values or any(set(v) != set(seeds) for v in values.values()):
    return {}
  return {name: np.asarray([v[s] for s in seeds]) for name, v in values.items()}


def _fmt_values(values) -> str:
  return "[" + " ".join(f"{float(v):.3f}" for v in np.asarray(values).reshape(-1)) + "]"


def _fmt_metrics(metrics: dict) -> str:
  return "  ".join(f"{k} {_fmt_values(v)}" for k, v in metrics.items())


def _log_train(step, state, seeds, fns, config, table, summaries, t0, step0):
  sums = sharding.to_host(state.sums)
  diverged = np.asarray(sharding.to_host(state.diverged))
  diverged_step = np.asarray(sharding.to_host(state.diverged_step), np.float64)
  n = np.maximum(sums["steps"], 1.0)
  schedule = make_schedule(config.optim, int(config.train.num_steps))
  metrics = {
      "train/loss": sums["loss"] / n,
      "train/grad_norm": sums["grad_norm"] / n,
      "train/learning_rate": np.full(len(seeds), float(schedule(step - 1))),
      "train/diverged": diverged.astype(np.float64),
      "train/diverged_step": diverged_step,
  }
  metrics["train/loss"] = np.where(diverged, np.nan, metrics["train/loss"])
  table.write(step, seeds, metrics)
  summaries.write(step, seeds, metrics)
  rate = (step - step0) / max(time.time() - t0, 1e-9)
  eta = (config.train.num_steps - step) / max(rate, 1e-9)
  log.info("step %d/%d  loss %s  %.1f steps/s (%.1f seed-steps/s)  ETA %s",
               step, config.train.num_steps, _fmt_values(metrics["train/loss"]), rate,
               rate * len(seeds), time.strftime("%H:%M:%S", time.gmtime(eta)))
  zero = jax.tree_util.tree_map(jnp.zeros_like, state.sums)
  return state.replace(sums=zero)
