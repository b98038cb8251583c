"""Question formation (McCoy et al. 2020; docs/REFERENCE.md §1 "Tasks").

Lines: `declarative . decl<TAB>declarative .` (identity) and
`declarative . quest<TAB>question ?` where the question fronts the *main* auxiliary (the
auxiliary of the main verb phrase). The competing linear rule fronts the *first* auxiliary; the two
disagree exactly when the subject carries a relative clause, and such `quest` lines go only to
`gen`. Trees follow the released `question_bracket.*` files: the question of `[ [ NP [ Aux X ] ] . ]`
is `[ Aux [ NP X ] ] ?`.

The metric (`question_prediction`, `question_target`, `question_rule_auxiliaries`, combined by
`QuestionTask.make_metrics`) is written in JAX; like every task module this one imports JAX only
inside those functions, when a metric is traced, so that `import sg_jax.tasks` (and `configlib`,
and data generation) stays JAX-free.
"""

from __future__ import annotations

import functools
from typing import Sequence

import numpy as np

from sg_jax.tasks import mccoy
from sg_jax.tasks import pcfg
from sg_jax.tasks import trees
from sg_jax.tasks import vocab as vocab_lib
from sg_jax.tasks.base import register_task
from sg_jax.tasks.examples import Example

AUXILIARIES = ("do", "does", "don't", "doesn't")
RELATIVE_PRONOUNS = ("who", "that")  # the `Rel` words of grammars/question.gr


def question_tree(source_tree: trees.Tree) -> trees.Tree:
  """Tree of the question formed by fronting the main auxiliary.

  Args:
    source_tree: `(S, ".")` with `S = (subject, (aux, rest))`.

  Returns:
    `((aux, (subject, rest)), "?")`.
  """
  s, _ = source_tree
  subject, (aux, rest) = s
  return ((aux, (subject, rest)), "?")


def linear_question(words: Sequence[str]) -> tuple:
  """Output of the linear rule: front the first auxiliary; `.` becomes `?`.

  Args:
    words: the declarative including its final `.`.
  """
  body = list(words[:-1])
  i = next(k for k, w in enumerate(body) if w in AUXILIARIES)
  return (body[i],) + tuple(body[:i] + body[i + 1:]) + ("?",)


def fronted(words: Sequence[str], k: int) -> tuple:
  """The question made by fronting the auxiliary at index `k` of the declarative `words`
  (including its final `.`, which becomes `?`)."""
  body = list(words[:-1])
  return (body[k],) + tuple(body[:k] + body[k + 1:]) + ("?",)


def question_foils(words: Sequence[str], question: Sequence[str]) -> dict:
  """{kind: question} of the linear rules' questions that differ from the correct `question`
  (the minimal-pair foils of `sg_jax.evaluation.minimal_pairs`):

  * `move_first`: front the first auxiliary (McCoy et al. 2020's linear rule);
  * `skip_relative`: front the first auxiliary not directly after `that`/`who`
    (`skip_relative_auxiliary`);
  * `move_last`: front the last auxiliary (a linear rule that also differs from the
    hierarchical one on in-domain lines with an auxiliary in an object relative clause, so
    in-domain lines get foils too).

  Args:
    words: the declarative including its final `.`.
    question: the correct question.
  """
  body = words[:-1]
  auxes = [k for k, w in enumerate(body) if w in AUXILIARIES]
  skips = [k for k in auxes if k == 0 or body[k - 1] not in RELATIVE_PRONOUNS]
  made = {"move_first": fronted(words, auxes[0]) if auxes else None,
          "skip_relative": fronted(words, skips[0]) if skips else None,
          "move_last": fronted(words, auxes[-1]) if auxes else None}
  return {kind: q for kind, q in made.items() if q is not None and q != tuple(question)}


def skip_relative_auxiliary(words: Sequence[str]) -> str:
  """The auxiliary fronted by the *skip-relative* rule: the first auxiliary not directly after a
  relative pronoun (`that`/`who`).

  A non-hierarchical rule that, like the hierarchical one, is right on every training question
  (no relative clause on the subject) and on gen lines whose subject carries a subject or
  intransitive relative clause, but fronts the relative clause's auxiliary when the subject
  carries an object-extracted relative clause (`her walruses who our unicorn doesn't entertain
  do ...`).
  The `grok_cpu` seeds that plateau at generalisation 0.65 follow it (README); the seed-vmapped
  metric is `question_rule_auxiliaries`.

  Args:
    words: the declarative (a final `.` is ignored).

  Raises:
    ValueError: no auxiliary outside that position.
  """
  for k, w in enumerate(words):
    if w in AUXILIARIES and (k == 0 or words[k - 1] not in RELATIVE_PRONOUNS):
      return w
  raise ValueError(f"no auxiliary outside a relative-pronoun position in {' '.join(words)!r}")


# Sentence-shape counts of the released files (identity lines of dev+test; all gen lines),
# `mccoy.sentence_shape` keys; see `mccoy.McCoyTask.generate_examples(shapes="released")`.
IN_DOMAIN_SHAPE_COUNTS = {
    ('PP', 'none'): 373,
    ('PP', 'obj:PP'): 372,
    ('PP', 'obj:RC-intrans'): 228,
    ('PP', 'obj:RC-obj'): 118,
    ('PP', 'obj:RC-subj'): 127,
    ('PP', 'obj:none'): 341,
    ('RC-intrans', 'none'): 104,
    ('RC-intrans', 'obj:PP'): 128,
    ('RC-intrans', 'obj:RC-intrans'): 81,
    ('RC-intrans', 'obj:RC-obj'): 42,
    ('RC-intrans', 'obj:RC-subj'): 41,
    ('RC-intrans', 'obj:none'): 120,
    ('RC-obj', 'none'): 216,
    ('RC-obj', 'obj:PP'): 248,
    ('RC-obj', 'obj:RC-intrans'): 152,
    ('RC-obj', 'obj:RC-obj'): 79,
    ('RC-obj', 'obj:RC-subj'): 86,
    ('RC-obj', 'obj:none'): 217,
    ('RC-subj', 'none'): 115,
    ('RC-subj', 'obj:PP'): 111,
    ('RC-subj', 'obj:RC-intrans'): 83,
    ('RC-subj', 'obj:RC-obj'): 49,
    ('RC-subj', 'obj:RC-subj'): 38,
    ('RC-subj', 'obj:none'): 116,
    ('none', 'none'): 35,
    ('none', 'obj:PP'): 897,
    ('none', 'obj:RC-intrans'): 581,
    ('none', 'obj:RC-obj'): 303,
    ('none', 'obj:RC-subj'): 309,
    ('none', 'obj:none'): 850,
}
GEN_SHAPE_COUNTS = {
    ('RC-intrans', 'none'): 1883,
    ('RC-intrans', 'obj:PP'): 685,
    ('RC-intrans', 'obj:none'): 636,
    ('RC-obj', 'none'): 1985,
    ('RC-obj', 'obj:PP'): 690,
    ('RC-obj', 'obj:none'): 658,
    ('RC-subj', 'none'): 2053,
    ('RC-subj', 'obj:PP'): 702,
    ('RC-subj', 'obj:none'): 708,
}


@functools.lru_cache(maxsize=1 << 16)
def _parse(words: tuple) -> pcfg.Derivation:
  """Cached parse of a source sentence (the released files are parsed by several checks)."""
  return pcfg.load_grammar("question").parse(words)


@register_task("question")
class QuestionTask(mccoy.McCoyTask):
  """Question formation: `decl` (identity) / `quest` (front the main auxiliary)."""
  eval_fields = ("transformed",)
  grammar_name = "question"
  identity_token = "decl"
  in_domain_shape_counts = IN_DOMAIN_SHAPE_COUNTS
  gen_shape_counts = GEN_SHAPE_COUNTS
  transformed_token = "quest"

  def extra_words(self) -> dict:
    return {**super().extra_words(), "?": "punct"}

  def source_derivation(self, words: Sequence[str]) -> pcfg.Derivation:
    return _parse(tuple(words))

  def gen_eligible(self, transformed: Example) -> bool:
    """A gen line must front a different auxiliary under the two rules (as every line of the
    released `question.gen`): when the relative clause's auxiliary equals the main one, the
    metric (the question's first word) cannot tell the rules apart. Such sentences are used in
    no split (their `quest` line is ambiguous, so it never goes to train/dev/test either)."""
    words = transformed.source[:-1]
    return linear_question(words)[0] != transformed.target[0]

  def lines_of(self, d: pcfg.Derivation) -> tuple[Example, Example, bool]:
    words = pcfg.words_of(d)
    tree = pcfg.to_tree(d)
    qtree = question_tree(tree)
    question = trees.leaves(qtree)
    ident = Example(source=words + ("decl",), target=words, source_tree=tree, target_tree=tree,
                    task_token="decl", transformed=False)
    trans = Example(source=words + ("quest",), target=question, source_tree=tree,
                    target_tree=qtree, task_token="quest", transformed=True)
    return ident, trans, linear_question(words) != question

  foil_kinds = ("move_first", "skip_relative", "move_last")

  def foils(self, example: Example, vocab: vocab_lib.Vocab) -> dict:
    """`question_foils` of a `quest` line (see `base.Task.foils`)."""
    del vocab
    return question_foils(example.source[:-1], example.target) if example.transformed else {}

  def make_metrics(self, vocab: vocab_lib.Vocab):
    """Auxiliary ranking after `quest` (`question_prediction`) on `quest` lines, and its
    agreement with the move-first and skip-relative rules (`question_rule_auxiliaries`); see
    `base.Task.make_metrics`."""
    import jax.numpy as jnp  # pylint: disable=import-outside-toplevel  (module docstring)
    aux_ids = jnp.asarray(vocab.encode(AUXILIARIES), jnp.int32)
    rel_ids = jnp.asarray(np.flatnonzero(np.asarray(vocab.pos_table) == vocab_lib.POS_REL),
                          jnp.int32)

    def metrics(batch, logits, decoded):
      del decoded
      sel = batch["valid"] & batch["transformed"]
      best = question_prediction(logits, batch["task_pos"], aux_ids)
      ok = best == question_target(batch["targets"], batch["task_pos"])
      move_first, skip_rel = question_rule_auxiliaries(batch["inputs"], batch["task_pos"],
                                                       aux_ids, rel_ids)
      return {"correct": jnp.sum(ok & sel).astype(jnp.float32),
              "total": jnp.sum(sel).astype(jnp.float32),
              "move_first_agreement": jnp.sum((best == move_first) & sel).astype(jnp.float32),
              "skip_relative_agreement": jnp.sum((best == skip_rel) & sel).astype(jnp.float32)}

    return metrics


# --------------------------------------------------------------------------------------------
# The metric (one seed, traced; arrays [batch, ...])
# --------------------------------------------------------------------------------------------


def question_prediction(logits_BxLxV, task_pos_B, aux_ids):
  """The auxiliary ranked first after `quest` (int32 [batch] vocabulary ids).

  Among the four auxiliaries {do, does, don't, doesn't}, the one with the highest next-token
  score at the task token (docs/REFERENCE.md §1 "Tasks").

  Args:
    logits_BxLxV: next-token logits of the teacher-forced line.
    task_pos_B: index t of the `quest`/`decl` token in the inputs; logits[t] predict the first
      word of the target.
    aux_ids: int32 [4] vocabulary ids of do, does, don't, doesn't.
  """
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel  (module docstring)
  at_task = jnp.take_along_axis(logits_BxLxV, task_pos_B[:, None, None], axis=1)[:, 0]  # [B, V]
  return aux_ids[jnp.argmax(at_task[:, aux_ids], axis=-1)]


def question_target(targets_BxL, task_pos_B):
  """The question's first word (int32 [batch] ids): targets[t] at t = task_pos."""
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel  (module docstring)
  return jnp.take_along_axis(targets_BxL, task_pos_B[:, None], axis=1)[:, 0]


def question_rule_auxiliaries(inputs_BxL, task_pos_B, aux_ids, rel_ids):
  """Auxiliaries fronted by two non-hierarchical rules (int32 [batch] ids each; -1 if none).

  * move-first (McCoy et al. 2020, the linear rule): the first auxiliary of the declarative
    (`linear_question`);
  * skip-relative: the first auxiliary not directly after a relative pronoun (`that`/`who`),
    i.e. move-first that skips the auxiliary of a subject relative clause
    (`skip_relative_auxiliary`). It agrees with the hierarchical rule on every training question
    and fails on gen lines whose subject carries an object-extracted relative clause; the
    `grok_cpu` seeds that plateau at generalisation 0.65 follow it (README).

  Args:
    inputs_BxL: `SOS w1 .. wn quest ...` input ids.
    task_pos_B: index of the task token in the inputs (the declarative is before it).
    aux_ids: int32 [4] ids of the auxiliaries.
    rel_ids: int32 [R] ids of the relative pronouns.
  """
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel  (module docstring)
  length = inputs_BxL.shape[1]
  in_source = jnp.arange(length)[None, :] < task_pos_B[:, None]
  is_aux = jnp.isin(inputs_BxL, aux_ids) & in_source
  after_rel = jnp.pad(jnp.isin(inputs_BxL, rel_ids)[:, :-1], ((0, 0), (1, 0)))

  def first_of(mask):
    i = jnp.argmax(mask, axis=1)
    word = jnp.take_along_axis(inputs_BxL, i[:, None], axis=1)[:, 0]
    return jnp.where(jnp.any(mask, axis=1), word, -1)

  return first_of(is_aux), first_of(is_aux & ~after_rel)
