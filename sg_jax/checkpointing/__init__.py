"""Orbax checkpoints of a multi-seed run: `WORKDIR/checkpoints/<step>/{state,meta}`.

`state` holds the stacked per-seed `TrainState` (parameters, optimiser state, step, PRNG key data,
divergence flags), every array with a leading seed axis `[seed, ...]`. `meta` (JSON) holds the
resolved config, the vocabulary and the list of seed ids, so that the analysis can rebuild the
model from a workdir alone. Checkpoints are written by orbax, which commits a step atomically
(a half-written step is never listed), and are kept forever by default because the analysis
needs the whole trajectory.

A checkpoint whose arrays have other shapes (or another structure) than the run's config gives
was written with another config: restoring it is refused (`CheckpointMismatch`) and nothing is
moved. Only a checkpoint that cannot be read for another reason is moved aside, to
`WORKDIR/corrupt_checkpoints/`. Every manager and checkpointer made here is closed after use.

A preservation policy (`checkpoint.keep_full` > 0, module `policy`) keeps only the newest full
states (in `WORKDIR/full_states/`) and parameter-only checkpoints for the analysis in
`checkpoints/`; the default keeps every checkpoint's full state.

Modules: `layout` (paths, managers, metadata, errors), `policy` (what a run keeps), `writer`
(saves, fault injection) and `reader` (restores, inspection, the resume-time fallback); their
public names are imported here.
"""

from sg_jax.checkpointing.layout import (ANALYSIS_FIELDS, CHECKPOINT_DIR, FULL_STATE_DIR,
                                         CheckpointError, CheckpointMismatch,
                                         CheckpointWriteError, WorkdirError, all_steps,
                                         checkpoint_dir, error_cause, make_manager, make_meta,
                                         read_meta, temporary_folders)
from sg_jax.checkpointing.policy import (Preservation, analysis_state, disk_bytes_per_seed,
                                         state_bytes)
from sg_jax.checkpointing.reader import (Restored, diverged_seeds, is_analysis_only, quarantine,
                                         restore, restore_latest_good, restore_seed_params,
                                         stored_arrays)
from sg_jax.checkpointing.writer import (DISK_FULL_AT_SAVE_ENV, DISK_FULL_BYTES,
                                         KILL_DURING_SAVE_ENV, CheckpointWriter, save, wait)

__all__ = [
    "ANALYSIS_FIELDS", "FULL_STATE_DIR", "Preservation", "analysis_state", "disk_bytes_per_seed",
    "state_bytes", "is_analysis_only", "CHECKPOINT_DIR", "CheckpointError", "CheckpointMismatch", "CheckpointWriteError",
    "WorkdirError", "all_steps", "checkpoint_dir", "error_cause", "make_manager", "make_meta",
    "read_meta", "temporary_folders", "Restored", "diverged_seeds", "quarantine", "restore",
    "restore_latest_good",
    "restore_seed_params", "stored_arrays", "DISK_FULL_AT_SAVE_ENV", "DISK_FULL_BYTES",
    "KILL_DURING_SAVE_ENV", "CheckpointWriter", "save", "wait",
]
