"""Stop signals during a command's start-up, before its imports (seconds of JAX, orbax) finish.

Nothing is unsaved then, so SIGTERM/SIGINT end the process at once with one line and exit code 75
(`exit_codes.EXIT_PREEMPTED`), instead of a KeyboardInterrupt traceback from inside an import.
The command replaces these handlers with its own (`stop_signal.StopSignal`) once it starts
working. This module imports nothing of JAX (only `exit_codes`), so that it can be installed
first.
"""

import os
import signal

from sg_jax.runtime.exit_codes import EXIT_PREEMPTED


def _stop_during_imports(signum, frame):
  del frame
  os.write(2, f"stopped by signal {signum} during start-up (nothing to save yet); rerun the same "
              f"command to resume\n".encode())
  os._exit(EXIT_PREEMPTED)


def install() -> None:
  """Makes SIGTERM and SIGINT end the process at once with one line (call it from a command's
  `if __name__ == "__main__":` before its heavy imports)."""
  signal.signal(signal.SIGTERM, _stop_during_imports)
  signal.signal(signal.SIGINT, _stop_during_imports)
