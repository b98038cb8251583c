"""What a command needs around its work: the workdir's guards, stop signals and exits.

One module per concern; nothing is imported here, so that `startup_signals` and `exit_codes`
stay light (a command installs them before its heavy imports):

* `exit_codes`: the exit code of a stopped command and how long a stop may take.
* `startup_signals`: SIGTERM/SIGINT during a command's imports (one line, exit 75).
* `stop_signal`: SIGTERM/SIGINT during the work (`StopSignal`, `StopNow`, `Preempted`).
* `config_changes`: which config fields may change when a workdir is resumed (the rules).
* `resume_check`: refuses to resume a workdir written with a config it may not continue.
* `writability`: creates the workdir and checks it can be written.
* `call_sizer`: steps per compiled call, so that a call ends within `train.max_call_seconds`.
* `workdir_lock`: one writer per workdir.
* `commands`: a command's known errors as one line and an exit code (`command_errors`).
"""
