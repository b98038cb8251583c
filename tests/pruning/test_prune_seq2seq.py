"""Pruning and the heuristic core of an encoder-decoder (`objective=seq2seq`; issue 51 item 4):
the gates' rows (encoder self-attention, decoder self-attention, cross-attention, MLP blocks),
all-ones gates against the unpruned model, one zeroed gate against the model with that unit's
output weights zeroed, the means over the positions each unit serves (a naive loop), a seed's
runs pruned in a group against the seed pruned alone, and `prune` + `prune_core` end to end on
a `tiny` seq2seq run."""

from __future__ import annotations

import csv
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sg_jax import models
from sg_jax import train
from sg_jax.models import interventions
from sg_jax.models.model_config import ModelConfig
from sg_jax.pruning import core, core_driver, driver, means as means_lib, objective, run
from sg_jax.pruning import table

VOCAB, SOS, QUEST, LAYERS, HEADS = 16, 15, 9, 2, 2
# Hand-built lines `SOS w.. QUEST o..`: the input part ends at QUEST (position 3, 2, 4), the
# output part starts there; 0 is padding.
LINES = np.asarray([[SOS, 3, 4, QUEST, 5, 6, 0, 0],
                    [SOS, 1, QUEST, 2, 7, 8, 4, 0],
                    [SOS, 6, 5, 2, QUEST, 3, 0, 0]], np.int32)
TASK_POS = (3, 2, 4)
LENGTHS = (6, 7, 6)


@functools.lru_cache(maxsize=None)
def _config(layers: int = LAYERS) -> ModelConfig:
  return ModelConfig(vocab_size=VOCAB, num_layers=layers, d_model=16, num_heads=HEADS, d_ff=32,
                     max_len=32, dropout=0.0, attention="prefix", prefix_end_ids=(QUEST,),
                     name="encoder_decoder", layer_impl="plain")


@functools.lru_cache(maxsize=None)
def _params(seed: int = 0, layers: int = LAYERS):
  return jax.jit(functools.partial(models.init_params, _config(layers)))(jax.random.key(seed))


@functools.partial(jax.jit, static_argnames="layers")
def _unit_means(params, batches, layers=LAYERS):
  return means_lib.unit_means(params, batches, config=_config(layers))


@jax.jit
def _apply(params, head_mask=None, mlp_mask=None, head_means=None, mlp_means=None):
  return models.build(_config()).apply(
      {"params": params}, jnp.asarray(LINES), head_mask=head_mask, mlp_mask=mlp_mask,
      head_means=head_means, mlp_means=mlp_means)


def _output_part() -> np.ndarray:
  """bool [3, L]: the positions whose logits the seq2seq loss reads (task token .. last)."""
  at = np.arange(LINES.shape[1])[None]
  return (at >= np.asarray(TASK_POS)[:, None]) & (at < np.asarray(LENGTHS)[:, None] - 1)


def test_the_gates_rows_names_shapes_and_parameter_counts():
  config = _config()
  heads, mlp = objective.unit_rows(config)
  assert heads == ["enc_l0", "enc_l1", "dec_l0", "dec_l1", "cross_l0", "cross_l1"]
  assert mlp == ["enc_l0", "enc_l1", "dec_l0", "dec_l1"]
  assert objective.unit_shapes(config) == ((6, HEADS), (4,))
  names = core.unit_names(6, HEADS, 4)
  assert names[:3] == ["enc_l0_h0", "enc_l0_h1", "enc_l1_h0"]
  assert names[8:10] == ["cross_l0_h0", "cross_l0_h1"] and names[-1] == "dec_l1_mlp"
  assert len(names) == 6 * HEADS + 4
  # the LM's names are as before
  assert core.unit_names(2, 2) == ["l0_h0", "l0_h1", "l1_h0", "l1_h1", "l0_mlp", "l1_mlp"]
  head_params, mlp_params = objective.unit_param_counts(config)
  assert head_params.shape == (6, HEADS) and (head_params == 4 * 16 * 8).all()
  assert mlp_params.shape == (4,) and (mlp_params == 2 * 16 * 32 + 32 + 16).all()
  with pytest.raises(ValueError, match="no model has 5 head-mask rows and 3 MLP-mask rows"):
    core.unit_names(5, HEADS, 3)
  with pytest.raises(ValueError, match=r"head_mask must have shape \[6 head rows, num_heads\]"):
    _apply(_params(), head_mask=jnp.ones((LAYERS, HEADS)))
  with pytest.raises(ValueError, match=r"mlp_mask must have shape \[4 MLP rows\]"):
    _apply(_params(), head_mask=jnp.ones((6, HEADS)), mlp_mask=jnp.ones((LAYERS,)))
  assert run.pruning_model_config(config) is config  # no refusal; "plain" kept


def test_all_ones_gates_equal_the_unpruned_model():
  """Zero ablation with every gate 1 is the same computation (x * 1); mean ablation
  (x - mu) * 1 + mu equals it up to rounding, and so does the seq2seq loss."""
  params = _params()
  full = _apply(params)
  ones = dict(head_mask=jnp.ones((6, HEADS)), mlp_mask=jnp.ones((4,)))
  np.testing.assert_array_equal(_apply(params, **ones), full)
  head_means, mlp_means = _unit_means(params, jnp.asarray(LINES)[None])
  mean = _apply(params, head_means=head_means, mlp_means=mlp_means, **ones)
  np.testing.assert_allclose(mean, full, atol=2e-5)
  targets = np.where(_output_part(), np.roll(LINES, -1, 1), 0)
  np.testing.assert_allclose(objective.lm_loss(mean, targets), objective.lm_loss(full, targets),
                             atol=1e-5)


@pytest.mark.parametrize("row,path", [(1, ("layer_1", "attention")),
                                      (2, ("decoder_layer_0", "attention")),
                                      (5, ("decoder_layer_1", "cross_attention"))])
def test_a_zeroed_head_equals_the_model_without_its_output_projection_rows(row, path):
  """Head 1 of row `row` (enc_l1, dec_l0, cross_l1) zero-ablated = the unpruned model whose
  merge projection drops that head's rows (`out` kernel [H, P, D][1] = 0); and it changes the
  logits the loss reads."""
  params = _params()
  head_mask = np.ones((6, HEADS), np.float32)
  head_mask[row, 1] = 0.0
  pruned = _apply(params, head_mask=jnp.asarray(head_mask), mlp_mask=jnp.ones((4,)))
  cut = jax.tree_util.tree_map(np.array, params)
  block = cut
  for key in path:
    block = block[key]
  block["out"]["kernel"][1] = 0.0
  np.testing.assert_allclose(pruned, _apply(cut), atol=1e-5)
  full = _apply(params)
  assert np.abs(np.asarray(pruned - full))[_output_part()].max() > 1e-3


def test_a_zeroed_decoder_mlp_equals_the_model_without_its_second_layer():
  params = _params()
  mlp_mask = np.ones((4,), np.float32)
  mlp_mask[3] = 0.0  # dec_l1
  pruned = _apply(params, head_mask=jnp.ones((6, HEADS)), mlp_mask=jnp.asarray(mlp_mask))
  cut = jax.tree_util.tree_map(np.array, params)
  cut["decoder_layer_1"]["linear2"]["kernel"][:] = 0.0
  cut["decoder_layer_1"]["linear2"]["bias"][:] = 0.0
  np.testing.assert_allclose(pruned, _apply(cut), atol=1e-5)


def test_means_average_each_unit_over_the_positions_it_serves():
  """`unit_means` against a loop over lines and positions of the sown outputs: the encoder's
  units over each line's input part (SOS .. QUEST), the decoder's over its output part (QUEST
  .. last token), one batch or three give the same."""
  params = _params()
  _, sown = jax.jit(functools.partial(models.build(_config()).apply,
                                      mutable=["intermediates"]))({"params": params},
                                                                  jnp.asarray(LINES))
  sown = jax.tree_util.tree_map(np.asarray, sown["intermediates"])
  sites = ([sown[f"layer_{i}"]["attention"]["heads"][0] for i in range(LAYERS)]
           + [sown[f"decoder_layer_{i}"]["attention"]["heads"][0] for i in range(LAYERS)]
           + [sown[f"decoder_layer_{i}"]["cross_attention"]["heads"][0] for i in range(LAYERS)])
  mlps = ([sown[f"layer_{i}"]["mlp"][0] for i in range(LAYERS)]
          + [sown[f"decoder_layer_{i}"]["mlp"][0] for i in range(LAYERS)])

  def naive(outputs, encoder):
    total, count = 0.0, 0
    for b, (task, length) in enumerate(zip(TASK_POS, LENGTHS)):
      for pos in (range(task + 1) if encoder else range(task, length)):
        total, count = total + outputs[b, pos].astype(np.float64), count + 1
    return total / count

  want_heads = np.stack([naive(o, r < LAYERS) for r, o in enumerate(sites)])
  want_mlp = np.stack([naive(o, r < LAYERS) for r, o in enumerate(mlps)])
  for batches in (jnp.asarray(LINES)[None], jnp.asarray(LINES)[:, None]):
    heads, mlp = _unit_means(params, batches)
    np.testing.assert_allclose(heads, want_heads, atol=1e-5)
    np.testing.assert_allclose(mlp, want_mlp, atol=1e-5)


@pytest.mark.slow
def test_a_seed_pruned_in_a_group_equals_the_seed_pruned_alone():
  """2 training seeds x 2 runs in one program (`train_runs`) against each run alone
  (`train_alone`), one layer each (3 head rows, 2 MLP rows): log_alpha, multipliers and
  per-step objectives within 1e-5."""
  config = _config(1)
  params = [_params(s, 1) for s in (1, 2)]
  params_s = jax.tree_util.tree_map(lambda *a: jnp.stack(a), *params)
  targets = np.where(_output_part(), np.roll(LINES, -1, 1), 0).astype(np.int32)
  data = {"inputs": jnp.asarray(LINES)[None], "targets": jnp.asarray(targets)[None]}
  means = [_unit_means(p, data["inputs"], layers=1) for p in params]
  means_s = tuple(jnp.stack(m) for m in zip(*means))
  grid = [(0.3, 0), (0.6, 1)]
  steps = 6
  settings = run.Settings(num_steps=steps, sparsity_warmup_steps=4, lr_warmup_steps=2)
  keys = jnp.stack([jnp.stack([run.run_key(s, lv, ps) for lv, ps in grid]) for s in (1, 2)])
  levels = jnp.asarray([[lv for lv, _ in grid]] * 2, jnp.float32)
  states, metrics = run.train_runs(run.init_runs(keys, config, settings), params_s, means_s,
                                   levels, data, num_steps=steps, config=config,
                                   settings=settings)
  assert states.log_alpha["heads"].shape == (2, 2, 3, HEADS)
  assert states.log_alpha["mlp"].shape == (2, 2, 2)
  for i in range(2):
    for k, (lv, _) in enumerate(grid):
      alone, alone_metrics = run.train_alone_jit(
          run.init_run(keys[i, k], config, settings), params[i], means[i], jnp.float32(lv),
          data, num_steps=steps, config=config, settings=settings)
      for got, want in ((states.log_alpha["heads"][i, k], alone.log_alpha["heads"]),
                        (states.log_alpha["mlp"][i, k], alone.log_alpha["mlp"]),
                        (states.lambdas[i, k], alone.lambdas)):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
      np.testing.assert_allclose(metrics["objective"][:, i, k], alone_metrics["objective"],
                                 atol=1e-5, rtol=1e-5)
  assert float(np.abs(metrics["objective"][-1]).max()) > 0.0  # the gates moved the model


def _read_csv(path):
  with open(path, newline="", encoding="utf-8") as f:
    return list(csv.DictReader(f))


@pytest.mark.slow
def test_prune_and_prune_core_on_a_tiny_seq2seq_run(tiny_config, tmp_path):
  """Train `tiny` with objective=seq2seq for 20 steps, prune its last checkpoint (2 pruning
  seeds), then the core analyses: the masks have the encoder-decoder's rows and the core table
  names its units."""
  workdir = str(tmp_path / "run")
  config = tiny_config(objective="seq2seq", **{"train.num_steps": 20, "checkpoint.every": 20,
                                               "eval.every": 20, "eval.max_lines": 16})
  train.train_and_evaluate(config, workdir, tensorboard=False)
  summary = driver.prune(workdir, sparsities=[0.5], pruning_seeds=2, num_steps=8,
                         sparsity_warmup_steps=4, lr_warmup_steps=2, num_lines=16,
                         batch_size=8, eval_lines=8, steps_per_call=8)
  assert summary["runs"]
  masks = table.load_masks(workdir, 20)
  num_seeds = config.num_seeds
  assert masks["head_mask"].shape == (num_seeds * 2, 3, 2)  # enc_l0, dec_l0, cross_l0 x 2 heads
  assert masks["mlp_mask"].shape == (num_seeds * 2, 2)  # enc_l0, dec_l0
  rows = _read_csv(os.path.join(workdir, "pruning.csv"))
  assert {r["seed"] for r in rows} == {str(s) for s in range(num_seeds)}
  core_driver.prune_core(workdir, num_draws=2, eval_lines=8)
  names = {r["name"] for r in _read_csv(os.path.join(workdir, "pruning_core.csv"))}
  assert {"inclusion/enc_l0_h1", "inclusion/dec_l0_h0", "in_core/cross_l0_h1",
          "in_core/dec_l0_mlp", "core/num_heads"} <= names
  assert interventions.rows_of_shape(3, 2)[0] == ["enc_l0", "dec_l0", "cross_l0"]
