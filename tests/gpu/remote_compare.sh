#!/usr/bin/env bash
# The remote vGPU on a GPU host, native vs shared memory vs loopback TCP (issue 3, items 7 and 8):
# starts a `tfusion worker` on a unix socket and 127.0.0.1:PORT, then runs every benchmark and
# check natively, through `tfusion run --remote unix:SOCK` and through `tfusion run --remote
# 127.0.0.1:PORT`. Usage (from the repository root):
#
#   bash tests/gpu/remote_compare.sh BUILD_DIR OUT_DIR
#
# BUILD_DIR is a build made with nvcc available (tests/gpu/README.md); it must hold
# src/cli/tfusion, the client stub, bench/gpu/{remote_micro,launch_overhead} and
# tests/gpu/{drvtest,ipc_pair,rt_smoke,compute_tenant,samples}. Missing pieces become FAIL lines, never a hang.
# Phases, most important first; each runs native, shm, tcp before the next phase starts:
#   micro        bench/gpu/remote_micro: async call cost, sync round trips, HtoD/DtoH bandwidth
#   models-key   bench/gpu/torch_models.py --parts key: ResNet-50 b64 eager, GPT-2 forward
#   checks       tests/gpu/torch_remote.py, outputs compared with native (--compare)
#   driver       drvtest alloc (10 paths), drvtest arrays, ipc_pair (CUDA IPC between two processes,
#                remotely two clients of the worker), rt_smoke, launch_overhead, compute_tenant
#                (kernel, graph)
#   samples      tests/gpu/samples: CUDA-samples-style programs (SAMPLE/RESULT lines, compared)
#   models-rest  bench/gpu/torch_models.py --parts rest: other batches, generation, torch.compile
#   rounds       GPT-2 8x512, ResNet-50 b64 eager and a ResNet-50 b32 training step, then
#                remote_micro's async-call costs and 1 GiB copies, in TF_REMOTE_ROUNDS (default 3)
#                rounds of native, shm, tcp in turn, so that drift of the host hits every mode
#                alike; rounds.md gives the median per mode and the median of each round's ratios
#                (not in the default phases)
# Environment: TF_REMOTE_BUDGET_S (default 540) bounds the whole run: every command runs under
# `timeout`, and what no longer fits is reported as SKIP. TF_REMOTE_PHASES (comma-separated,
# default all six), TF_REMOTE_MODES (default "native shm tcp"), TF_REMOTE_PORT (default 7611),
# TF_REMOTE_MICRO_S (bandwidth budget of remote_micro, default 20), PYTHON (default python3),
# TF_REMOTE_WORKER_ARGS (more worker flags, e.g. "--driver /path/libtfusion-limiter.so"),
# TF_REMOTE_KEEP_LOGS=1 keeps OUT_DIR/logs of an earlier run (a second run with other phases
# then adds to the same summary).
# OUT_DIR receives remote-summary.md (tables native vs shm vs tcp with ratios, PASS/FAIL per
# program and mode, equality with native) and remote-logs.tar.gz (logs/: one log per command,
# steps.tsv, worker.log). Exit status: 0 when no step failed.
set -uo pipefail

if [ $# -ne 2 ]; then
  echo "usage: bash tests/gpu/remote_compare.sh BUILD_DIR OUT_DIR" >&2
  exit 2
fi
START=$(date +%s)
BUDGET=${TF_REMOTE_BUDGET_S:-540}
PHASES=${TF_REMOTE_PHASES:-micro,models-key,checks,driver,samples,models-rest}
MODES=${TF_REMOTE_MODES:-native shm tcp}
PORT=${TF_REMOTE_PORT:-7611}
MICRO_S=${TF_REMOTE_MICRO_S:-20}
ROUNDS=${TF_REMOTE_ROUNDS:-3}
# TF_ROUNDS_GPU_BUSY=0: the rounds skip native's GPU-busy profile (torch.profiler), which makes a
# native round about twice as long.
GPU_BUSY=--gpu-busy
[ "${TF_ROUNDS_GPU_BUSY:-1}" = 0 ] && GPU_BUSY=
PY=${PYTHON:-python3}
RESERVE=25  # seconds kept for stopping the worker, the summary and the tarball
case $BUDGET in '' | *[!0-9]*) echo "TF_REMOTE_BUDGET_S must be whole seconds, got '$BUDGET'" >&2; exit 2 ;; esac
case $MICRO_S in '' | *[!0-9]*) echo "TF_REMOTE_MICRO_S must be whole seconds, got '$MICRO_S'" >&2; exit 2 ;; esac
case $ROUNDS in '' | *[!0-9]* | 0) echo "TF_REMOTE_ROUNDS must be a whole number of rounds, got '$ROUNDS'" >&2; exit 2 ;; esac
for m in $MODES; do
  case $m in native | shm | tcp) ;; *) echo "TF_REMOTE_MODES: unknown mode '$m' (native shm tcp)" >&2; exit 2 ;; esac
done
for p in ${PHASES//,/ }; do
  case $p in micro | models-key | checks | driver | samples | models-rest | rounds) ;;
    *) echo "TF_REMOTE_PHASES: unknown phase '$p' (micro models-key checks driver samples models-rest rounds)" >&2; exit 2 ;;
  esac
done
BUILD=$(cd "$1" && pwd) || exit 2
mkdir -p "$2" || exit 2
OUT=$(cd "$2" && pwd)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
LOGS=$OUT/logs
[ "${TF_REMOTE_KEEP_LOGS:-0}" = 1 ] || rm -rf "$LOGS"
mkdir -p "$LOGS"
STEPS=$LOGS/steps.tsv
touch "$STEPS"
WORK=$(mktemp -d /tmp/tf-remote-compare.XXXXXX)

TF=$BUILD/src/cli/tfusion
MICRO=$BUILD/bench/gpu/remote_micro
LAUNCH=$BUILD/bench/gpu/launch_overhead
DRV=$BUILD/tests/gpu/drvtest
IPC_PAIR=$BUILD/tests/gpu/ipc_pair
RT_SMOKE=$BUILD/tests/gpu/rt_smoke
TENANT=$BUILD/tests/gpu/compute_tenant
SAMPLES=$BUILD/tests/gpu/samples
SOCK=$WORK/worker.sock
TOKEN=remote-compare-$$-$RANDOM
WPID=""

left() { echo $((START + BUDGET - $(date +%s))); }

stop_worker() {
  if [ -n "$WPID" ]; then
    kill "$WPID" 2>/dev/null
    for _ in $(seq 30); do kill -0 "$WPID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$WPID" 2>/dev/null
    wait "$WPID" 2>/dev/null
    WPID=""
  fi
}

finish() {
  local rc=$?
  stop_worker
  timeout 60 "$PY" "$HERE/remote_summary.py" --logs "$LOGS" --out "$OUT/remote-summary.md" \
    --elapsed "$(($(date +%s) - START))" --budget "$BUDGET" > "$LOGS/summary.log" 2>&1 ||
    { echo "# Remote vGPU comparison: remote_summary.py failed, see logs/summary.log"; echo; cat "$STEPS"; } \
      > "$OUT/remote-summary.md"
  tar -czf "$OUT/remote-logs.tar.gz" -C "$OUT" logs
  rm -rf "$WORK"
  echo "summary: $OUT/remote-summary.md  logs: $OUT/remote-logs.tar.gz  ($(($(date +%s) - START)) s)"
  if awk -F'\t' '$4 != 0 && $4 != -3 { bad = 1 } END { exit !bad }' "$STEPS"; then exit 1; fi
  exit "$rc"
}
trap finish EXIT
trap 'exit 130' INT TERM

start_worker() {
  if [ ! -x "$TF" ]; then
    echo "tfusion not found at $TF" >> "$LOGS/worker.log"
    return 1
  fi
  rm -f "$WORK/ready" "$SOCK"
  local extra=()
  read -r -a extra <<< "${TF_REMOTE_WORKER_ARGS:-}"
  echo "\$ $TF worker --listen unix:$SOCK --listen 127.0.0.1:$PORT --token *** ${extra[*]}" >> "$LOGS/worker.log"
  "$TF" worker --listen "unix:$SOCK" --listen "127.0.0.1:$PORT" --token "$TOKEN" \
    --ready-file "$WORK/ready" "${extra[@]}" >> "$LOGS/worker.log" 2>&1 &
  WPID=$!
  for _ in $(seq 100); do
    [ -f "$WORK/ready" ] && return 0
    kill -0 "$WPID" 2>/dev/null || break
    sleep 0.1
  done
  echo "worker not ready after 10 s" >> "$LOGS/worker.log"
  stop_worker
  return 1
}

# worker_up: true when a worker serves; restarts one that died (at most 3 starts in all).
STARTS=0
worker_up() {
  if [ -n "$WPID" ] && kill -0 "$WPID" 2>/dev/null; then return 0; fi
  [ -n "$WPID" ] && echo "worker (pid $WPID) died; restarting" >> "$LOGS/worker.log"
  WPID=""
  ((STARTS >= 3)) && return 1
  STARTS=$((STARTS + 1))
  start_worker
}

# step PHASE PROGRAM MODE LOG TIMEOUT CMD...: runs CMD natively or through the stub, stdout and
# stderr into logs/LOG, under timeout min(TIMEOUT, budget left - RESERVE), and appends
# "phase program mode rc ms log" to steps.tsv: rc is CMD's exit status (124/137: timed out) or
# one of this script's own, negative so that no program can return them: -1 not built,
# -2 no worker, -3 skipped (budget). Environment for CMD goes in front as `env K=V ... CMD`. RUN_AS=native in front of
# `step` runs CMD natively while recording MODE (a comparison belonging to that mode).
step() {
  local phase=$1 prog=$2 mode=$3 log=$4 t=$5
  shift 5
  local how=${RUN_AS:-$mode} room=$(($(left) - RESERVE)) rc t0="" ms=0
  if ((room < 10)); then
    echo "SKIPPED: time budget spent" > "$LOGS/$log"
    rc=-3
  elif [ "$how" != native ] && ! worker_up; then
    echo "SKIPPED: no worker (see worker.log)" > "$LOGS/$log"
    rc=-2
  else
    ((t > room)) && t=$room
    local cmd=("$@")
    if [ "$how" = shm ]; then
      cmd=("$TF" run --remote "unix:$SOCK" --token "$TOKEN" -- "$@")
    elif [ "$how" = tcp ]; then
      cmd=("$TF" run --remote "127.0.0.1:$PORT" --token "$TOKEN" -- "$@")
    fi
    echo "\$ [$how, timeout $t s] $*" > "$LOGS/$log"
    t0=$(date +%s%N)
    timeout -k 5 "$t" "${cmd[@]}" >> "$LOGS/$log" 2>&1 < /dev/null
    rc=$?
  fi
  [ -n "$t0" ] && ms=$((($(date +%s%N) - t0) / 1000000))
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$phase" "$prog" "$mode" "$rc" "$ms" "$log" >> "$STEPS"
  echo "[$(($(date +%s) - START)) s] $phase $prog $mode rc=$rc ${ms} ms"
  return 0
}

# need PHASE PROGRAM FILE: true when FILE is an executable; otherwise a failed step per mode.
need() {
  if [ -x "$3" ]; then return 0; fi
  local m
  echo "$2: $3 not built"
  for m in $MODES; do
    echo "MISSING: $3 not built (was nvcc found when configuring?)" > "$LOGS/$2-$m.log"
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$m" -1 0 "$2-$m.log" >> "$STEPS"
  done
  return 1
}

has_phase() { [[ ",$PHASES," == *",$1,"* ]]; }

# --- preflight --------------------------------------------------------------------------------
{
  echo "date: $(date -u +%FT%TZ)  host: $(hostname)  build: $BUILD  budget: $BUDGET s  phases: $PHASES"
  timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
  timeout 60 "$PY" -c "import torch, torchvision, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'torchvision', torchvision.__version__, 'transformers', transformers.__version__)"
  ls -l "$BUILD/src/cli" "$BUILD/tests/gpu" "$BUILD/bench/gpu" "$BUILD/src/client" 2>&1
} > "$LOGS/preflight.log" 2>&1
worker_up || echo "worker did not start: remote steps will be skipped (logs/worker.log)"

# Inductor/Triton caches: one per run for the benchmarks (native compiles first, remote runs reuse
# the kernels: the timed loop is what is compared), one per mode for the checks (each compiles).
MODEL_ENV=(env "TORCHINDUCTOR_CACHE_DIR=$WORK/inductor-models" "TRITON_CACHE_DIR=$WORK/triton-models")

# --- phases -------------------------------------------------------------------------------------
if has_phase micro && need micro micro "$MICRO"; then
  for m in $MODES; do
    step micro micro "$m" "micro-$m.log" $((MICRO_S + 90)) "$MICRO" --seconds "$MICRO_S" --max-bytes 1GiB
  done
fi

models() {  # models GROUP
  local m
  for m in $MODES; do
    local t=$(($(left) - RESERVE))
    ((t > 240)) && t=240
    step "models-$1" "models-$1" "$m" "models-$1-$m.log" 240 "${MODEL_ENV[@]}" "$PY" \
      "$REPO/bench/gpu/torch_models.py" --parts "$1" --part-budget-s 120 --total-budget-s $((t > 30 ? t - 10 : 20))
  done
}
has_phase models-key && models key

if has_phase checks; then
  for m in $MODES; do
    t=$(($(left) - RESERVE))
    ((t > 300)) && t=300
    step checks checks "$m" "checks-$m.log" 300 env "TORCHINDUCTOR_CACHE_DIR=$WORK/inductor-checks-$m" \
      "TRITON_CACHE_DIR=$WORK/triton-checks-$m" "$PY" "$HERE/torch_remote.py" --out "$WORK/checks-$m" \
      --check-budget-s 100 --total-budget-s $((t > 30 ? t - 10 : 20))
    if [ "$m" != native ]; then
      RUN_AS=native step checks compare-checks "$m" "compare-checks-$m.log" 60 \
        "$PY" "$HERE/torch_remote.py" --compare "$WORK/checks-native" "$WORK/checks-$m"
    fi
  done
fi

if has_phase driver; then
  if need driver alloc "$DRV"; then
    for p in mem_alloc pitch async pool_async vmm managed array2d array3d mipmap graph; do
      for m in $MODES; do
        step driver "alloc-$p" "$m" "alloc-$p-$m.log" 40 "$DRV" alloc --path "$p" --chunk 64MiB --max 2GiB --limit 0
      done
    done
  fi
  if need driver arrays "$DRV"; then
    for m in $MODES; do step driver arrays "$m" "arrays-$m.log" 60 "$DRV" arrays --big 64MiB; done
  fi
  if need driver ipc "$IPC_PAIR"; then
    for m in $MODES; do step driver ipc "$m" "ipc-$m.log" 60 "$IPC_PAIR" --mib 64; done
  fi
  if need driver rt-smoke "$RT_SMOKE"; then
    for m in $MODES; do step driver rt-smoke "$m" "rt-smoke-$m.log" 60 "$RT_SMOKE" 0; done
  fi
  if need driver launch "$LAUNCH"; then
    for m in $MODES; do step driver launch "$m" "launch-$m.log" 60 "$LAUNCH" --n 200000 --max-seconds 20; done
  fi
  if need driver tenant "$TENANT"; then
    for launch in kernel graph; do
      for m in $MODES; do
        step driver "tenant-$launch" "$m" "tenant-$launch-$m.log" 40 "$TENANT" --seconds 3 --spin-us 300 \
          --depth 8 --launch "$launch" --out "$WORK/segments-$launch-$m"
      done
    done
  fi
fi

# Every sample runs in a child process of its own (a new session each remotely); the summary
# reports PASS/FAIL per sample and mode and whether its RESULT line equals native's.
if has_phase samples && need samples samples "$SAMPLES"; then
  for m in $MODES; do step samples samples "$m" "samples-$m.log" 300 "$SAMPLES"; done
fi

has_phase models-rest && models rest

if has_phase rounds; then
  for r in $(seq "$ROUNDS"); do
    for m in $MODES; do
      step rounds "rounds-r$r" "$m" "rounds-$m-r$r.log" 240 "${MODEL_ENV[@]}" "$PY" \
        "$REPO/bench/gpu/torch_models.py" --parts gpt2_fwd_b8_s512,resnet50_b64_eager,resnet50_b32_train --reps 7 $GPU_BUSY \
        --part-budget-s 60 --total-budget-s 200
      step rounds "micro-rounds-r$r" "$m" "micro-$m-r$r.log" 90 "$MICRO" --parts async,bandwidth \
        --min-bytes 1GiB --max-bytes 1GiB --seconds 10
    done
  done
  timeout 30 "$PY" "$HERE/remote_rounds.py" "$LOGS" > "$OUT/rounds.md" 2>&1
  cp "$OUT/rounds.md" "$LOGS/rounds.md"
fi
echo "all phases done ($(($(date +%s) - START)) s)"
