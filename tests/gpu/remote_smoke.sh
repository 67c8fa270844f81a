#!/usr/bin/env bash
# The remote vGPU's first slice on a GPU host: a worker on the real driver, and driver-API
# programs run natively, through the shared-memory transport and through loopback TCP.
# Usage: bash tests/gpu/remote_smoke.sh BUILD_DIR OUT_DIR   (prints a Markdown table)
set -uo pipefail
B=$(cd "$1" && pwd)
OUT=$2
mkdir -p "$OUT"
TF=$B/src/cli/tfusion
W=$(mktemp -d /tmp/tf-remote.XXXXXX)
TOKEN=gpu-smoke-$$
"$TF" worker --listen "unix:$W/worker.sock" --listen 127.0.0.1:7601 --token "$TOKEN" \
  --ready-file "$W/ready" > "$OUT/remote-worker.log" 2>&1 &
WPID=$!
for i in $(seq 50); do [ -f "$W/ready" ] && break; sleep 0.1; done
run_mode() {  # run_mode native|shm|tcp CMD...
  local mode=$1
  shift
  case $mode in
    native) timeout 120 "$@" ;;
    shm) timeout 120 "$TF" run --remote "unix:$W/worker.sock" --token "$TOKEN" -- "$@" ;;
    tcp) timeout 120 "$TF" run --remote 127.0.0.1:7601 --token "$TOKEN" -- "$@" ;;
  esac
}
echo "| program | mode | exit | key results |"
echo "| --- | --- | --- | --- |"
for mode in native shm tcp; do
  out=$(run_mode $mode "$B/tests/gpu/drvtest" alloc --path mem_alloc --chunk 64MiB --max 2GiB 2>&1)
  rc=$?
  echo "$out" > "$OUT/remote-alloc-$mode.log"
  echo "| drvtest alloc mem_alloc | $mode | $rc | $(echo "$out" | grep -E 'RESULT (total_mib|error|realloc)' | tr '\n' ' ') |"
  out=$(run_mode $mode "$B/bench/gpu/launch_overhead" --n 200000 --max-seconds 30 2>&1)
  rc=$?
  echo "$out" > "$OUT/remote-launch-$mode.log"
  echo "| launch_overhead 200k | $mode | $rc | $(echo "$out" | grep -E 'RESULT (mean_ns|p50_ns|launches_per_s|launch_error)' | tr '\n' ' ') |"
  out=$(run_mode $mode "$B/tests/gpu/compute_tenant" --seconds 3 --spin-us 300 --depth 8 --out "$W/seg-$mode" 2>&1)
  rc=$?
  echo "$out" > "$OUT/remote-tenant-$mode.log"
  echo "| compute_tenant 3 s | $mode | $rc | $(echo "$out" | grep -E 'RESULT (kernels|gpu_kernels_per_s|error)' | tr '\n' ' ') |"
done
kill "$WPID" 2>/dev/null
wait "$WPID" 2>/dev/null
rm -rf "$W"
