#!/usr/bin/env bash
# The cost of the import-time drift check (docs/notes/drift.md): instructions (valgrind's
# callgrind, median of 3) of `python -c "import cloudpickle"` on a warm start, with one enabled
# user patch that wraps cloudpickle.cloudpickle:dumps, pinned or not.
#   bash docs/examples/drift/measure_import_check.sh PYTHON SOURCE [LABEL [CODE]]
# PYTHON: an interpreter with importpatch-hook's .pth and cloudpickle installed (tox -e py311's);
# SOURCE: the importpatch source tree put first on PYTHONPATH (this checkout, or another commit's
# `git archive`), so two versions are measured in the same environment. CODE: what the measured
# process runs (default `import cloudpickle`; `pass`: a start that does not import the target).
set -euo pipefail
python=$1 source=$(cd "$2" && pwd) label=${3:-$2} code=${4:-import cloudpickle}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/patches"
cat > "$work/patches/bench_drift_wrap.py" <<'PY'
from importpatch import Patch

patch = Patch("bench-drift-wrap", doc="a pass-through wrap, for measuring")


@patch.wrap("cloudpickle.cloudpickle:dumps")
def dumps(wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs)
PY
run() {  # what, extra environment...
  local what=$1 cache counts=()
  shift
  cache=$(mktemp -d "$work/cache.XXXX")
  local env=(env -i "PATH=$PATH" "HOME=$HOME" "PYTHONPATH=$source" "IMPORTPATCH_CACHE_DIR=$cache"
             "IMPORTPATCH_PATH=$work/patches" "$@")
  "${env[@]}" "$python" -c "import cloudpickle"  # warm: index and bytecode cache built
  for _ in 1 2 3; do
    counts+=("$("${env[@]}" valgrind --tool=callgrind --callgrind-out-file=/dev/null "$python" \
                -c "$code" 2>&1 | sed -n 's/.*refs: *//p' | tr -d ,)")
  done
  printf '%s\t%s: %s\t%s\n' "$label" "$code" "$what" \
    "$(printf '%s\n' "${counts[@]}" | sort -n | sed -n 2p)"
}
run "nothing enabled"
run "enabled, unpinned" IMPORTPATCH_ENABLE=bench-drift-wrap
if env -i "PATH=$PATH" "HOME=$HOME" "PYTHONPATH=$source" "IMPORTPATCH_PATH=$work/patches" \
    "$python" -m importpatch pin bench-drift-wrap >/dev/null 2>&1; then
  run "enabled, pinned" IMPORTPATCH_ENABLE=bench-drift-wrap
  # the check runs: a pin whose digest no longer matches warns at the import
  sed -i 's/^digest = "sha256:./digest = "sha256:0/' "$work/patches/bench_drift_wrap.pin.toml"
  env -i "PATH=$PATH" "HOME=$HOME" "PYTHONPATH=$source" "IMPORTPATCH_PATH=$work/patches" \
    "IMPORTPATCH_ENABLE=bench-drift-wrap" "IMPORTPATCH_CACHE_DIR=$work/cache.check" \
    "$python" -c "import cloudpickle" 2>&1 | grep -o "bench-drift-wrap: wrap .*changed since" \
    | sed "s/^/$label\tsanity: /" || echo "$label	sanity: NO drift warning"
else
  echo "$label	(no 'importpatch pin' in this version: nothing pinned)"
fi
