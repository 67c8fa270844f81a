// Routing of cuGetProcAddress lookups, from a table probed on a real driver (api/cuda-*/).
// The caller passes the base name ("cuMemAlloc"), its CUDA version and flags; the answer is the
// exact exported variant the real driver would have returned ("cuMemAlloc_v2", or
// "cuLaunchKernel_ptsz" for per-thread default-stream callers).
#pragma once

namespace tf::driver {

struct ProcLookup {
  int fn = -1;                       // Fn id of the variant, -1 when none
  bool known_base = false;           // the base name is in the probed table
  bool found_any_version = false;
  bool needs_newer_version = false;  // the function exists, but only for a newer cudaVersion
};

// Thread safety: pure function over constant data.
ProcLookup LookupProcAddress(const char* base, int cuda_version, unsigned long long flags);

// The newest cudaVersion the probed table covers; lookups above it are answered from the
// newest row (the probed driver itself refuses them, see docs/driver-surface.md).
int ProbedMaxVersion();

}  // namespace tf::driver
