#!/usr/bin/env bash
# How long a PyTorch program takes to reach its first CUDA tensor and first matmul, natively and
# through the remote client, and how many fat binaries it loads on the way. Usage (repository
# root, on a GPU machine with PyTorch):
#
#   bash bench/gpu/torch_startup.sh BUILD_DIR OUT_DIR [RUNS]
#
# Per mode (native; native with CUDA_MODULE_LOADING=EAGER; remote over shm and over loopback TCP)
# RUNS runs (default 2) print `import_s`, `first_tensor_s` and `first_matmul_s`. The native driver
# calls are counted once under the limiter (`tfusion run --vram`, TFUSION_TRACE=1); the remote
# runs log the client's synchronous calls and the worker's calls (TFUSION_CLIENT_PROFILE=1,
# TFUSION_WORKER_PROFILE=1). OUT_DIR gets startup.txt (everything) and the logs.
set -uo pipefail
if [ $# -lt 2 ]; then
  echo "usage: bash bench/gpu/torch_startup.sh BUILD_DIR OUT_DIR [RUNS]" >&2
  exit 2
fi
B=$(cd "$1" && pwd) || exit 2
mkdir -p "$2" || exit 2
OUT=$(cd "$2" && pwd)
RUNS=${3:-2}
case $RUNS in '' | *[!0-9]* | 0) echo "RUNS must be a whole number above 0" >&2; exit 2 ;; esac
PY=${PYTHON:-python3}
TF=$B/src/cli/tfusion
W=$(mktemp -d /tmp/tf-startup.XXXXXX)
trap 'kill "$wpid" 2>/dev/null; rm -rf "$W"' EXIT
wpid=
cat > "$W/start.py" <<'PY'
import time
t0 = time.time()
import torch
t1 = time.time()
x = torch.randn(512, 512, device="cuda")
torch.cuda.synchronize()
t2 = time.time()
y = torch.nn.functional.relu(x @ x).sum()
torch.cuda.synchronize()
t3 = time.time()
print("import_s=%.2f first_tensor_s=%.2f first_matmul_s=%.2f" % (t1 - t0, t2 - t1, t3 - t2), flush=True)
PY
SUM=$OUT/startup.txt
: > "$SUM"
for i in $(seq "$RUNS"); do echo "native: $("$PY" "$W/start.py" 2>>"$OUT/native.log")" >> "$SUM"; done
for i in $(seq "$RUNS"); do
  echo "native CUDA_MODULE_LOADING=EAGER: $(CUDA_MODULE_LOADING=EAGER "$PY" "$W/start.py" 2>>"$OUT/native.log")" >> "$SUM"
done
TFUSION_TRACE=1 "$TF" run --vram 8GiB --vgpu torch-startup -- "$PY" "$W/start.py" > /dev/null 2> "$OUT/trace.log"
echo "native driver calls (limiter trace): $(grep -c 'cuLibraryLoadData(' "$OUT/trace.log") cuLibraryLoadData, $(grep -c 'cuLibraryGetKernel(' "$OUT/trace.log") cuLibraryGetKernel" >> "$SUM"
TFUSION_WORKER_PROFILE=1 "$TF" worker --listen "unix:$W/w.sock" --listen 127.0.0.1:7621 --token startup \
  --ready-file "$W/ready" > "$OUT/worker.log" 2>&1 &
wpid=$!
for _ in $(seq 100); do [ -f "$W/ready" ] && break; sleep 0.1; done
for mode in shm tcp; do
  addr=unix:$W/w.sock
  [ $mode = tcp ] && addr=127.0.0.1:7621
  for i in $(seq "$RUNS"); do
    echo "$mode: $(TFUSION_CLIENT_PROFILE=1 "$TF" run --remote "$addr" --token startup -- "$PY" "$W/start.py" 2>> "$OUT/client-$mode.log")" >> "$SUM"
  done
  echo "$mode client, first run: $(grep -m1 'profile: cuLibraryLoadData ' "$OUT/client-$mode.log" | sed 's/.*profile: *//')" >> "$SUM"
done
kill "$wpid" 2>/dev/null
wait "$wpid" 2>/dev/null
wpid=
cat "$SUM"
