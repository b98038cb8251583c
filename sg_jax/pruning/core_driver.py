"""The core analysis behind `python -m sg_jax.prune_core` (whose module docstring describes the
options; its flags and `main` stay there): core sizes, inclusion frequencies, overlaps and
ablations over checkpoints and seeds, appended to the core table.
"""

from __future__ import annotations

import json
import logging as py_logging
import os
import time
from typing import Sequence

import jax.numpy as jnp
import numpy as np

from sg_jax import checkpointing
from sg_jax.config.cli_options import check_options
from sg_jax.pruning import core
from sg_jax.pruning import core_table
from sg_jax.pruning import driver as prune_lib
from sg_jax.pruning import evaluate as evaluate_lib
from sg_jax.pruning import inputs as inputs_lib
from sg_jax.pruning import table
from sg_jax.runtime import workdir_lock


log = py_logging.getLogger("sg_jax.prune_core")


def parse_names(text: str) -> list[str]:
  """'a.csv, b.csv' -> ['a.csv', 'b.csv']; '' -> []."""
  return [t.strip() for t in text.split(",") if t.strip()]


def parse_levels(text: str) -> list[float] | None:
  """'all' -> None; '0.3,0.5' -> [0.3, 0.5]. Raises ValueError unless distinct levels in (0, 1)."""
  if text.strip().lower() == "all":
    return None
  try:
    return prune_lib.parse_sparsities(text)
  except ValueError:
    raise ValueError(f"--sparsity must be 'all' or distinct comma-separated numbers in (0, 1), "
                     f"got {text!r}") from None


def _select(name: str, wanted, present: list, flag: str) -> list:
  if wanted is None:
    return present
  missing = sorted(set(wanted) - set(present))
  if missing:
    raise ValueError(f"{name} {missing} are not in the pruning table ({flag}); present: "
                     f"{present}")
  return sorted(set(wanted))


def _pruning_options(path: str) -> dict:
  """The pruning table's recorded `num_lines`, `batch_size` and `ablation` (prune's defaults
  when it has no options file)."""
  opts = {"num_lines": 1000, "batch_size": 16, "ablation": "mean"}
  if os.path.exists(path + ".options.json"):
    with open(path + ".options.json") as f:
      opts.update({k: v for k, v in json.load(f).items() if k in opts})
  else:
    log.warning("%s has no options file; assuming sg_jax.prune's defaults %s", path, opts)
  return opts


class _Masks:
  """The masks files of a workdir, read once each: {(seed, level): bool [P, U]} per step."""

  def __init__(self, workdir: str, table_name: str = table.DEFAULT_TABLE):
    self.workdir, self.table_name, self.cache, self.shape = workdir, table_name, {}, None
    self.mlp_rows = None  # R_m of the masks (R_h, num_heads = `shape`)

  def get(self, step: int, seed: int, level: float) -> np.ndarray:
    """bool [P, U] of one (step, seed, level). Raises ValueError when it has no masks."""
    if step not in self.cache:
      masks = table.load_masks(self.workdir, step, self.table_name)
      if masks is None:
        raise ValueError(f"step {step} has runs in the pruning table but no masks file "
                         f"{table.masks_path(self.workdir, step, self.table_name)}")
      self.shape = tuple(masks["head_mask"].shape[1:])
      self.mlp_rows = int(masks["mlp_mask"].shape[1])
      self.cache[step] = core_table.unit_masks(masks)
    if (seed, level) not in self.cache[step]:
      raise ValueError(f"step {step}: no masks of seed {seed} at sparsity {level} in "
                       f"{table.masks_path(self.workdir, step, self.table_name)}")
    return self.cache[step][(seed, level)]

  def find(self, step: int, seed: int, level: float) -> np.ndarray | None:
    """As `get`, None when there are no such masks."""
    try:
      return self.get(step, seed, level)
    except ValueError:
      return None


def prune_core(workdir: str, *, input_name: str = "pruning.csv",
               output: str = "pruning_core.csv", sparsities: list[float] | None = None,
               steps: list[int] | None = None, last_only: bool = False,
               seeds: list[int] | None = None, num_draws: int = 8, eval_lines: int = 0,
               ablation: bool = True, ablate_units: str = "heads",
               compare: Sequence[str] = ()) -> dict:
  """Writes the core analyses of the selected groups (module docstring); returns a summary.

  Args: as the flags; None selects everything present in the pruning table (`last_only`: its
  last step); `compare`: names of other pruning tables (relative to `workdir`).

  Returns:
    {'groups': [(step, seed, level)], 'evaluated': groups whose ablation rows were computed,
    'reused': groups whose ablation rows were kept, 'rows': rows in the output, 'path': it,
    'table': `summary_table` of the groups}.

  Raises:
    ValueError: no pruning table or no run in it, an unknown step, seed or level, a step
      without masks, num_draws < 0, an unknown `ablate_units`, options differing from the
      output's.
    checkpointing.CheckpointError: the checkpoint of a step to ablate cannot be restored.
    workdir_lock.LockHeld: another command holds the workdir (`runtime.workdir_lock`); nothing
      was written.
  """
  if num_draws < 0 or eval_lines < 0:
    raise ValueError("--num_draws and --eval_lines must be >= 0")
  if ablate_units not in core.ABLATION_UNITS:
    raise ValueError(f"--ablate_units must be one of {core.ABLATION_UNITS}, got "
                     f"{ablate_units!r}")
  if not os.path.isdir(workdir):
    raise ValueError(f"workdir {workdir} does not exist")
  # One writer per workdir: refused (nothing written) while another command holds it.
  with workdir_lock.locked(workdir, "sg_jax.prune_core", read_only_ok=True):
    return _prune_core(workdir, input_name=input_name, output=output, sparsities=sparsities,
                       steps=steps, last_only=last_only, seeds=seeds, num_draws=num_draws,
                       eval_lines=eval_lines, ablation=ablation, ablate_units=ablate_units,
                       compare=compare)


def _prune_core(workdir, *, input_name, output, sparsities, steps, last_only, seeds, num_draws,
                eval_lines, ablation, ablate_units, compare) -> dict:
  in_path, out_path = os.path.join(workdir, input_name), os.path.join(workdir, output)
  if not os.path.exists(in_path):
    raise ValueError(f"no pruning table {in_path}; run python -m sg_jax.prune first")
  runs, full = core_table.run_tables(table.read_rows(in_path))
  if not runs:
    raise ValueError(f"{in_path} has no pruning run")
  all_steps = sorted({s for s, _ in runs})
  todo_steps = [all_steps[-1]] if last_only else _select("steps", steps, all_steps, "--steps")
  all_seeds = sorted({seed for s, seed in runs if s in todo_steps})
  todo_seeds = _select("seeds", seeds, all_seeds, "--seeds")
  all_levels = sorted({lv for (s, _), by_lv in runs.items() if s in todo_steps for lv in by_lv})
  todo_levels = _select("sparsity levels", None if sparsities is None else
                        [table.level_key(x) for x in sparsities], all_levels, "--sparsity")
  missing = [n for n in compare if not os.path.exists(os.path.join(workdir, n))]
  if missing:  # before any options file is written
    raise ValueError(f"--compare: no pruning table {os.path.join(workdir, missing[0])}")
  gone = _diverged(workdir, todo_steps)
  if gone and all(seed in gone.get(step, {}) for step in todo_steps for seed in todo_seeds):
    raise ValueError(f"every selected seed of {workdir} diverged ("
                     + "; ".join(f"step {step}: seeds {sorted(gone[step])}" for step in gone)
                     + "; docs/reliability.md): no core analysis")
  opts = _pruning_options(in_path)
  if ablation:
    check_options(out_path, {"input": input_name, "num_draws": num_draws,
                             "eval_lines": eval_lines, "num_lines": opts["num_lines"],
                             "ablation": opts["ablation"], "ablate_units": ablate_units},
                  legacy={"ablate_units": "all"})
  masks = _Masks(workdir, input_name)
  compared = {table.table_stem(name): _Masks(workdir, name)
              for name in compare}
  last_step = {}  # (seed, level) -> the last step with runs
  for (s, seed), by_lv in runs.items():
    for lv in by_lv:
      last_step[(seed, lv)] = max(s, last_step.get((seed, lv), s))
  rows = core_table.read_rows(out_path)
  stored = {}
  for r in rows:
    stored.setdefault(core_table.group_of(r), []).append(r)
  summary = {"groups": [], "evaluated": [], "reused": [], "path": out_path}
  data = {}
  for step in todo_steps:
    new: dict[core_table.Group, list] = {}
    to_ablate = {}  # (seed, level) -> core
    for seed in todo_seeds:
      if (step, seed) not in runs:
        log.info("step %d: no run of seed %d", step, seed)
        continue
      if seed in gone.get(step, {}):  # frozen parameters, not a trained seed's: left out
        log.warning("step %d: seed %d diverged at step %d; no core analysis", step, seed,
                    gone[step][seed])
        continue
      eff, why = core_table.effective_size_rows(step, seed, runs[(step, seed)],
                                                full.get((step, seed)))
      if why:
        log.info("step %d seed %d: no effective size (%s)", step, seed, why)
      new[(step, seed, None)] = eff
      for lv in todo_levels:
        if lv not in runs[(step, seed)]:
          continue
        group = (step, seed, lv)
        new[group], kernel, reuse = _group_rows(group, runs, masks, last_step[(seed, lv)],
                                                stored.get(group, []))
        num_heads_total = masks.shape[0] * masks.shape[1]
        for stem, other in compared.items():
          found = other.find(step, seed, lv)
          if found is None:
            log.info("step %d seed %d sparsity %s: no masks in %s to compare", step, seed,
                     lv, stem)
          else:
            new[group] += core_table.compare_rows(step, seed, lv, masks.get(step, seed, lv),
                                                  found, stem, num_heads_total)
        if reuse:
          summary["reused"].append(group)
        elif core.without_core(kernel, num_heads_total, ablate_units).all():  # removes nothing
          log.info("step %d seed %d sparsity %s: the core has no %s; no core ablation", step,
                   seed, lv, "head" if ablate_units == "heads" else "unit")
        elif ablation:
          to_ablate[(seed, lv)] = kernel
        summary["groups"].append(group)
    if to_ablate:
      _ablate(workdir, step, to_ablate, new, masks.shape + (masks.mlp_rows,), num_draws,
              eval_lines, opts, data, ablate_units)
      summary["evaluated"] += [(step, seed, lv) for seed, lv in to_ablate]
    rows = core_table.merge(rows, new)
    core_table.write_rows(out_path, rows)
    log.info("step %d: %d (seed, level) groups -> %s", step,
             sum(1 for g in new if g[2] is not None), out_path)
  summary["rows"] = len(rows)
  summary["table"] = summary_table(rows, summary["groups"])
  return summary


def _diverged(workdir: str, steps: list[int]) -> dict[int, dict[int, int]]:
  """{step: {seed: step it diverged}} from the checkpoints of `steps` that exist (a table of an
  older `sg_jax.prune` may hold diverged seeds' runs); steps without a readable checkpoint give
  nothing."""
  available = set(checkpointing.all_steps(workdir))
  out = {}
  for step in steps:
    if step not in available:
      continue
    try:
      found = checkpointing.diverged_seeds(workdir, step)
    except checkpointing.CheckpointError as e:
      log.warning("cannot tell the diverged seeds of step %d: %s", step, e)
      continue
    if found:
      out[step] = found
  return out


def _group_rows(group, runs, masks: _Masks, final_step: int, old: list):
  """The core rows of one (step, seed, level) and its stored ablation rows while its stored
  core is the same: (rows, core bool [U], whether the ablation rows were reused)."""
  step, seed, lv = group
  sub = masks.get(step, seed, lv)
  num_layers, num_heads = masks.shape
  names = core.unit_names(num_layers, num_heads, masks.mlp_rows)
  others = {b: core.heuristic_core(masks.get(step, b, lv)) for (s, b), by_lv in runs.items()
            if s == step and b != seed and lv in by_lv}
  final = core.heuristic_core(masks.get(final_step, seed, lv))
  rows = core_table.core_rows(step, seed, lv, sub, names, num_layers * num_heads, final, others)
  kernel = core.heuristic_core(sub)
  old_ablation = [r for r in old if r[3].startswith(core_table.ABLATION_PREFIXES)]
  old_core = core_table.stored_core(old, names)
  if old_ablation and old_core is not None and np.array_equal(old_core, kernel):
    return rows + old_ablation, kernel, True
  if old_ablation:
    log.info("step %d seed %d sparsity %s: the core changed; its old ablation rows are dropped",
             step, seed, lv)
  return rows, kernel, False


def _ablate(workdir, step, to_ablate, new, shape, num_draws, eval_lines, opts, data,
            units) -> None:
  """Restores `step`, scores every (seed, level) of `to_ablate` ({(seed, level): core}) in one
  evaluator call (the core's `units`, "heads" or "all", ablated) and appends its ablation rows
  to `new`'s groups."""
  t0 = time.time()
  log.info("step %d: restoring the checkpoint and computing the mean activations for the core "
           "ablation of %d (seed, level) groups", step, len(to_ablate))
  restored = checkpointing.restore(workdir, step, params_only=True)
  seeds = sorted({seed for seed, _ in to_ablate})
  missing = sorted(set(seeds) - set(restored.seeds))
  if missing:
    raise ValueError(f"step {step}: seeds {missing} are not in the checkpoint "
                     f"(seeds: {list(restored.seeds)})")
  if not data:
    data.update(inputs_lib.load_lines(restored, workdir, num_lines=opts["num_lines"],
                                     batch_size=opts["batch_size"], eval_lines=eval_lines))
  model_config, vocab, params_S, means_S = inputs_lib.seed_inputs(restored, seeds, data)
  num_layers, num_heads, mlp_rows = shape  # R_h, H, R_m
  levels = sorted({lv for _, lv in to_ablate})
  per = 2 + num_draws
  heads = np.ones((len(seeds), len(levels) * per, num_layers, num_heads), bool)
  mlp = np.ones((len(seeds), len(levels) * per, mlp_rows), bool)
  reasons = {}
  for (seed, lv), kernel in to_ablate.items():
    i, k = seeds.index(seed), levels.index(lv) * per
    h, m, reasons[(seed, lv)] = core_table.ablation_masks(
        kernel, num_layers, num_heads, num_draws, core_table.draw_seed(step, seed, lv), units)
    heads[i, k:k + per], mlp[i, k:k + per] = h, m
  evaluator = evaluate_lib.make_evaluator(data["task"], model_config, vocab, data["eval"],
                                          opts["ablation"], data["objective"])
  log.info("step %d: scoring %d cores (%d masks per seed: per level the full model, the core "
           "ablated and %d random-head draws) on %d + %d evaluation lines (%.0f s so far)",
           step, len(to_ablate), heads.shape[1], num_draws,
           *(int(np.sum(data["eval"][split]["valid"])) for split in ("in_domain",
                                                                   "out_of_domain")),
           time.time() - t0)
  metrics = _score_in_chunks(evaluator, params_S, means_S, heads, mlp,
                             lambda done, total: log.info(
                                 "step %d: scored %d/%d masks per seed (%.0f s so far)", step,
                                 done, total, time.time() - t0))
  for (seed, lv), reason in reasons.items():
    if reason:
      log.info("step %d seed %d sparsity %s: no random baseline (%s)", step, seed, lv, reason)
    i, k = seeds.index(seed), levels.index(lv) * per
    new[(step, seed, lv)] += core_table.ablation_rows(
        step, seed, lv, {n: v[i, k:k + per] for n, v in metrics.items()}, reason is None)


SCORE_CHUNK = 4  # masks per seed scored per call, so a long scoring logs its progress


def _score_in_chunks(evaluator, params_S, means_S, heads, mlp, progress) -> dict:
  """`evaluate_lib.to_rows` of the evaluator over the masks [S, K, ...], `SCORE_CHUNK` masks per
  seed per call (the last chunk padded with full-model masks, so every call has one shape and
  compiles once), calling `progress(masks done, K)` after each; {name: [S, K]}."""
  k = heads.shape[1]
  chunk = min(SCORE_CHUNK, k)
  pad = -k % chunk
  heads = np.concatenate([heads, np.ones(heads.shape[:1] + (pad,) + heads.shape[2:], bool)], 1)
  mlp = np.concatenate([mlp, np.ones(mlp.shape[:1] + (pad,) + mlp.shape[2:], bool)], 1)
  parts = []
  for start in range(0, k, chunk):
    parts.append(evaluate_lib.to_rows(evaluator(
        params_S, means_S, jnp.asarray(heads[:, start:start + chunk], jnp.float32),
        jnp.asarray(mlp[:, start:start + chunk], jnp.float32))))
    progress(min(start + chunk, k), k)
  return {name: np.concatenate([p[name] for p in parts], axis=1)[:, :k] for name in parts[0]}


def summary_table(rows, groups) -> str:
  """One line per (step, seed, level) of `groups`: core heads + MLPs, effective size (mean
  variant; "<=" when it is an upper bound, some pruning seeds at the highest level tried),
  Jaccard with the final core, out-of-domain accuracy with the core / random units ablated."""
  values = {}
  for r in rows:
    values[(core_table.group_of(r), r[3])] = r[4]
  fmt = lambda x: "-" if x is None or np.isnan(x) else f"{x:.3f}"
  mean_size = "effective_size/mean"
  # "<=": some pruning seeds reached the highest level tried, so the size is an upper bound.
  bounded = lambda step, seed: "<=" if (values.get(
      ((step, seed, None), "effective_size/mean/at_highest_level")) or 0) > 0 else ""
  lines = [f"{'step':>8} {'seed':>4} {'level':>6} {'core':>7} {'eff_size':>8} "
           f"{'jac_final':>9} {'ood_core':>8} {'ood_rand':>8}"]
  for step, seed, lv in groups:
    get = lambda name, g=(step, seed, lv): values.get((g, name))
    size = f"{get('core/num_heads') or 0:.0f}h+{get('core/num_mlps') or 0:.0f}m"
    lines.append(
        f"{step:>8} {seed:>4} {lv:>6} {size:>7} "
        f"{bounded(step, seed) + fmt(values.get(((step, seed, None), mean_size))):>8} "
        f"{fmt(get('core/jaccard_final')):>9} "
        f"{fmt(get('core_ablation/out_of_domain/accuracy')):>8} "
        f"{fmt(get('random_ablation/out_of_domain/accuracy')):>8}")
  return "\n".join(lines)
