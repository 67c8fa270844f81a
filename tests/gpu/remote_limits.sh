#!/usr/bin/env bash
# Per-client vGPU limits of the remote vGPU on a GPU host: `tfusion worker` makes each client that
# asks for limits a vGPU of its own (enforced by the limiter in the session) and removes it when
# the session ends. Usage (from the repository root):
#
#   bash tests/gpu/remote_limits.sh BUILD_DIR OUT_DIR
#
# Over shared memory and over loopback TCP:
#   memory    rt_smoke LIMIT and rt_oom LIMIT with --vram 2GiB: cudaMemGetInfo's total is the
#             limit, cudaMalloc is refused with cudaErrorMemoryAllocation at the limit
#   two       two clients at once, each --vram 2GiB: each gets its own 2 GiB
#   compute   compute_tenant for 4 s with --percent 50 and with --percent 100: share of GPU time
#             (union of the kernel's running segments per 1 s window, first second dropped)
#   gpu       (hosts with 2 or more GPUs) --gpu 1 and --gpu <GPU 1's UUID>: the client sees one
#             device, GPU 1 (its UUID), with the VRAM limit; --gpu 99 is refused
#   killed    a worker killed with SIGKILL while a client runs: the next worker removes the
#             vGPU its session left
#   cleanup   after the clients exit, `tfusion smi` lists no remote vGPU
# OUT_DIR gets limits-summary.txt (PASS/FAIL lines, the numbers) and one log per command.
# Exit status 0 when nothing failed.
set -uo pipefail
if [ $# -ne 2 ]; then
  echo "usage: bash tests/gpu/remote_limits.sh BUILD_DIR OUT_DIR" >&2
  exit 2
fi
B=$(cd "$1" && pwd) || exit 2
mkdir -p "$2" || exit 2
OUT=$(cd "$2" && pwd)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PY=${PYTHON:-python3}
TF=$B/src/cli/tfusion
W=$(mktemp -d /tmp/tf-remote-limits.XXXXXX)
export TFUSION_SHM_DIR=$W/shm
PORT=${TF_LIMITS_PORT:-7617}
TOKEN=limits-$$-$RANDOM
SUM=$OUT/limits-summary.txt
: > "$SUM"
FAILS=0
LIMIT=$((2 << 30))

pass() { echo "PASS $*" | tee -a "$SUM"; }
fail() { echo "FAIL $*" | tee -a "$SUM"; FAILS=$((FAILS + 1)); }

"$TF" worker --listen "unix:$W/w.sock" --listen "127.0.0.1:$PORT" --token "$TOKEN" \
  --ready-file "$W/ready" > "$OUT/worker.log" 2>&1 &
WPID=$!
trap 'kill $WPID 2>/dev/null; wait $WPID 2>/dev/null; rm -rf "$W"' EXIT
for _ in $(seq 100); do [ -f "$W/ready" ] && break; sleep 0.1; done
[ -f "$W/ready" ] || { fail "worker did not start"; cat "$OUT/worker.log"; exit 1; }

remote() {  # remote MODE FLAGS... -- CMD...
  local mode=$1; shift
  local addr="unix:$W/w.sock"
  [ "$mode" = tcp ] && addr=127.0.0.1:$PORT
  timeout 120 "$TF" run --remote "$addr" --token "$TOKEN" "$@"
}

share() {  # share SEGMENTS_FILE -> mean % of GPU time per 1 s window
  "$PY" -c "
import sys
sys.path.insert(0, '$HERE')
import compute_share as cs
s = cs.load_segments('$1')
w = cs.window_shares([s])
print('%.1f' % (sum(w[0]) / len(w[0])) if w else 'none')
"
}

for mode in shm tcp; do
  remote "$mode" --vram 2GiB --percent 100 -- "$B/tests/gpu/rt_smoke" "$LIMIT" > "$OUT/rt-smoke-$mode.log" 2>&1
  rc=$?
  if [ $rc = 0 ] && grep -q "total_mib=2048" "$OUT/rt-smoke-$mode.log"; then
    pass "$mode memory: rt_smoke sees a 2048 MiB GPU and computes right"
  else
    fail "$mode memory: rt_smoke rc=$rc ($(grep RESULT "$OUT/rt-smoke-$mode.log" | tr '\n' ' '))"
  fi
  remote "$mode" --vram 2GiB --percent 100 -- "$B/tests/gpu/rt_oom" "$LIMIT" $((8 << 30)) > "$OUT/rt-oom-$mode.log" 2>&1
  rc=$?
  total=$(sed -n 's/^RESULT total_mib=//p' "$OUT/rt-oom-$mode.log")
  err=$(sed -n 's/^RESULT error=//p' "$OUT/rt-oom-$mode.log")
  if [ $rc = 0 ] && [ "$err" = cudaErrorMemoryAllocation ] && [ -n "$total" ] && [ "$total" -le 2050 ] && [ "$total" -ge 1024 ]; then
    pass "$mode memory: cudaMalloc refused at $total MiB of 2048 ($err)"
  else
    fail "$mode memory: rt_oom rc=$rc total=${total:-?} MiB error=${err:-?}"
  fi

  # Two clients at once, each with its own vGPU.
  remote "$mode" --vram 2GiB --percent 100 -- "$B/tests/gpu/rt_oom" "$LIMIT" $((8 << 30)) > "$OUT/two-a-$mode.log" 2>&1 &
  a=$!
  remote "$mode" --vram 2GiB --percent 100 -- "$B/tests/gpu/rt_oom" "$LIMIT" $((8 << 30)) > "$OUT/two-b-$mode.log" 2>&1 &
  b=$!
  wait $a; ra=$?
  wait $b; rb=$?
  ta=$(sed -n 's/^RESULT total_mib=//p' "$OUT/two-a-$mode.log")
  tb=$(sed -n 's/^RESULT total_mib=//p' "$OUT/two-b-$mode.log")
  if [ $ra = 0 ] && [ $rb = 0 ] && [ "${ta:-0}" -ge 1024 ] && [ "${tb:-0}" -ge 1024 ] &&
     [ "${ta:-9999}" -le 2050 ] && [ "${tb:-9999}" -le 2050 ]; then
    pass "$mode two clients: $ta MiB and $tb MiB, each within its own 2048"
  else
    fail "$mode two clients: rc=$ra/$rb totals ${ta:-?}/${tb:-?} MiB"
  fi

  for pct in 100 50; do
    remote "$mode" --vram 4GiB --percent "$pct" -- "$B/tests/gpu/compute_tenant" --seconds 4 --spin-us 300 \
      --depth 8 --out "$W/seg-$mode-$pct" > "$OUT/tenant-$mode-$pct.log" 2>&1
    rc=$?
    s=none
    [ $rc = 0 ] && [ -f "$W/seg-$mode-$pct" ] && s=$(share "$W/seg-$mode-$pct")
    echo "$mode compute --percent $pct: ${s}% of GPU time" | tee -a "$SUM"
    eval "share_$pct=$s"
  done
  # shellcheck disable=SC2154
  if [ "$share_50" != none ] && [ "$share_100" != none ] &&
     "$PY" -c "import sys; a, b = $share_50, $share_100; sys.exit(0 if abs(a - 50) <= 5 and b >= 90 else 1)"; then
    pass "$mode compute: --percent 50 got ${share_50}%, --percent 100 got ${share_100}%"
  else
    fail "$mode compute: --percent 50 got ${share_50}%, --percent 100 got ${share_100}% (want 50±5, >=90)"
  fi
done

NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if [ "${NGPU:-0}" -ge 2 ]; then
  UUID1=$(nvidia-smi -i 1 --query-gpu=uuid --format=csv,noheader | tr -d ' ')
  PROBE="import torch; p = torch.cuda.get_device_properties(0); print('DEVICES', torch.cuda.device_count()); print('UUID GPU-' + str(p.uuid)); print('TOTAL_MIB', torch.cuda.mem_get_info()[1] >> 20)"
  for mode in shm tcp; do
    for sel in 1 "$UUID1"; do
      remote "$mode" --gpu "$sel" --vram 2GiB -- "$PY" -c "$PROBE" > "$OUT/gpu-$mode.log" 2>&1
      rc=$?
      dev=$(sed -n 's/^DEVICES //p' "$OUT/gpu-$mode.log")
      uuid=$(sed -n 's/^UUID //p' "$OUT/gpu-$mode.log")
      total=$(sed -n 's/^TOTAL_MIB //p' "$OUT/gpu-$mode.log")
      if [ $rc = 0 ] && [ "$dev" = 1 ] && [ "$uuid" = "$UUID1" ] && [ "$total" = 2048 ]; then
        pass "$mode --gpu ${sel:0:12}: one device, GPU 1 ($uuid), 2048 MiB"
      else
        fail "$mode --gpu ${sel:0:12}: rc=$rc devices=${dev:-?} uuid=${uuid:-?} (want $UUID1) total=${total:-?} MiB"
      fi
    done
    remote "$mode" --gpu 99 --vram 2GiB -- "$PY" -c "$PROBE" > "$OUT/gpu-bad-$mode.log" 2>&1
    rc=$?
    if [ $rc != 0 ] && grep -q "refused\|vGPU" "$OUT/gpu-bad-$mode.log"; then
      pass "$mode --gpu 99: refused ($(grep -m1 -i "refused" "$OUT/gpu-bad-$mode.log" | cut -c1-100))"
    else
      fail "$mode --gpu 99: rc=$rc, not refused"
    fi
  done
else
  echo "SKIP gpu: this host has ${NGPU:-0} GPU(s); --gpu needs 2" | tee -a "$SUM"
fi

# A worker killed outright (SIGKILL): its session dies with it and leaves its vGPU; the next
# worker removes it (the session's lock file is no longer held) and says so.
remote shm --vram 2GiB --percent 50 -- "$B/tests/gpu/compute_tenant" --seconds 30 --spin-us 300 --depth 8 --out "$W/seg-killed" \
  > "$OUT/killed-client.log" 2>&1 &
c=$!
for _ in $(seq 100); do "$TF" smi 2>/dev/null | grep -q "remote-" && break; sleep 0.1; done
held=$("$TF" smi 2>/dev/null | grep -o "remote-[0-9]*" | head -1)
kill -KILL $WPID; wait $WPID 2>/dev/null
wait $c; crc=$?
locks=$(ls "$TFUSION_SHM_DIR/session-locks-$(id -u)" 2>/dev/null | grep -c "^remote-")
"$TF" worker --listen "unix:$W/w.sock" --listen "127.0.0.1:$PORT" --token "$TOKEN" \
  --ready-file "$W/ready2" > "$OUT/worker2.log" 2>&1 &
WPID=$!
for _ in $(seq 100); do [ -f "$W/ready2" ] && break; sleep 0.1; done
# At its start, or at one of its next sweeps (every 10 s) if the session was still dying (the
# driver's teardown) when it started. Timed from when the new worker is ready (after its
# start-up sweep).
t0=$(date +%s.%N)
found=""
for _ in $(seq 250); do
  grep -qE "removed 1 vGPU\(s\) that ended sessions or runs left \(a worker or a tfusion run killed outright, or a stop that timed out\): $held\$" "$OUT/worker2.log" && { found=1; break; }
  sleep 0.1
done
t1=$(date +%s.%N)
if [ -n "$held" ] && [ "$crc" != 0 ] && [ "$locks" -ge 1 ] && [ -n "$found" ] && ! "$TF" smi 2>&1 | grep -q "remote-"; then
  pass "worker killed outright: its session's vGPU $held (client exit $crc) removed by the next worker $("$PY" -c "print('%.1f' % ($t1 - $t0))") s after it was ready"
else
  fail "worker killed outright: vGPU '${held:-none}', client exit $crc, $locks lock file(s), next worker: $(grep -m1 removed "$OUT/worker2.log")"
fi

left=""
for _ in $(seq 30); do
  left=$("$TF" smi 2>&1 | grep -c "remote-")
  [ "$left" = 0 ] && break
  sleep 0.2
done
if [ "$left" = 0 ]; then pass "cleanup: no remote vGPU left after the clients exited"; else fail "cleanup: $left remote vGPU lines in tfusion smi"; "$TF" smi >> "$SUM" 2>&1; fi
echo "failures: $FAILS" | tee -a "$SUM"
[ $FAILS = 0 ]
