#!/usr/bin/env bash
# Single multi-GPU host launcher for sg_jax: install, then run `python -m sg_jax.main` or
# `python -m sg_jax.sweep` in the background on the GPUs of this machine, mirroring runs/ to a
# bucket if asked.
#
# Usage: launch/gpu_host.sh COMMAND [options] [-- ARGS for sg_jax.main/sg_jax.sweep]
#
# Commands:
#   install   pip-install the requirements, JAX with CUDA 12 and sg_jax (editable)
#   train     start `python -m sg_jax.main ARGS` in the background (log: --log); with --bucket,
#             also mirror runs/ to it every --sync_every seconds while the job runs and once
#             when it ends (log: --log with _sync before .log)
#   sweep     start `python -m sg_jax.sweep ARGS` in the background (same)
#   push      copy runs/ to --bucket (gs:// with gcloud storage, anything else with rsync)
#   pull      copy --bucket back into runs/ (resume on a new machine)
#   status    show the GPUs and the end of the log
#
# Options:
#   --gpus=0,1,...   GPUs the job may use (CUDA_VISIBLE_DEVICES; default: all). One process
#                    uses every visible GPU: the seed axis is sharded over them.
#   --log=FILE       job log (default sg_jax_job.log)
#   --bucket=DEST    gs://BUCKET/PATH or a path/host:path for rsync (push/pull, and the mirror
#                    of train/sweep)
#   --sync_every=S   period of the mirror while a train/sweep job runs (default 900; 0 = off)
#   --fill_chips     train/sweep: use the seed count that fills every GPU of --gpus (the next
#                    multiple of the GPUs); without it such a count is only named in a one-line
#                    warning (launch/seed_check.py)
#   --gpu_type=T     h100, h200 or a100: the row of launch/seeds_per_chip.json that caps the
#                    seeds per GPU (default: read from `nvidia-smi --query-gpu=name` of the first
#                    GPU of --gpus; a GPU the table does not know is checked for idle GPUs only)
#   --dry_run        print the exact commands instead of running them
#
# A job stopped with SIGTERM/SIGINT checkpoints and exits with code 75; rerunning the same
# train/sweep command resumes from the latest checkpoint.
#
# Example:
#   launch/gpu_host.sh install
#   launch/gpu_host.sh sweep --gpus=0,1,2,3 -- --config=configs/question.py --depths=2,4,6,8,10 \
#       --seeds=10 --root=runs/qf
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$HERE/.." && pwd)"
source "$HERE/common.sh"

COMMAND=${1:-}
case "$COMMAND" in -h|--help|help) usage "${BASH_SOURCE[0]}"; exit 0 ;; esac
USAGE="launch/gpu_host.sh COMMAND [options] [-- ARGS]"
[[ -n "$COMMAND" && "$COMMAND" != -* ]] || die "usage: $USAGE (--help: commands and options)"
shift
GPUS="" LOG="sg_jax_job.log" BUCKET="" SYNC_EVERY=900 FILL=0 GPU_TYPE=""
JOB_ARGS=()
while (($#)); do
  case "$1" in
    --gpus=*) GPUS=${1#*=} ;;
    --log=*) LOG=${1#*=} ;;
    --bucket=*) BUCKET=${1#*=} ;;
    --sync_every=*) SYNC_EVERY=${1#*=} ;;
    --fill_chips) FILL=1 ;;
    --gpu_type=*) GPU_TYPE=${1#*=} ;;
    --dry_run) DRY_RUN=1 ;;
    -h|--help) usage "${BASH_SOURCE[0]}"; exit 0 ;;
    --) shift; JOB_ARGS=("$@"); break ;;
    *) die "unknown option $1 (options go before --, sg_jax arguments after it)" ;;
  esac
  shift
done
if [[ -n "$GPUS" && ! "$GPUS" =~ ^[0-9]+(,[0-9]+)*$ ]]; then
  die "--gpus must be comma-separated GPU indices, got $GPUS"
fi
[[ -z "$GPU_TYPE" || "$GPU_TYPE" =~ ^(h100|h200|a100)$ ]] || die "--gpu_type must be h100, h200 or a100, got $GPU_TYPE"
[[ "$SYNC_EVERY" =~ ^[0-9]+$ ]] || die "--sync_every must be a number of seconds, got $SYNC_EVERY"
SYNC_LOG="${LOG%.log}_sync.log"

sync_words() {  # $1 = source, $2 = destination: prints the copy command as one line
  if [[ "$1" == gs://* || "$2" == gs://* ]]; then
    join_cmd gcloud storage rsync --recursive "$1" "$2"
  else
    join_cmd rsync -a "$1/" "$2/"
  fi
}

sync_cmd() {  # $1 = source, $2 = destination
  if [[ "$1" == gs://* || "$2" == gs://* ]]; then
    run gcloud storage rsync --recursive "$1" "$2"
  else
    run rsync -a "$1/" "$2/"
  fi
}

start_job() {  # $1 = main | sweep
  [[ ${#JOB_ARGS[@]} -gt 0 ]] || die "give the sg_jax.$1 arguments after --, e.g. -- --config=configs/question.py --workdir=runs/q6"
  if [[ -n "$GPUS" ]]; then
    local gpu_list
    IFS=, read -r -a gpu_list <<< "$GPUS"
    local gpu_name=""
    if [[ -z "$GPU_TYPE" ]] && command -v nvidia-smi > /dev/null; then
      gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader --id="${gpu_list[0]}" \
                   2> /dev/null | head -n 1 || true)
    fi
    check_seeds "$1" --chips="${#gpu_list[@]}" --generation="$GPU_TYPE" --gpu_name="${gpu_name:-gpu}"
  fi
  local env=(env)
  [[ -n "$GPUS" ]] && env+=(CUDA_VISIBLE_DEVICES="$GPUS")
  # JAX preallocates 75% of GPU memory by default; several jobs per GPU need less.
  env+=(XLA_PYTHON_CLIENT_PREALLOCATE=false)
  run cd "$REPO_ROOT"
  local loop=""
  if [[ -n "$BUCKET" && "$SYNC_EVERY" != 0 ]]; then
    loop=$(sync_loop "$SYNC_EVERY" "$(sync_words runs "${BUCKET%/}/runs")")
  fi
  if [[ "$DRY_RUN" == 1 ]]; then
    echo "$(join_cmd nohup "${env[@]}" python -m "sg_jax.$1" "${JOB_ARGS[@]}") > $(quote "$LOG") 2>&1 &"
    # $! is the job's PID when the two lines run in one shell, as printed.
    if [[ -n "$loop" ]]; then
      echo "nohup bash -c $(quote "$loop") sync_loop \$! > $(quote "$SYNC_LOG") 2>&1 &"
    fi
  else
    nohup "${env[@]}" python -m "sg_jax.$1" "${JOB_ARGS[@]}" > "$LOG" 2>&1 &
    local pid=$!
    echo "started sg_jax.$1 as process $pid (log: $LOG)" >&2
    if [[ -n "$loop" ]]; then
      nohup bash -c "$loop" sync_loop "$pid" > "$SYNC_LOG" 2>&1 &
      echo "mirroring runs/ to $BUCKET every $SYNC_EVERY s and at the end (log: $SYNC_LOG)" >&2
    fi
  fi
}

case "$COMMAND" in
  install)
    run cd "$REPO_ROOT"
    run pip install -r requirements.txt
    run pip install -U 'jax[cuda12]'
    run pip install -e . ;;
  train) start_job main ;;
  sweep) start_job sweep ;;
  push)
    [[ -n "$BUCKET" ]] || die "push needs --bucket"
    run cd "$REPO_ROOT"
    sync_cmd runs "${BUCKET%/}/runs" ;;
  pull)
    [[ -n "$BUCKET" ]] || die "pull needs --bucket"
    run cd "$REPO_ROOT"
    run mkdir -p runs
    sync_cmd "${BUCKET%/}/runs" runs ;;
  status)
    run nvidia-smi --query-gpu=index,name,utilization.gpu,memory.used,memory.total --format=csv
    run tail -n 20 "$REPO_ROOT/$LOG" ;;
  *) die "unknown command $COMMAND (install, train, sweep, push, pull, status)" ;;
esac
