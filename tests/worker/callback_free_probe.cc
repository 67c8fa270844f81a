// remote_probe mode "callbackfree N ROUNDS": NVIDIA's simpleCallback pattern. N workloads, each a
// stream with page-locked memory: copy up, a kernel, copy down, then a stream callback that starts
// a thread; that thread checks the bytes and frees the workload's memory and stream while other
// streams' callbacks may still be pending, and counts down a barrier the main thread waits on
// without calling CUDA.
#include <cuda.h>
#include <pthread.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "probe_util.h"

namespace {

struct Workload {
  int id = 0;
  CUcontext ctx = nullptr;
  CUstream stream = nullptr;
  CUdeviceptr dev = 0;
  unsigned* host = nullptr;
  size_t n = 0;
  bool ok = false;
};

std::mutex g_mu;
std::condition_variable g_cv;
int g_left = 0;

void* PostProcess(void* arg) {
  auto* w = static_cast<Workload*>(arg);
  CHECK(cuCtxSetCurrent(w->ctx));
  w->ok = w->host[0] == 0x1234u + w->id && w->host[w->n - 1] == 0x1234u + w->id;
  CHECK(cuMemFreeHost(w->host));
  CHECK(cuMemFree(w->dev));
  CHECK(cuStreamDestroy(w->stream));
  std::lock_guard<std::mutex> l(g_mu);
  if (--g_left == 0) g_cv.notify_all();
  return nullptr;
}

void OnStreamDone(CUstream, CUresult, void* arg) {
  pthread_t t;
  if (pthread_create(&t, nullptr, PostProcess, arg) == 0) pthread_detach(t);
}

}  // namespace

int CallbackFree(int workloads, int rounds) {
  CUcontext ctx = tf_probe::Setup();
  CUfunction fill = tf_probe::Kernel("fill_u32");
  if (workloads < 1 || workloads > 64) return 2;
  int rounds_ok = 0;
  for (int r = 0; r < rounds; ++r) {
    Workload ws[64];
    g_left = workloads;
    for (int i = 0; i < workloads; ++i) {
      Workload& w = ws[i];
      w.id = i;
      w.ctx = ctx;
      w.n = 1 << 18;
      CHECK(cuStreamCreate(&w.stream, CU_STREAM_NON_BLOCKING));
      CHECK(cuMemAlloc(&w.dev, w.n * 4));
      CHECK(cuMemAllocHost(reinterpret_cast<void**>(&w.host), w.n * 4));
      std::memset(w.host, 0, w.n * 4);
      CHECK(cuMemcpyHtoDAsync(w.dev, w.host, w.n * 4, w.stream));
      unsigned v = 0x1234u + i;
      size_t count = w.n;
      void* args[] = {&w.dev, &v, &count};
      CHECK(cuLaunchKernel(fill, 1, 1, 1, 1, 1, 1, 0, w.stream, args, nullptr));
      CHECK(cuMemcpyDtoHAsync(w.host, w.dev, w.n * 4, w.stream));
      CHECK(cuStreamAddCallback(w.stream, OnStreamDone, &w, 0));
    }
    std::unique_lock<std::mutex> l(g_mu);
    g_cv.wait(l, [] { return g_left == 0; });
    int ok = 0;
    for (int i = 0; i < workloads; ++i) ok += ws[i].ok;
    rounds_ok += ok == workloads;
  }
  CHECK(cuCtxSynchronize());
  std::printf("rounds_ok=%d\n", rounds_ok);
  std::printf("done=1\n");
  return 0;
}
