#!/usr/bin/env bash
# Installs the build dependencies (Debian/Ubuntu, needs root or sudo) and builds into build/.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
PKGS="cmake ninja-build g++ python3 libgtest-dev libgmock-dev libbenchmark-dev nlohmann-json3-dev
      libsqlite3-dev libcpp-httplib-dev libcli11-dev etcd-server etcd-client clang libclang-rt-14-dev
      chromium chromium-driver g++-aarch64-linux-gnu python3-selenium python3-kubernetes python3-jsonschema python3-yaml openssl libssl-dev
      prometheus systemd"
missing=""
# gRPC and protobuf: the kubelet device plugin (src/deviceplugin) and its tests.
PKGS="$PKGS libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc"
for p in $PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  echo "==> installing:$missing"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
fi

echo "==> configuring and building (build/)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" >/dev/null
cmake --build build
