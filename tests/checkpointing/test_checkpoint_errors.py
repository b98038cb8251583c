"""How checkpoint read failures are reported: one short cause, no echo from orbax's coroutines."""
import logging
import sys
import types

from sg_jax.checkpointing import layout
from sg_jax.records import metric_logging


def test_error_cause_drops_tensorstore_spec_and_slices():
  e = Exception("Encountered error while reading array index: (slice(0, 1, 1), slice(None, None, "
                "None)). See full TensorStore details: <bound method spec of TensorStore({ "
                "'base': { 'driver': 'zarr', 'kvstore': {'path': 'a/b'} } })>")
  assert layout.error_cause(e) == "Encountered error while reading array index: (...)"


def test_error_cause_of_a_tensorstore_os_error_is_the_os_text():
  """Whatever tensorstore puts before its os_error_code (seen: a fragment of its spec, under a
  full disk in the reliability test), the cause is the OS's text for the code."""
  for text in ("Failed to write 69478 bytes to file 4: No space left on device "
               "[os_error_code='28']",
               "Error writing \"a/b\": {'base': {'recheck': true}'] [os_error_code=27]"):
    code = "28" if "28" in text else "27"
    expected = {"28": "No space left on device [errno 28]", "27": "File too large [errno 27]"}
    assert layout.error_cause(Exception(text)) == expected[code]


def _coroutine_from(filename):
  namespace = {}
  exec(compile("async def read():\n  pass\n", filename, "exec"), namespace)  # pylint: disable=exec-used
  return namespace["read"]()


def test_unraisable_reports_of_orbax_coroutines_are_dropped(monkeypatch):
  seen = []
  monkeypatch.setattr(sys, "unraisablehook", seen.append)
  layout._quiet_closed_loop_callbacks()  # pylint: disable=protected-access
  orbax_coro = _coroutine_from("/site-packages/orbax/checkpoint/_src/serialization/x.py")
  other_coro = _coroutine_from("/site-packages/mine/x.py")
  try:
    for obj in (orbax_coro, other_coro):
      sys.unraisablehook(types.SimpleNamespace(exc_type=Exception, exc_value=Exception("read"),
                                               exc_traceback=None, err_msg=None, object=obj))
  finally:
    orbax_coro.close()
    other_coro.close()
  assert [u.object for u in seen] == [other_coro]


def _asyncio_record(message):
  return logging.LogRecord("asyncio", logging.ERROR, "base_events.py", 1771, message, None, None)


def test_orphan_futures_of_a_failed_save_are_dropped_and_others_kept():
  quiet = metric_logging._DropOrbaxOrphanTasks()  # pylint: disable=protected-access
  failed_write = ("_GatheringFuture exception was never retrieved\nfuture: <_GatheringFuture "
                  "finished exception=ValueError('OUT_OF_RANGE: Error writing \"a/0.0\" at local "
                  "file \"/w/checkpoints/60.orbax-checkpoint-tmp/state/\": File too large')>")
  assert not quiet.filter(_asyncio_record(failed_write))
  assert quiet.filter(_asyncio_record("Future exception was never retrieved\nfuture: <Future "
                                      "finished exception=ValueError('mine')>"))
  assert quiet.filter(_asyncio_record("Executing <Task> took 0.2 seconds"))
