#!/usr/bin/env bash
# A quick pass over the shared compute mode on a GPU machine: accuracy on saturating kernels
# (compute_share.py), the launch path's cost per mode, and four ResNet-50 batch-1 tenants
# natively and at 25% each. bash tests/gpu/share_probe.sh BUILD_DIR OUT_DIR
set -uo pipefail
B=$(cd "$1" && pwd)
OUT=$2
mkdir -p "$OUT/work"
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-python3}
T=$B/src/cli/tfusion
export LD_LIBRARY_PATH=$B/src/cli/deps${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
log() { echo "== $* ($(date +%T))"; }

log "compute share (shared mode)"
timeout 240 "$PY" "$HERE/compute_share.py" --tfusion "$T" --tenant "$B/tests/gpu/compute_tenant" \
  --work "$OUT/work/cs" --logs "$OUT" --results "$OUT/cs-results.tsv" --md "$OUT/compute-share.md" \
  --json "$OUT/compute-share.json" --seconds 6 --spin-us 300 --depth 8 --budget-s 200
cat "$OUT/compute-share.md" 2>/dev/null

log "launch overhead"
L=$B/bench/gpu/launch_overhead
for mode in native p100 p50 p50x; do
  case $mode in
    native) cmd=("$L") ;;
    p100) cmd=("$T" run --vram 4GiB --percent 100 -- "$L") ;;
    p50) cmd=("$T" run --vram 4GiB --percent 50 -- "$L") ;;
    p50x) cmd=(env TFUSION_COMPUTE_MODE=exclusive "$T" run --vram 4GiB --percent 50 -- "$L") ;;
  esac
  echo "-- $mode"
  timeout 60 "${cmd[@]}" --n 300000 --max-seconds 6 2>&1 | tail -4
done

log "four ResNet-50 batch-1 tenants"
cat > "$OUT/work/r50.py" <<'EOF'
import sys, time, os, torch, torchvision
secs, ready, go = float(sys.argv[1]), sys.argv[2], sys.argv[3]
m = torchvision.models.resnet50().half().cuda().eval().to(memory_format=torch.channels_last)
x = torch.randn(1, 3, 224, 224, device="cuda").half().to(memory_format=torch.channels_last)
with torch.inference_mode():
    for _ in range(20): m(x)
    torch.cuda.synchronize()
    open(ready, "w").close()
    while not os.path.exists(go): time.sleep(0.005)
    n, t0 = 0, time.time()
    while time.time() - t0 < secs:
        m(x); torch.cuda.synchronize(); n += 1
print(f"ips={n / (time.time() - t0):.1f}")
EOF
run_group() {  # name n prefix...
  local name=$1 n=$2; shift 2
  rm -f "$OUT/work/go" "$OUT/work/$name".*
  local pids=()
  for i in $(seq 1 "$n"); do
    "$@" "$PY" "$OUT/work/r50.py" 8 "$OUT/work/$name.r$i" "$OUT/work/go" > "$OUT/$name.$i.log" 2>&1 &
    pids+=($!)
  done
  for _ in $(seq 1 600); do
    c=$(ls "$OUT/work/$name".r* 2>/dev/null | wc -l); [ "$c" -ge "$n" ] && break; sleep 0.1
  done
  touch "$OUT/work/go"
  for p in "${pids[@]}"; do timeout 60 tail --pid="$p" -f /dev/null; done
  echo "$name: $(grep -ho 'ips=[0-9.]*' "$OUT/$name".*.log | tr '\n' ' ')"
}
for round in 1 2; do
  run_group native1 1
  run_group limit1 1 "$T" run --vram 8GiB --percent 100 --
  run_group native4 4
  run_group shared4 4 "$T" run --vram 8GiB --percent 25 --
  run_group excl4 4 env TFUSION_COMPUTE_MODE=exclusive "$T" run --vram 8GiB --percent 25 --
done
log done
