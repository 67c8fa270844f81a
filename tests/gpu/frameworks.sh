#!/usr/bin/env bash
# JAX and CuPy on a GPU host: tests/gpu/framework_checks.py for each framework natively, under the
# limiter (`tfusion run --percent 100 --vram CAP`), through a worker over shared memory and over
# loopback TCP (`tfusion run --remote ... --vram CAP`: the session gets a vGPU of CAP), each remote
# and local run's outputs compared with the native run's (--compare). The capped runs get
# --vram-mib, so their memory parts assert that the framework sees the cap (CuPy's memGetInfo
# total and pool limits, JAX's allocator limit) and that an allocation beyond it is refused.
# Usage (from the repository root):
#
#   bash tests/gpu/frameworks.sh BUILD_DIR OUT_DIR
#
# BUILD_DIR must hold src/cli/tfusion and the client stub (tests/gpu/README.md). OUT_DIR receives
# frameworks.md (one Markdown table: framework, part, mode, status, comparison with native) and
# frameworks-logs.tar.gz (one log per run and comparison, the worker's log). Every run is bounded
# by TF_FRAMEWORKS_RUN_S seconds (default 240), the whole script by TF_FRAMEWORKS_BUDGET_S
# (default 470, under 8 minutes; a run that no longer fits is reported as skipped).
# TF_FRAMEWORKS_PARTS (comma-separated, e.g. "memory,blas") runs only those parts. PYTHON (default python3) must
# import jax and cupy; TF_FRAMEWORKS (default "jax cupy"), TF_FRAMEWORKS_MODES (default "native
# local shm tcp"), TF_FRAMEWORKS_PORT (default 7621), TF_FRAMEWORKS_VRAM_MIB (the cap of the local
# and remote runs, default 8192). Exit status: 0 when every run passed and matched native.
set -uo pipefail

if [ $# -ne 2 ]; then
  echo "usage: bash tests/gpu/frameworks.sh BUILD_DIR OUT_DIR" >&2
  exit 2
fi
START=$(date +%s)
RUN_S=${TF_FRAMEWORKS_RUN_S:-240}
BUDGET=${TF_FRAMEWORKS_BUDGET_S:-470}
PARTS=${TF_FRAMEWORKS_PARTS:-}
FRAMEWORKS=${TF_FRAMEWORKS:-jax cupy}
MODES=${TF_FRAMEWORKS_MODES:-native local shm tcp}
PORT=${TF_FRAMEWORKS_PORT:-7621}
PY=${PYTHON:-python3}
VRAM_MIB=${TF_FRAMEWORKS_VRAM_MIB:-8192}
for v in "$RUN_S" "$BUDGET" "$PORT" "$VRAM_MIB"; do
  case $v in '' | *[!0-9]*) echo "TF_FRAMEWORKS_RUN_S, _BUDGET_S, _PORT and _VRAM_MIB are whole numbers, got '$v'" >&2; exit 2 ;; esac
done
((VRAM_MIB >= 1024)) || { echo "TF_FRAMEWORKS_VRAM_MIB must be at least 1024 (the checks need about 1 GiB)" >&2; exit 2; }
case $PARTS in *[!a-z0-9_,]*) echo "TF_FRAMEWORKS_PARTS: comma-separated part names, got '$PARTS'" >&2; exit 2 ;; esac
for f in $FRAMEWORKS; do
  case $f in jax | cupy) ;; *) echo "TF_FRAMEWORKS: unknown framework '$f' (jax cupy)" >&2; exit 2 ;; esac
done
for m in $MODES; do
  case $m in native | local | shm | tcp) ;; *) echo "TF_FRAMEWORKS_MODES: unknown mode '$m' (native local shm tcp)" >&2; exit 2 ;; esac
done
BUILD=$(cd "$1" && pwd) || exit 2
mkdir -p "$2" || exit 2
OUT=$(cd "$2" && pwd)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CHECKS=$HERE/framework_checks.py
TF=$BUILD/src/cli/tfusion
WORK=$(mktemp -d /tmp/tf-frameworks.XXXXXX)
LOGS=$WORK/logs
mkdir -p "$LOGS"
SOCK=$WORK/worker.sock
TOKEN=frameworks-$$-$RANDOM
WPID=""
ROWS=$WORK/rows.tsv  # framework part mode status comparison
: > "$ROWS"

left() { echo $((START + BUDGET - $(date +%s))); }

stop_worker() {
  [ -n "$WPID" ] || return 0
  kill "$WPID" 2>/dev/null
  for _ in $(seq 30); do kill -0 "$WPID" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$WPID" 2>/dev/null
  wait "$WPID" 2>/dev/null
  WPID=""
}

start_worker() {
  [ -x "$TF" ] || { echo "tfusion not found at $TF" >> "$LOGS/worker.log"; return 1; }
  "$TF" worker --listen "unix:$SOCK" --listen "127.0.0.1:$PORT" --token "$TOKEN" \
    --ready-file "$WORK/ready" >> "$LOGS/worker.log" 2>&1 &
  WPID=$!
  for _ in $(seq 100); do
    [ -f "$WORK/ready" ] && return 0
    kill -0 "$WPID" 2>/dev/null || break
    sleep 0.1
  done
  echo "worker not ready after 10 s" >> "$LOGS/worker.log"
  stop_worker
  return 1
}

# The table, the tarball and the worker's end, however the script ends.
finish() {
  stop_worker
  {
    echo "# JAX and CuPy: native, local (limiter), remote over shm and TCP; VRAM cap ${VRAM_MIB} MiB but natively"
    echo
    echo "$(date -u +%FT%TZ), $(timeout 20 nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1), $(($(date +%s) - START)) s"
    echo
    echo "| framework | part | mode | status | comparison with native |"
    echo "| --- | --- | --- | --- | --- |"
    sort -t$'\t' -k1,1 -k2,2 -s "$ROWS" | awk -F'\t' '{ printf "| %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5 }'
  } > "$OUT/frameworks.md"
  tar -czf "$OUT/frameworks-logs.tar.gz" -C "$WORK" logs
  cat "$OUT/frameworks.md"
  echo "table: $OUT/frameworks.md  logs: $OUT/frameworks-logs.tar.gz"
  local rc=0
  if [ ! -s "$ROWS" ] || awk -F'\t' '$4 != "ok" || ($3 != "native" && $5 !~ /^(equal|close)/) { bad = 1 } END { exit !bad }' "$ROWS"; then
    rc=1
  fi
  rm -rf "$WORK"
  exit "$rc"
}
trap finish EXIT
trap 'exit 130' INT TERM

{
  timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  timeout 120 "$PY" -c "import jax, cupy; print('jax', jax.__version__, 'cupy', cupy.__version__)"
} > "$LOGS/preflight.log" 2>&1

# run FRAMEWORK MODE: framework_checks.py into $WORK/FRAMEWORK-MODE, log logs/FRAMEWORK-MODE.log.
run() {
  local fw=$1 mode=$2 log=$LOGS/$1-$2.log t=$RUN_S room
  room=$(($(left) - 10))
  mkdir -p "$WORK/$fw-$mode"
  if ((room < 20)); then
    echo "SKIPPED: time budget spent" > "$log"
    return
  fi
  ((t > room)) && t=$room
  local cmd=("$PY" "$CHECKS" --framework "$fw" --out "$WORK/$fw-$mode")
  # Every mode but native runs on a vGPU of VRAM_MIB, and its memory parts check that cap.
  [ "$mode" = native ] || cmd+=(--vram-mib "$VRAM_MIB")
  [ -z "$PARTS" ] || cmd+=(--parts "$PARTS")
  local cap=(--vram "${VRAM_MIB}MiB")
  case $mode in
    local) cmd=("$TF" run --percent 100 "${cap[@]}" -- "${cmd[@]}") ;;
    shm) cmd=("$TF" run --remote "unix:$SOCK" --token "$TOKEN" "${cap[@]}" -- "${cmd[@]}") ;;
    tcp) cmd=("$TF" run --remote "127.0.0.1:$PORT" --token "$TOKEN" "${cap[@]}" -- "${cmd[@]}") ;;
  esac
  if [ "$mode" = shm ] || [ "$mode" = tcp ]; then
    if [ -z "$WPID" ] || ! kill -0 "$WPID" 2>/dev/null; then
      WPID=""
      start_worker || { echo "SKIPPED: no worker (see worker.log)" > "$log"; return; }
    fi
  fi
  echo "\$ [$mode, timeout $t s] ${cmd[*]}" > "$log"
  timeout -k 5 "$t" "${cmd[@]}" >> "$log" 2>&1 < /dev/null
  echo "exit=$?" >> "$log"
  echo "[$(($(date +%s) - START)) s] $fw $mode: $(grep -c 'status=ok' "$log") parts ok"
}

for fw in $FRAMEWORKS; do
  for mode in $MODES; do run "$fw" "$mode"; done
done

# One row per framework, part and mode: the run's status, and its outputs against native's.
for fw in $FRAMEWORKS; do
  parts=$(cat "$LOGS/$fw"-*.log 2>/dev/null | sed -n 's/^RESULT framework=[a-z]* part=\([a-z0-9_]*\) .*/\1/p' | sort -u)
  if [ -z "$parts" ]; then  # no run got as far as a part (the framework does not import, ...)
    for mode in $MODES; do
      why=$(grep -v '^\$\|^exit=' "$LOGS/$fw-$mode.log" 2>/dev/null | tail -1 | tr '\t|' '  ' | cut -c1-120)
      printf '%s\t%s\t%s\t%s\t%s\n' "$fw" "(all)" "$mode" "no result: ${why:-no log}" "-" >> "$ROWS"
    done
    continue
  fi
  for mode in $MODES; do
    log=$LOGS/$fw-$mode.log
    cmp=$LOGS/$fw-$mode-compare.log
    if [ "$mode" != native ]; then
      timeout 120 "$PY" "$CHECKS" --compare "$WORK/$fw-native" "$WORK/$fw-$mode" > "$cmp" 2>&1
    fi
    for part in $parts; do
      status=$(sed -n "s/^RESULT framework=$fw part=$part status=\([^ ]*\).*/\1/p" "$log" 2>/dev/null | tail -1)
      if [ -z "$status" ]; then
        status=$(head -1 "$log" 2>/dev/null | grep -o '^SKIPPED.*' || echo "no result (timed out or crashed: see $fw-$mode.log)")
      fi
      if [ "$mode" = native ]; then
        c="(reference)"
      else
        c=$(sed -n "s/^COMPARE part=$fw-$part status=\([^ ]*\) max_rel_diff=\(.*\)/\1 (max rel. diff \2)/p" "$cmp" | tail -1)
        [ -n "$c" ] || c="not compared (no output)"
      fi
      printf '%s\t%s\t%s\t%s\t%s\n' "$fw" "$part" "$mode" "$status" "$c" >> "$ROWS"
    done
  done
done
