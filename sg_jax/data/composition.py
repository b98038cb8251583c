"""Training-data composition, per seed: which lines of one shared training set each seed draws.

Seeds of one configuration end on different rules, and the training data explains part of it:
center-embedded relative clauses drive the hierarchical rule and diverse data drives rule use
(Qin, Saphra & Alvarez-Melis, EMNLP 2025); a few disambiguating questions change the outcome
(Ahuja et al. 2024, "Learning Syntax Without Planting Trees"). `config.data` sets the
composition, and every field below takes one value per seed (or one value for all), so a
dose-response curve over data is one vmapped run (docs/data.md, "Composition"):

* `num_disambiguating`: transformed lines (questions, present-tense lines) whose subject carries
  a relative clause, drawn like gen lines (`generate_examples` with another seed) but never a
  sentence of the gen, dev or test split (checked), appended to the training set;
* `exclude_identity`: no identity (`decl` / `PAST`) lines;
* `num_types`: only lines of the `num_types` most frequent sentence types of the training split
  (a type is `mccoy.sentence_shape`: what modifies the subject and what the object is; 0 = all);
* `subject_mix`: weights of the subject constructions (`Task.constructions`, e.g.
  `"none=1,PP=1,RC-subj=1,RC-obj=0,RC-intrans=1"`; '' = as generated): lines are taken per
  construction in file order, as many as keep the ratios (a weight 0 drops the construction;
  unnamed constructions keep weight 1). It sets both the simple / PP / relative-clause mix and
  the subject- vs object-extracted one;
* `subset_fraction`: the first fraction (in file order) of what the fields above kept.

The filters apply in that order (exclusion, types, mix, subset), then the disambiguating lines
are added. Each seed's lines are a POOL of indices into one training set on device (the split
plus the largest number of disambiguating lines any seed takes): there are no per-seed copies of
the data, and a seed draws its epoch permutations over its own pool (`step.make_chunk_fn`), so a
seed trained in a mixed group equals the same seed trained alone with its own mix.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Sequence

import ml_collections
import numpy as np

from sg_jax.config import per_seed

log = logging.getLogger("sg_jax")

# Composition fields of `config.data` and their defaults (no change to the training split).
FIELDS = {"num_disambiguating": 0, "exclude_identity": False, "num_types": 0,
          "subject_mix": "", "subset_fraction": 1.0}
# Seed offset of the generator of the disambiguating lines (independent of the split files').
DISAMBIGUATING_SEED_OFFSET = 7_919


def add_defaults(data: ml_collections.ConfigDict) -> None:
  """Adds the composition fields to `config.data`, each a 1-tuple (one value for all seeds;
  `--config.data.num_disambiguating="(0,0,100,100)"` gives one per seed)."""
  for name, default in FIELDS.items():
    data[name] = (default,)


def parse_mix(text: str, constructions: Sequence[str]) -> dict[str, float]:
  """`"none=1,PP=0.5"` -> {construction: weight} over every construction (unnamed: 1).

  Raises:
    ValueError: an unknown construction, a malformed entry or a negative weight.
  """
  weights = {c: 1.0 for c in constructions}
  for item in [s.strip() for s in str(text).split(",") if s.strip()]:
    name, sep, value = item.partition("=")
    name = name.strip()
    if not sep or name not in weights:
      raise ValueError(f"invalid config: data.subject_mix entry {item!r}: expected "
                       f"<construction>=<weight> with a construction of {tuple(constructions)}")
    try:
      weights[name] = float(value)
    except ValueError:
      raise ValueError(f"invalid config: data.subject_mix weight {value!r} of {name} is not a "
                       "number") from None
    if weights[name] < 0:
      raise ValueError(f"invalid config: data.subject_mix weight of {name} must be >= 0")
  if not any(weights.values()):
    raise ValueError("invalid config: data.subject_mix gives every construction weight 0")
  return weights


@dataclasses.dataclass(frozen=True)
class Mix:
  """One seed's composition (the `config.data` fields, resolved for that seed)."""

  num_disambiguating: int = 0
  exclude_identity: bool = False
  num_types: int = 0
  subject_mix: str = ""
  subset_fraction: float = 1.0

  @property
  def is_default(self) -> bool:
    return self == Mix()


def mixes_from_config(config: ml_collections.ConfigDict) -> tuple[Mix, ...]:
  """Each seed's `Mix`, in seed order: the typed form of the run config's `data` composition
  fields, built once at the top of a run (`input_pipeline.DataOptions.from_config`).

  Returns:
    S `Mix` (S = `num_seeds`).

  Raises:
    ValueError: a field with a wrong number of values or an out-of-range value.
  """
  n = int(config.num_seeds)
  values = {name: per_seed.values(config.data.get(name, (default,)), n, f"data.{name}")
            for name, default in FIELDS.items()}
  mixes = [Mix(num_disambiguating=int(values["num_disambiguating"][k]),
               exclude_identity=bool(values["exclude_identity"][k]),
               num_types=int(values["num_types"][k]),
               subject_mix=str(values["subject_mix"][k]),
               subset_fraction=float(values["subset_fraction"][k])) for k in range(n)]
  for m in mixes:
    if m.num_disambiguating < 0:
      raise ValueError("invalid config: data.num_disambiguating must be >= 0")
    if m.num_types < 0:
      raise ValueError("invalid config: data.num_types must be >= 0 (0 = all)")
    if not 0 < m.subset_fraction <= 1:
      raise ValueError(f"invalid config: data.subset_fraction must be in (0, 1] "
                       f"(got {m.subset_fraction})")
  return tuple(mixes)


def active(mixes: Sequence[Mix]) -> bool:
  """Whether any seed's composition (`mixes`, one per seed) differs from the plain training
  split."""
  return not all(m.is_default for m in mixes)


@dataclasses.dataclass(frozen=True)
class LineFacts:
  """What the composition filters read of each training line (arrays [N]).

  Attributes:
    identity: bool, an identity (`decl` / `PAST`) line.
    construction: int32, index into `Task.constructions` of what modifies the subject.
    shape: int32, index of the line's sentence type (`mccoy.sentence_shape`) in `shapes`.
    shapes: the sentence types, most frequent in the training split first.
    num_split: lines of the training split; lines from `num_split` on are disambiguating.
  """

  identity: np.ndarray
  construction: np.ndarray
  shape: np.ndarray
  shapes: tuple
  num_split: int


def line_facts(task, train_examples: Sequence, extra_examples: Sequence) -> LineFacts:
  """`LineFacts` of the training split followed by the disambiguating lines (parses each
  line's source with the task's grammar: about 0.4 ms a line).

  Raises:
    ValueError: the task declares no constructions (Dyck), so no composition applies.
  """
  if not task.constructions:
    raise ValueError(f"invalid config: data composition fields need a task with sentence "
                     f"constructions; {task.name} has none")
  examples = list(train_examples) + list(extra_examples)
  shapes = [task.shape(ex) for ex in examples]
  counts: dict = {}
  for s in shapes[:len(train_examples)]:
    counts[s] = counts.get(s, 0) + 1
  order = sorted(set(shapes), key=lambda s: (-counts.get(s, 0), s))
  index = {s: k for k, s in enumerate(order)}
  cons = {c: k for k, c in enumerate(task.constructions)}
  return LineFacts(identity=np.array([not ex.transformed for ex in examples], bool),
                   construction=np.array([cons[s[0]] for s in shapes], np.int32),
                   shape=np.array([index[s] for s in shapes], np.int32),
                   shapes=tuple(order), num_split=len(train_examples))


def pool(mix: Mix, facts: LineFacts, constructions: Sequence[str]) -> np.ndarray:
  """int32 [P] the training-set indices one seed draws from, in file order (module docstring)."""
  keep = np.arange(facts.num_split)
  if mix.exclude_identity:
    keep = keep[~facts.identity[keep]]
  if mix.num_types:
    keep = keep[facts.shape[keep] < mix.num_types]
  if mix.subject_mix:
    weights = parse_mix(mix.subject_mix, constructions)
    by_cons = {k: keep[facts.construction[keep] == k] for k in range(len(constructions))}
    used = [k for k, c in enumerate(constructions) if weights[c] > 0 and by_cons[k].size]
    scale = min(by_cons[k].size / weights[constructions[k]] for k in used) if used else 0
    chosen = [by_cons[k][:int(np.floor(scale * weights[constructions[k]] + 1e-9))]
              for k in used]
    keep = np.sort(np.concatenate(chosen)) if chosen else keep[:0]
  if mix.subset_fraction < 1:
    keep = keep[:int(round(mix.subset_fraction * keep.size))]
  extra = facts.num_split + np.arange(mix.num_disambiguating)
  return np.concatenate([keep, extra]).astype(np.int32)


def disambiguating_examples(task, count: int, data_seed: int, held_out: Sequence) -> list:
  """`count` transformed lines whose subject carries a relative clause (what gen holds), drawn
  by the task's generator with seed `data_seed + DISAMBIGUATING_SEED_OFFSET`, none with the
  sentence of a line in `held_out` (the gen, dev and test lines).

  Raises:
    ValueError: the generator cannot supply that many new sentences.
  """
  if count <= 0:
    return []
  held = {tuple(ex.source[:-1]) for ex in held_out}
  out, draw = [], 2 * count + 50
  for _ in range(6):
    sizes = {s: 0 for s in task.split_names}
    sizes["gen"] = draw
    fresh = task.generate_examples(seed=data_seed + DISAMBIGUATING_SEED_OFFSET, sizes=sizes)
    out = [ex for ex in fresh["gen"] if tuple(ex.source[:-1]) not in held][:count]
    if len(out) == count:
      return out
    draw *= 2
  raise ValueError(f"could not draw {count} disambiguating lines outside the held-out splits")


def extra_training_examples(mixes: Sequence[Mix], data_seed: int, task, data_dir: str) -> list:
  """The lines composition appends to the training split: the largest `num_disambiguating` any
  seed's mix (`mixes`) takes, drawn outside the task's other splits (read from `data_dir`); []
  when no seed takes any. Deterministic in `data_seed` (the run's `data.seed`), so every reader
  of the training set gets the same lines (`input_pipeline.load_data`, the loss terms' arrays
  of `training_examples`)."""
  need = max(m.num_disambiguating for m in mixes)
  if need <= 0:
    return []
  held_out = []
  for split in task.split_names:
    if split != "train":
      held_out += task.read_split(data_dir, split)
  return disambiguating_examples(task, need, int(data_seed), held_out)


def training_examples(mixes: Sequence[Mix], data_seed: int, task, data_dir: str) -> list:
  """The examples of the training set on device, row i = example i: the training split read
  from `data_dir`, then the disambiguating lines (`extra_training_examples`) when composition
  is active."""
  examples = task.read_split(data_dir, "train")
  if active(mixes):
    examples += extra_training_examples(mixes, data_seed, task, data_dir)
  return examples


def summary(mixes: Sequence[Mix], pools: Sequence[np.ndarray], facts: LineFacts,
            constructions: Sequence[str], first_seed: int = 0) -> list[str]:
  """Log lines: each distinct mix, its seeds and its pool's counts per construction."""
  lines = []
  seen: dict = {}
  for k, m in enumerate(mixes):
    seen.setdefault(m, []).append(k)
  for m, seeds in seen.items():
    p = pools[seeds[0]]
    split = p[p < facts.num_split]
    counts = np.bincount(facts.construction[split], minlength=len(constructions))
    ident = int(facts.identity[split].sum())
    lines.append(
        f"data mix of seeds {[first_seed + k for k in seeds]}: {len(p)} lines = {len(split)} "
        f"of the training split ({ident} identity, {len(split) - ident} transformed; subject "
        + ", ".join(f"{c} {n}" for c, n in zip(constructions, counts))
        + f"; {len(np.unique(facts.shape[split]))} sentence types) + "
        f"{m.num_disambiguating} disambiguating")
  return lines


def pools_array(pools: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
  """{'pools': int32 [S, P_max] (each row's tail repeats its last index), 'pool_sizes': int32
  [S]}: the per-seed pools as the training step reads them."""
  size = max(len(p) for p in pools)
  out = np.zeros((len(pools), size), np.int32)
  for k, p in enumerate(pools):
    out[k, :len(p)] = p
    out[k, len(p):] = p[-1] if len(p) else 0
  return {"pools": out, "pool_sizes": np.array([len(p) for p in pools], np.int32)}


def metric_rows(mixes: Sequence[Mix], pool_sizes: np.ndarray) -> dict:
  """{'data/<field>': [S] values, 'data/pool_size': [S]}: each seed's mix (`mixes`) as
  metrics.csv rows (step 0; `subject_mix` is recorded in config.json only, being text)."""
  rows = {f"data/{name}": np.array([float(getattr(m, name)) for m in mixes])
          for name in FIELDS if name != "subject_mix"}
  rows["data/pool_size"] = np.asarray(pool_sizes, np.float64)
  return rows
