#!/usr/bin/env bash
# Remote copy bandwidth over loopback TCP against a plain socket benchmark in the same run:
# `tcp_copy_bench socket` (one process sends N bytes to another over loopback TCP, which answers
# one byte), then a worker on DRIVER and `tcp_copy_bench copy` through the client stub over TCP
# (synchronous and asynchronous HtoD/DtoH, pageable and page-locked, 4 KiB to 1 GiB), then the
# same copies natively on DRIVER. Usage (repository root):
#
#   bash tests/gpu/tcp_copy.sh BUILD_DIR OUT_DIR [DRIVER]
#
# DRIVER is the libcuda.so.1 the worker and the native run load (default: the system's, found by
# the loader; give BUILD_DIR/tests/fakecuda/libcuda.so.1 on a machine without a GPU).
# TF_TCP_COPY_MAX_MIB (default 1024) and TF_TCP_COPY_BUDGET_MIB (default 1024) bound the sizes
# and the bytes copied per point. OUT_DIR gets socket.txt, tcp.txt, native.txt, worker.log and
# table.md (GB/s per size; "ratio" is TCP over socket). Exit 0 when every part ran.
set -uo pipefail
if [ $# -lt 2 ]; then
  echo "usage: bash tests/gpu/tcp_copy.sh BUILD_DIR OUT_DIR [DRIVER]" >&2
  exit 2
fi
B=$(cd "$1" && pwd) || exit 2
mkdir -p "$2" || exit 2
OUT=$(cd "$2" && pwd)
DRIVER=${3:-libcuda.so.1}
BENCH=$B/bench/copy/tcp_copy_bench
WORKER=$B/src/worker/tfusion-worker
[ -x "$WORKER" ] || WORKER="$B/src/cli/tfusion worker"
MAX=${TF_TCP_COPY_MAX_MIB:-1024}
BUDGET=${TF_TCP_COPY_BUDGET_MIB:-1024}
for f in "$BENCH" "$B/src/client/inject"; do
  [ -e "$f" ] || { echo "missing $f (build the tcp_copy_bench, tfusion-client and worker targets)" >&2; exit 2; }
done
W=$(mktemp -d /tmp/tf-tcp-copy.XXXXXX)
wpid=
cleanup() {
  [ -n "$wpid" ] && kill "$wpid" 2>/dev/null && wait "$wpid" 2>/dev/null
  rm -rf "$W"
}
trap cleanup EXIT
rc=0

echo "== plain socket" >&2
timeout 600 "$BENCH" socket --max "$MAX" --budget "$BUDGET" > "$OUT/socket.txt" || rc=1

echo "== remote copies over TCP (worker on $DRIVER)" >&2
$WORKER --listen 127.0.0.1:0 --token tcp-copy --driver "$DRIVER" --ready-file "$W/ready" \
  > "$OUT/worker.log" 2>&1 &
wpid=$!
for _ in $(seq 100); do [ -s "$W/ready" ] && break; sleep 0.1; done
ADDR=$(awk '$1 == "tcp" { print $2; exit }' "$W/ready" 2>/dev/null)
if [ -z "$ADDR" ]; then
  echo "the worker did not start: see $OUT/worker.log" >&2
  exit 1
fi
LD_LIBRARY_PATH=$B/src/client/inject TFUSION_REMOTE=$ADDR TFUSION_TOKEN=tcp-copy \
  timeout 900 "$BENCH" copy --max "$MAX" --budget "$BUDGET" > "$OUT/tcp.txt" || rc=1
kill "$wpid" 2>/dev/null
wait "$wpid" 2>/dev/null
wpid=

echo "== native copies on $DRIVER" >&2
if [ "$DRIVER" = libcuda.so.1 ]; then
  timeout 600 "$BENCH" copy --max "$MAX" --budget "$BUDGET" > "$OUT/native.txt" || rc=1
else
  LD_LIBRARY_PATH=$(dirname "$DRIVER") timeout 600 "$BENCH" copy --max "$MAX" --budget "$BUDGET" \
    > "$OUT/native.txt" || rc=1
fi

# One table: per size the socket rate, then per kind of copy TCP GB/s (ratio to the socket), and
# native GB/s in a second table.
awk -v sock="$OUT/socket.txt" -v tcp="$OUT/tcp.txt" -v nat="$OUT/native.txt" '
  function label(n) { return n >= 1073741824 ? n / 1073741824 " GiB" : n >= 1048576 ? n / 1048576 " MiB" : n / 1024 " KiB" }
  BEGIN {
    while ((getline l < sock) > 0) { split(l, f, " "); if (f[1] == "socket") { s[f[2]] = f[3]; sizes[++ns] = f[2] } }
    while ((getline l < tcp) > 0) { split(l, f, " "); if (f[1] == "copy") { t[f[2], f[3]] = f[4]; if (!(f[2] in seen)) { seen[f[2]] = 1; kinds[++nk] = f[2] } } }
    while ((getline l < nat) > 0) { split(l, f, " "); if (f[1] == "copy") v[f[2], f[3]] = f[4] }
    printf "### TCP copies, GB/s (ratio to the plain socket)\n\n| size | socket |"
    for (k = 1; k <= nk; k++) printf " %s |", kinds[k]
    printf "\n| --- | --- |"
    for (k = 1; k <= nk; k++) printf " --- |"
    printf "\n"
    for (i = 1; i <= ns; i++) {
      n = sizes[i]
      printf "| %s | %s |", label(n), s[n]
      for (k = 1; k <= nk; k++) {
        x = t[kinds[k], n]
        if (x == "") printf " ? |"
        else printf(" %s (%.2f) |", x, (s[n] > 0 ? x / s[n] : 0))
      }
      printf "\n"
    }
    printf "\n### Native copies on the same driver, GB/s\n\n| size |"
    for (k = 1; k <= nk; k++) printf " %s |", kinds[k]
    printf "\n| --- |"
    for (k = 1; k <= nk; k++) printf " --- |"
    printf "\n"
    for (i = 1; i <= ns; i++) {
      n = sizes[i]
      printf "| %s |", label(n)
      for (k = 1; k <= nk; k++) { x = v[kinds[k], n]; printf(" %s |", (x == "" ? "?" : x)) }
      printf "\n"
    }
  }' > "$OUT/table.md"
cat "$OUT/table.md"
exit $rc
