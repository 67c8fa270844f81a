// Large host-to-host copies on several threads (pageable device-to-host copies out of the shared
// bulk memory): one thread's memcpy moves about 6-10 GB/s, less than the DMA that fills the bulk
// memory, so a copy of at least kParallelCopyMin bytes is split between the calling thread and up
// to three helper threads. The helpers are started on first use and do nothing else; a forked
// child starts its own when it needs them.
#pragma once

#include <cstddef>

namespace tf::client {

inline constexpr size_t kParallelCopyMin = 1u << 20;

// memcpy(dst, src, n), split across threads when n >= kParallelCopyMin and helpers can be had;
// falls back to one memcpy otherwise. Thread-safe: concurrent callers take turns with the helpers.
void ParallelCopy(void* dst, const void* src, size_t n);

}  // namespace tf::client
