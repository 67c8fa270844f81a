// Large host-to-host copies on several threads (pageable device-to-host copies out of the shared
// bulk memory): one thread's memcpy moves about 6-10 GB/s, less than the DMA that fills the bulk
// memory, so a copy of at least kParallelCopyMin bytes is split between the calling thread and up
// to three helper threads. The helpers are started on first use and do nothing else; a forked
// child starts its own when it needs them.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tf::client {

inline constexpr size_t kParallelCopyMin = 1u << 20;

// Copies with non-temporal stores (the destination is not read first and does not pass through
// the cache), memcpy for the unaligned head and tail. For copies much larger than the cache.
void StreamCopy(void* dst, const void* src, size_t n);

// memcpy(dst, src, n), split across threads when n >= kParallelCopyMin and helpers can be had;
// falls back to one memcpy otherwise. Thread-safe: concurrent callers take turns with the helpers.
// TFUSION_COPY_THREADS=1..4 sets the threads in all (1: no helpers), TFUSION_COPY_NT=0 copies
// the parts with memcpy instead of StreamCopy; both are read once.
void ParallelCopy(void* dst, const void* src, size_t n);

// What the large copies of this process cost so far (for TFUSION_COPY_PROFILE): calls that
// used the helpers, the helpers started (and pthread_create's error if one failed to start), the
// nanoseconds the calling thread spent on its own part and waiting for the helpers' parts after.
struct ParallelCopyStats {
  uint64_t calls = 0;
  int helpers = 0;
  int start_error = 0;
  uint64_t own_ns = 0;
  uint64_t wait_ns = 0;
};
ParallelCopyStats GetParallelCopyStats();

}  // namespace tf::client
