# Shared helpers of the launch scripts (sourced, not run). Bash 4+.
#
# `run CMD ARGS...` executes a command, or, with DRY_RUN=1, prints it as one shell-quoted line
# (copy-pastable: exactly what would run). `die MSG` prints an error and exits 2.

DRY_RUN=${DRY_RUN:-0}

die() {
  echo "error: $*" >&2
  exit 2
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
