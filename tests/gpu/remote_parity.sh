#!/usr/bin/env bash
# The remote-parity pass of the GPU tier in one call (docs/benchmarks.md): JAX and CuPy
# (frameworks.sh), TCP copy bandwidth against a plain socket (tcp_copy.sh), host memory of remote
# sessions (remote_host_memory.sh) and the PyTorch checks, driver programs and samples natively,
# over shared memory and over TCP (remote_compare.sh). Usage, from the repository root:
#
#   bash tests/gpu/remote_parity.sh BUILD_DIR OUT_DIR [PARTS]
#
# PARTS (comma-separated, default frameworks,copy,hostmem,compare) picks the parts. Each part
# writes its own folder under OUT_DIR; the script ends with OUT_DIR/parity.md (each part's
# summary) and one tarball per part, so that few files come back from a remote machine.
set -uo pipefail
if [ $# -lt 2 ]; then echo "usage: bash tests/gpu/remote_parity.sh BUILD_DIR OUT_DIR [PARTS]" >&2; exit 2; fi
B=$(cd "$1" && pwd) || exit 2
OUT=$2
PARTS=${3:-frameworks,copy,hostmem,compare}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$B/src/cli/deps${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
SUM=$OUT/parity.md
: > "$SUM"
for p in ${PARTS//,/ }; do
  d=$OUT/$p
  mkdir -p "$d"
  echo "== $p $(date -u +%T)" | tee -a "$SUM"
  case $p in
    frameworks)
      TF_FRAMEWORKS_BUDGET_S=${TF_FRAMEWORKS_BUDGET_S:-200} TF_FRAMEWORKS_RUN_S=${TF_FRAMEWORKS_RUN_S:-90} \
        bash "$HERE/frameworks.sh" "$B" "$d" > "$d/run.txt" 2>&1
      cat "$d/frameworks.md" >> "$SUM" 2>/dev/null ;;
    copy)
      timeout 300 bash "$HERE/tcp_copy.sh" "$B" "$d" > "$d/run.txt" 2>&1
      cat "$d/table.md" >> "$SUM" 2>/dev/null ;;
    hostmem)
      timeout 240 bash "$HERE/remote_host_memory.sh" "$B" "$d" > "$d/run.txt" 2>&1
      grep -E "^==|steps_ok|steps_refused|steps_alloc_ms|data_ok|error" "$d/remote_host_memory.txt" >> "$SUM" ;;
    compare)
      TF_REMOTE_BUDGET_S=${TF_REMOTE_BUDGET_S:-240} TF_REMOTE_PHASES=${TF_REMOTE_PHASES:-checks,driver,samples} \
        bash "$HERE/remote_compare.sh" "$B" "$d" > "$d/run.txt" 2>&1
      cat "$d/remote-summary.md" >> "$SUM" 2>/dev/null ;;
    *) echo "unknown part $p (frameworks copy hostmem compare)" | tee -a "$SUM" ;;
  esac
  echo "exit $? at $(date -u +%T)" >> "$SUM"
  tar czf "$OUT/$p.tgz" -C "$OUT" "$p" && rm -rf "$d"
done
cat "$SUM"
