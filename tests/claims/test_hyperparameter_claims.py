"""`sg_jax.claims.hyperparameters`: the weight-decay and initialisation-vs-data-order claims on
hand-made runs whose answer is known."""

import numpy as np

from sg_jax import claims
from sg_jax.report.reading import Run

STEPS = np.arange(0, 11000, 1000)


def _run(finals, config, crossing=None):
  """A run whose seed s ends at finals[s] (without `crossing`: 0.1, then finals[s] at the last
  step); with `crossing`, generalisation is 0.1 until crossing[s], then finals[s] (None: 0.1
  throughout)."""
  series = {"in_domain/accuracy": {}, "out_of_domain/accuracy": {}}
  for s, f in enumerate(finals):
    series["in_domain/accuracy"][s] = (STEPS, np.minimum(1.0, STEPS / 2000))
    at = None if crossing is None else crossing[s]
    gen = np.where(STEPS >= (at if at is not None else 10 ** 9), f, 0.1)
    gen[-1] = f if crossing is None else gen[-1]
    series["out_of_domain/accuracy"][s] = (STEPS, gen)
  cfg = {"task": "question", "objective": "lm", "num_seeds": len(finals),
         "model": {"num_layers": 4}, **config}
  return Run(workdir="", name="run", depth=4, task="question", num_steps=10000, series=series,
             config=cfg)


def _row(claim_id, runs):
  row, = claims.evaluate(runs, ids=[claim_id])
  return row


def test_weight_decay_reliable_follows_the_trend():
  wd = [0.0] * 4 + [0.1] * 4 + [0.3] * 4 + [1.0] * 4
  rng = np.random.default_rng(0)
  rising = np.repeat([0.2, 0.4, 0.6, 0.9], 4) + rng.normal(0, 0.02, 16)
  config = {"optim": {"weight_decay": wd}}
  assert _row("grokking.weight_decay_reliable", [_run(rising, config)])["verdict"] == \
      claims.SUPPORTED
  assert _row("grokking.weight_decay_reliable", [_run(rising[::-1], config)])["verdict"] == \
      claims.CONTRADICTED
  flat = 0.5 + rng.normal(0, 0.2, 16)
  row = _row("grokking.weight_decay_reliable", [_run(flat, config)])
  assert row["verdict"] == claims.NOT_TESTABLE and row["seeds per arm"] == "4 / 4 / 4 / 4"
  assert _row("grokking.weight_decay_reliable", [_run(flat, {})])["verdict"] == claims.NO_RUNS


def test_weight_decay_earlier_by_log_rank():
  """Largest weight decay: every seed crosses 0.8 at step 2000; none of the unregularised seeds
  ever does (censored at 10000): the hazard ratio favours the largest value."""
  wd = [0.0] * 8 + [1.0] * 8
  finals = [0.3] * 8 + [0.95] * 8
  crossing = [None] * 8 + [2000] * 8
  row = _row("grokking.weight_decay_earlier",
             [_run(finals, {"optim": {"weight_decay": wd}}, crossing)])
  assert row["verdict"] == claims.SUPPORTED, row
  assert "0/8 at 0" in row["note"] and "8/8 at 1" in row["note"]
  reverse = _row("grokking.weight_decay_earlier",
                 [_run(finals[::-1], {"optim": {"weight_decay": wd}}, crossing[::-1])])
  assert reverse["verdict"] == claims.CONTRADICTED


def test_init_or_data_order_decides():
  """4 x 4 seeds: the final value is set by the initialisation (plus small noise): the init
  claim is supported, the data-order claim not testable (no effect found), and the note gives
  the shares."""
  init = np.repeat(np.arange(4), 4)
  data = np.tile(np.arange(4), 4)
  finals = np.array([0.2, 0.9, 0.3, 0.8])[init] + np.random.default_rng(1).normal(0, 0.02, 16)
  config = {"seeds": {"init": list(init), "data": list(data)}}
  run = _run(finals, config)
  init_row = _row("grokking.init_seed_decides", [run])
  data_row = _row("grokking.data_seed_decides", [run])
  assert init_row["verdict"] == claims.SUPPORTED
  assert data_row["verdict"] == claims.NOT_TESTABLE
  assert float(init_row["statistic"]) > 0.95  # init's share of the variance
  assert "seeds.init 1.00, seeds.data 0.00" in init_row["note"]
  swapped = _run(finals, {"seeds": {"init": list(data), "data": list(init)}})
  assert _row("grokking.data_seed_decides", [swapped])["verdict"] == claims.SUPPORTED
  assert _row("grokking.init_seed_decides", [_run(finals, {})])["verdict"] == claims.NO_RUNS


def test_unbalanced_crossing_is_not_testable_with_the_reason():
  init = [0, 0, 1, 1, 1]
  data = [0, 1, 0, 1, 1]
  row = _row("grokking.init_seed_decides",
             [_run([0.1, 0.2, 0.3, 0.4, 0.5], {"seeds": {"init": init, "data": data}})])
  assert row["verdict"] == claims.NOT_TESTABLE and "balanced" in row["note"]
