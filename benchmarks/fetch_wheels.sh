#!/usr/bin/env bash
# Downloads the wheels benchmarks/accelerator_check.sh installs on a machine that cannot
# download anything (docs/performance.md, "Accelerator check").
#
#   bash benchmarks/fetch_wheels.sh                          # Python 3.12 wheels into wheels/
#   bash benchmarks/fetch_wheels.sh --python_version 3.11 DEST
#
# What: benchmarks/accelerator_wheels.txt and its dependencies (about 3 MB), as wheels for
# CPython X.Y on manylinux x86-64 (pure-Python wheels, and PyYAML's compiled one), whatever this
# machine runs. wheels/ is ignored by git: carry it to the accelerator machine with the working
# tree. Needs a package index (pip's usual configuration); exits non-zero if one is unreachable.
set -euo pipefail

usage() { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; }

root="$(cd "$(dirname "$0")/.." && pwd)"
python_version=3.12
dest=""
while [ $# -gt 0 ]; do
  case "$1" in
    --python_version) python_version="${2:?--python_version needs a value, e.g. 3.12}"; shift 2 ;;
    --python_version=*) python_version="${1#*=}"; shift ;;
    -h|--help|help) usage; exit 0 ;;
    -*) echo "error: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) [ -z "$dest" ] || { echo "error: one destination folder only (got $dest and $1)" >&2; exit 2; }
       dest="$1"; shift ;;
  esac
done
if ! [[ "$python_version" =~ ^3\.[0-9]+$ ]]; then
  echo "error: --python_version must look like 3.12 (got $python_version)" >&2
  exit 2
fi
dest="${dest:-$root/wheels}"
abi="cp${python_version/./}"
mkdir -p "$dest"
"${PYTHON:-python3}" -m pip download --quiet --disable-pip-version-check \
  --only-binary=:all: --python-version "$python_version" --implementation cp --abi "$abi" \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 \
  -r "$root/benchmarks/accelerator_wheels.txt" -d "$dest"
echo "wheels for CPython $python_version in $dest ($(du -sh "$dest" | cut -f1)):"
ls "$dest"
