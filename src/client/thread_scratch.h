// Per-thread buffers for encoding the largest requests (kernel launches with up to 64 KiB of
// parameters, cuLink inputs), on the heap. A thread_local array of that size would be static TLS
// of the library, which glibc carves out of the stack of every thread the program creates: a
// program thread (or one of ours) started with a small stack would fail to start at all.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tf::client {

enum class Scratch { kLaunch, kLaunchEx, kLink, kCount };

// This thread's buffer for `kind`, of ScratchBytes(kind) bytes, allocated on first use and freed
// when the thread exits; nullptr when it cannot be allocated (the caller fails the call with
// CUDA_ERROR_OUT_OF_MEMORY).
uint8_t* ThreadScratch(Scratch kind);
size_t ScratchBytes(Scratch kind);

}  // namespace tf::client
