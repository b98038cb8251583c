"""Tense reinflection (McCoy et al. 2020; docs/REFERENCE.md §1 "Tasks").

Sentences are sampled in the present tense from `tense.gr` (where verbs agree in number with their
subjects). Lines: `past sentence . PAST<TAB>past sentence .` (identity) and
`past sentence . PRESENT<TAB>present sentence .`. The hierarchical rule makes each verb agree with
its subject; the competing linear rule makes it agree with the most recent preceding noun. They
disagree exactly when a noun of the other number intervenes between the subject and the main verb;
such `PRESENT` lines go only to `gen`.

Past-tense forms (checked against every verb of the released tense files): regular `-ed`/`-d`
(`high_five` -> `high_fived`, `comfort` -> `comforted`) except `ate`, `read`, `slept`, `swam`.

The metric (`tense_correct`, scored by `TenseTask.make_metrics` on the greedy continuation) is
written in JAX, imported inside those functions only (see `sg_jax.tasks.question`).
"""

from __future__ import annotations

import functools
from typing import Sequence

from sg_jax.tasks import mccoy
from sg_jax.tasks import pcfg
from sg_jax.tasks import vocab as vocab_lib
from sg_jax.tasks.base import register_task
from sg_jax.tasks.examples import Example

IRREGULAR_PAST = {"eat": "ate", "read": "read", "sleep": "slept", "swim": "swam"}


def past_of(lemma: str) -> str:
  """Past-tense form of a verb lemma (= the plural present form), e.g. `high_five` -> `high_fived`."""
  if lemma in IRREGULAR_PAST:
    return IRREGULAR_PAST[lemma]
  return lemma + ("d" if lemma.endswith("e") else "ed")


@functools.lru_cache(maxsize=None)
def _tables():
  g = pcfg.load_grammar("tense")
  lex = g.preterminal_words()
  noun_number, lemma_of, forms = {}, {}, {}
  for word, labels in lex.items():
    label = labels[0]
    if label.startswith("N_"):
      noun_number[word] = label[-2:]
  for lhs, alts in g.rules.items():
    if lhs.startswith("V_") and lhs.endswith("_pl"):
      for (w,), _ in alts:
        lemma_of[w] = w
        lemma_of[w + "s"] = w
        forms[w] = {"pl": w, "sg": w + "s", "past": past_of(w)}
  for lhs, alts in g.rules.items():  # sanity: every singular form is lemma + "s"
    if lhs.startswith("V_") and lhs.endswith("_sg"):
      for (w,), _ in alts:
        assert w in lemma_of, w
  past_to_lemma = {f["past"]: lemma for lemma, f in forms.items()}
  return noun_number, lemma_of, forms, past_to_lemma


def to_past(word: str) -> str:
  """Past form of a present-tense verb form; other words unchanged."""
  _, lemma_of, forms, _ = _tables()
  lemma = lemma_of.get(word)
  return forms[lemma]["past"] if lemma is not None else word


def past_forms() -> tuple:
  """All past-tense verb forms, sorted."""
  return tuple(sorted(_tables()[3]))


@functools.lru_cache(maxsize=None)
def past_grammar() -> pcfg.Grammar:
  """`tense.gr` with every verb replaced by its past form (parses the source sentences)."""
  return pcfg.load_grammar("tense").map_terminals(
      lambda lhs, w: to_past(w) if lhs.startswith("V_") else w)


def present_of_derivation(d: pcfg.Derivation) -> tuple:
  """Present-tense words of a (past or present) derivation: each verb agrees with the number of
  its preterminal label, i.e. with its subject (the hierarchical rule)."""
  _, lemma_of, forms, past_to_lemma = _tables()
  out = []

  def walk(x, label):
    if isinstance(x, str):
      if label.startswith("V_"):
        lemma = lemma_of.get(x) or past_to_lemma[x]
        out.append(forms[lemma][label[-2:]])
      else:
        out.append(x)
      return
    for k in x[2]:
      walk(k, x[0])

  walk(d, "ROOT")
  return tuple(out)


def linear_present(past_words: Sequence[str]) -> tuple:
  """Output of the linear rule: each verb agrees with the most recent preceding noun."""
  noun_number, _, forms, past_to_lemma = _tables()
  out, number = [], None
  for w in past_words:
    if w in noun_number:
      number = noun_number[w]
    if w in past_to_lemma:
      out.append(forms[past_to_lemma[w]][number])
    else:
      out.append(w)
  return tuple(out)


def tense_foils(past: Sequence[str], present: Sequence[str], main_verb: int) -> dict:
  """{kind: present sentence} of the minimal-pair foils of a `PRESENT` line (`sg_jax.evaluation.minimal_pairs`):
  the correct `present` with its main verb (index `main_verb`) replaced by

  * `attractor`: the form agreeing with the most recent noun before it (`linear_present`: the
    attractor noun of a relative clause or prepositional phrase on the subject), where that
    differs from the correct form;
  * `number`: the form of the other number (every line with a main verb).
  """
  if main_verb < 0:
    return {}
  _, lemma_of, forms, _ = _tables()
  correct = present[main_verb]
  lemma = lemma_of[correct]
  other = forms[lemma]["pl" if forms[lemma]["sg"] == correct else "sg"]
  swap = lambda w: tuple(present[:main_verb]) + (w,) + tuple(present[main_verb + 1:])
  out = {"number": swap(other)}
  linear = linear_present(past)[main_verb]
  if linear != correct:
    out["attractor"] = swap(linear)
  return out


# Sentence-shape counts of the released files (identity lines of dev+test; all gen lines),
# `mccoy.sentence_shape` keys; see `mccoy.McCoyTask.generate_examples(shapes="released")`.
IN_DOMAIN_SHAPE_COUNTS = {
    ('PP', 'none'): 603,
    ('PP', 'obj:PP'): 568,
    ('PP', 'obj:RC-intrans'): 183,
    ('PP', 'obj:RC-obj'): 184,
    ('PP', 'obj:RC-subj'): 186,
    ('PP', 'obj:none'): 527,
    ('RC-intrans', 'none'): 165,
    ('RC-intrans', 'obj:PP'): 185,
    ('RC-intrans', 'obj:RC-intrans'): 65,
    ('RC-intrans', 'obj:RC-obj'): 66,
    ('RC-intrans', 'obj:RC-subj'): 65,
    ('RC-intrans', 'obj:none'): 171,
    ('RC-obj', 'none'): 177,
    ('RC-obj', 'obj:PP'): 164,
    ('RC-obj', 'obj:RC-intrans'): 65,
    ('RC-obj', 'obj:RC-obj'): 61,
    ('RC-obj', 'obj:RC-subj'): 75,
    ('RC-obj', 'obj:none'): 209,
    ('RC-subj', 'none'): 192,
    ('RC-subj', 'obj:PP'): 169,
    ('RC-subj', 'obj:RC-intrans'): 69,
    ('RC-subj', 'obj:RC-obj'): 59,
    ('RC-subj', 'obj:RC-subj'): 67,
    ('RC-subj', 'obj:none'): 179,
    ('none', 'none'): 260,
    ('none', 'obj:PP'): 526,
    ('none', 'obj:RC-intrans'): 198,
    ('none', 'obj:RC-obj'): 192,
    ('none', 'obj:RC-subj'): 179,
    ('none', 'obj:none'): 575,
}
GEN_SHAPE_COUNTS = {
    ('PP', 'none'): 1537,
    ('PP', 'obj:PP'): 1467,
    ('PP', 'obj:RC-intrans'): 477,
    ('PP', 'obj:RC-obj'): 513,
    ('PP', 'obj:RC-subj'): 530,
    ('PP', 'obj:none'): 1521,
    ('RC-obj', 'none'): 524,
    ('RC-obj', 'obj:PP'): 502,
    ('RC-obj', 'obj:RC-intrans'): 148,
    ('RC-obj', 'obj:RC-obj'): 137,
    ('RC-obj', 'obj:RC-subj'): 167,
    ('RC-obj', 'obj:none'): 527,
    ('RC-subj', 'none'): 475,
    ('RC-subj', 'obj:PP'): 492,
    ('RC-subj', 'obj:RC-intrans'): 172,
    ('RC-subj', 'obj:RC-obj'): 157,
    ('RC-subj', 'obj:RC-subj'): 164,
    ('RC-subj', 'obj:none'): 490,
}


@functools.lru_cache(maxsize=1 << 16)
def _parse(words: tuple) -> pcfg.Derivation:
  """Cached parse of a source sentence (the released files are parsed by several checks)."""
  return past_grammar().parse(words)


@register_task("tense")
class TenseTask(mccoy.McCoyTask):
  """Tense reinflection: `PAST` (identity) / `PRESENT` (re-inflect, verbs agree with subjects)."""
  eval_fields = ("main_verb_pos",)
  decodes = True
  grammar_name = "tense"
  identity_token = "PAST"
  in_domain_shape_counts = IN_DOMAIN_SHAPE_COUNTS
  gen_shape_counts = GEN_SHAPE_COUNTS
  transformed_token = "PRESENT"

  def extra_words(self) -> dict:
    return {**super().extra_words(), **{w: "V" for w in past_forms()}}

  def source_derivation(self, words: Sequence[str]) -> pcfg.Derivation:
    return _parse(tuple(words))

  def lines_of(self, d: pcfg.Derivation) -> tuple[Example, Example, bool]:
    present = present_of_derivation(d)
    past = tuple(to_past(w) for w in present)
    tree = mccoy.tree_with_leaves(pcfg.to_tree(d), past)
    ptree = mccoy.tree_with_leaves(tree, present)
    ident = Example(source=past + ("PAST",), target=past, source_tree=tree, target_tree=tree,
                    task_token="PAST", transformed=False)
    trans = Example(source=past + ("PRESENT",), target=present, source_tree=tree,
                    target_tree=ptree, task_token="PRESENT", transformed=True)
    return ident, trans, linear_present(past) != present

  foil_kinds = ("attractor", "number")

  def foils(self, example: Example, vocab: vocab_lib.Vocab) -> dict:
    """`tense_foils` of a `PRESENT` line (see `base.Task.foils`)."""
    if not example.transformed:
      return {}
    return tense_foils(example.source[:-1], example.target,
                       vocab_lib.main_verb_index(example.target, vocab))

  def make_metrics(self, vocab: vocab_lib.Vocab):
    """Greedy continuation after the task token scored by `tense_correct` (same part-of-speech
    sequence and main verb) on every line; see `base.Task.make_metrics`."""
    import jax.numpy as jnp  # pylint: disable=import-outside-toplevel  (module docstring)
    pos_table = jnp.asarray(vocab.pos_table, jnp.int32)

    def metrics(batch, logits, decoded):
      del logits
      valid = batch["valid"]
      ok = tense_correct(decoded, batch["targets"], batch["task_pos"], batch["lengths"],
                         batch["main_verb_pos"], pos_table)
      return {"correct": jnp.sum(ok & valid).astype(jnp.float32),
              "total": jnp.sum(valid).astype(jnp.float32)}

    return metrics


def tense_correct(decoded_BxL, targets_BxL, task_pos_B, lengths_B, main_verb_pos_B, pos_table):
  """Tense metric per line (bool [batch]): same part-of-speech sequence and same main verb.

  The part-of-speech sequences (`pos_table`: int32 [vocab] class of each id) are compared over
  the target half including EOS (positions task_pos .. length-1 of `targets`), so the decoded
  sentence (`decoded_BxL`, the greedy continuation aligned with the targets) must also end where
  the target ends; `main_verb_pos_B` is the target index of the main verb (-1: none, never
  correct).
  """
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel  (module docstring)
  span = (jnp.arange(targets_BxL.shape[1])[None] >= task_pos_B[:, None]) & (
      jnp.arange(targets_BxL.shape[1])[None] < lengths_B[:, None])
  same_pos = (pos_table[decoded_BxL] == pos_table[targets_BxL]) | ~span
  mv = jnp.maximum(main_verb_pos_B, 0)[:, None]
  same_verb = (jnp.take_along_axis(decoded_BxL, mv, 1) == jnp.take_along_axis(targets_BxL, mv, 1))
  return jnp.all(same_pos, axis=-1) & same_verb[:, 0] & (main_verb_pos_B >= 0)
