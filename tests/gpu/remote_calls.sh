#!/usr/bin/env bash
# Counts the driver calls a PyTorch step makes through the remote stub (shared memory), from the
# client's call trace: bash tests/gpu/remote_calls.sh BUILD_DIR OUT_DIR. Writes OUT_DIR/calls-*.txt
# (calls per name inside the marked window, most frequent first) and the error lines.
# TF_CALLS_PARTS picks the workloads (default "resnet graphs"; also gpt2, gpt2b8, generate), and
# TF_CALLS_TCP=1 runs them over loopback TCP instead of the unix socket.
set -uo pipefail
B=$(cd "$1" && pwd)
OUT=$2
mkdir -p "$OUT"
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TF=$B/src/cli/tfusion
W=$(mktemp -d /tmp/tf-calls.XXXXXX)
ADDR="unix:$W/w.sock"
[ "${TF_CALLS_TCP:-0}" = 1 ] && ADDR=127.0.0.1:${TF_CALLS_PORT:-7613}
"$TF" worker --listen "$ADDR" --token calls --ready-file "$W/ready" > "$OUT/worker.log" 2>&1 &
WPID=$!
for _ in $(seq 50); do [ -f "$W/ready" ] && break; sleep 0.1; done
for part in ${TF_CALLS_PARTS:-resnet graphs}; do
  TFUSION_CLIENT_TRACE=calls timeout 240 "$TF" run --remote "$ADDR" --token calls -- \
    "${PYTHON:-python3}" "$HERE/remote_calls.py" "$part" > "$W/$part.out" 2> "$W/$part.err"
  echo "$part exit $?" >> "$OUT/summary.txt"
  grep RESULT "$W/$part.out" >> "$OUT/summary.txt"
  awk '/^MARK begin/{on=1; next} /^MARK end/{on=0} on' "$W/$part.err" |
    sed -n 's/^tfusion-trace: \([A-Za-z0-9_]*\)(.*/\1/p' | sort | uniq -c | sort -rn > "$OUT/calls-$part.txt"
  awk '/^MARK begin/{on=1; next} /^MARK end/{on=0} on' "$W/$part.err" |
    grep -v '^tfusion-trace:' | head -200 > "$OUT/other-$part.txt"
  awk '/^MARK begin/{on=1; next} /^MARK end/{on=0} on' "$W/$part.err" |
    grep -B4 ' -> [0-9]\|not supported' | grep -v "cuGetProcAddress\|cuGetExportTable" | head -120 > "$OUT/errors-$part.txt"
done
kill "$WPID" 2>/dev/null
wait "$WPID" 2>/dev/null
rm -rf "$W"
cat "$OUT/summary.txt"; head -40 "$OUT/calls-resnet.txt"
