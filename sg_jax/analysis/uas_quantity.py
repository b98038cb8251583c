"""The `uas` analysis quantity: UAS of every attention head (`sg_jax.analysis.uas`; docs/sas.md).

`python -m sg_jax.analyze --workdir=W --modules=sg_jax.analysis.uas_quantity` writes, per
checkpoint and seed, `uas` and `uas_weight` (best head, all arcs), `uas_l{layer}_h{head}` and
`uas_weight_l{layer}_h{head}` (every head, all arcs) and `uas_rel_{relation}` /
`uas_weight_rel_{relation}` (best head per relation; relations with fewer than
`--uas_min_count` arcs, default 100, get no row). A model whose arcs are scored in two
directions (bidirectional attention, `uas.DIRECTIONS`) also gets `uas_dir_{direction}` and
`uas_weight_dir_{direction}` (best head in each direction); its per-head and best-head rows take
the better direction. The lines are the analysis's sentence set
(`--split`, `--sentence_set`, `--num_sentences`), whole LM lines with the arcs of both halves.
Tasks without gold dependencies (Dyck) skip the group with a warning.

Beside them, the positional baselines of the same lines and arcs
(`uas_positional.positional_baselines`,
Clark et al. 2019, §4.2): `uas_prev_token`, `uas_next_token`, `uas_best_offset` (all arcs) and
`uas_best_offset_rel_{relation}` (relations with at least `--uas_min_count` arcs). They depend
on the sentence set only, so they are computed once per sentence set and attention and
repeated for every checkpoint and seed.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from sg_jax.analysis import registry
from sg_jax.analysis.uas import directions, line_batches, uas_metrics
from sg_jax.analysis.uas_positional import positional_baselines, positional_uas_stats
from sg_jax.tasks import dependencies

_BASELINES: dict = {}  # (lines digest, attention, prefix ends, min_count) -> positional baselines


def _positional(batches, special, config, min_count: int) -> dict:
  """`positional_baselines` of the batches, computed once per sentence set and attention."""
  digest = hashlib.sha1()
  for b in batches:
    for k in ("inputs", "dep_head", "dep_relation"):
      digest.update(np.ascontiguousarray(b[k]).tobytes())
  key = (digest.hexdigest(), config.attention, tuple(config.prefix_end_ids), min_count)
  if key not in _BASELINES:
    _BASELINES.clear()  # one sentence set at a time
    _BASELINES[key] = positional_baselines(positional_uas_stats(
        batches, special, attention=config.attention, prefix_end_ids=config.prefix_end_ids),
        min_count)
  return _BASELINES[key]


def _compute(inputs: registry.Inputs) -> dict[str, Any]:
  """uas, uas_weight, the positional baselines (uas_prev_token, uas_next_token,
  uas_best_offset, uas_best_offset_rel_{relation}), uas_l{layer}_h{head},
  uas_weight_l{layer}_h{head}, uas_rel_{relation} and uas_weight_rel_{relation} [S] (a rare
  relation writes no row), and with two directions uas_dir_{direction} and
  uas_weight_dir_{direction}."""
  batches = line_batches(inputs.dependency_lines, sos_id=inputs.sos_id,
                         batch_size=inputs.options.entropy_batch_size)
  # pad, EOS, SOS (`vocab.Vocab`: EOS = SOS - 1)
  special = np.asarray([0, inputs.sos_id - 1, inputs.sos_id], np.int32)
  out = uas_metrics(inputs.params, batches, special, config=inputs.config,
                    min_count=inputs.options.uas_min_count,
                    seeds_per_call=inputs.options.seeds_per_call)
  columns = {"uas": out["uas"], "uas_weight": out["uas_weight"]}
  num_seeds = len(out["uas"])
  base = _positional(batches, special, inputs.config, inputs.options.uas_min_count)
  for name in ("prev_token", "next_token", "best_offset"):
    columns[f"uas_{name}"] = np.full(num_seeds, base[name], np.float32)
  for r, name in enumerate(dependencies.RELATIONS):
    if np.isfinite(base["best_offset_relation"][r]):
      columns[f"uas_best_offset_rel_{name}"] = np.full(num_seeds, base["best_offset_relation"][r],
                                                       np.float32)
  names = directions(inputs.config.attention)
  if len(names) > 1:
    for d, name in enumerate(names):
      columns[f"uas_dir_{name}"] = out["uas_direction"][:, d]
      columns[f"uas_weight_dir_{name}"] = out["weight_direction"][:, d]
  for layer in range(out["uas_head"].shape[1]):
    for h in range(out["uas_head"].shape[2]):
      columns[f"uas_l{layer}_h{h}"] = out["uas_head"][:, layer, h]
      columns[f"uas_weight_l{layer}_h{h}"] = out["weight_head"][:, layer, h]
  for r, name in enumerate(dependencies.RELATIONS):
    for key, column in (("uas_relation", f"uas_rel_{name}"),
                        ("weight_relation", f"uas_weight_rel_{name}")):
      values = out[key][:, r]
      if not np.all(np.isnan(values)):
        columns[column] = [None if np.isnan(v) else float(v) for v in values]
  return columns


registry.register_quantity(registry.Quantity(
    name="uas",
    groups=(registry.Group("uas", (
        "uas", "uas_weight", "uas_prev_token", "uas_next_token", "uas_best_offset",
        "uas_best_offset_rel_{relation}", "uas_dir_{direction}", "uas_weight_dir_{direction}",
        "uas_l{layer}_h{head}", "uas_weight_l{layer}_h{head}", "uas_rel_{relation}",
        "uas_weight_rel_{relation}"), inputs=("dependency_lines",)),),
    compute=_compute,
    dynamics=(registry.Dynamic(
        "uas", axis="UAS of the best head (argmax; directions as uas.DIRECTIONS)",
        title="Syntactic attention structure: UAS of the best head", label="UAS",
        in_summary=True, logged_as="in_domain/uas"),) + tuple(
        registry.Dynamic(f"uas_{name}", axis="UAS (argmax)",
                         title=f"{label} head", label=f"{label} UAS", in_summary=True,
                         reference_for="uas", logged_as=f"in_domain/uas_{name}")
        for name, label in (("prev_token", "previous-token"), ("next_token", "next-token"),
                            ("best_offset", "best-offset"))),
))
