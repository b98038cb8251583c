"""Hand-made workdirs for the tests of `sg_jax.results` and `sg_jax.claims`: the files a
`tiny`-sized run leaves (metrics.csv, analysis.csv and its options, config.json, vocab.json,
pruning tables and masks, a checkpoint), written directly with the project's table writers so
that every value is known."""

from __future__ import annotations

import json
import os

import numpy as np

from sg_jax.pruning import core_table
from sg_jax.pruning import table as pruning_table
from sg_jax.records import long_csv

STEPS = np.arange(0, 1100, 100)  # 11 evaluations, as the tiny preset's dense runs log


def curves(num_seeds: int, finals, sat_gen: float = 0.1, saturate_at: int = 200):
  """{name: {seed: (steps, values)}}: in-domain accuracy reaching 1 at `saturate_at`,
  generalisation from `sat_gen` at saturation rising linearly to `finals[seed]` at the end,
  a training loss that falls, and a construction metric with one NaN."""
  out = {"in_domain/accuracy": {}, "out_of_domain/accuracy": {}, "train/loss": {},
         "out_of_domain/accuracy/RC-obj": {}}
  for s in range(num_seeds):
    ind = np.minimum(1.0, STEPS / saturate_at)
    after = np.clip((STEPS - saturate_at) / (STEPS[-1] - saturate_at), 0, 1)
    gen = np.where(STEPS < saturate_at, sat_gen * STEPS / saturate_at,
                   sat_gen + (finals[s] - sat_gen) * after)
    out["in_domain/accuracy"][s] = (STEPS, ind)
    out["out_of_domain/accuracy"][s] = (STEPS, gen)
    out["train/loss"][s] = (STEPS, 3.0 * np.exp(-STEPS / 300.0) + 0.1 * s)
    construction = gen.copy()
    construction[3] = np.nan
    out["out_of_domain/accuracy/RC-obj"][s] = (STEPS, construction)
  return out


def write_series(path: str, series) -> None:
  """Writes {name: {seed: (steps, values)}} as a long `step,seed,name,value` table."""
  table = long_csv.LongCsv(path)
  rows = [(int(step), seed, name, float(v)) for name, by_seed in sorted(series.items())
          for seed, (steps, values) in sorted(by_seed.items()) for step, v in zip(steps, values)]
  rows.sort(key=lambda r: (r[0], r[1], r[2]))
  table.append(rows)


def make_workdir(path: str, *, depth: int = 1, finals=(0.9, 0.3), task: str = "question",
                 config_extra: dict | None = None, analysis: bool = True,
                 pruning: bool = True) -> str:
  """A hand-made workdir at `path` (created); returns `path`."""
  os.makedirs(path, exist_ok=True)
  num_seeds = len(finals)
  config = {"task": task, "objective": "lm", "first_seed": 0, "num_seeds": num_seeds,
            "data": {"dir": os.path.join(os.path.abspath(path), "data")},
            "model": {"num_layers": depth, "num_heads": 2},
            "train": {"num_steps": int(STEPS[-1])}, "eval": {"max_lines": 400},
            "sas": {"lambdas": [0.0]}, "tree": {"lambdas": [0.0]}}
  for section, values in (config_extra or {}).items():
    config.setdefault(section, {})
    if isinstance(values, dict):
      config[section].update(values)
    else:
      config[section] = values
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(config, f)
  with open(os.path.join(path, "vocab.json"), "w") as f:
    json.dump(["<pad>", "a", "b"], f)
  write_series(os.path.join(path, "metrics.csv"), curves(num_seeds, finals))
  os.makedirs(os.path.join(path, "checkpoints", "1000"), exist_ok=True)
  with open(os.path.join(path, "checkpoints", "1000", "state"), "wb") as f:
    f.write(b"\0" * 4096)
  if analysis:
    series = {"tscore": {s: (STEPS, np.linspace(0.1, 0.5 + 0.1 * s, STEPS.size))
                         for s in range(num_seeds)},
              "weight_norm_per_layer": {s: (STEPS, np.full(STEPS.size, 20.0 + s))
                                        for s in range(num_seeds)}}
    write_series(os.path.join(path, "analysis.csv"), series)
    with open(os.path.join(path, "analysis.csv.options.json"), "w") as f:
      json.dump({"split": "train", "num_sentences": 10}, f)
  if pruning:
    write_pruning(path, depth, num_seeds)
  return path


def write_pruning(path: str, num_layers: int, num_seeds: int, num_heads: int = 2,
                  steps=(500, 1000), levels=(0.5,), pruning_seeds: int = 3) -> None:
  """pruning.csv, the masks files and pruning_core.csv of known values: subnetwork p of seed s
  keeps head 0 always (the core) and head 1 + p % 2; accuracies in-domain 1.0, out-of-domain
  0.5 + 0.1 p."""
  rows, core_rows = [], []
  heads_total = num_layers * num_heads
  for step in steps:
    masks = {k: [] for k in pruning_table.MASK_FIELDS}
    for s in range(num_seeds):
      rows += [(step, s, 0.0, pruning_table.FULL_MODEL, "in_domain/accuracy", 1.0),
               (step, s, 0.0, pruning_table.FULL_MODEL, "out_of_domain/accuracy", 0.6)]
      for level in levels:
        for p in range(pruning_seeds):
          rows += [(step, s, level, p, "in_domain/accuracy", 1.0),
                   (step, s, level, p, "out_of_domain/accuracy", 0.5 + 0.1 * p),
                   (step, s, level, p, "kl", 0.1), (step, s, level, p, "achieved_sparsity", level)]
          head = np.zeros((num_layers, num_heads), bool)
          head.flat[0] = True
          head.flat[1 + p % 2 if heads_total > 2 else 1] = True
          masks["seed"].append(s)
          masks["sparsity"].append(level)
          masks["pruning_seed"].append(p)
          masks["head_mask"].append(head)
          masks["mlp_mask"].append(np.ones(num_layers, bool))
          masks["log_alpha_heads"].append(np.zeros((num_layers, num_heads), np.float32))
          masks["log_alpha_mlp"].append(np.zeros(num_layers, np.float32))
        if step == steps[-1]:
          for name, value in (("core_ablation/out_of_domain/accuracy", 0.3 + 0.01 * s),
                              ("random_ablation/out_of_domain/accuracy", 0.55 + 0.01 * s)):
            core_rows.append((step, s, level, name, value))
    pruning_table.save_masks(path, step, {k: np.asarray(v) for k, v in masks.items()})
  pruning_table.PruningCsv(os.path.join(path, "pruning.csv")).append(rows)
  core_table.write_rows(os.path.join(path, "pruning_core.csv"), core_rows)
