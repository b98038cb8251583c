"""A command's known errors as one line and an exit code, written once for every command.

Each command (`sg_jax.main`, `analyze`, `prune`, `prune_core`, `report`, `data`, `sweep`) runs its
work inside `command_errors()`:

* `stop_signal.Preempted` (a SIGTERM/SIGINT stopped it): one warning line, `...; rerun the same
  command to resume`, and exit code `EXIT_PREEMPTED` (75), without the interpreter's teardown
  (XLA's teardown of compiled programs took 6-20 s on a 2-core CPU, too long after a preemption
  notice);
* a known error (`KNOWN_ERRORS`: ValueError, OSError and the project's `OneLineError`s, such as a
  checkpoint or workdir error or a held lock): `error: <message>` on stderr and exit code 1;
* anything else propagates with its traceback (a bug).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import Callable, Iterator

from sg_jax.runtime.exit_codes import EXIT_PREEMPTED, OneLineError
from sg_jax.runtime.stop_signal import Preempted

# Errors reported as one line: ValueError covers bad input (flags, config, data: DataError,
# ReportError), OSError unreadable or unwritable files, OneLineError the project's own.
KNOWN_ERRORS = (ValueError, OSError, OneLineError)


def exit_at_once(code: int) -> None:
  """Exits with `code` without the interpreter's teardown, after flushing the logs and streams
  (call it once everything the command wrote is closed)."""
  logging.shutdown()
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)  # pylint: disable=protected-access


@contextlib.contextmanager
def command_errors(on_error: Callable[[], None] | None = None,
                   exit_preempted: Callable[[int], None] = exit_at_once) -> Iterator[None]:
  """Within: `Preempted` and the known errors end the command as the module docstring says.

  Args:
    on_error: called before a known error ends the command (e.g. `sg_jax.main` checks its
      other processes first: a failed save may mean one died).
    exit_preempted: how a preempted command exits, given EXIT_PREEMPTED (`sg_jax.main` also
      tells the other processes of a multi-process run).

  Raises:
    SystemExit: with `error: <message>` for a known error.
  """
  try:
    yield
  except Preempted as e:
    logging.getLogger("sg_jax").warning("%s; rerun the same command to resume", e)
    exit_preempted(EXIT_PREEMPTED)
  except KNOWN_ERRORS as e:
    if on_error is not None:
      on_error()
    sys.exit(f"error: {e}")
