"""Data generation during training says what it generates and logs its progress."""

import logging
import re

import pytest

from sg_jax import tasks
from sg_jax.tasks import base


def test_generation_for_a_run_logs_what_and_how_far(tmp_path, monkeypatch, caplog):
  monkeypatch.setattr(base, "LOG_PROGRESS_EVERY_S", 0.2)
  caplog.set_level(logging.INFO, logger="sg_jax")
  tasks.get_task("question").ensure_data(tmp_path / "data", seed=3, num_train=200)
  messages = [r.getMessage() for r in caplog.records if r.name == "sg_jax"]
  assert messages[0] == (f"generating question data (seed 3) into {tmp_path / 'data'}: "
                         f"train 200, dev 1,000, test 10,000, gen 10,000 lines"), messages[:3]
  progress = [m for m in messages
              if re.fullmatch(r"question lines: \d+/21200 lines, .*line/s, \d\d:\d\d elapsed, "
                              r"\d\d:\d\d left", m)]
  assert progress and progress[-1].startswith("question lines: 21200/21200"), messages
  assert all("\r" not in m and "\n" not in m for m in messages)
  assert re.fullmatch(r"generated question data in \d+ s", messages[-1]), messages[-1]
  # Present files are not generated again, and nothing is logged for them.
  caplog.clear()
  tasks.get_task("question").ensure_data(tmp_path / "data", seed=3, num_train=200)
  assert not [r for r in caplog.records if r.name == "sg_jax"]


def test_short_generations_log_no_progress_lines(caplog):
  caplog.set_level(logging.INFO, logger="sg_jax")
  tasks.get_task("dyck").generate_examples(seed=0, sizes={"train": 50, "val": 10, "test": 10},
                                           progress="log")
  assert not caplog.records  # under LOG_PROGRESS_EVERY_S seconds: no line at all


def test_progress_must_be_a_known_mode():
  with pytest.raises(ValueError, match="progress must be True, False or 'log', got 'yes'"):
    base.progress_bar(10, "x", "line", "yes")
