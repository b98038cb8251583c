#!/usr/bin/env bash
# The accelerator check: what one GPU (or TPU) host says about sg_jax, in under 8 minutes
# (docs/performance.md, "Accelerator check").
#
#   bash benchmarks/fetch_wheels.sh                       # once, on a machine with a package index
#   bash benchmarks/accelerator_check.sh OUT_DIR          # on the accelerator (carry wheels/)
#   bash benchmarks/accelerator_check.sh --cpu_smoke OUT_DIR   # the same stages shrunk, CPU, < 3 min
#
# Options: --wheels DIR (default wheels/), --only STAGE,STAGE (default all; names below;
# install always runs).
# Stages, each with its own time limit, its output in OUT_DIR/NN_STAGE.txt, its exit code in
# OUT_DIR/stages.tsv and summary.md; a failing stage does not stop the later ones:
#   install      the carried wheels (ml-collections, PyYAML, pytest...) into a temporary folder
#   env          devices, backend, package versions and origins, nvidia-smi
#   tests        a fast subset of the model and training tests, on the device
#   throughput_float32 / throughput_bfloat16
#                benchmarks/train_throughput.py: depth 6, reference size, 1/4/16/64 seeds
#   memory       benchmarks/memory.py: memory per seed (compiled and, on GPU/TPU, measured)
#   run          python -m sg_jax.main, 16 seeds, reference size, stopped by SIGTERM after 180 s
#   run_report   its seed-steps/s and training loss at the end (from its log and metrics.csv),
#                beside the AOT projection of the same run on this chip (its training call
#                compiled: the roofline bound on seed-steps/s per chip, the peak memory)
# Needs no TensorFlow, clu or download; the run's checkpoints stay in a temporary folder (only
# its metrics.csv and config.json are kept, in OUT_DIR/run). Exit code: 0, or 1 if a stage failed.
set -u

usage() { sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; }

root="$(cd "$(dirname "$0")/.." && pwd)"
smoke=0
out=""
wheels="$root/wheels"
only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu_smoke) smoke=1; shift ;;
    --wheels) wheels="${2:?--wheels needs a folder}"; shift 2 ;;
    --wheels=*) wheels="${1#*=}"; shift ;;
    --only) only="${2:?--only needs stage names}"; shift 2 ;;
    --only=*) only="${1#*=}"; shift ;;
    -h|--help|help) usage; exit 0 ;;
    -*) echo "error: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) [ -z "$out" ] || { echo "error: one OUT_DIR only (got $out and $1)" >&2; exit 2; }
       out="$1"; shift ;;
  esac
done
[ -n "$out" ] || { echo "error: missing OUT_DIR (see --help)" >&2; exit 2; }
stages="install env tests throughput_float32 throughput_bfloat16 memory run run_report"
for name in ${only//,/ }; do
  [[ " $stages " == *" $name "* ]] ||
    { echo "error: unknown stage $name in --only (stages: $stages)" >&2; exit 2; }
done
mkdir -p "$out" || { echo "error: cannot create OUT_DIR $out" >&2; exit 2; }
out="$(cd "$out" && pwd)"
py="${PYTHON:-python3}"
cd "$root" || exit 2

scratch="$(mktemp -d -t sg_jax_accelerator_check.XXXXXX)"
trap 'rm -rf "$scratch"' EXIT
site="$scratch/site"
rundir="$scratch/run"
export SG_JAX_CARRIED="$site"
export PYTHONPATH="$site:$root${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

if [ "$smoke" = 1 ]; then
  mode="cpu_smoke"
  export JAX_PLATFORMS=cpu
  # Plumbing, not speed: XLA's CPU backend without LLVM optimisation compiles in half the time.
  export XLA_FLAGS="--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true${XLA_FLAGS:+ $XLA_FLAGS}"
  limit_install=60; limit_env=60; limit_tests=90; limit_throughput=60; limit_memory=60
  run_seconds=90; run_log_lines=3; limit_report=30
  tests=(tests/models/test_model.py tests/training/test_train.py -k
         "dense_equals_flax or extra_attention_mask or test_pack_lines_lays_out")
  throughput=(--quick --depths=1 --seeds=2 --packing=off --no_sequential --steps_per_call=2
              --min_time=0.1 --min_calls=1 --num_train=300 --peak_size=256)
  memory=(--quick --depths=1 --seeds=2 --packing=off --steps_per_call=2 --num_train=300
          --num_eval=20)
  run_config="configs/question.py:tiny"
else
  mode="accelerator"
  limit_install=60; limit_env=60; limit_tests=55; limit_throughput=90; limit_memory=35
  run_seconds=180; run_log_lines=0; limit_report=150  # + the AOT projection's compile
  tests=(tests/models/test_model.py tests/training/test_train.py::test_vmapped_seeds_equal_each_seed_trained_alone)
  # the padded layout (the default config's), no sequential baseline: 16 compiles in the limit
  throughput=(--depths=6 --seeds=1,4,16,64 --packing=off --no_sequential --steps_per_call=50
              --min_time=1 --min_calls=2)
  memory=(--depths=6 --seeds=1,16 --packing=off --steps_per_call=20)
  run_config="configs/question.py:seeds=16"
fi
[ -f tests/models/test_layer_impl.py ] && tests=(tests/models/test_layer_impl.py "${tests[@]}")

stage_no=0
failed=0
[ -n "$only" ] || : >"$out/stages.tsv"  # --only adds to an earlier run's table

wanted() { [ -z "$only" ] || [ "$1" = install ] || [[ ",$only," == *",$1,"* ]]; }

# run_stage NAME LIMIT_S COMMAND...: runs COMMAND with a time limit (SIGTERM, then SIGKILL 15 s
# later), output in OUT_DIR/NN_NAME.txt, a line in stages.tsv.
run_stage() {
  local name="$1" limit="$2"
  shift 2
  stage_no=$((stage_no + 1))
  local file
  file="$(printf '%02d_%s.txt' "$stage_no" "$name")"
  wanted "$name" || return 0
  local t0=$SECONDS rc
  echo "[$(date -u +%H:%M:%S)] $name (limit ${limit} s) -> $file"
  timeout --kill-after=15 "$limit" "$@" >"$out/$file" 2>&1
  rc=$?
  [ "$rc" = 0 ] || failed=1
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" "$limit" "$file" >>"$out/stages.tsv"
  echo "[$(date -u +%H:%M:%S)] $name: exit $rc after $((SECONDS - t0)) s"
}

install_wheels() {
  if ! ls "$wheels"/*.whl >/dev/null 2>&1; then
    echo "no wheels in $wheels: using this machine's packages (bash benchmarks/fetch_wheels.sh" \
         "downloads them; carry wheels/ to a machine without a package index)"
    "$py" -c "import ml_collections, pytest" && return 0
    echo "error: ml_collections or pytest is not importable here and no wheels were carried"
    return 1
  fi
  local names tag
  names="$(ls "$wheels"/*.whl | sed 's#.*/##; s/-.*//' | sort -u)"
  tag="$("$py" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')"
  # A compiled wheel (e.g. PyYAML) is for one CPython: wheels fetched for another Python cannot
  # be installed here.
  if ls "$wheels"/*-cp3*.whl >/dev/null 2>&1 && ! ls "$wheels"/*-"$tag"-*.whl >/dev/null 2>&1; then
    echo "error: the compiled wheels in $wheels are for" \
         "$(ls "$wheels"/*-cp3*.whl | sed 's#.*/##' | grep -o -- '-cp3[0-9]*-' | tr -d - | sort -u | paste -sd' ')" \
         "but this Python is $tag; fetch them for it with" \
         "'bash benchmarks/fetch_wheels.sh --python_version $("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])') DIR'" \
         "and pass --wheels DIR"
    return 1
  fi
  echo "installing from $wheels into $site: $(echo $names)"
  if ! "$py" -m pip --version >/dev/null 2>&1; then
    echo "no pip: unzipping the pure-Python wheels and those tagged for this CPython instead"
    "$py" - "$wheels" "$site" <<'PY'
import glob, os, sys, zipfile
tag = "cp%d%d" % sys.version_info[:2]
for w in sorted(glob.glob(os.path.join(sys.argv[1], "*.whl"))):
  if w.endswith("-none-any.whl") or f"-{tag}-" in os.path.basename(w):
    zipfile.ZipFile(w).extractall(sys.argv[2])
    print("unzipped", os.path.basename(w))
PY
    return
  fi
  # shellcheck disable=SC2086  (one argument per distribution name)
  "$py" -m pip install --quiet --disable-pip-version-check --no-index --no-deps \
    --find-links "$wheels" --target "$site" $names
}

env_stage() {
  "$py" benchmarks/accelerator_report.py env
  local rc=$?
  if command -v nvidia-smi >/dev/null 2>&1; then
    echo; nvidia-smi
  else
    echo; echo "nvidia-smi: not on this machine"
  fi
  return $rc
}

# train_run: python -m sg_jax.main until SIGTERM, after $run_seconds s or once the log has
# $run_log_lines training lines (0: time only); waits 30 s for it to checkpoint and exit 75.
train_run() {
  local log="$out/run/train.log"
  mkdir -p "$out/run"
  # evaluations and checkpoints at the start and on SIGTERM only
  local extra=(--config.eval.every=1000000 --config.checkpoint.every=1000000)
  if [ "$smoke" = 1 ]; then
    extra+=(--config.train.num_steps=1000000)
  else
    extra+=(--config.train.log_every=100 --config.eval.max_lines=1000)
  fi
  "$py" -m sg_jax.main --config="$run_config" --workdir="$rundir" --notensorboard \
    "${extra[@]}" >"$log" 2>&1 &
  local pid=$! t0=$SECONDS
  while kill -0 "$pid" 2>/dev/null; do
    if [ $((SECONDS - t0)) -ge "$run_seconds" ] || { [ "$run_log_lines" -gt 0 ] &&
        [ "$(grep -c ' step [0-9]*/' "$log")" -ge "$run_log_lines" ]; }; then
      echo "SIGTERM after $((SECONDS - t0)) s"
      kill -TERM "$pid"
      break
    fi
    sleep 1
  done
  local waited=0
  while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt 30 ]; do sleep 1; waited=$((waited + 1)); done
  kill -0 "$pid" 2>/dev/null && { echo "no exit 30 s after SIGTERM: SIGKILL"; kill -KILL "$pid"; }
  wait "$pid"
  local rc=$?
  echo "sg_jax.main exit $rc after $((SECONDS - t0)) s"
  echo "$rc" >"$out/run/exit_code"
  cp "$rundir/metrics.csv" "$rundir/config.json" "$out/run/" 2>/dev/null
  tail -n 25 "$log"
  [ "$rc" = 75 ] || [ "$rc" = 0 ]
}

# The stages that are functions run in a child bash under `timeout`.
export py wheels site out rundir smoke run_config run_seconds run_log_lines
export -f install_wheels env_stage train_run
echo "accelerator check ($mode) into $out"
run_stage install "$limit_install" bash -c install_wheels
run_stage env "$limit_env" bash -c env_stage
# float32 matmuls at full precision: the tests compare to 1e-5 (TF32 is the benchmarks' business)
run_stage tests "$limit_tests" env JAX_DEFAULT_MATMUL_PRECISION=highest \
  "$py" -m pytest -v -p no:cacheprovider "${tests[@]}"
for dtype in float32 bfloat16; do
  layer_sets=both  # model.layer_impl tuned and plain; the smoke's bf16: auto's pick only
  [ "$smoke" = 1 ] && [ "$dtype" = bfloat16 ] && layer_sets=auto
  run_stage "throughput_$dtype" "$limit_throughput" "$py" benchmarks/train_throughput.py \
    "${throughput[@]}" --layer_impl="$layer_sets" --dtype="$dtype"
done
run_stage memory "$limit_memory" "$py" benchmarks/memory.py "${memory[@]}"
run_stage run $((run_seconds + 60)) bash -c train_run
run_stage run_report "$limit_report" "$py" benchmarks/accelerator_report.py run "$out/run" \
  "$out/run/train.log" "$(cat "$out/run/exit_code" 2>/dev/null || echo -1)"
"$py" benchmarks/accelerator_report.py summary "$out" "$mode" >/dev/null || failed=1
echo "summary: $out/summary.md"
exit "$failed"
