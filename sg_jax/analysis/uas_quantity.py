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
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sg_jax.analysis import registry
from sg_jax.analysis.uas import directions, line_batches, uas_metrics
from sg_jax.tasks import dependencies


def _compute(inputs: registry.Inputs) -> dict[str, Any]:
  """uas, uas_weight, uas_l{layer}_h{head}, uas_weight_l{layer}_h{head}, uas_rel_{relation}
  and uas_weight_rel_{relation} [S] (a rare relation writes no row), and with two directions
  uas_dir_{direction} and uas_weight_dir_{direction}."""
  batches = line_batches(inputs.dependency_lines, sos_id=inputs.sos_id,
                         batch_size=inputs.options.entropy_batch_size)
  # pad, EOS, SOS (`vocab.Vocab`: EOS = SOS - 1)
  special = np.asarray([0, inputs.sos_id - 1, inputs.sos_id], np.int32)
  out = uas_metrics(inputs.params, batches, special, config=inputs.config,
                    min_count=inputs.options.uas_min_count,
                    seeds_per_call=inputs.options.seeds_per_call)
  columns = {"uas": out["uas"], "uas_weight": out["uas_weight"]}
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
        "uas", "uas_weight", "uas_dir_{direction}", "uas_weight_dir_{direction}",
        "uas_l{layer}_h{head}", "uas_weight_l{layer}_h{head}", "uas_rel_{relation}",
        "uas_weight_rel_{relation}"), inputs=("dependency_lines",)),),
    compute=_compute,
    dynamics=(registry.Dynamic(
        "uas", axis="UAS of the best head (argmax; directions as uas.DIRECTIONS)",
        title="Syntactic attention structure: UAS of the best head", label="UAS",
        in_summary=True, logged_as="in_domain/uas"),),
))
