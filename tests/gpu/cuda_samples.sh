#!/usr/bin/env bash
# NVIDIA's public CUDA samples (github.com/NVIDIA/cuda-samples; not part of this repository) on a
# GPU host: each sample natively, then through a worker over shared memory and over loopback TCP
# (and under the limiter with TF_SAMPLES_MODES="native local shm tcp"). Usage, from the
# repository root:
#
#   bash tests/gpu/cuda_samples.sh BUILD_DIR SAMPLES_DIR OUT_DIR
#
# SAMPLES_DIR is a copy of that repository (its Common/ and the Samples/ folders wanted) holding
# list.txt: one sample folder per line, relative to Samples/ (e.g. 0_Introduction/vectorAdd).
# Each sample is built with nvcc for the GPU's architecture from every .cu and .cpp file of its
# folder (an *_nvrtc sample from its .cpp files only: it compiles its kernel at run time), linked
# with the driver, cudart, NVRTC, cuBLAS and cuRAND, and run from its folder with a 60 s bound.
# Exit status 0 is PASS, 2 WAIVED (the samples' own code for "not applicable here"), anything else
# FAIL. Each run's stdout is kept apart from its stderr, and the stdout of every run that passed
# in a mode other than native is compared with the native run's after masking what varies between
# runs (timings, rates, dates, pids, addresses, bus ids: tests/gpu/sample_output.py, which also
# lists the samples whose output is not compared and why). OUT_DIR receives samples.md (per sample
# and mode: PASS and SAME or DIFFERENT OUTPUT, or WAIVED, FAIL(status), TIMEOUT, BUILD-FAIL,
# SKIP(budget); the first differing line of each difference; how many of those that pass natively
# pass in each other mode and how many of them print the same) and samples-logs.tar.gz (build
# logs, and runs/MODE-NAME.{out,err,status}). TF_SAMPLES_JOBS (default 4) samples run at once per
# mode; TF_SAMPLES_ONLY="NAME ..." runs only those samples of list.txt (a NAME may also be a folder
# of Samples/, e.g. 0_Introduction, for all of its listed samples); TF_SAMPLES_BUDGET_S (default
# 450) bounds the whole script: a build or run that would start later is BUILD-FAIL or
# SKIP(budget), and no run outlasts it.
# Exit status 0 when every sample that passes natively passes in every other mode with the same
# output (those not compared excepted).
set -uo pipefail

if [ $# -ne 3 ]; then
  echo "usage: bash tests/gpu/cuda_samples.sh BUILD_DIR SAMPLES_DIR OUT_DIR" >&2
  exit 2
fi
BUILD=$(cd "$1" && pwd) || exit 2
SRC=$(cd "$2" && pwd) || exit 2
mkdir -p "$3" || exit 2
OUT=$(cd "$3" && pwd)
MODES=${TF_SAMPLES_MODES:-native shm tcp}
JOBS=${TF_SAMPLES_JOBS:-4}
PORT=${TF_SAMPLES_PORT:-7641}
BUDGET=${TF_SAMPLES_BUDGET_S:-450}
START=$(date +%s)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
for m in $MODES; do
  case $m in native | local | shm | tcp) ;; *) echo "TF_SAMPLES_MODES: unknown mode '$m'" >&2; exit 2 ;; esac
done
case " $MODES " in *" native "*) ;; *) echo "TF_SAMPLES_MODES must include native (the reference)" >&2; exit 2 ;; esac
case $JOBS in '' | *[!0-9]* | 0) echo "TF_SAMPLES_JOBS must be a positive whole number" >&2; exit 2 ;; esac
case $BUDGET in '' | *[!0-9]* | 0) echo "TF_SAMPLES_BUDGET_S must be a positive whole number" >&2; exit 2 ;; esac
[ -f "$SRC/list.txt" ] && [ -d "$SRC/Common" ] || { echo "$SRC needs Common/ and list.txt" >&2; exit 2; }
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
[ -x "$NVCC" ] || { echo "nvcc not found (PATH or /usr/local/cuda/bin)" >&2; exit 2; }
TF=$BUILD/src/cli/tfusion
WORK=$(mktemp -d /tmp/tf-samples.XXXXXX)
LOGS=$WORK/logs
RUNS=$LOGS/runs  # MODE-NAME.out (stdout), .err (stderr), .status
mkdir -p "$LOGS" "$RUNS" "$WORK/bin"
CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '. ')
ARCH=${CAP:+-arch=sm_$CAP}

# Build every sample (in parallel); a sample that does not build is BUILD-FAIL in every mode.
build_one() {
  local s=$1 dir=$SRC/Samples/$1 name
  name=$(basename "$s")
  local files
  if [[ $name == *_nvrtc ]]; then
    files=$(find "$dir" -maxdepth 2 -name '*.cpp' | sort)
  else
    files=$(find "$dir" -maxdepth 2 \( -name '*.cu' -o -name '*.cpp' \) | sort)
  fi
  local left=$((START + BUDGET - $(date +%s)))
  if ((left < 30)); then echo "build failed: time budget spent" > "$LOGS/build-$name.log"; return; fi
  # shellcheck disable=SC2086
  timeout -k 5 "$((left - 20))" "$NVCC" $ARCH -std=c++17 -O2 -I"$SRC/Common" -I"$dir" -I"$dir/inc" -Xcompiler -fopenmp $files \
    -o "$WORK/bin/$name" -lcuda -lnvrtc -lcublas -lcurand > "$LOGS/build-$name.log" 2>&1 ||
    echo "build failed" >> "$LOGS/build-$name.log"
}
export -f build_one
export NVCC ARCH SRC WORK LOGS START BUDGET
LIST=$WORK/list.txt
# TF_SAMPLES_ONLY (space-separated sample names or folders, e.g. "graphMemoryNodes simpleCudaGraphs"
# or "0_Introduction"): only those of list.txt.
if [ -n "${TF_SAMPLES_ONLY:-}" ]; then
  for s in $(grep -v '^ *$' "$SRC/list.txt"); do
    for want in $TF_SAMPLES_ONLY; do
      if [ "$(basename "$s")" = "$want" ] || [ "${s%%/*}" = "$want" ]; then echo "$s"; break; fi
    done
  done > "$LIST"
  [ -s "$LIST" ] || { echo "TF_SAMPLES_ONLY: none of '$TF_SAMPLES_ONLY' is in $SRC/list.txt" >&2; exit 2; }
else
  grep -v '^ *$' "$SRC/list.txt" > "$LIST"
fi
xargs -P "$(nproc)" -I{} bash -c 'build_one {}' < "$LIST"

TOKEN=samples-$$-$RANDOM
SOCK=$WORK/worker.sock
"$TF" worker --listen "unix:$SOCK" --listen "127.0.0.1:$PORT" --token "$TOKEN" --ready-file "$WORK/ready" \
  > "$LOGS/worker.log" 2>&1 &
WPID=$!
for _ in $(seq 100); do [ -e "$WORK/ready" ] && break; sleep 0.1; done

run_one() {
  local s=$1 mode=$2 name
  name=$(basename "$s")
  local base=$RUNS/$mode-$name
  if [ ! -x "$WORK/bin/$name" ]; then echo "BUILD-FAIL" > "$base.status"; return; fi
  local left=$((START + BUDGET - $(date +%s))) t=60
  if ((left < 10)); then echo "SKIP(budget)" > "$base.status"; return; fi
  ((t > left)) && t=$left
  local cmd=("$WORK/bin/$name")
  # Line-buffered output, so that a sample stopped by the time bound still shows how far it got.
  command -v stdbuf > /dev/null && cmd=(stdbuf -oL -eL "${cmd[@]}")
  case $mode in
    local) cmd=("$TF" run --percent 100 -- "${cmd[@]}") ;;
    shm) cmd=("$TF" run --remote "unix:$SOCK" --token "$TOKEN" -- "${cmd[@]}") ;;
    tcp) cmd=("$TF" run --remote "127.0.0.1:$PORT" --token "$TOKEN" -- "${cmd[@]}") ;;
  esac
  # stdout alone is what is compared with native; the stub's and tfusion's logs go to stderr.
  (cd "$SRC/Samples/$s" && timeout -k 5 "$t" "${cmd[@]}" > "$base.out" 2> "$base.err" < /dev/null)
  local rc=$? st
  case $rc in 0) st=PASS ;; 2) st=WAIVED ;; 124 | 137) st=TIMEOUT ;; *) st="FAIL($rc)" ;; esac
  echo "$st" > "$base.status"
}
export -f run_one
export TF TOKEN SOCK PORT RUNS
for m in $MODES; do
  xargs -P "$JOBS" -I{} bash -c "run_one {} $m" < "$LIST"
done
kill "$WPID" 2> /dev/null
wait "$WPID" 2> /dev/null

HEADER="$(date -u +%FT%TZ), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1), $($NVCC --version | tail -2 | head -1)"
python3 "$HERE/sample_output.py" report "$RUNS" "$LIST" "$MODES" "$OUT/samples.md" "$HEADER"
rc=$?
tar czf "$OUT/samples-logs.tar.gz" -C "$WORK" logs
rm -rf "$WORK"
exit "$rc"
