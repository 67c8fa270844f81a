#!/usr/bin/env bash
# TLS against plaintext on the remote vGPU's TCP stream, on a GPU host: round trip p50 and 1 GiB
# HtoD/DtoH bandwidth through two workers on loopback that load the real driver, in alternating
# rounds of one run (bench/remote/tls_compare.sh does the work). Usage, from the repository root:
#
#   bash tests/gpu/remote_tls.sh BUILD_DIR [LIBCUDA]
#
# BUILD_DIR holds src/cli/tfusion (or src/worker/tfusion-worker), src/client/inject and
# bench/remote/remote_rtt_copy (tests/gpu/stage_build.sh copies them). LIBCUDA defaults to the
# first libcuda.so.1 found in the usual places. Needs the openssl command and libssl3.
set -euo pipefail
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: bash tests/gpu/remote_tls.sh BUILD_DIR [LIBCUDA]" >&2
  exit 2
fi
DRIVER=${2:-}
if [ -z "$DRIVER" ]; then
  for p in /usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/lib64/libcuda.so.1 \
           /usr/local/nvidia/lib64/libcuda.so.1 /lib/x86_64-linux-gnu/libcuda.so.1; do
    [ -e "$p" ] && DRIVER=$p && break
  done
fi
[ -n "$DRIVER" ] || { echo "no libcuda.so.1 found: give its path" >&2; exit 2; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 | sed 's/^/GPU: /'
echo "driver: $DRIVER"
exec bash "$(dirname "$0")/../../bench/remote/tls_compare.sh" "$1" "$DRIVER"
