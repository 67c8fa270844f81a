// Subcommands of `drvtest`, the driver-behaviour program of the GPU tier. Each is written once
// and run natively and under the limiter; run_all.sh compares the two. Each prints
// `RESULT key=value` lines, ends with `RESULT verdict=PASS|FAIL` where it judges itself, and
// returns the process exit status: 0 pass, 1 fail, 2 setup or usage error.
#ifndef TF_TESTS_GPU_DRVTEST_H_
#define TF_TESTS_GPU_DRVTEST_H_

#include "gpu_harness.h"

namespace tf::gpu {

// Budgets that the verdicts use. A granule is the driver's large-page size; the limiter rounds
// every reservation to it, so a vGPU may end at most one granule past its limit.
constexpr uint64_t kGranule = 2 * kMiB;

// alloc --path P --chunk 64MiB --max 4GiB --limit BYTES (0: native)
int RunAlloc(const Flags& flags);
// meminfo --limit BYTES (0: native) --alloc 512MiB
int RunMemInfo(const Flags& flags);
// procaddr --expect native | --expect-lib PATH
int RunProcAddr(const Flags& flags);
// hold: allocate until OOM or a target, report, then hold until released (concurrency, kill -9).
int RunHold(const Flags& flags);
// reclaim: wait for a go file, then retry until a target amount can be allocated.
int RunReclaim(const Flags& flags);
// arrays --big 64MiB: data through arrays, mipmap levels and pitched 2D/3D copies, texture and
// surface objects, refused copies (drvtest_arrays.cc).
int RunArrays(const Flags& flags);

}  // namespace tf::gpu

#endif  // TF_TESTS_GPU_DRVTEST_H_
