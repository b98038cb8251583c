"""Question formation (McCoy et al. 2020; docs/REFERENCE.md §1 "Tasks").

Lines: `declarative . decl<TAB>declarative .` (identity) and
`declarative . quest<TAB>question ?` where the question fronts the *main* auxiliary (the
auxiliary of the main verb phrase). The competing linear rule fronts the *first* auxiliary; the two
disagree exactly when the subject carries a relative clause, and such `quest` lines go only to
`gen`. Trees follow the released `question_bracket.*` files: the question of `[ [ NP [ Aux X ] ] . ]`
is `[ Aux [ NP X ] ] ?`.
"""

from __future__ import annotations

import functools
from typing import Sequence

from sg_jax.tasks import mccoy
from sg_jax.tasks import pcfg
from sg_jax.tasks import trees
from sg_jax.tasks import vocab as vocab_lib
from sg_jax.tasks.base import Example, register_task

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


def skip_relative_auxiliary(words: Sequence[str]) -> str:
  """The auxiliary fronted by the *skip-relative* rule: the first auxiliary not directly after a
  relative pronoun (`that`/`who`).

  A non-hierarchical rule that, like the hierarchical one, is right on every training question
  (no relative clause on the subject) and on gen lines whose subject carries a subject or
  intransitive relative clause, but fronts the relative clause's auxiliary when the subject
  carries an object-extracted relative clause (`her walruses who our unicorn doesn't entertain
  do ...`).
  The `grok_cpu` seeds that plateau at generalisation 0.65 follow it (README); the seed-vmapped
  metric is `evaluation.question_rule_auxiliaries`.

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

  def make_metrics(self, vocab: vocab_lib.Vocab):
    """Auxiliary ranking after `quest` (`evaluation.question_prediction`) on `quest` lines, and
    its agreement with the move-first and skip-relative rules
    (`evaluation.question_rule_auxiliaries`); see `base.Task.make_metrics`."""
    import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel
    from sg_jax import evaluation  # pylint: disable=import-outside-toplevel
    aux_ids = jnp.asarray(vocab.encode(AUXILIARIES), jnp.int32)
    rel_ids = jnp.asarray(np.flatnonzero(np.asarray(vocab.pos_table) == vocab_lib.POS_REL),
                          jnp.int32)

    def metrics(batch, logits, decoded):
      del decoded
      sel = batch["valid"] & batch["transformed"]
      best = evaluation.question_prediction(logits, batch["task_pos"], aux_ids)
      ok = best == evaluation.question_target(batch["targets"], batch["task_pos"])
      move_first, skip_rel = evaluation.question_rule_auxiliaries(
          batch["inputs"], batch["task_pos"], aux_ids, rel_ids)
      return {"correct": jnp.sum(ok & sel).astype(jnp.float32),
              "total": jnp.sum(sel).astype(jnp.float32),
              "move_first_agreement": jnp.sum((best == move_first) & sel).astype(jnp.float32),
              "skip_relative_agreement": jnp.sum((best == skip_rel) & sel).astype(jnp.float32)}

    return metrics
