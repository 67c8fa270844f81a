#!/usr/bin/env bash
# The GPU tier: every driver-behaviour test, PyTorch check and GPU benchmark, natively and under
# the limiter, on one GPU machine, in under 9 minutes. Usage (from the repository root):
#
#   bash tests/gpu/run_all.sh BUILD_DIR OUT_DIR
#
# BUILD_DIR is a build folder made with nvcc available (see tests/gpu/README.md); it must hold
# src/cli/tfusion, the limiter (libtfusion-limiter.so*), tests/gpu/{drvtest,compute_tenant,
# rt_smoke,rt_oom} and bench/gpu/{launch_overhead,startup_probe}. Missing pieces turn into FAIL
# lines, never a hang. OUT_DIR receives summary.md (PASS/FAIL per test and every benchmark
# table) and gpu-logs.tar.gz (logs/: one log per command, results.tsv, timing.txt).
# TF_GPU_BUDGET_S (default 510) is the wall-time budget; every command runs under `timeout`, and
# what the budget cannot fit is reported as SKIP. Exit status: 0 when nothing failed.
set -uo pipefail

if [ $# -ne 2 ]; then
  echo "usage: bash tests/gpu/run_all.sh BUILD_DIR OUT_DIR" >&2
  exit 2
fi
BUILD=$(cd "$1" && pwd) || exit 2
mkdir -p "$2" || exit 2
OUT=$(cd "$2" && pwd)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
LOGS=$OUT/logs
rm -rf "$LOGS"
mkdir -p "$LOGS"
WORK=$(mktemp -d /tmp/tf-gpu-tier.XXXXXX)
RESULTS=$LOGS/results.tsv
: > "$RESULTS"
START=$(date +%s)
BUDGET=${TF_GPU_BUDGET_S:-510}
PY=${PYTHON:-python3}

TFUSION=$BUILD/src/cli/tfusion
LIMITER=$(find "$BUILD" -name 'libtfusion-limiter.so*' \( -type f -o -type l \) 2>/dev/null | sort | head -n1)
DRV=$BUILD/tests/gpu/drvtest
TENANT=$BUILD/tests/gpu/compute_tenant
RT_SMOKE=$BUILD/tests/gpu/rt_smoke
RT_OOM=$BUILD/tests/gpu/rt_oom
LAUNCH=$BUILD/bench/gpu/launch_overhead
STARTUP=$BUILD/bench/gpu/startup_probe
GIB=$((1 << 30))
LIMIT2=$((2 * GIB))

finish() {
  local rc=$?
  "$PY" "$HERE/summarize.py" --logs "$LOGS" --out "$OUT/summary.md" --build "$BUILD" \
    --elapsed "$(($(date +%s) - START))" > "$LOGS/summarize.log" 2>&1 ||
    { echo "# GPU tier: summarize.py failed, see logs"; cat "$RESULTS"; } > "$OUT/summary.md"
  tar -czf "$OUT/gpu-logs.tar.gz" -C "$OUT" logs
  rm -rf "$WORK"
  echo "summary: $OUT/summary.md  logs: $OUT/gpu-logs.tar.gz  ($(($(date +%s) - START)) s)"
  if grep -q $'\tFAIL\t' "$RESULTS"; then exit 1; fi
  exit "$rc"
}
trap finish EXIT

record() {  # record NAME PASS|FAIL|SKIP|INFO NOTE
  printf '%s\t%s\t%s\n' "$1" "$2" "$3" >> "$RESULTS"
  echo "[$2] $1 $3"
}
left() { echo $((START + BUDGET - $(date +%s))); }

# step LOG TIMEOUT CMD...: runs CMD with stdout+stderr into logs/LOG under
# timeout min(TIMEOUT, budget left - 15 s). Returns CMD's status, 124 on timeout, 125 if skipped
# or stopped at a limit the budget shortened.
step() {
  local log=$1 t=$2
  shift 2
  local room=$(($(left) - 15))
  if ((room < 5)); then
    echo "SKIPPED: time budget spent" > "$LOGS/$log"
    return 125
  fi
  local cut=0
  ((t > room)) && t=$room && cut=1
  echo "\$ $*" > "$LOGS/$log"
  local t0
  t0=$(date +%s%N)
  timeout -k 5 "$t" "$@" >> "$LOGS/$log" 2>&1
  local rc=$?
  echo "$log rc=$rc $((($(date +%s%N) - t0) / 1000000)) ms" >> "$LOGS/timing.txt"
  # Stopped at a limit the time budget shortened: the budget ran out, not the step (a SIGKILL
  # from elsewhere at that moment, such as the OOM killer's, reads the same).
  if ((cut && (rc == 124 || rc == 137))); then
    echo "stopped after $t s: the time budget ran out (its own limit is longer)" >> "$LOGS/$log"
    return 125
  fi
  return $rc
}

result_of() { grep -h "^RESULT $2=" "$LOGS/$1" 2>/dev/null | tail -n1 | cut -d= -f2-; }

# judge NAME LOG RC: records PASS/FAIL from the program's verdict and exit status.
judge() {
  local name=$1 log=$2 rc=$3 why
  if ((rc == 125)); then record "$name" SKIP "time budget spent"; return; fi
  if ((rc == 0)) && [ "$(result_of "$log" verdict)" != FAIL ]; then
    record "$name" PASS "$(note_of "$log")"
  else
    why=$(result_of "$log" reason)
    ((rc == 124 || rc == 137)) && why="timed out"
    record "$name" FAIL "exit $rc ${why:-} $(note_of "$log") (logs/$log)"
  fi
}
# harness NAME LOG RC: a harness that records its own results: only its failure (or its skip by the
# time budget) is recorded here.
harness() {
  if (($3 == 125)); then
    record "$1" SKIP "time budget spent"
  elif (($3 != 0)); then
    record "$1" FAIL "exit $3 (logs/$2)"
  fi
}
note_of() {
  local n=""
  local total err
  total=$(result_of "$1" total_mib)
  err=$(result_of "$1" error)
  [ -n "$total" ] && n="got ${total} MiB"
  [ -n "$err" ] && n="$n, $err"
  [ -n "$(result_of "$1" realloc)" ] && n="$n, realloc $(result_of "$1" realloc)"
  echo "$n"
}

have_limiter() {
  if [ -x "$TFUSION" ] && [ -n "$LIMITER" ]; then return 0; fi
  record "$1" FAIL "tfusion ($TFUSION) or libtfusion-limiter.so* under $BUILD missing"
  return 1
}
have() {
  if [ -x "$2" ]; then return 0; fi
  record "$1" FAIL "$2 not built (was nvcc found when configuring?)"
  return 1
}

# --- 0. preflight (about 5 s) -------------------------------------------------------------
{
  echo "date: $(date -u +%FT%TZ)  host: $(hostname)  build: $BUILD  limiter: ${LIMITER:-missing}"
  timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,compute_mode,persistence_mode --format=csv
  timeout 20 nvidia-smi
  timeout 30 "$PY" -c "import torch, torchvision; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'torchvision', torchvision.__version__)"
  ls -l "$BUILD/src/cli" "$BUILD/tests/gpu" "$BUILD/bench/gpu" 2>&1
} > "$LOGS/preflight.log" 2>&1
step tfusion-help.log 10 "$TFUSION" run --help
step tfusion-smi-start.log 15 "$TFUSION" smi
echo "preflight done ($(($(date +%s) - START)) s)"

# --- 1. driver behaviour: allocation paths (about 40 s) ------------------------------------
PATHS="mem_alloc pitch async pool_async vmm managed array2d array3d mipmap graph"
if have "alloc (drvtest)" "$DRV"; then
  for p in $PATHS; do
    step "alloc-$p-native.log" 60 "$DRV" alloc --path "$p" --chunk 64MiB --max 4GiB --limit 0
    judge "alloc $p native" "alloc-$p-native.log" $?
    if have_limiter "alloc $p limiter"; then
      step "alloc-$p-limiter.log" 60 "$TFUSION" run --vram 2GiB --percent 100 -- \
        "$DRV" alloc --path "$p" --chunk 64MiB --max 3GiB --limit "$LIMIT2"
      judge "alloc $p limiter 2GiB" "alloc-$p-limiter.log" $?
    fi
  done

  # --- 2. cuMemGetInfo vs NVML; 3. proc-address lookups (about 10 s) -----------------------
  step meminfo-native.log 30 "$DRV" meminfo --limit 0 --alloc 512MiB
  judge "meminfo cuda vs nvml native" meminfo-native.log $?
  if have_limiter "meminfo cuda vs nvml limiter"; then
    step meminfo-limiter.log 30 "$TFUSION" run --vram 2GiB --percent 100 -- \
      "$DRV" meminfo --limit "$LIMIT2" --alloc 512MiB
    judge "meminfo cuda vs nvml limiter 2GiB" meminfo-limiter.log $?
  fi
  step procaddr-native.log 30 "$DRV" procaddr --expect native
  judge "procaddr direct/dlsym/cuGetProcAddress native" procaddr-native.log $?
  if have_limiter "procaddr limiter"; then
    step procaddr-limiter.log 30 "$TFUSION" run --vram 2GiB --percent 100 -- \
      "$DRV" procaddr --expect-lib "$LIMITER"
    judge "procaddr direct/dlsym/cuGetProcAddress limiter" procaddr-limiter.log $?
  fi
fi

# --- 4. runtime-API programs (about 10 s) ----------------------------------------------------
if have "cudart smoke" "$RT_SMOKE"; then
  step rt-smoke-native.log 60 "$RT_SMOKE" 0
  judge "cudart kernels+graph native" rt-smoke-native.log $?
  if have_limiter "cudart smoke limiter"; then
    step rt-smoke-limiter.log 60 "$TFUSION" run --vram 2GiB --percent 100 -- "$RT_SMOKE" "$LIMIT2"
    judge "cudart kernels+graph limiter 2GiB" rt-smoke-limiter.log $?
  fi
fi
if have "cudart oom" "$RT_OOM"; then
  step rt-oom-native.log 60 "$RT_OOM" 0 $((4 * GIB))
  judge "cudart cudaMalloc until refused native" rt-oom-native.log $?
  if have_limiter "cudart oom limiter"; then
    step rt-oom-limiter.log 60 "$TFUSION" run --vram 2GiB --percent 100 -- "$RT_OOM" "$LIMIT2" $((3 * GIB))
    judge "cudart cudaMalloc until refused limiter 2GiB" rt-oom-limiter.log $?
  fi
fi
echo "driver tests done ($(($(date +%s) - START)) s)"

# --- 5. several processes in one vGPU (about 40 s) -------------------------------------------
if have "vgpu sharing" "$DRV" && have_limiter "vgpu sharing"; then
  step vgpu-share.log 150 "$PY" "$HERE/vgpu_share.py" --tfusion "$TFUSION" --drvtest "$DRV" \
    --work "$WORK/vgpu" --logs "$LOGS" --results "$RESULTS"
  harness "vgpu sharing harness" vgpu-share.log $?
fi
rc=0

# --- 6. compute isolation (about 90 s: 8 runs of 6 s + start-up) ------------------------------
if have "compute share" "$TENANT" && have_limiter "compute share"; then
  cs_budget=$(($(left) - 250))
  ((cs_budget > 170)) && cs_budget=170
  if ((cs_budget < 30)); then
    record "compute share" SKIP "time budget spent"
  else
    step compute-share.log $((cs_budget + 30)) "$PY" "$HERE/compute_share.py" --tfusion "$TFUSION" \
    --tenant "$TENANT" --work "$WORK/compute" --logs "$LOGS" --results "$RESULTS" \
    --md "$LOGS/compute-share.md" --json "$LOGS/compute-share.json" \
    --seconds 6 --spin-us 300 --depth 8 --budget-s "$cs_budget"
    harness "compute share harness" compute-share.log $?
  fi
fi
echo "sharing tests done ($(($(date +%s) - START)) s)"

# --- 7. PyTorch (about 90 s) ------------------------------------------------------------------
torch_env=(env "TORCHINDUCTOR_CACHE_DIR=$WORK/inductor-native" "TRITON_CACHE_DIR=$WORK/triton-native")
step torch-checks-native.log 120 "${torch_env[@]}" "$PY" "$HERE/torch_checks.py" --out "$WORK/torch-native"
judge "torch checks run native" torch-checks-native.log $?
if have_limiter "torch checks limiter"; then
  # A fresh Inductor/Triton cache, so that the limited run compiles and loads its own kernels.
  step torch-checks-limiter.log 120 env "TORCHINDUCTOR_CACHE_DIR=$WORK/inductor-limiter" \
    "TRITON_CACHE_DIR=$WORK/triton-limiter" "$TFUSION" run --vram 16GiB --percent 100 -- \
    "$PY" "$HERE/torch_checks.py" --out "$WORK/torch-limiter"
  judge "torch checks run limiter 16GiB" torch-checks-limiter.log $?
  step torch-compare.log 60 "$PY" "$HERE/torch_compare.py" --native "$WORK/torch-native" \
    --limited "$WORK/torch-limiter" --results "$RESULTS"
fi
step torch-expandable-native.log 60 env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
  "$PY" "$HERE/torch_memory.py" expandable --gib 3
judge "torch expandable_segments 3GiB native" torch-expandable-native.log $?
if have_limiter "torch expandable limiter"; then
  step torch-expandable-limiter.log 60 env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
    "$TFUSION" run --vram 16GiB --percent 100 -- "$PY" "$HERE/torch_memory.py" expandable --gib 3
  judge "torch expandable_segments 3GiB limiter 16GiB" torch-expandable-limiter.log $?
fi
step torch-oom-native.log 60 "$PY" "$HERE/torch_memory.py" oom --gib 3 --limit 0
judge "torch 3GiB allocation native" torch-oom-native.log $?
if have_limiter "torch oom limiter"; then
  step torch-oom-limiter.log 60 "$TFUSION" run --vram 2GiB --percent 100 -- \
    "$PY" "$HERE/torch_memory.py" oom --gib 3 --limit "$LIMIT2"
  judge "torch OutOfMemoryError + mem_get_info limiter 2GiB" torch-oom-limiter.log $?
fi
echo "torch done ($(($(date +%s) - START)) s)"

# --- 8. benchmarks (about 100 s) ----------------------------------------------------------------
bench() {  # bench NAME LOG TIMEOUT CMD...: a benchmark has no verdict, only a completed run
  local name=$1 log=$2
  shift 2
  step "$log" "$@"
  local rc=$?
  if ((rc == 0)); then
    record "$name" INFO "completed (logs/$log)"
  elif ((rc == 125)); then
    record "$name" SKIP "time budget spent"
  else
    record "$name" FAIL "exit $rc (logs/$log)"
  fi
}
if have "launch overhead" "$LAUNCH"; then
  bench "bench launch overhead native" launch-native.log 60 "$LAUNCH" --n 1000000 --max-seconds 20
  if have_limiter "bench launch overhead limiter"; then
    bench "bench launch overhead limiter 100%" launch-limiter100.log 60 \
      "$TFUSION" run --vram 4GiB --percent 100 -- "$LAUNCH" --n 1000000 --max-seconds 20
    bench "bench launch overhead limiter 50%" launch-limiter50.log 60 \
      "$TFUSION" run --vram 4GiB --percent 50 -- "$LAUNCH" --n 1000000 --max-seconds 20
  fi
fi
bench "bench resnet50 native" resnet-native.log 120 "$PY" "$REPO/bench/gpu/resnet50.py"
if have_limiter "bench resnet50 limiter"; then
  bench "bench resnet50 limiter 100%" resnet-limiter.log 120 \
    "$TFUSION" run --vram 16GiB --percent 100 -- "$PY" "$REPO/bench/gpu/resnet50.py"
fi

# startup MODE: 100 processes at once; writes logs/startup-MODE.tsv for summarize.py.
startup() {
  local mode=$1 dir=$WORK/startup-$1 i t0 t1 ok
  if (($(left) < 90)); then record "bench startup 100 processes $mode" SKIP "time budget spent"; return; fi
  mkdir -p "$dir"
  t0=$(date +%s%N)
  for i in $(seq 1 100); do
    if [ "$mode" = native ]; then
      timeout -k 2 60 "$STARTUP" > "$dir/$i.log" 2>&1 &
    else
      timeout -k 2 60 "$TFUSION" run --vram 60GiB --percent 100 --vgpu "startup-$$" -- \
        "$STARTUP" > "$dir/$i.log" 2>&1 &
    fi
  done
  wait
  t1=$(date +%s%N)
  ok=$(grep -l '^RESULT init_ms=' "$dir"/*.log | wc -l)
  grep -h '^RESULT init_ms=' "$dir"/*.log | cut -d= -f2 | sort -n > "$LOGS/startup-$mode-init-ms.txt"
  cat "$dir"/*.log | grep -v '^RESULT init_ms=' | sort | uniq -c | sort -rn | head -20 > "$LOGS/startup-$mode-other.txt"
  printf '%s\t%s\t%s\n' "$mode" "$(((t1 - t0) / 1000000))" "$ok" > "$LOGS/startup-$mode.tsv"
  if ((ok == 100)); then
    record "bench startup 100 processes $mode" INFO "$(((t1 - t0) / 1000000)) ms for all"
  else
    record "bench startup 100 processes $mode" FAIL "only $ok of 100 succeeded (logs/startup-$mode-other.txt)"
  fi
}
if have "startup" "$STARTUP"; then
  startup native
  if have_limiter "bench startup limiter"; then startup limiter; fi
fi
step tfusion-smi-end.log 15 "$TFUSION" smi
echo "benchmarks done ($(($(date +%s) - START)) s)"
