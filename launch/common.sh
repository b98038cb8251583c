# Shared helpers of the launch scripts (sourced, not run). Bash 4+.
#
# `run CMD ARGS...` executes a command, or, with DRY_RUN=1, prints it as one shell-quoted line
# (copy-pastable: exactly what would run). `die MSG` prints an error and exits 2. `usage SCRIPT`
# prints the header comment of SCRIPT (its help: what `-h`/`--help` print, exit 0). `sync_loop`
# writes the loop that mirrors runs/ while a job runs.

DRY_RUN=${DRY_RUN:-0}

die() {
  echo "error: $*" >&2
  exit 2
}

# Prints the comment block at the top of a script (after the #! line), without the "# ".
usage() {
  local line
  while IFS= read -r line; do
    [[ "$line" == '#!'* ]] && continue
    [[ "$line" == '#'* ]] || break
    line=${line#\#}
    printf '%s\n' "${line# }"
  done < "$1"
}

# Quotes one word for the shell only when needed (like Python's shlex.quote).
quote() {
  local s=$1
  if [[ -n "$s" && "$s" =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]]; then
    printf '%s' "$s"
  else
    printf "'%s'" "${s//\'/\'\\\'\'}"
  fi
}

# Joins words into one shell-quoted command line.
join_cmd() {
  local out="" w
  for w in "$@"; do
    out+="${out:+ }$(quote "$w")"
  done
  printf '%s' "$out"
}

run() {
  if [[ "$DRY_RUN" == 1 ]]; then
    join_cmd "$@"
    echo
  else
    echo "+ $(join_cmd "$@")" >&2
    "$@"
  fi
}

# Prints a bash script for `bash -c SCRIPT sync_loop PID`: every PERIOD seconds, while process PID
# (the job) lives, it runs SYNC_COMMAND; once PID has gone it syncs a last time and ends, so it
# ends at most one period after the job. The job is tracked by its PID because matching its
# command line (pgrep -f) also matches this loop's own command line.
sync_loop() {  # $1 = PERIOD (seconds), $2 = SYNC_COMMAND (one shell command line)
  printf '%s' "job=\$1; echo \"mirroring while process \$job runs\"; "
  printf '%s' "while sleep $1 && kill -0 \"\$job\" 2>/dev/null; do "
  printf '%s' "$2 || echo \"sync failed\"; done; "
  printf '%s' "$2 && echo \"process \$job ended; final sync done\""
}

# check_seeds JOB SEED_CHECK_OPTIONS...: runs launch/seed_check.py on JOB_ARGS (JOB = main |
# sweep): a seed count that leaves chips idle is named in one line on stderr with the count to
# use; with FILL=1 JOB_ARGS get that count. Skipped (saying so) without python3.
check_seeds() {
  local job=$1 out
  shift
  if ! command -v python3 > /dev/null; then
    echo "launch: python3 not found: seeds per chip not checked" >&2
    return 0
  fi
  local fill=()
  [[ "${FILL:-0}" == 1 ]] && fill=(--fill)
  out=$(python3 "$(dirname "${BASH_SOURCE[0]}")/seed_check.py" --job="$job" "$@" "${fill[@]}" \
        -- "${JOB_ARGS[@]}") || exit 2
  mapfile -t JOB_ARGS <<< "$out"
}
