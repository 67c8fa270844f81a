#include "client/thread_scratch.h"

#include <pthread.h>

#include <cstdlib>
#include <new>

#include "client/remote_protocol.h"

namespace tf::client {
namespace {

constexpr int kKinds = static_cast<int>(Scratch::kCount);

struct Buffers {
  uint8_t* b[kKinds] = {};
};

// A plain pointer (no thread_local destructor: those of the main thread run at exit before the
// atexit handlers that may still call in); the key's destructor frees the buffers of threads that
// exit.
thread_local Buffers* t_buffers = nullptr;

// Runs on the exiting thread itself: a later destructor (another library's) that still makes a
// call on this thread allocates afresh instead of touching freed memory.
void FreeBuffers(void* p) {
  auto* bufs = static_cast<Buffers*>(p);
  if (t_buffers == bufs) t_buffers = nullptr;
  for (uint8_t* b : bufs->b) free(b);
  delete bufs;
}

pthread_key_t Key() {
  static pthread_key_t key = [] {
    pthread_key_t k;
    pthread_key_create(&k, &FreeBuffers);
    return k;
  }();
  return key;
}

}  // namespace

size_t ScratchBytes(Scratch kind) {
  switch (kind) {
    case Scratch::kLaunch: return remote::kMaxKernelParamBytes + 8192;
    case Scratch::kLaunchEx: return remote::kMaxKernelParamBytes + 16384;
    case Scratch::kLink: return remote::kMaxFunctionName + 64 + remote::kMaxJitOptions * 12;
    case Scratch::kCount: break;
  }
  return 0;
}

uint8_t* ThreadScratch(Scratch kind) {
  const int i = static_cast<int>(kind);
  if (i < 0 || i >= kKinds) return nullptr;
  if (t_buffers == nullptr) {
    auto* bufs = new (std::nothrow) Buffers();
    if (bufs == nullptr) return nullptr;
    pthread_setspecific(Key(), bufs);
    t_buffers = bufs;
  }
  uint8_t*& b = t_buffers->b[i];
  if (b == nullptr) b = static_cast<uint8_t*>(malloc(ScratchBytes(kind)));
  return b;
}

}  // namespace tf::client
