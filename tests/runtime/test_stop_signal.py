"""A stop signal whose StopNow lands inside a callback Python cannot propagate out of (JAX's
garbage-collection callback, a __del__) prints nothing: the signal is recorded anyway."""

import gc
import signal
import sys

from sg_jax.runtime import stop_signal


class _RaisesInDel:
  def __init__(self, exc):
    self.exc = exc

  def __del__(self):
    raise self.exc


def test_stop_now_inside_a_callback_is_dropped_other_errors_are_passed_on(monkeypatch):
  seen = []
  monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(type(u.exc_value).__name__))
  with stop_signal.StopSignal():
    obj = _RaisesInDel(stop_signal.StopNow(signal.SIGTERM, "during start-up"))
    del obj
    gc.collect()
    assert not seen  # dropped: the loop stops on the recorded signal, in its one line
    obj = _RaisesInDel(ValueError("a real bug"))
    del obj
    gc.collect()
    assert seen == ["ValueError"]  # everything else reaches the previous hook
