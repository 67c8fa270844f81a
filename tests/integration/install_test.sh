#!/usr/bin/env bash
# scripts/install.sh, as docs/operations.md tells an operator to run it, gives a host where
# tenants run: the installed tfusion finds its installed limiter and remote client (every link
# resolves, outside the build tree), a tenant of `tfusion run` sees its VRAM cap, and a second
# install over a first one (an upgrade) works the same.
# Usage: install_test.sh REPO BUILD FAKE_LIB_DIR PROBE
set -euo pipefail
REPO=$1 BUILD=$2 FAKE=$3 PROBE=$4
T=$(mktemp -d /tmp/tf-install-XXXXXX)
SHM=/tf-install-$$
cleanup() { rm -rf "$T"; rm -f /dev/shm"$SHM"*; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

for round in install upgrade; do
  out=$(bash "$REPO/scripts/install.sh" --prefix "$T/usr/local" "$BUILD") || fail "$round: install.sh exited $?"
  echo "$out"
  lib=$T/usr/local/lib/tensorfusion
  for link in "$lib"/inject/libcuda.so.1 "$lib"/inject/libnvidia-ml.so.1 "$lib"/client-inject/libcuda.so.1 \
              "$lib"/client-inject/libnvidia-ml.so.1; do
    [ -e "$link" ] || fail "$round: $link does not resolve"
    case $(readlink -f "$link") in "$lib"/*) ;; *) fail "$round: $link leaves the install: $(readlink -f "$link")" ;; esac
  done
  [ "$(readlink -f "$lib/inject/libcuda.so")" = "$(readlink -f "$lib/inject/libcuda.so.1")" ] ||
    fail "$round: libcuda.so and libcuda.so.1 are two copies of the limiter"
  # The installed binary, away from the build tree, runs a tenant under its installed limiter.
  cp "$PROBE" "$T/probe"
  got=$(env -u TFUSION_LIB_DIR TFUSION_SHM_DIR="$T/shm" FAKECUDA_SHM_NAME="$SHM" \
        "$T/usr/local/bin/tfusion" run --driver "$FAKE/libcuda.so.1" --nvml "$FAKE/libnvidia-ml.so.1" \
        --vram 1GiB -- "$T/probe" alloc 2>&1) || true
  echo "$got"
  grep -q '^total_mib=1024$' <<< "$got" || fail "$round: the tenant did not see its 1 GiB cap"
  grep -q '^allocated_mib=1024$' <<< "$got" || fail "$round: the tenant was not held at its 1 GiB cap"
  # The remote client is found too: with no worker listening, the client says it cannot connect
  # (not that it is not installed).
  got=$(env -u TFUSION_CLIENT_DIR "$T/usr/local/bin/tfusion" run --remote 127.0.0.1:1 --token t -- "$T/probe" alloc 2>&1) || true
  if grep -q "not installed" <<< "$got"; then fail "$round: $got"; fi
done
[ "$(bash "$REPO/scripts/install.sh" --prefix "$T/x" "$T/no-build" 2>&1 >/dev/null; echo $?)" != 0 ] ||
  fail "install.sh from a folder that is not a build succeeded"
bash "$REPO/scripts/install.sh" --help | grep -q -- "--prefix" || fail "install.sh --help says nothing of --prefix"
echo "PASS"
