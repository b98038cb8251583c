#!/usr/bin/env bash
# Cloud TPU VM launcher for sg_jax: thin wrappers over gcloud that run `python -m sg_jax.main` or
# `python -m sg_jax.sweep` on every worker of a TPU VM or pod slice.
#
# Usage: launch/tpu_vm.sh COMMAND --name=NAME [options] [-- ARGS for sg_jax.main/sg_jax.sweep]
#
# Commands (run in this order for a new job; see docs/sweeps_and_launch.md, "TPU workflow"):
#   create    create the TPU VM (on-demand or --spot; --queued = through a queued resource)
#   install   copy this checkout (or clone --repo) to ~/sg_jax on all workers and pip-install it
#   train     start `python -m sg_jax.main ARGS` on all workers (background, log in ~/sg_jax.log)
#   sweep     start `python -m sg_jax.sweep ARGS` on all workers (same)
#   push      copy ~/sg_jax/runs of worker 0 to --bucket (also done every --sync_every seconds
#             while a train/sweep job runs, and once when it ends)
#   restore   copy --bucket back into ~/sg_jax/runs on worker 0 (a fresh VM after preemption)
#   resume    after a preemption: delete + create the VM again, install, restore, then rerun the
#             same job (sg_jax resumes from the latest checkpoint); needs --job=train|sweep
#   pull      copy --bucket to --dest on this machine (results for sg_jax.report)
#   status    describe the VM (or the queued resource) and show the end of the job log
#   ssh       open a shell on worker 0
#   delete    delete the VM (and the queued resource)
#
# Options:
#   --name=NAME            TPU VM name (required)
#   --zone=ZONE            default us-central2-b
#   --project=PROJECT      default: gcloud's configured project
#   --accelerator=TYPE     default v4-8 (one host, 4 chips); pod slices e.g. v4-32
#   --version=RUNTIME      TPU software version, default tpu-ubuntu2204-base (v5e:
#                          v2-alpha-tpuv5-lite)
#   --spot                 Spot (preemptible) capacity: cheaper, can be preempted any time
#   --queued               create through `queued-resources` (waits for capacity)
#   --bucket=gs://B/PATH   where runs/ is mirrored (required by push/restore/pull/resume)
#   --repo=URL --branch=B  install by git clone instead of copying this checkout
#   --dest=DIR             local folder for pull (default runs)
#   --job=train|sweep      which job resume reruns
#   --sync_every=SECONDS   period of the background push while a job runs (default 900; 0 = off)
#   --fill_chips           train/sweep: use the seed count that fills every chip (the next
#                          multiple of the chips within the seeds per chip that fit, from
#                          launch/seeds_per_chip.json); without it such a count is only named in
#                          a one-line warning (launch/seed_check.py)
#   --dry_run              print the exact commands instead of running them
#
# Example:
#   launch/tpu_vm.sh create --name=sg-qf --spot
#   launch/tpu_vm.sh install --name=sg-qf
#   launch/tpu_vm.sh sweep --name=sg-qf --bucket=gs://my-bucket/sg_jax -- \
#       --config=configs/question.py --depths=2,4,6,8,10 --seeds=10 --root=runs/qf
#   launch/tpu_vm.sh resume --name=sg-qf --spot --job=sweep --bucket=gs://my-bucket/sg_jax -- \
#       --config=configs/question.py --depths=2,4,6,8,10 --seeds=10 --root=runs/qf
#   launch/tpu_vm.sh pull --name=sg-qf --bucket=gs://my-bucket/sg_jax --dest=runs
#
# Pod slices (several hosts): every worker runs the same command (`--worker=all`); sg_jax then
# needs the multi-host seed sharding (jax.distributed) and a workdir all hosts can write (orbax
# multi-host checkpoints), e.g. a gcsfuse mount of the bucket, passed as --workdir/--root.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$HERE/.." && pwd)"
source "$HERE/common.sh"

COMMAND=${1:-}
case "$COMMAND" in -h|--help|help) usage "${BASH_SOURCE[0]}"; exit 0 ;; esac
USAGE="launch/tpu_vm.sh COMMAND --name=NAME [options] [-- ARGS]"
[[ -n "$COMMAND" && "$COMMAND" != -* ]] || die "usage: $USAGE (--help: commands and options)"
shift
NAME="" ZONE="us-central2-b" PROJECT="" ACCELERATOR="v4-8" VERSION="tpu-ubuntu2204-base"
SPOT=0 QUEUED=0 BUCKET="" REPO="" BRANCH="main" DEST="runs" JOB="" SYNC_EVERY=900 FILL=0
JOB_ARGS=()
while (($#)); do
  case "$1" in
    --name=*) NAME=${1#*=} ;;
    --zone=*) ZONE=${1#*=} ;;
    --project=*) PROJECT=${1#*=} ;;
    --accelerator=*) ACCELERATOR=${1#*=} ;;
    --version=*) VERSION=${1#*=} ;;
    --spot) SPOT=1 ;;
    --queued) QUEUED=1 ;;
    --bucket=*) BUCKET=${1#*=} ;;
    --repo=*) REPO=${1#*=} ;;
    --branch=*) BRANCH=${1#*=} ;;
    --dest=*) DEST=${1#*=} ;;
    --job=*) JOB=${1#*=} ;;
    --sync_every=*) SYNC_EVERY=${1#*=} ;;
    --fill_chips) FILL=1 ;;
    --dry_run) DRY_RUN=1 ;;
    -h|--help) usage "${BASH_SOURCE[0]}"; exit 0 ;;
    --) shift; JOB_ARGS=("$@"); break ;;
    *) die "unknown option $1 (options go before --, sg_jax arguments after it)" ;;
  esac
  shift
done
[[ -n "$NAME" ]] || die "--name=NAME is required"
[[ "$SYNC_EVERY" =~ ^[0-9]+$ ]] || die "--sync_every must be a number of seconds, got $SYNC_EVERY"
if [[ -n "$BUCKET" && "$BUCKET" != gs://* ]]; then
  die "--bucket must start with gs://, got $BUCKET"
fi

GLOBAL=(--zone="$ZONE")
[[ -n "$PROJECT" ]] && GLOBAL+=(--project="$PROJECT")
REMOTE_DIR="sg_jax"   # relative to the home directory of each worker
LOG="sg_jax.log"
PID_FILE="sg_jax.pid"       # the job's process id on each worker
SYNC_LOG="sg_jax_sync.log"  # the output of worker 0's sync loop

need_bucket() { [[ -n "$BUCKET" ]] || die "$COMMAND needs --bucket=gs://BUCKET/PATH"; }

# ssh WORKER REMOTE_COMMAND: run a command on one worker (0) or all workers (all).
on_workers() {
  run gcloud compute tpus tpu-vm ssh "$NAME" "${GLOBAL[@]}" --worker="$1" --command="$2"
}

do_create() {
  local extra=()
  [[ "$SPOT" == 1 ]] && extra+=(--spot)
  if [[ "$QUEUED" == 1 ]]; then
    run gcloud compute tpus queued-resources create "$NAME" "${GLOBAL[@]}" --node-id="$NAME" \
      --accelerator-type="$ACCELERATOR" --runtime-version="$VERSION" "${extra[@]}"
    wait_active
  else
    run gcloud compute tpus tpu-vm create "$NAME" "${GLOBAL[@]}" \
      --accelerator-type="$ACCELERATOR" --version="$VERSION" "${extra[@]}"
  fi
}

# Waits until the queued resource is ACTIVE (the VM exists then); prints the poll in dry runs.
wait_active() {
  local poll=(gcloud compute tpus queued-resources describe "$NAME" "${GLOBAL[@]}"
              --format='value(state.state)')
  if [[ "$DRY_RUN" == 1 ]]; then
    echo "# poll every 60 s until it prints ACTIVE:"
    run "${poll[@]}"
    return
  fi
  local state=""
  until [[ "$state" == ACTIVE ]]; do
    state=$("${poll[@]}" 2>/dev/null || true)
    [[ "$state" == FAILED || "$state" == SUSPENDED ]] && die "queued resource $NAME is $state"
    [[ "$state" == ACTIVE ]] || { echo "queued resource $NAME: ${state:-unknown}; waiting" >&2; sleep 60; }
  done
}

do_delete() {
  if [[ "$QUEUED" == 1 ]]; then
    run gcloud compute tpus queued-resources delete "$NAME" "${GLOBAL[@]}" --force --quiet
  else
    run gcloud compute tpus tpu-vm delete "$NAME" "${GLOBAL[@]}" --quiet
  fi
}

do_install() {
  local setup="cd $REMOTE_DIR && pip install -q -r requirements.txt && pip install -q -U 'jax[tpu]' && pip install -q -e ."
  if [[ -n "$REPO" ]]; then
    on_workers all "(test -d $REMOTE_DIR || git clone --branch $(quote "$BRANCH") $(quote "$REPO") $REMOTE_DIR) && git -C $REMOTE_DIR pull --ff-only && $setup"
  else
    local archive="sg_jax_src.tar.gz"
    # The committed tree (HEAD) of this checkout; uncommitted edits are not copied.
    run git -C "$REPO_ROOT" archive --format=tar.gz --output="$archive" HEAD
    run gcloud compute tpus tpu-vm scp "$archive" "$NAME:~/$archive" "${GLOBAL[@]}" --worker=all
    run rm -f "$archive"
    on_workers all "mkdir -p $REMOTE_DIR && tar -xzf $archive -C $REMOTE_DIR && $setup"
  fi
}

do_push() {
  need_bucket
  on_workers 0 "cd $REMOTE_DIR && gcloud storage rsync --recursive runs $(quote "$BUCKET/runs")"
}

do_restore() {
  need_bucket
  on_workers 0 "mkdir -p $REMOTE_DIR/runs && gcloud storage rsync --recursive $(quote "$BUCKET/runs") $REMOTE_DIR/runs"
}

do_job() {  # $1 = main | sweep
  local module="sg_jax.$1"
  [[ ${#JOB_ARGS[@]} -gt 0 ]] || die "give the $module arguments after --, e.g. -- --config=configs/question.py --workdir=runs/q6"
  check_seeds "$1" --accelerator="$ACCELERATOR"
  local job
  # Each worker records the job's PID in ~/$PID_FILE (the sync loop below waits on it).
  job="cd $REMOTE_DIR && { nohup python -m $module $(join_cmd "${JOB_ARGS[@]}") > ~/$LOG 2>&1 &"
  job+=" echo \$! > ~/$PID_FILE; }"
  on_workers all "$job"
  if [[ -n "$BUCKET" && "$SYNC_EVERY" != 0 ]]; then
    # Worker 0 mirrors runs/ to the bucket while the job runs and once after it ends.
    local loop
    loop=$(sync_loop "$SYNC_EVERY" "gcloud storage rsync --recursive runs $(quote "$BUCKET/runs")")
    on_workers 0 "cd $REMOTE_DIR && nohup bash -c $(quote "$loop") sync_loop \"\$(cat ~/$PID_FILE)\"\
 > ~/$SYNC_LOG 2>&1 &"
  fi
}

case "$COMMAND" in
  create) do_create ;;
  delete) do_delete ;;
  install) do_install ;;
  train) do_job main ;;
  sweep) do_job sweep ;;
  push) do_push ;;
  restore) do_restore ;;
  pull)
    need_bucket
    run mkdir -p "$DEST"
    run gcloud storage rsync --recursive "$BUCKET/runs" "$DEST" ;;
  resume)
    need_bucket
    case "$JOB" in
      train) module=main ;;
      sweep) module=sweep ;;
      *) die "resume needs --job=train or --job=sweep (the job to rerun)" ;;
    esac
    # A preempted Spot VM (or queued resource) cannot be restarted: delete and create it again.
    # The disk is gone, so the runs come back from the bucket; sg_jax then resumes from the
    # latest checkpoint there (at most --sync_every seconds of checkpoints are lost).
    do_delete || true
    do_create
    do_install
    do_restore
    do_job "$module" ;;
  status)
    if [[ "$QUEUED" == 1 ]]; then
      run gcloud compute tpus queued-resources describe "$NAME" "${GLOBAL[@]}"
    fi
    run gcloud compute tpus tpu-vm describe "$NAME" "${GLOBAL[@]}" --format='value(state,health)'
    on_workers 0 "tail -n 20 ~/$LOG" ;;
  ssh) run gcloud compute tpus tpu-vm ssh "$NAME" "${GLOBAL[@]}" --worker=0 ;;
  *) die "unknown command $COMMAND (create, install, train, sweep, push, restore, resume, pull, status, ssh, delete)" ;;
esac
