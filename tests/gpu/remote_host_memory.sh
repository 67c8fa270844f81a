#!/bin/bash
# Host memory of remote sessions on the real driver: managed, mapped and page-locked memory in
# 256 MiB steps through `tfusion worker --session-host-mem 2GiB`, over TCP and shared memory,
# with and without a 4 GiB vGPU (docs/remote.md "Host memory of a session"), and managed memory
# natively for the timing baseline.
#   bash tests/gpu/remote_host_memory.sh BUILD_DIR OUT_DIR
# BUILD_DIR holds src/cli/tfusion (with ../limiter/inject and ../client/inject beside it) and
# tests/worker/host_region_probe (memsets instead of kernels: it runs on any driver).
set -u
B=$(cd "${1:?BUILD_DIR}" && pwd)
OUT=${2:?OUT_DIR}
mkdir -p "$OUT"
T=$B/src/cli/tfusion
P=$B/tests/worker/host_region_probe
D=$(mktemp -d)
export TFUSION_SHM_DIR=$D/shm
{
  echo "== native, managed 256 MiB x 16"
  timeout 120 "$P" steps managed 256 16 memset
  "$T" worker --listen 127.0.0.1:0 --listen "unix:$D/w.sock" --token t --session-host-mem 2GiB \
    --ready-file "$D/ready" > "$OUT/worker.log" 2>&1 &
  W=$!
  for _ in $(seq 200); do [ -s "$D/ready" ] && break; sleep 0.1; done
  tcp=$(awk '/^tcp/{print $2}' "$D/ready")
  for via in "$tcp" "unix:$D/w.sock"; do
    echo "== $via --vram 4GiB: managed 256 MiB x 24 (the VRAM limit)"
    timeout 120 "$T" run --remote "$via" --token t --vram 4GiB -- "$P" steps managed 256 24 memset
    for kind in managed mapped pinned; do
      echo "== $via: $kind 256 MiB x 12 (the 2 GiB host-memory limit)"
      timeout 120 "$T" run --remote "$via" --token t -- "$P" steps $kind 256 12 memset
    done
  done
  kill "$W"
  wait "$W"
} 2>&1 | tee "$OUT/remote_host_memory.txt"
rm -rf "$D"
