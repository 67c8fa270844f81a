// Runs a driver call with a given context current on the calling thread (the limiter's own
// threads copy and map in the tenant's contexts).
#pragma once

#include "limiter/export_support.h"

namespace tf::limiter {

// `fn`'s result, or the push's error (then `fn` does not run).
template <typename Fn>
CUresult InContext(CUcontext ctx, Fn&& fn) {
  CUresult e = g_real.cuCtxPushCurrent_v2(ctx);
  if (e != CUDA_SUCCESS) return e;
  CUresult r = fn();
  CUcontext popped = nullptr;
  g_real.cuCtxPopCurrent_v2(&popped);
  return r;
}

}  // namespace tf::limiter
