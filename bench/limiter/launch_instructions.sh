#!/usr/bin/env bash
# Instructions the limiter adds to one unthrottled cuLaunchKernel, counted by callgrind on the
# fake driver (repeatable on any machine, no GPU): 20,000 launches under `tfusion run`; the
# limiter's own cost is the inclusive cost of its cuLaunchKernel minus that of the driver's
# cuLaunchKernel it calls (the driver's own cost varies with its worker thread, so the native
# run is shown for scale only).
# Usage: bash bench/limiter/launch_instructions.sh BUILD_DIR
set -euo pipefail
B=$(cd "$1" && pwd)
N=20000
D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT
export TFUSION_SHM_DIR=$D/shm FAKECUDA_SHM_NAME=/tf-launch-instr-$$
cd "$D"
LD_LIBRARY_PATH=$B/tests/fakecuda valgrind --tool=callgrind --callgrind-out-file=native.out \
  "$B/tests/limiter/limiter_probe" launchloop $N > /dev/null 2>&1
"$B/src/cli/tfusion" run --driver "$B/tests/fakecuda/libcuda.so.1" \
  --nvml "$B/tests/fakecuda/libnvidia-ml.so.1" --vram 1GiB -- \
  valgrind --tool=callgrind --callgrind-out-file=limiter.out "$B/tests/limiter/limiter_probe" launchloop $N \
  > /dev/null 2>&1
incl() {  # incl FILE LIBRARY-SUBSTRING -> inclusive instructions of that library's cuLaunchKernel
  callgrind_annotate --inclusive=yes "$1" 2>/dev/null |
    awk -v lib="$2" '/:cuLaunchKernel \[/ && index($0, lib) && !done { gsub(",", "", $1); print $1; done = 1 }'
}
native=$(incl native.out fakecuda)
limiter=$(incl limiter.out libtfusion-limiter)
inner=$(incl limiter.out fakecuda)
echo "| launches | native: driver instr. | limited: limiter incl. instr. | of which driver | limiter's own per launch |"
echo "| --- | --- | --- | --- | --- |"
echo "| $N | $native | $limiter | $inner | $(( (limiter - inner) / N )) |"
