#!/usr/bin/env bash
# SLURM launcher for sg_jax (multi-node GPU clusters): writes an sbatch script and submits it.
# Bash 4.4+ on the submitting machine.
#
# Usage: launch/slurm.sh train --workdir=DIR [options] -- ARGS for sg_jax.main
#        launch/slurm.sh sweep --root=DIR [options] -- ARGS for sg_jax.sweep
#
# Commands:
#   train   one task per node on --nodes nodes, each `python -m sg_jax.main ARGS --workdir=DIR
#           --multihost`: the tasks form one jax.distributed job and shard the seed axis over
#           the GPUs of all nodes
#   sweep   one task on one node, `python -m sg_jax.sweep ARGS --root=DIR` (the sweep driver is
#           single-host; it runs one sg_jax.main per depth on that node's GPUs)
#
# Options (before --):
#   --workdir=DIR / --root=DIR  the sg_jax workdir (train) or sweep root (sweep), required: an
#                          absolute path on storage every node shares (not /tmp or a node's local
#                          disk); the job log and a copy of the script go to DIR/slurm/
#   --nodes=N              nodes (train only; default 1)
#   --gpus_per_node=G      GPUs per node (default 1; TYPE:G such as a100:4 picks a GPU type;
#                          0 = CPU nodes)
#   --cpus_per_task=C      CPU cores of the task on each node (default 8; 0 = cluster default);
#                          XLA compiles on them
#   --partition=P --account=A --time=LIMIT   the usual sbatch options (LIMIT as sbatch takes it,
#                          e.g. 04:00:00 or 2-00:00:00); unset = cluster default
#   --job_name=NAME        default sg_jax-<basename of DIR>
#   --signal_secs=S        SIGTERM reaches sg_jax S seconds before the time limit (default 300):
#                          it checkpoints and exits 75, and the job requeues itself
#   --setup=CMD            a shell line run in the job before sg_jax (e.g. 'module load cuda',
#                          'source ~/venvs/sg/bin/activate'); repeatable
#   --sbatch=OPTION        an extra #SBATCH option (e.g. --sbatch=--qos=high); repeatable
#   --dry_run              print the sbatch script instead of submitting it
#
# Preemption and time limits: the job is requeueable (--requeue). sbatch's --signal=TERM@S sends
# SIGTERM to the sg_jax process S seconds before the limit (straight to the srun task: SIGTERM
# sent to srun itself would make it kill its tasks at once); sg_jax finishes the current compiled
# call, writes a checkpoint and exits with code 75, and the script then runs `scontrol requeue`:
# the job waits in the queue again and resumes from that checkpoint (the log is appended to).
# Exit code 0 ends the job; any other code fails it.
#
# jax.distributed.initialize() (sg_jax.main --multihost) reads SLURM_JOB_ID (the coordinator
# port), SLURM_STEP_NODELIST (its first node is the coordinator), SLURM_NTASKS (process count),
# SLURM_PROCID (process id) and SLURM_LOCALID, which srun sets in each task. From SLURM_LOCALID
# JAX would give each process only one GPU (one process per GPU), so the script exports
# JAX_LOCAL_DEVICE_IDS=0,...,G-1: one process per node drives all its GPUs.
#
# The job runs in this checkout (it must be visible from the compute nodes, e.g. in $HOME), with
# the environment of the submitting shell (sbatch's default) plus the --setup lines.
#
# Example:
#   launch/slurm.sh train --workdir=/shared/$USER/runs/q6 --nodes=2 --gpus_per_node=4 \
#       --partition=gpu --time=04:00:00 -- --config=configs/question.py:depth=6,seeds=64
#   launch/slurm.sh sweep --root=/shared/$USER/runs/qf --gpus_per_node=1 --time=1-00:00:00 -- \
#       --config=configs/question.py --depths=2,4,6,8,10 --seeds=10
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$HERE/.." && pwd)"
source "$HERE/common.sh"

COMMAND=${1:-}
case "$COMMAND" in -h|--help|help) usage "${BASH_SOURCE[0]}"; exit 0 ;; esac
USAGE="launch/slurm.sh train|sweep --workdir=DIR|--root=DIR [options] -- ARGS"
[[ -n "$COMMAND" && "$COMMAND" != -* ]] || die "usage: $USAGE (--help: commands and options)"
shift
WORKDIR="" ROOT="" NODES=1 GPUS=1 CPUS=8 PARTITION="" ACCOUNT="" TIME="" JOB_NAME=""
SIGNAL_SECS=300
SETUP=() EXTRA_SBATCH=() JOB_ARGS=()
while (($#)); do
  case "$1" in
    --workdir=*) WORKDIR=${1#*=} ;;
    --root=*) ROOT=${1#*=} ;;
    --nodes=*) NODES=${1#*=} ;;
    --gpus_per_node=*) GPUS=${1#*=} ;;
    --cpus_per_task=*) CPUS=${1#*=} ;;
    --partition=*) PARTITION=${1#*=} ;;
    --account=*) ACCOUNT=${1#*=} ;;
    --time=*) TIME=${1#*=} ;;
    --job_name=*) JOB_NAME=${1#*=} ;;
    --signal_secs=*) SIGNAL_SECS=${1#*=} ;;
    --setup=*) SETUP+=("${1#*=}") ;;
    --sbatch=*) EXTRA_SBATCH+=("${1#*=}") ;;
    --dry_run) DRY_RUN=1 ;;
    -h|--help) usage "${BASH_SOURCE[0]}"; exit 0 ;;
    --) shift; JOB_ARGS=("$@"); break ;;
    *) die "unknown option $1 (options go before --, sg_jax arguments after it)" ;;
  esac
  shift
done

case "$COMMAND" in
  train)
    MODULE=sg_jax.main DIR_FLAG=--workdir DIR=$WORKDIR
    [[ -z "$ROOT" ]] || die "train takes --workdir=DIR (--root is for sweep)" ;;
  sweep)
    MODULE=sg_jax.sweep DIR_FLAG=--root DIR=$ROOT
    [[ -z "$WORKDIR" ]] || die "sweep takes --root=DIR (--workdir is for train)"
    [[ "$NODES" == 1 ]] ||
      die "sweep runs on one node (the sweep driver is single-host); use train for several nodes"
    ;;
  *) die "unknown command $COMMAND (train, sweep)" ;;
esac

# Local disks and memory file systems: a path there differs from node to node (and vanishes
# with the job), so checkpoints written there cannot be resumed by a requeued job.
NODE_LOCAL=(/tmp /var/tmp /dev/shm /run /local /lscratch /localscratch /scratch/local
            /scratch_local /state/partition1)
[[ -n "${TMPDIR:-}" && "${TMPDIR%/}" != "" ]] && NODE_LOCAL+=("${TMPDIR%/}")

# Prints the node-local prefix that path $1 (or its canonical form) lies under; fails if none.
node_local_prefix() {
  local canon p c
  canon=$(realpath -m -- "$1" 2>/dev/null || printf '%s' "$1")
  for p in "${NODE_LOCAL[@]}"; do
    for c in "$1" "$canon"; do
      if [[ "$c" == "$p" || "$c" == "$p"/* ]]; then
        printf '%s' "$p"
        return 0
      fi
    done
  done
  return 1
}

[[ -n "$DIR" ]] || die "$COMMAND needs $DIR_FLAG=DIR: an absolute path on storage all nodes share"
[[ "$DIR" == /* ]] ||
  die "$DIR_FLAG must be an absolute path (the job runs on other nodes), got $DIR"
if [[ "$DIR" =~ [[:space:]\'\"] ]]; then
  die "$DIR_FLAG must not contain spaces or quotes (it goes into #SBATCH lines), got $DIR"
fi
if prefix=$(node_local_prefix "$DIR"); then
  die "$DIR_FLAG=$DIR is under $prefix, which is local to each node: give a directory on" \
      "shared storage (e.g. in \$HOME or a cluster file system)"
fi
DIR=${DIR%/}
if prefix=$(node_local_prefix "$REPO_ROOT"); then
  echo "warning: this checkout ($REPO_ROOT) is under $prefix; the compute nodes may not see it" >&2
fi

[[ "$NODES" =~ ^[1-9][0-9]*$ ]] || die "--nodes must be a positive integer, got $NODES"
[[ "$GPUS" =~ ^([A-Za-z0-9_-]+:)?[0-9]+$ ]] ||
  die "--gpus_per_node must be a count (or TYPE:COUNT, e.g. a100:4), got $GPUS"
NUM_GPUS=$((10#${GPUS##*:}))
[[ "$CPUS" =~ ^[0-9]+$ ]] || die "--cpus_per_task must be a non-negative integer, got $CPUS"
[[ "$SIGNAL_SECS" =~ ^[1-9][0-9]*$ ]] ||
  die "--signal_secs must be a positive number of seconds, got $SIGNAL_SECS"
JOB_NAME=${JOB_NAME:-sg_jax-$(basename "$DIR")}
[[ "$JOB_NAME" =~ ^[A-Za-z0-9_.+-]+$ ]] ||
  die "--job_name may hold only letters, digits and _.+-, got $JOB_NAME"
for value in "$PARTITION" "$ACCOUNT"; do
  [[ "$value" =~ ^[A-Za-z0-9_.,+-]*$ ]] || die "bad --partition/--account value: $value"
done
for value in "${EXTRA_SBATCH[@]}"; do
  [[ "$value" == -* && "$value" != *$'\n'* ]] ||
    die "--sbatch takes one sbatch option such as --qos=high, got $value"
done
for value in "${SETUP[@]}"; do
  [[ "$value" != *$'\n'* ]] || die "--setup takes one shell line (repeat --setup for more)"
done

# Seconds of a SLURM time limit (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS); fails if bad.
time_secs() {
  local d=0 h=0 m=0 s=0 r
  if [[ "$1" =~ ^([0-9]+)-([0-9]+)(:([0-9]+))?(:([0-9]+))?$ ]]; then
    r=("${BASH_REMATCH[@]}")
    d=${r[1]} h=${r[2]} m=${r[4]:-0} s=${r[6]:-0}
  elif [[ "$1" =~ ^([0-9]+)$ ]]; then
    m=${BASH_REMATCH[1]}
  elif [[ "$1" =~ ^([0-9]+):([0-9]+)$ ]]; then
    m=${BASH_REMATCH[1]} s=${BASH_REMATCH[2]}
  elif [[ "$1" =~ ^([0-9]+):([0-9]+):([0-9]+)$ ]]; then
    h=${BASH_REMATCH[1]} m=${BASH_REMATCH[2]} s=${BASH_REMATCH[3]}
  else
    return 1
  fi
  echo $(( ((10#$d * 24 + 10#$h) * 60 + 10#$m) * 60 + 10#$s ))
}
if [[ -n "$TIME" && "$TIME" != UNLIMITED && "$TIME" != INFINITE ]]; then
  limit=$(time_secs "$TIME") ||
    die "--time must be a SLURM time limit such as 04:00:00 or 2-00:00:00, got $TIME"
  # SLURM may send the signal up to 60 s early; a limit inside that window would signal the job
  # right after it starts, and it would requeue itself forever.
  if (( limit <= SIGNAL_SECS + 60 )); then
    die "--time=$TIME ($limit s) must exceed --signal_secs=$SIGNAL_SECS by more than 60 s"
  fi
fi

[[ ${#JOB_ARGS[@]} -gt 0 ]] ||
  die "give the $MODULE arguments after --, e.g. -- --config=configs/question.py"
# The flags of $MODULE end at a nested `--` (sg_jax.sweep passes what follows to sg_jax.main);
# the launcher's own flags go just before it.
HEAD=() TAIL=()
for i in "${!JOB_ARGS[@]}"; do
  if [[ "${JOB_ARGS[$i]}" == -- ]]; then
    TAIL=("${JOB_ARGS[@]:$i}")
    break
  fi
  HEAD+=("${JOB_ARGS[$i]}")
done
has_config=0
for arg in "${HEAD[@]}"; do
  case "$arg" in
    --workdir|--workdir=*|--root|--root=*)
      die "give the directory as $DIR_FLAG=DIR to launch/slurm.sh (before --), not to $MODULE" ;;
    --config|--config=*) has_config=1 ;;
  esac
done
[[ "$has_config" == 1 ]] || die "$MODULE needs --config=... after --"

PY=(python -m "$MODULE" "${HEAD[@]}" "$DIR_FLAG=$DIR")
[[ "$COMMAND" == train ]] && PY+=(--multihost)
PY+=("${TAIL[@]}")
SRUN=(srun --nodes="$NODES" --ntasks-per-node=1)
# srun does not inherit --cpus-per-task from sbatch in every SLURM version: pass it again.
[[ "$CPUS" != 0 ]] && SRUN+=(--cpus-per-task="$CPUS")
# When one task exits, the others may still be finishing the multi-process checkpoint (process 0
# commits it last); a cluster default of KillOnBadExit=1 would kill them mid-write.
SRUN+=(--kill-on-bad-exit=0)

sbatch_script() {
  local n_gpu="$GPUS GPU(s)"
  [[ "$NUM_GPUS" == 0 ]] && n_gpu="CPUs only"
  echo "#!/bin/bash"
  echo "# sg_jax $COMMAND on SLURM (written by launch/slurm.sh): $NODES node(s) x $n_gpu," \
       "one task per node."
  echo "# To submit it by hand: mkdir -p $DIR/slurm && sbatch THIS_FILE"
  echo "#SBATCH --job-name=$JOB_NAME"
  echo "#SBATCH --nodes=$NODES"
  echo "#SBATCH --ntasks-per-node=1"
  [[ "$NUM_GPUS" != 0 ]] && echo "#SBATCH --gpus-per-node=$GPUS"
  [[ "$CPUS" != 0 ]] && echo "#SBATCH --cpus-per-task=$CPUS"
  [[ -n "$PARTITION" ]] && echo "#SBATCH --partition=$PARTITION"
  [[ -n "$ACCOUNT" ]] && echo "#SBATCH --account=$ACCOUNT"
  [[ -n "$TIME" ]] && echo "#SBATCH --time=$TIME"
  echo "#SBATCH --output=$DIR/slurm/%x-%j.out"
  echo "#SBATCH --open-mode=append"
  echo "#SBATCH --requeue"
  echo "#SBATCH --signal=TERM@$SIGNAL_SECS"
  local opt line
  for opt in "${EXTRA_SBATCH[@]}"; do
    echo "#SBATCH $opt"
  done
  echo
  echo "set -uo pipefail  # not -e: the exit code of srun decides below"
  echo "cd $(quote "$REPO_ROOT")"
  for line in "${SETUP[@]}"; do
    echo "$line"
  done
  if [[ "$COMMAND" == train && "$NUM_GPUS" != 0 ]]; then
    echo "# One process per node drives all its GPUs (jax.distributed would otherwise restrict"
    echo "# each process to the GPU numbered SLURM_LOCALID)."
    echo "export JAX_LOCAL_DEVICE_IDS=$(seq -s, 0 $((NUM_GPUS - 1)))"
  fi
  if [[ "$COMMAND" == sweep ]]; then
    echo "# sg_jax.sweep --parallel=N runs N jobs on the same GPUs: allocate memory on demand."
    echo "export XLA_PYTHON_CLIENT_PREALLOCATE=false"
  fi
  echo 'echo "[slurm.sh] job ${SLURM_JOB_ID:?run this script with sbatch} (restart' \
       '${SLURM_RESTART_COUNT:-0}) on ${SLURM_JOB_NODELIST:-?}"'
  echo "rc=0"
  echo "$(join_cmd "${SRUN[@]}" "${PY[@]}") || rc=\$?"
  cat <<'EOF'
if [[ $rc == 75 ]]; then
  # sg_jax checkpointed after SIGTERM (time limit or preemption): queue this job again; it
  # resumes from that checkpoint.
  echo "[slurm.sh] exit code 75 (checkpointed after SIGTERM): requeueing job $SLURM_JOB_ID"
  scontrol requeue "$SLURM_JOB_ID" && exit 0
  echo "[slurm.sh] scontrol requeue failed: submit this script again to resume" >&2
  exit 75
fi
echo "[slurm.sh] exit code $rc"
exit "$rc"
EOF
}

SCRIPT=$(sbatch_script)
if [[ "$DRY_RUN" == 1 ]]; then
  printf '%s\n' "$SCRIPT"
  exit 0
fi
command -v sbatch > /dev/null ||
  die "sbatch not found: run this on a SLURM login node (or add --dry_run)"
run mkdir -p "$DIR/slurm"
FILE="$DIR/slurm/$JOB_NAME-$(date +%Y%m%d-%H%M%S).sbatch"
printf '%s\n' "$SCRIPT" > "$FILE"
echo "wrote $FILE" >&2
run sbatch "$FILE"
