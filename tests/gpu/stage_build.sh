#!/usr/bin/env bash
# Copies what the GPU tier needs from a build folder into a small, stripped folder that can be
# shipped to a GPU machine: bash tests/gpu/stage_build.sh BUILD_DIR STAGE_DIR
set -euo pipefail
B=$1
S=$2
rm -rf "$S"
mkdir -p "$S/src/cli" "$S/src/limiter/inject" "$S/tests/gpu" "$S/bench/gpu"
cp "$B/src/cli/tfusion" "$S/src/cli/"
# Control-plane libraries from this machine's packages that a stock GPU host may lack.
mkdir -p "$S/src/cli/deps"
for lib in libcpp-httplib libbrotlidec libbrotlienc libbrotlicommon libsqlite3; do
  p=$(ldd "$B/src/cli/tfusion" | awk -v l="$lib" '$1 ~ "^"l {print $3}')
  [ -n "$p" ] && cp -L "$p" "$S/src/cli/deps/"
done
cp "$B/src/limiter/libtfusion-limiter.so" "$S/src/limiter/"
if [ -d "$B/src/limiter/nvml" ]; then
  mkdir -p "$S/src/limiter/nvml"
  cp "$B"/src/limiter/nvml/libtfusion-nvml.so "$S/src/limiter/nvml/"
fi
cp -P "$B"/src/limiter/inject/* "$S/src/limiter/inject/"
if [ -f "$B/src/client/libtfusion-client.so" ]; then
  mkdir -p "$S/src/client/inject"
  cp "$B"/src/client/libtfusion-client*.so "$S/src/client/"  # the stub and the client NVML
  cp -P "$B"/src/client/inject/* "$S/src/client/inject/"
fi
for f in drvtest ipc_pair compute_tenant rt_smoke rt_oom samples tier_kernels.fatbin; do
  [ -e "$B/tests/gpu/$f" ] && cp "$B/tests/gpu/$f" "$S/tests/gpu/"
done
for f in launch_overhead startup_probe remote_micro dtoh_probe tier_kernels.fatbin; do
  [ -e "$B/bench/gpu/$f" ] && cp "$B/bench/gpu/$f" "$S/bench/gpu/"
done
# TLS against plaintext on the remote stream (tests/gpu/remote_tls.sh).
if [ -e "$B/bench/remote/remote_rtt_copy" ]; then
  mkdir -p "$S/bench/remote"
  cp "$B/bench/remote/remote_rtt_copy" "$S/bench/remote/"
fi
# Allocate/release throughput over HTTPS against HTTP on the GPU host's cores
# (docs/benchmarks-controller.md; its libraries are in src/cli/deps).
if [ -e "$B/bench/controller/tls_latency" ]; then
  mkdir -p "$S/bench/controller"
  cp "$B/bench/controller/tls_latency" "$S/bench/controller/"
fi
# The remote probe: its graph-node mode runs on a real driver (tests/gpu/README.md).
# host_region_probe and query_probe: their memset and query modes run on a real driver too.
for f in remote_probe host_region_probe query_probe; do
  if [ -e "$B/tests/worker/$f" ]; then
    mkdir -p "$S/tests/worker"
    cp "$B/tests/worker/$f" "$S/tests/worker/"
  fi
done
for f in copy_bench tcp_copy_bench; do
  if [ -e "$B/bench/copy/$f" ]; then
    mkdir -p "$S/bench/copy"
    cp "$B/bench/copy/$f" "$S/bench/copy/"
  fi
done
find "$S" -type f -perm -u+x -exec strip --strip-debug {} + 2>/dev/null || true
strip --strip-debug "$S"/src/limiter/*.so "$S"/src/limiter/nvml/*.so "$S"/src/client/*.so 2>/dev/null || true
du -sh "$S"
