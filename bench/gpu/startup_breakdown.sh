#!/usr/bin/env bash
# Where start-up time goes under the limiter, without the driver's own serialisation of 100
# concurrent context creations in the way:
#  1. `tfusion run` itself: 100 concurrent `tfusion run -- true` against 100 concurrent `true`;
#  2. the limiter inside a CUDA process: 10 sequential startup_probe runs (cuInit + primary
#     context + 1 MiB allocation), native and under the limiter.
# Usage: bash bench/gpu/startup_breakdown.sh BUILD_DIR   (prints Markdown)
set -euo pipefail
B=$1
TF=$B/src/cli/tfusion
PROBE=$B/bench/gpu/startup_probe
now_ms() { date +%s%3N; }

t0=$(now_ms)
for i in $(seq 100); do /bin/true & done
wait
t1=$(now_ms)
for i in $(seq 100); do "$TF" run --vram 1GiB --vgpu startup-breakdown -- /bin/true & done
wait
t2=$(now_ms)
plain=$((t1 - t0))
wrapped=$((t2 - t1))

seq_init() {  # seq_init native|limiter -> mean init_ms over 10 sequential runs
  for i in $(seq 10); do
    if [ "$1" = native ]; then "$PROBE"; else "$TF" run --vram 1GiB --vgpu startup-breakdown -- "$PROBE"; fi
  done | sed -n 's/^RESULT init_ms=//p' | python3 -c 'import sys; v=[float(x) for x in sys.stdin]; print("%.1f" % (sum(v)/len(v)))'
}
n=$(seq_init native)
l=$(seq_init limiter)

echo "| measurement | native | under tfusion run | added |"
echo "| --- | --- | --- | --- |"
echo "| 100 concurrent processes of /bin/true, wall ms | $plain | $wrapped | $((wrapped - plain)) |"
echo "| cuInit + primary context + 1 MiB alloc, mean of 10 sequential runs, ms | $n | $l | $(python3 -c "print('%.1f' % ($l - $n))") |"
