"""The training step of ONE seed, and the seed-vmapped, jitted functions of a run built from it.

Everything per seed is written for one seed (`training.state.init_state`, `loss_and_grads`,
`apply_gradients`, `training.sampling.epoch_permutation`); the seed axis is added with
`jax.vmap` in exactly one place, where the functions of a run are built (`make_chunk_fn`,
`make_train_fns`), and `make_train_fns` shards it over devices (`sharding.per_device`, each
device training its own seeds). A compiled call (`make_chunk_fn`) runs its steps with
`lax.scan`; the training set lives on device and each seed draws its own epoch permutations from
its own key (`training.sampling`). Every random quantity of seed `s` at step `t` is a pure
function of (`jax.random.key(s)`, `t`) (`training.state`), so a resumed run equals an
uninterrupted one and a seed trained in a group equals the same seed trained alone
(`seeds.init` / `seeds.data` may give the initialisation and the data order, dropout and
masking draws different seeds: `per_seed.seed_ids`). The scalar hyperparameters may differ per
seed too: they then ride with the data as arrays (`per_seed.hparam_arrays`,
`optim.adamw.PerSeedAdamW`), so one compiled program serves any values of them. The functions
are built from typed `StepOptions`, never from the run config.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from sg_jax import models
from sg_jax import objectives
from sg_jax import terms as terms_lib
from sg_jax.config import per_seed
from sg_jax.data.packing import pack_lines
from sg_jax.models import transformer as model_lib
from sg_jax.models.model_config import ModelConfig
from sg_jax.optim.adamw import PerSeedAdamW, make_optimizer, make_per_seed_optimizer
from sg_jax.optim.options import OptimOptions
from sg_jax.runtime import sharding
from sg_jax.training.sampling import line_sampler
from sg_jax.training.state import DROPOUT_KEY, OBJECTIVE_KEY, TrainState, init_state, subkey

Array = jax.Array


def model_inputs(objective: objectives.Objective, data: dict, idx_B: Array,
                 capacity: int | None, key_data: Array, step: Array
                 ) -> tuple[Array, Array, dict]:
  """(inputs, targets, model keyword arguments) of one seed's step on the lines `idx_B`.

  The objective turns the stored lines into its inputs and targets (`Objective.lines`, with the
  seed's OBJECTIVE_KEY folded with `step`); with `capacity` they are then packed into one row
  of that many token positions (`pack_lines`; the keyword arguments describe the row), else they
  stay a padded batch [batch, length] (no keyword arguments).

  Args:
    data: {'inputs', 'targets': int32 [num_lines, length], 'lengths': int32 [num_lines]}.
    idx_B: int32 [batch] line indices.
    capacity: static packed-row length, or None (padded).
    key_data: the seed's uint32 [2] key data.
  """
  key = jax.random.fold_in(subkey(key_data, OBJECTIVE_KEY), step)
  lengths = data["lengths"][idx_B]
  inputs, targets = objective.lines(data["inputs"][idx_B], data["targets"][idx_B], lengths, key)
  if capacity is None:
    return inputs, targets, {}
  rows = pack_lines(inputs, targets, lengths, jnp.arange(idx_B.shape[0]), capacity)
  return rows.pop("inputs"), rows.pop("targets"), rows


def total_loss(params, model: model_lib.TransformerLM, objective: objectives.Objective,
               terms: tuple, lams_T: tuple, inputs_BxL: Array, targets_BxL: Array,
               dropout_key: Array | None, data: dict | None = None, idx_B: Array | None = None,
               hp: dict | None = None, **model_kwargs) -> tuple[Array, tuple[Array, tuple, dict]]:
  """(objective loss + sum_t lams_T[t] * penalty_t, (objective loss, (penalty_t, ...),
  {objective metric: value})) of one seed's batch (float32 scalars; the metrics are the
  objective's `metric_names`, e.g. a masked LM's `masked_accuracy`).

  Args:
    terms: the active loss terms (`terms.active`), static; () = the objective alone, and the
      model then runs without sowing anything.
    lams_T: each term's lambda for this seed and step (float32 [] each).
    dropout_key: this step's dropout key, or None (deterministic).
    data, idx_B: the training data and the step's lines, for the terms' per-line arrays.
    hp: this seed's hyperparameters as data ({name: []}, `per_seed.hparam_arrays`), or None
      (the model's compiled dropout rate, no label smoothing). With `hp`, dropout (when the
      model has it: some seed's rate > 0) uses 'dropout_scale' / 'dropout_threshold' when
      present (the seeds have different rates), and
      'label_smoothing' (when present: some seed's is > 0) adds e x (uniform cross-entropy -
      cross-entropy) to the minimised loss (`objectives.smoothing_gap`); the returned
      objective loss stays the plain one.
    model_kwargs: describe packed rows (`pack_lines`).
  """
  if hp is not None and "dropout_scale" in hp and dropout_key is not None \
      and model.config.dropout > 0:
    model = models.build(dataclasses.replace(
        model.config, dropout_keep=(hp["dropout_scale"], hp["dropout_threshold"])))
  mutable = [model_lib.INTERMEDIATES] if any(t.needs_intermediates for t in terms) else False
  out = model.apply({"params": params}, inputs_BxL, deterministic=dropout_key is None,
                    rngs=None if dropout_key is None else {"dropout": dropout_key},
                    mutable=mutable, **model_kwargs)
  logits, sown = (out[0], out[1][model_lib.INTERMEDIATES]) if mutable else (out, None)
  loss = objective.loss(logits, targets_BxL)
  total, penalties = loss, []
  if hp is not None and "label_smoothing" in hp:
    total = total + hp["label_smoothing"] * objectives.smoothing_gap(logits, targets_BxL)
  for term, lam in zip(terms, lams_T):
    pen = term.penalty(params, sown, data, idx_B, model.config)
    total = total + lam * pen
    penalties.append(pen)
  metrics = jax.lax.stop_gradient(objective.metrics(logits, targets_BxL))
  return total, (loss, tuple(penalties), metrics)


def loss_and_grads(params, key_data: Array, data: dict, idx_B: Array, step: Array,
                   model: model_lib.TransformerLM, objective: objectives.Objective,
                   terms: tuple = (), lams_T: tuple = (), capacity: int | None = None,
                   hp: dict | None = None) -> tuple[tuple[Array, tuple, dict], Any]:
  """((objective loss [], (penalty_t [], ...), {objective metric: []}), gradients like `params`)
  of one seed's step on
  the lines `idx_B` of `data`, with that step's dropout masks: the one training body's loss
  (`model_inputs`, then `total_loss`). `key_data` is the seed's uint32 [2] key data; `hp` its
  hyperparameters as data (`total_loss`)."""
  inputs, targets, model_kwargs = model_inputs(objective, data, idx_B, capacity, key_data, step)
  dropout_key = jax.random.fold_in(subkey(key_data, DROPOUT_KEY), step)
  (_, aux), grads = jax.value_and_grad(total_loss, has_aux=True)(
      params, model, objective, terms, lams_T, inputs, targets, dropout_key, data, idx_B, hp,
      **model_kwargs)
  return aux, grads


def apply_gradients(state: TrainState, loss: Array, grads, step: Array,
                    tx, penalties: dict | None = None, hp: dict | None = None) -> TrainState:
  """The optimiser update of one seed from `loss_and_grads`; a non-finite loss/gradient freezes
  its parameters for good (marks the seed diverged; see `TrainState.diverged`).

  `penalties` ({sums key: float32 []}, the loss terms' penalties) are added to their running
  sums; `loss` is the objective's loss (`train/loss`). `tx` is a `PerSeedAdamW` (then `hp`:
  this seed's hyperparameters, None = the configured first seed's) or an optax transformation.
  """
  grad_norm = optax.tree.norm(grads)
  if isinstance(tx, PerSeedAdamW):
    updates, opt_state = tx.update(grads, state.opt_state, state.params, hp)
  else:
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  ok = finite & ~state.diverged
  # Only the parameters are guarded. Selecting the old optimiser state as well made XLA copy the
  # AdamW moments every step (the parameter update re-reads the old moments after the guarded
  # ones overwrite them in place): ~10% of a depth-2 step (docs/performance.md).
  params = jax.tree_util.tree_map(lambda new, old: jnp.where(ok, new, old),
                                  optax.apply_updates(state.params, updates), state.params)
  sums = {**state.sums, "loss": state.sums["loss"] + loss,
          "grad_norm": state.sums["grad_norm"] + grad_norm, "steps": state.sums["steps"] + 1.0}
  for name, value in (penalties or {}).items():
    sums[name] = state.sums[name] + value
  return state.replace(
      step=state.step + 1, params=params, opt_state=opt_state,
      diverged=state.diverged | ~finite,
      diverged_step=jnp.where(state.diverged | finite, state.diverged_step, step),
      sums=sums)


def make_chunk_fn(model: model_lib.TransformerLM, tx,
                  batch_size: int, capacities: tuple[int, ...] | None,
                  pool_sizes: tuple[int, ...] | None = None, sharded: bool = False,
                  objective: objectives.Objective | None = None, terms: tuple = (),
                  label_smoothing: bool = False, dropout_as_data: bool = False,
                  hparams: dict | None = None) -> Callable:
  """`chunk(state [S], data, start_step, num_steps) -> state`: `num_steps` steps of every seed.

  The one training body of sg_jax: the per-seed functions (`epoch_permutation`,
  `batch_indices`, `loss_and_grads`, `apply_gradients`) get the seed axis here, with
  `jax.vmap`; the step loop is a `lax.scan` outside the vmap, so the epoch-boundary `cond` and
  the packing bucket `switch` are real branches (not selects). What a study changes in training
  is a value handed in: the `objective` (default `lm`) and the loss `terms` added to it.

  Args of `chunk`:
    state: stacked TrainState [S, ...].
    data: {'inputs', 'targets': int32 [num_lines, length], 'lengths': int32 [num_lines]} on
      device, shared by all seeds; with per-seed composition also 'pools' and 'pool_sizes'
      (`line_sampler`; `pool_sizes` then lists their distinct values); with loss terms also
      their per-line arrays and per-seed '<name>_lambda', '<name>_start', '<name>_end'
      (`terms.train_arrays`); and 'hparams', the per-seed hyperparameters {name: [S_total]}
      (`per_seed.hparam_arrays`; without it, `tx.defaults`, compiled in).
    start_step: int32 [] global step of the first step.
    num_steps: static.

  With `terms`, each seed's gradient is that of the objective's loss plus each term's lambda
  (at this step, `terms.lambdas_at`) times its penalty; `train/loss` stays the objective's
  loss, `sums['<name>_loss']` adds each penalty and `sums[<metric>]` each of the objective's
  `metric_names`.

  Per-seed hyperparameters (`per_seed.hparam_arrays`) come from data['hparams'], else from
  `hparams` (the config's, compiled in). With a `PerSeedAdamW` as `tx` the optimiser's
  (learning rate, warm-up, Adam's b1 / b2 / eps, weight decay, clipping) are read there, with
  `dropout_as_data` the dropout rate, with `label_smoothing` (some seed's is > 0) the label
  smoothing, so the compiled chunk serves any values of them (docs/usage.md "Per-seed
  hyperparameters and split seeds").
  """
  objective = objective or objectives.from_config({})

  def local_hparams(data, num_local):
    if "hparams" not in data and hparams is None:
      return None
    hp = dict(data["hparams"] if "hparams" in data else
              {name: jnp.asarray(value) for name, value in hparams.items()})
    if not label_smoothing:
      hp.pop("label_smoothing", None)
    if not dropout_as_data:
      hp.pop("dropout_scale", None)
      hp.pop("dropout_threshold", None)
    hp.pop("init_scale", None)
    first = next(iter(hp.values()))
    if first.shape[0] != num_local and sharded:  # the device's block (`terms.lambdas_at`)
      idx = jax.lax.axis_index(sharding.SEED_AXIS) * num_local + jnp.arange(num_local)
      hp = {name: value[idx] for name, value in hp.items()}
    elif first.shape[0] != num_local:
      # The config's values for a state of another number of seeds (a caller training its own
      # group of seeds): only one value per field can serve them.
      if "hparams" in data or any(len(set(np.asarray(v).tolist())) > 1
                                  for v in hparams.values()):
        raise ValueError(f"the per-seed hyperparameters hold {first.shape[0]} seeds' values "
                         f"for a state of {num_local} seeds")
      hp = {name: jnp.broadcast_to(value[0], (num_local,)) for name, value in hp.items()}
    return hp

  def chunk(state, data, start_step, num_steps):
    perms, sample = line_sampler(data, state.key, batch_size, pool_sizes, sharded)
    hp = local_hparams(data, state.step.shape[0])

    # Only the gradients depend on the layout; the optimiser update runs outside the bucket
    # `switch`, whose branches then read the parameters and return fresh buffers (an update
    # inside the branches made XLA copy parameters and both moments every step).
    def grads_of(capacity):
      def run(params, keys, idx_SxB, lams_TxS, step):
        def one(p, k, idx, lams, h):
          return loss_and_grads(p, k, data, idx, step, model, objective, terms, lams, capacity,
                                h)
        return jax.vmap(one)(params, keys, idx_SxB, lams_TxS, hp)
      return run

    def body(carry, t):
      state, perm = carry
      step = start_step + t
      perm, idx = sample(perm, step)
      lams = tuple(terms_lib.lambdas_at(data, term, state.step.shape[0], step) for term in terms)
      if capacities is None:
        (loss, pens, metrics), grads = grads_of(None)(state.params, state.key, idx, lams, step)
      else:
        need = jnp.max(jnp.sum(data["lengths"][idx], axis=-1))
        bucket = jnp.searchsorted(jnp.asarray(capacities), need)
        (loss, pens, metrics), grads = jax.lax.switch(
            bucket, [grads_of(c) for c in capacities], state.params, state.key, idx, lams, step)
      named = {terms_lib.sum_name(term): pen for term, pen in zip(terms, pens)} | metrics
      state = jax.vmap(lambda s, l, g, p, h: apply_gradients(s, l, g, step, tx, p, h))(
          state, loss, grads, named, hp)
      return (state, perm), None

    (state, _), _ = jax.lax.scan(body, (state, perms(start_step)),
                                 jnp.arange(num_steps, dtype=jnp.int32))
    return state

  return chunk


@dataclasses.dataclass
class TrainFns:
  """The compiled, seed-vmapped functions of a run."""

  # (key_data [S, 2], init key data [S, 2] or None, init scales float32 [S] or None)
  #   -> TrainState [S, ...] (`init_state`)
  init: Callable
  chunk: Callable  # (state, data, start_step, num_steps) -> state
  model: model_lib.TransformerLM
  tx: Any  # PerSeedAdamW (`per_seed.as_data`) or optax's chain (`make_optimizer`)
  capacities: tuple[int, ...] | None  # packed-row buckets (None = padded batches)
  objective: objectives.Objective
  terms: tuple  # the active loss terms (`terms.active`)


@dataclasses.dataclass(frozen=True)
class StepOptions:
  """What the training step of a run is built from (`make_train_fns`), built once at the top of
  the loop (`from_config`). Equal options give the same compiled functions: they are the
  functions' cache key, so a value read inside the step is one of these fields, and two runs
  differing in anything else (the evaluation schedule, the step count when the schedule's end
  is set, the data seed) share their functions.

  Attributes:
    objective: the run's objective (`objectives.from_config`).
    model: the model's hyper-parameters (`objectives.model_config_from_config`: vocabulary
      rows, attention and model name included).
    optimizer: clipping, AdamW and the learning-rate schedule (`optim.OptimOptions`).
    terms: the active loss terms (`terms.active`; () = none).
    batch_size: training lines per seed and step.
    hparams_as_data: the optimiser's hyperparameters and the dropout rate are data of the
      programs (`per_seed.as_data`: `PerSeedAdamW`), not constants.
    label_smoothing: some seed's label smoothing is > 0 (`per_seed.switches`).
    hparams: {name: array [S]} the per-seed hyperparameters (`per_seed.hparam_arrays`): the
      values a call uses when its data carries no 'hparams' (compared by value).
  """

  objective: objectives.Objective
  model: ModelConfig
  optimizer: OptimOptions
  terms: tuple
  batch_size: int
  hparams_as_data: bool
  label_smoothing: bool
  hparams: dict = dataclasses.field(compare=False)

  @classmethod
  def from_config(cls, config, vocab_size: int) -> "StepOptions":
    """The step options of a run config whose task vocabulary has `vocab_size` entries.

    Raises:
      ValueError: a bad objective, model, optimiser or loss-term field (one line naming it).
    """
    return cls(objective=objectives.from_config(config),
               model=objectives.model_config_from_config(config, vocab_size),
               optimizer=OptimOptions.from_config(config), terms=terms_lib.active(config),
               batch_size=int(config.train.batch_size),
               hparams_as_data=per_seed.as_data(config),
               label_smoothing=per_seed.switches(config)["train.label_smoothing"],
               hparams=per_seed.hparam_arrays(config))

  def cache_key(self) -> tuple:
    """The options with `hparams` by value (name, dtype and bytes of each array)."""
    return (self, tuple((name, value.dtype.str, value.tobytes())
                        for name, value in sorted(self.hparams.items())))


_TRAIN_FNS_CACHE: dict = {}


def make_train_fns(options: StepOptions, capacities: tuple[int, ...] | None = None,
                   mesh: jax.sharding.Mesh | None = None,
                   pool_sizes: tuple[int, ...] | None = None) -> TrainFns:
  """Builds the model, the optimiser and the jitted functions vmapped over the seed axis.

  Args:
    options: the run's step options (`StepOptions.from_config`).
    capacities: packed-row buckets from `packing_capacities` (None = padded batches).
    pool_sizes: the distinct per-seed pool sizes of a run with per-seed data composition
      (`input_pipeline.make_train_data`; the data then holds 'pools'); None: every seed draws
      from all lines.
    mesh: the seed mesh (`sharding.seed_mesh`) or None. With a mesh, `chunk` runs under
      `jax.shard_map`: each device trains its own seeds with no communication at all, so each
      device also picks its own packing bucket (from its seeds only: less padding) and devices
      never wait for one another inside a call. The state must then be sharded over the mesh
      (`sharding.seed_sharding`) and the data replicated.

  Cached on the options (`StepOptions.cache_key`) and the other arguments, so repeated runs in
  one process (tests, sweeps, notebooks) reuse the compiled functions, and a value read inside
  the step, being a field of the options, can never reuse functions compiled for another value
  of it. The per-seed hyperparameters (`per_seed.HPARAM_FIELDS`) are data of the programs
  (data['hparams']) when `hparams_as_data`: the functions of other values of them trace to the
  same programs, which JAX's persistent compilation cache then serves (`compile_cache`).
  """
  cache_key = (options.cache_key(), capacities, mesh, pool_sizes)
  if cache_key not in _TRAIN_FNS_CACHE:
    objective, terms, as_data = options.objective, options.terms, options.hparams_as_data
    model = models.build(options.model)
    tx = (make_per_seed_optimizer(options.optimizer, options.hparams) if as_data
          else make_optimizer(options.optimizer))
    sums = tuple(terms_lib.sum_name(term) for term in terms) + objective.metric_names

    def init_all(keys, init_keys=None, init_scales=None):
      return jax.vmap(lambda k, ik, sc: init_state(k, model, tx, sums, ik, sc))(
          keys, init_keys, init_scales)

    init = jax.jit(init_all)
    chunk_fn = make_chunk_fn(model, tx, options.batch_size, capacities, pool_sizes,
                             sharded=mesh is not None, objective=objective, terms=terms,
                             label_smoothing=options.label_smoothing, dropout_as_data=as_data,
                             hparams=options.hparams)
    if mesh is not None:
      chunk_fn = sharding.per_device(chunk_fn, mesh, static_argnums=(3,))
    chunk = jax.jit(chunk_fn, static_argnums=(3,), donate_argnums=(0,))
    _TRAIN_FNS_CACHE[cache_key] = TrainFns(init=init, chunk=chunk, model=model, tx=tx,
                                           capacities=capacities, objective=objective,
                                           terms=terms)
  return _TRAIN_FNS_CACHE[cache_key]


def train_fns_from_config(config, vocab_size: int, capacities: tuple[int, ...] | None = None,
                          mesh: jax.sharding.Mesh | None = None,
                          pool_sizes: tuple[int, ...] | None = None) -> TrainFns:
  """`make_train_fns` of a run config (`StepOptions.from_config(config, vocab_size)`), for
  callers holding a config: tests, benchmarks, notebooks."""
  return make_train_fns(StepOptions.from_config(config, vocab_size), capacities, mesh,
                        pool_sizes)
