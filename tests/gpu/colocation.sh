#!/usr/bin/env bash
# The compute-sharing benchmarks of docs/benchmarks.md on a GPU machine, from a staged build
# (tests/gpu/stage_build.sh): bash tests/gpu/colocation.sh [--mps DIR] BUILD_DIR OUT_DIR [PHASES]
# PHASES (comma-separated, default coloc,noisy,burst): colocation.py's phases, plus "accuracy"
# (compute_share.py: saturating spin kernels at fixed splits) and "overhead" (launch_overhead
# natively, at 100% and at 50%). TF_COLOC_ARGS adds colocation.py flags (e.g. "--rounds 2").
# --mps DIR: after the phases, colocation.py's mps phase (noisy, and ResNet-50 b1 at N = 4, under
# a private MPS daemon it starts and stops, with its pipe and log directories in DIR; relative:
# under OUT_DIR). accuracy and overhead never run under MPS.
set -uo pipefail
MPS=()
if [ "${1:-}" = "--mps" ]; then
  if [ $# -lt 2 ] || [ -z "$2" ]; then echo "colocation.sh: --mps needs a directory" >&2; exit 2; fi
  MPS=(--mps "$2")
  shift 2
fi
if [ $# -lt 2 ]; then echo "usage: bash tests/gpu/colocation.sh [--mps DIR] BUILD_DIR OUT_DIR [PHASES]" >&2; exit 2; fi
B=$(cd "$1" && pwd)
OUT=$2
PHASES=${3:-coloc,noisy,burst}
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-python3}
T=$B/src/cli/tfusion
export LD_LIBRARY_PATH=$B/src/cli/deps${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/device.txt" 2>&1
py_phases=""
for p in ${PHASES//,/ }; do
  case $p in
    accuracy)
      echo "== accuracy ($(date +%T))"
      timeout 300 "$PY" "$HERE/compute_share.py" --tfusion "$T" --tenant "$B/tests/gpu/compute_tenant" \
        --work "$OUT/work/cs" --logs "$OUT/logs" --results "$OUT/cs-results.tsv" --md "$OUT/compute-share.md" \
        --json "$OUT/compute-share.json" --seconds 6 --spin-us 300 --depth 8 --budget-s 240 --tolerance 1
      ;;
    overhead)
      echo "== overhead ($(date +%T))"
      L=$B/bench/gpu/launch_overhead
      # p99: governed (every launch goes through the governor's path) but never held alone.
      for round in 1 2 3; do
        for mode in native p100 p99 p50; do
          case $mode in
            native) cmd=("$L") ;;
            p100) cmd=("$T" run --vram 4GiB --percent 100 -- "$L") ;;
            p99) cmd=("$T" run --vram 4GiB --percent 99 -- "$L") ;;
            p50) cmd=("$T" run --vram 4GiB --percent 50 -- "$L") ;;
          esac
          echo "-- $mode round $round"
          timeout 60 "${cmd[@]}" --n 300000 --max-seconds 5 2>&1 | tail -3
        done
      done 2>&1 | tee "$OUT/overhead.txt"
      ;;
    *) py_phases=${py_phases:+$py_phases,}$p ;;
  esac
done
if [ -n "$py_phases" ] || [ ${#MPS[@]} -gt 0 ]; then
  # With --mps and no other colocation.py phase: the mps phase alone.
  [ -n "$py_phases" ] || py_phases=mps
  # shellcheck disable=SC2086
  timeout 590 "$PY" "$HERE/colocation.py" --build "$B" --out "$OUT" --phases "$py_phases" "${MPS[@]}" ${TF_COLOC_ARGS:-}
fi
tar czf "$OUT/logs.tgz" -C "$OUT" logs 2>/dev/null && rm -rf "$OUT/logs" "$OUT/work"
