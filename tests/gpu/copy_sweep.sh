#!/usr/bin/env bash
# Where the time of large pageable copies over the shared-memory transport goes: runs
# `remote_micro --parts bandwidth` (64 MiB to 1 GiB) natively and then over shm once per setting
# of the copy pipeline, with TFUSION_COPY_PROFILE=1 on both sides. Usage (repository root):
#
#   bash tests/gpu/copy_sweep.sh BUILD_DIR OUT_DIR [SETTING ...]
#
# A SETTING is a comma-separated list of KEY=VALUE for the client and worker environment, e.g.
# "TFUSION_SHM_ARENA_MIB=512,TFUSION_COPY_DEPTH=8" (keys: TFUSION_SHM_ARENA_MIB,
# TFUSION_COPY_THREADS, TFUSION_COPY_NT, TFUSION_COPY_SLICE_KIB, TFUSION_COPY_DEPTH); "default"
# is no change.
# OUT_DIR gets sweep.txt (pageable GB/s per setting and size, native first) and one client and
# one worker log per setting.
set -uo pipefail
if [ $# -lt 2 ]; then
  echo "usage: bash tests/gpu/copy_sweep.sh BUILD_DIR OUT_DIR [SETTING ...]" >&2
  exit 2
fi
B=$(cd "$1" && pwd) || exit 2
mkdir -p "$2" || exit 2
OUT=$(cd "$2" && pwd)
shift 2
SETTINGS=("$@")
[ ${#SETTINGS[@]} = 0 ] && SETTINGS=(default)
TF=$B/src/cli/tfusion
MICRO=$B/bench/gpu/remote_micro
SECS=${TF_SWEEP_SECONDS:-6}
W=$(mktemp -d /tmp/tf-copy-sweep.XXXXXX)
trap 'rm -rf "$W"' EXIT
SUM=$OUT/sweep.txt
: > "$SUM"

pageable() {  # pageable LOG LABEL: one line per direction with GB/s per size
  for dir in htod dtoh; do
    printf '%-60s %s' "$2" "$dir" >> "$SUM"
    for size in 64MiB 256MiB 1GiB; do
      v=$(sed -n "s/^RESULT ${dir}_pageable_${size}_gbps=//p" "$1")
      printf ' %s=%s' "$size" "${v:-?}" >> "$SUM"
    done
    echo >> "$SUM"
  done
}

timeout 120 "$MICRO" --parts bandwidth --min-bytes 64MiB --max-bytes 1GiB --seconds "$SECS" \
  > "$OUT/native.log" 2>&1
pageable "$OUT/native.log" native

i=0
for setting in "${SETTINGS[@]}"; do
  i=$((i + 1))
  envs=(TFUSION_COPY_PROFILE=1)
  if [ "$setting" != default ]; then
    IFS=, read -r -a kv <<< "$setting"
    for e in "${kv[@]}"; do
      case $e in
        TFUSION_SHM_ARENA_MIB=* | TFUSION_COPY_THREADS=* | TFUSION_COPY_NT=* | TFUSION_COPY_SLICE_KIB=* | TFUSION_COPY_DEPTH=*) envs+=("$e") ;;
        *) echo "unknown setting '$e'" >&2; exit 2 ;;
      esac
    done
  fi
  rm -f "$W/ready"
  env "${envs[@]}" "$TF" worker --listen "unix:$W/w$i.sock" --token sweep --ready-file "$W/ready" \
    > "$OUT/worker-$i.log" 2>&1 &
  wpid=$!
  for _ in $(seq 100); do [ -f "$W/ready" ] && break; sleep 0.1; done
  env "${envs[@]}" timeout 120 "$TF" run --remote "unix:$W/w$i.sock" --token sweep -- \
    "$MICRO" --parts bandwidth --min-bytes 64MiB --max-bytes 1GiB --seconds "$SECS" > "$OUT/client-$i.log" 2>&1
  echo "rc=$?" >> "$OUT/client-$i.log"
  kill "$wpid" 2>/dev/null
  wait "$wpid" 2>/dev/null
  pageable "$OUT/client-$i.log" "shm $setting"
done
cat "$SUM"
