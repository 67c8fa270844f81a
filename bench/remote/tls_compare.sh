#!/usr/bin/env bash
# The cost of TLS on the remote vGPU's TCP stream: round trip p50 and 1 GiB HtoD/DtoH bandwidth
# through a plaintext worker and a TLS worker, started side by side on loopback and measured in
# alternating rounds of the same run (bench/remote/remote_rtt_copy through the client stub).
#
#   bash bench/remote/tls_compare.sh BUILD_DIR [DRIVER]
#
# DRIVER: the libcuda.so.1 the workers' sessions load; default the fake driver of BUILD_DIR
# (tests/fakecuda: copies land in host memory, so the numbers are the transport's alone). On a GPU
# host give the real one (tests/gpu/remote_tls.sh does). Needs the openssl command (a throw-away
# self-signed certificate for 127.0.0.1). Environment: TF_TLS_ROUNDS (default 3), TF_TLS_MIB
# (copy size, default 1024), TF_TLS_TRIPS (timed round trips, default 5000), TF_TLS_PROGRAM
# (default BUILD_DIR/bench/remote/remote_rtt_copy). Prints one markdown row per round and mode,
# then the medians; exit 1 when a run failed.
set -uo pipefail
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: bash bench/remote/tls_compare.sh BUILD_DIR [DRIVER]" >&2
  exit 2
fi
B=$(cd "$1" && pwd)
DRIVER=${2:-$B/tests/fakecuda/libcuda.so.1}
ROUNDS=${TF_TLS_ROUNDS:-3}
MIB=${TF_TLS_MIB:-1024}
TRIPS=${TF_TLS_TRIPS:-5000}
PROG=${TF_TLS_PROGRAM:-$B/bench/remote/remote_rtt_copy}
INJECT=$B/src/client/inject
if [ -x "$B/src/worker/tfusion-worker" ]; then WORKER=("$B/src/worker/tfusion-worker")
else WORKER=("$B/src/cli/tfusion" worker); fi
for f in "$PROG" "$INJECT/libcuda.so.1" "$DRIVER" "${WORKER[0]}"; do
  [ -e "$f" ] || { echo "missing $f" >&2; exit 2; }
done
command -v openssl >/dev/null || { echo "the openssl command is needed for a test certificate" >&2; exit 2; }

T=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=127.0.0.1 \
  -addext subjectAltName=IP:127.0.0.1 -keyout "$T/key.pem" -out "$T/cert.pem" 2>"$T/openssl.log" ||
  { cat "$T/openssl.log" >&2; exit 2; }
export FAKECUDA_SHM_NAME=/tf-tls-bench-$$
TOKEN=bench-token-$$
start_worker() {  # name, extra flags...
  local name=$1
  shift
  "${WORKER[@]}" --listen 127.0.0.1:0 --token "$TOKEN" --driver "$DRIVER" \
    --ready-file "$T/$name.ready" "$@" >"$T/$name.log" 2>&1 &
  PIDS+=($!)
}
start_worker plain
start_worker tls --tls-cert "$T/cert.pem" --tls-key "$T/key.pem"
for i in $(seq 100); do
  [ -s "$T/plain.ready" ] && [ -s "$T/tls.ready" ] && break
  sleep 0.1
done
ADDR_plain=$(awk '$1 == "tcp" {print $2}' "$T/plain.ready" 2>/dev/null)
ADDR_tls=$(awk '$1 == "tcp" {print $2}' "$T/tls.ready" 2>/dev/null)
if [ -z "$ADDR_plain" ] || [ -z "$ADDR_tls" ]; then
  echo "the workers did not start:" >&2
  cat "$T/plain.log" "$T/tls.log" >&2
  exit 1
fi

echo "| round | stream | RTT p50 µs | RTT p99 µs | HtoD ${MIB} MiB GB/s | DtoH ${MIB} MiB GB/s |"
echo "| --- | --- | --- | --- | --- | --- |"
failed=0
for r in $(seq "$ROUNDS"); do
  for mode in plain tls; do
    addr_var=ADDR_$mode
    env_ca=()
    [ "$mode" = tls ] && env_ca=(TFUSION_CA_FILE="$T/cert.pem")
    out=$(env LD_LIBRARY_PATH="$INJECT" TFUSION_REMOTE="${!addr_var}" TFUSION_TOKEN="$TOKEN" \
          "${env_ca[@]}" "$PROG" --trips "$TRIPS" --mib "$MIB" 2>&1)
    if [ $? -ne 0 ] || ! grep -q "RESULT copy_intact=1" <<<"$out"; then
      echo "$mode round $r failed: $out" >&2
      failed=1
      continue
    fi
    get() { sed -n "s/^RESULT $1=//p" <<<"$out"; }
    echo "| $r | $mode | $(get rtt_p50_us) | $(get rtt_p99_us) | $(get htod_gbps) | $(get dtoh_gbps) |"
    echo "$mode $(get rtt_p50_us) $(get htod_gbps) $(get dtoh_gbps)" >>"$T/rows"
  done
done
median() {  # mode, column
  awk -v m="$1" -v c="$2" '$1 == m {print $c}' "$T/rows" | sort -g |
    awk '{v[NR] = $1} END {if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}'
}
if [ -s "$T/rows" ]; then
  echo
  echo "| median of $ROUNDS rounds | RTT p50 µs | HtoD GB/s | DtoH GB/s |"
  echo "| --- | --- | --- | --- |"
  for mode in plain tls; do
    echo "| $mode | $(median $mode 2) | $(median $mode 3) | $(median $mode 4) |"
  done
  echo
  echo "TLS session: $(grep -o 'via tls ([^)]*)' "$T/tls.log" | head -1)"
fi
exit $failed
