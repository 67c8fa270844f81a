// Stream-ordered allocation on movable memory (VRAM tiering, local mode and remote sessions).
//
// With tiering on, cuMemAllocAsync / cuMemAllocFromPoolAsync (and their _ptsz forms) on a device's
// default pool, or on a pool the tenant created without export handle types, are served from
// movable ranges (Tiering::Allocate) that the swap-out moves like cuMemAlloc memory. This class
// keeps, per pool, the books the driver's pool would keep:
//   - used ranges: handed to the tenant;
//   - pending ranges: freed by cuMemFreeAsync, with an event recorded on the freeing stream at
//     the time of the free; the memory stays mapped until that event completes, so the work
//     queued on the stream before the free can still use it;
//   - idle ranges: freed and complete, reused (best fit, at most twice the size asked for) by the
//     pool's later allocations, given back to the driver beyond the pool's release threshold at
//     the pool's next allocation, free, trim or attribute query, and by cuMemPoolTrimTo.
// cuMemPoolGetAttribute answers the used/reserved current and high figures from these books (the
// driver's own pool stays empty); release threshold and the other attributes are the driver's.
// Reserved bytes (used, pending and idle) are charged to the vGPU's quota; an allocation over the
// quota first gives the idle ranges of every pool back and tries again.
//
// Stays with the driver (fixed, counted as such): pools with an export handle type, pools and
// pointers imported from other processes, host-located pools, allocations on a capturing stream
// (graph memory nodes).
//
// Thread safety: every method may be called from any thread; one mutex guards the books and is
// taken before the tier mutex (Tiering's calls), never after it.
#pragma once

#include <cstddef>

#include "tf_driver_api.h"

namespace tf::limiter {

class StreamOrderedPools {
 public:
  static StreamOrderedPools& Instance();

  // Each call returns false when the pool or pointer is not one of ours (the caller forwards the
  // call to the driver, *result untouched), true with the call's answer in *result otherwise.
  // `pool` nullptr: the current pool of the current context's device (cuMemAllocAsync).
  // `per_thread`: the _ptsz entry points (stream 0 is the per-thread default stream).
  // *captured (when given) is set when the stream captures a graph: the allocation becomes a graph
  // memory node, which stays the driver's (false is returned).
  bool Allocate(CUdeviceptr* dptr, size_t bytes, CUmemoryPool pool, CUstream stream, bool per_thread,
                CUresult* result, bool* captured = nullptr);
  bool FreeAsync(CUdeviceptr dptr, CUstream stream, bool per_thread, CUresult* result);
  // cuMemFree_v2 on a stream-ordered allocation: freed at once, after the context's queued work.
  bool FreeNow(CUdeviceptr dptr, CUresult* result);
  bool TrimTo(CUmemoryPool pool, size_t keep, CUresult* result);
  bool GetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value, CUresult* result);
  // The pool of a live (used) range containing `ptr`: CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, which
  // the driver cannot answer for our ranges.
  bool PoolOf(CUdeviceptr ptr, CUmemoryPool* pool);

  // After the driver created or destroyed a pool, or set one of its attributes.
  void Created(CUmemoryPool pool, const CUmemPoolProps* props);
  void Destroyed(CUmemoryPool pool);
  void AttributeSet(CUmemoryPool pool, CUmemPool_attribute attr);

  // A forked child holds none of the parent's ranges.
  void ResetAfterFork();

 private:
  StreamOrderedPools() = default;
};

}  // namespace tf::limiter
