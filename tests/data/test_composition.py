"""Training-data composition per seed (sg_jax/data/composition.py): each control on hand-built line
facts, the disambiguating lines, and a seed of a mixed group equal to the same seed alone."""

import jax
import numpy as np
import pytest

from sg_jax import checkpointing, configlib, tasks, terms, train
from sg_jax.config import checks as config_checks
from sg_jax.data import composition
from sg_jax.data import input_pipeline
from sg_jax.tasks import mccoy

CONS = ("none", "PP", "RC-subj", "RC-obj", "RC-intrans")


def _facts():
  # 12 split lines + 3 disambiguating ones. identity: even lines; subject construction and
  # sentence type (0 = most frequent) per line.
  construction = np.array([0, 0, 1, 1, 2, 3, 3, 4, 0, 1, 3, 0, 2, 3, 4], np.int32)
  shape = np.array([0, 0, 1, 1, 2, 3, 3, 4, 0, 1, 3, 5, 6, 6, 6], np.int32)
  identity = np.arange(15) % 2 == 0
  identity[12:] = False
  return composition.LineFacts(identity=identity, construction=construction, shape=shape,
                               shapes=(), num_split=12)


def test_each_control_keeps_the_configured_lines():
  facts = _facts()
  pool = lambda **kw: composition.pool(composition.Mix(**kw), facts, CONS).tolist()
  assert pool() == list(range(12))
  assert pool(exclude_identity=True) == [1, 3, 5, 7, 9, 11]
  assert pool(num_types=2) == [0, 1, 2, 3, 8, 9]  # types 0 and 1
  # none:PP:RC-obj = 2:1:1 with the RCs other than RC-obj dropped: none has 4, PP 3, RC-obj 3
  # lines; the largest mix keeping 2:1:1 takes 4 none, 2 PP, 2 RC-obj (file order).
  assert pool(subject_mix="none=2,RC-subj=0,RC-intrans=0") == [0, 1, 2, 3, 5, 6, 8, 11]
  assert pool(subset_fraction=0.5) == list(range(6))
  assert pool(num_disambiguating=2) == list(range(12)) + [12, 13]
  # in order: exclusion, types, mix, subset, then the disambiguating lines
  assert pool(exclude_identity=True, num_types=2, subset_fraction=0.5,
              num_disambiguating=1) == [1, 3, 12]  # [1, 3, 9] -> half (2 lines)


def test_per_seed_values_and_bad_values(load_config):
  config = load_config("question", "tiny,seeds=4")
  configlib.set_field(config, "data.num_disambiguating", (0, 0, 100, 100))
  configlib.set_field(config, "data.exclude_identity", True)  # one value for all seeds
  mixes = composition.mixes_from_config(config)
  assert [m.num_disambiguating for m in mixes] == [0, 0, 100, 100]
  assert all(m.exclude_identity for m in mixes) and composition.active(mixes)
  configlib.set_field(config, "data.subset_fraction", (0.5, 1.0))
  with pytest.raises(ValueError, match="2 values for 4 seeds"):
    config_checks.validate(config)
  with pytest.raises(ValueError, match="subject_mix entry 'RC=1'"):
    composition.parse_mix("RC=1", CONS)
  assert composition.parse_mix("PP=0.5", CONS)["PP"] == 0.5


def test_disambiguating_lines_are_questions_with_relative_clauses_outside_held_out(tiny_data):
  task = tasks.get_task("question")
  held_out = [ex for split in ("dev", "test", "gen") for ex in task.read_split(tiny_data, split)]
  lines = composition.disambiguating_examples(task, 50, 0, held_out)
  assert len(lines) == 50 and len({ex.source for ex in lines}) == 50
  held = {tuple(ex.source[:-1]) for ex in held_out}
  for ex in lines:
    assert ex.transformed and tuple(ex.source[:-1]) not in held
    assert task.shape(ex)[0].startswith("RC-")
    # a disambiguating question: the linear rule fronts another auxiliary than the answer
    assert mccoy.sentence_shape(task.source_derivation(ex.source[:-1]))[0] != "none"


def _params_of(workdir, index):
  state = checkpointing.restore(workdir).state
  return np.concatenate([np.asarray(x[index]).ravel()
                         for x in jax.tree_util.tree_leaves(state["params"])])


@pytest.mark.slow
def test_a_seed_in_a_mixed_group_equals_the_seed_trained_alone(tiny_config, tmp_path):
  import run_files  # pylint: disable=import-outside-toplevel  (tests/ is on the path)
  fields = {"train.num_steps": 30, "eval.every": 30, "checkpoint.every": 30, "num_seeds": 3,
            "data.num_disambiguating": (0, 40, 40), "data.exclude_identity": (False, False, True)}
  group = str(tmp_path / "group")
  train.train_and_evaluate(tiny_config(**fields), group, tensorboard=False)
  alone = {}
  for k, (n, ex) in enumerate([(0, False), (40, False), (40, True)]):
    alone[k] = str(tmp_path / f"alone{k}")
    train.train_and_evaluate(tiny_config(**{**fields, "num_seeds": 1, "first_seed": k,
                                            "data.num_disambiguating": n,
                                            "data.exclude_identity": ex}),
                             alone[k], tensorboard=False)
  rows = run_files.rows(group)
  for k in range(3):
    np.testing.assert_allclose(_params_of(group, k), _params_of(alone[k], 0), atol=1e-5)
    mine = {(r[0], r[2]): r[3] for r in rows if r[1] == k}
    solo = {(r[0], r[2]): r[3] for r in run_files.rows(alone[k])}
    for key, value in solo.items():
      if key[1].startswith(("train/loss", "out_of_domain/accuracy")):
        assert mine[key] == pytest.approx(value, abs=1e-5), (k, key)
  # metrics.csv records each seed's mix (step 0)
  at0 = {(r[1], r[2]): r[3] for r in rows if r[0] == 0}
  assert [at0[(k, "data/num_disambiguating")] for k in range(3)] == [0, 40, 40]
  assert [at0[(k, "data/exclude_identity")] for k in range(3)] == [0, 0, 1]
  sizes = [at0[(k, "data/pool_size")] for k in range(3)]
  assert sizes[1] == sizes[0] + 40 and sizes[2] < sizes[1]
  # seed 0's mix is the default, so its lone run took the plain path (no pools): the group's pool
  # of every line drew exactly the plain path's lines
  assert not composition.active(composition.mixes_from_config(tiny_config(
      **{**fields, "num_seeds": 1, "first_seed": 0, "data.num_disambiguating": 0,
         "data.exclude_identity": False})))


def test_sas_arcs_cover_the_disambiguating_lines_too(tiny_config, tmp_path):
  """With both a data mix and the SAS regulariser, the arcs cover every training line (the
  appended disambiguating ones included), row for row with the training data."""
  config = tiny_config(**{"num_seeds": 2, "data.num_disambiguating": (0, 20),
                          "sas.lambdas": (0.0, 0.01)})
  data_options = input_pipeline.DataOptions.from_config(config)
  task, _, splits = input_pipeline.load_data(data_options, str(tmp_path))
  data, _ = input_pipeline.make_train_data(data_options, splits["train"], 2)
  examples = data_options.training_examples(str(tmp_path))
  loss_terms, schedules = terms.active(config), terms.schedules_from_config(config)
  arcs = terms.train_arrays(loss_terms, schedules, task, examples, data["inputs"].shape[1],
                            num_lines=data["inputs"].shape[0])
  np.testing.assert_array_equal(arcs["sas_lambda"], np.float32([0.0, 0.01]))
  assert arcs["dep_head"].shape[0] == data["inputs"].shape[0] == len(splits["train"])
  extra = composition.extra_training_examples(data_options.mixes, data_options.seed, task,
                                              config.data.dir)
  assert len(extra) == 20
  # the last row's arcs are those of the last disambiguating line
  from sg_jax.tasks import dependencies  # pylint: disable=import-outside-toplevel
  want = dependencies.dependency_arrays([task.gold_dependencies(extra[-1])],
                                        data["inputs"].shape[1])["dep_head"][0]
  np.testing.assert_array_equal(arcs["dep_head"][-1], want)
  with pytest.raises(ValueError, match="cover"):
    terms.train_arrays(loss_terms, schedules, task, examples, data["inputs"].shape[1],
                       num_lines=5)
