"""Exit codes and stop timing shared by every command (imports nothing, so that the lightest
command and the start-up signal handlers can use them).

`EXIT_PREEMPTED` (75, EX_TEMPFAIL) is the exit code of a command stopped by SIGTERM/SIGINT:
rerunning the same command resumes it (`sg_jax.sweep` counts such a job as preempted, not failed).
"""

EXIT_PREEMPTED = 75  # a SIGTERM/SIGINT stopped the command; rerun it to resume (EX_TEMPFAIL)

# The command line's bound, in seconds, on stopping at once: a signal that should stop a command
# at once but has not reached the main thread within this time (one long native call: an XLA
# compilation or device computation) ends the process (`stop_signal.StopSignal(exit_after=...)`).
STOP_EXIT_SECONDS = 2.0


class OneLineError(Exception):
  """An error whose message says all a user needs (what failed and what to do): a command reports
  it as the one line `error: <message>` with exit code 1, without a traceback
  (`commands.command_errors`). The project's own error classes derive from it (e.g.
  `checkpointing.CheckpointError`, `workdir_lock.LockHeld`); ValueError and OSError are reported
  the same way."""
