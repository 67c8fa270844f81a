// A driver-API program for the remote tests of cuDevicePrimaryCtxReset (cudaDeviceReset): make
// memory, a stream, an event, a module and page-locked memory in the primary context, use them,
// reset the device, check that the old objects fail, and do the same work again with new ones
// (launches, pageable and page-locked copies, a captured graph, a host function); a library and
// its kernel (context-independent) made before the reset still work after it. Run directly on
// tests/fakecuda or through the client stub and a worker, it prints "key=value" lines the tests
// compare.
#include <cuda.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <vector>

#include "probe_util.h"

namespace {

using tf_probe::Fill;
using tf_probe::Setup;

constexpr size_t kCount = 4096;  // unsigned values
constexpr size_t kBytes = kCount * sizeof(unsigned);

std::atomic<int> g_host_runs{0};

unsigned long long Sum(const unsigned* p) {
  unsigned long long s = 0;
  for (size_t i = 0; i < kCount; ++i) s += p[i];
  return s;
}

// One round of work: fill on a stream, read back through page-locked and pageable memory, write
// from pageable memory and copy device to device, a captured graph and a host function.
void Round(const char* tag, CUfunction fill, CUstream st, CUevent ev, CUdeviceptr d, CUdeviceptr d2,
           unsigned* pinned, unsigned value) {
  Fill(fill, d, value, kCount, st);
  CHECK(cuMemcpyDtoHAsync_v2(pinned, d, kBytes, st));
  CHECK(cuEventRecord(ev, st));
  CHECK(cuEventSynchronize(ev));
  std::vector<unsigned> pageable(kCount);
  CHECK(cuMemcpyDtoH_v2(pageable.data(), d, kBytes));
  std::printf("%s_pinned_sum=%llu\n", tag, Sum(pinned));
  std::printf("%s_pageable_sum=%llu\n", tag, Sum(pageable.data()));
  for (size_t i = 0; i < kCount; ++i) pageable[i] = static_cast<unsigned>(i);
  CHECK(cuMemcpyHtoD_v2(d2, pageable.data(), kBytes));
  CHECK(cuMemcpyDtoD_v2(d, d2, kBytes));
  std::memset(pinned, 0, kBytes);
  CHECK(cuMemcpyDtoHAsync_v2(pinned, d, kBytes, st));
  CHECK(cuStreamSynchronize(st));
  std::printf("%s_roundtrip_sum=%llu\n", tag, Sum(pinned));
  // A graph captured from the stream.
  CUgraph g;
  CUgraphExec ge;
  CHECK(cuStreamBeginCapture_v2(st, CU_STREAM_CAPTURE_MODE_GLOBAL));
  Fill(fill, d2, value + 1, kCount, st);
  CHECK(cuStreamEndCapture(st, &g));
  CHECK(cuGraphInstantiateWithFlags(&ge, g, 0));
  CHECK(cuGraphLaunch(ge, st));
  CHECK(cuMemcpyDtoHAsync_v2(pinned, d2, kBytes, st));
  const int before = g_host_runs.load();
  CHECK(cuLaunchHostFunc(st, [](void*) { g_host_runs.fetch_add(1); }, nullptr));
  CHECK(cuStreamSynchronize(st));
  std::printf("%s_graph_sum=%llu\n", tag, Sum(pinned));
  std::printf("%s_host_func=%d\n", tag, g_host_runs.load() - before);
  CHECK(cuGraphExecDestroy(ge));
  CHECK(cuGraphDestroy(g));
}

int Reset() {
  CUcontext ctx = Setup();
  CUmodule mod;
  CHECK(cuModuleLoadData(&mod, "fakecuda:builtin"));
  CUfunction fill;
  CHECK(cuModuleGetFunction(&fill, mod, "fill_u32"));
  CUdeviceptr d, d2;
  CHECK(cuMemAlloc_v2(&d, kBytes));
  CHECK(cuMemAlloc_v2(&d2, kBytes));
  CUstream st;
  CHECK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
  CUevent ev;
  CHECK(cuEventCreate(&ev, CU_EVENT_DEFAULT));
  void* pinned = nullptr;
  CHECK(cuMemAllocHost_v2(&pinned, kBytes));
  // A library and its kernel: context-independent, they outlive the reset.
  CUlibrary lib;
  CHECK(cuLibraryLoadData(&lib, "fakecuda:builtin", nullptr, nullptr, 0, nullptr, nullptr, 0));
  CUkernel kern;
  CHECK(cuLibraryGetKernel(&kern, lib, "fill_u32"));
  Round("before", fill, st, ev, d, d2, static_cast<unsigned*>(pinned), 3);

  std::printf("reset=%d\n", static_cast<int>(cuDevicePrimaryCtxReset_v2(0)));
  unsigned flags = 0;
  int active = -1;
  CHECK(cuDevicePrimaryCtxGetState(0, &flags, &active));
  std::printf("state_after_reset=%u:%d\n", flags, active);
  // Every object of the context is gone: each call on one fails (0 would be a success).
  CUfunction again = nullptr;
  std::printf("old_module=%d\n", cuModuleGetFunction(&again, mod, "fill_u32") != CUDA_SUCCESS);
  std::printf("old_stream=%d\n", cuStreamSynchronize(st) != CUDA_SUCCESS);
  std::printf("old_event=%d\n", cuEventQuery(ev) != CUDA_SUCCESS);
  std::printf("old_memory_free=%d\n", cuMemFree_v2(d) != CUDA_SUCCESS);
  size_t size = 0;
  CUdeviceptr base = 0;
  std::printf("old_memory_range=%d\n", cuMemGetAddressRange_v2(&base, &size, d2) != CUDA_SUCCESS);

  // The primary context is used again (as cudart does after cudaDeviceReset).
  CUcontext ctx2;
  CHECK(cuDevicePrimaryCtxRetain(&ctx2, 0));
  CHECK(cuCtxSetCurrent(ctx2));
  std::printf("same_context=%d\n", ctx2 == ctx);
  CHECK(cuModuleLoadData(&mod, "fakecuda:builtin"));
  CHECK(cuModuleGetFunction(&fill, mod, "fill_u32"));
  CHECK(cuMemAlloc_v2(&d, kBytes));
  CHECK(cuMemAlloc_v2(&d2, kBytes));
  CHECK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
  CHECK(cuEventCreate(&ev, CU_EVENT_DEFAULT));
  void* pinned2 = nullptr;
  CHECK(cuMemAllocHost_v2(&pinned2, kBytes));
  Round("after", fill, st, ev, d, d2, static_cast<unsigned*>(pinned2), 5);
  CUkernel kern2 = nullptr;
  CHECK(cuLibraryGetKernel(&kern2, lib, "fill_u32"));
  std::printf("library_kernel_kept=%d\n", kern2 == kern);
  Fill(reinterpret_cast<CUfunction>(kern), d, 7, kCount, st);
  CHECK(cuMemcpyDtoHAsync_v2(pinned2, d, kBytes, st));
  CHECK(cuStreamSynchronize(st));
  std::printf("after_library_kernel_sum=%llu\n", Sum(static_cast<unsigned*>(pinned2)));
  CHECK(cuLibraryUnload(lib));
  // A reset with nothing left of the session, then the new objects' own release.
  CHECK(cuEventDestroy_v2(ev));
  CHECK(cuStreamDestroy_v2(st));
  CHECK(cuMemFree_v2(d));
  CHECK(cuMemFree_v2(d2));
  CHECK(cuMemFreeHost(pinned2));
  CHECK(cuModuleUnload(mod));
  std::printf("bad_device=%d\n", static_cast<int>(cuDevicePrimaryCtxReset_v2(99)));
  CHECK(cuDevicePrimaryCtxRelease_v2(0));
  CHECK(cuDevicePrimaryCtxRelease_v2(0));
  std::printf("done=1\n");
  return 0;
}

// A reset while the session has a created context as well: remotely refused (what the session
// holds is not recorded per context), and the session goes on working.
int WithOtherContext() {
  CUcontext primary = Setup();
  CUcontext created;
  CHECK(cuCtxCreate(&created, nullptr, 0, 0));
  CHECK(cuCtxSetCurrent(primary));
  CUdeviceptr d;
  CHECK(cuMemAlloc_v2(&d, kBytes));
  std::printf("reset_with_other_context=%d\n", static_cast<int>(cuDevicePrimaryCtxReset_v2(0)));
  CHECK(cuCtxSetCurrent(primary));
  CHECK(cuMemsetD32_v2(d, 9, kCount));
  std::vector<unsigned> h(kCount);
  CHECK(cuMemcpyDtoH_v2(h.data(), d, kBytes));
  std::printf("memory_kept_sum=%llu\n", Sum(h.data()));
  CHECK(cuMemFree_v2(d));
  CHECK(cuCtxDestroy(created));
  std::printf("done=1\n");
  return 0;
}

// Managed, mapped (cuMemHostAlloc with DEVICEMAP) and registered memory alive at a reset. Remotely
// over TCP all three are mirrors; over shared memory the first two are host regions and the
// registration, not page-aligned, is a mirror. They are written by the host and by kernels, a
// sleep, a fill and a copy into the registered memory are still in flight when the device is
// reset; afterwards the managed and mapped memory are gone (every call naming them fails as after
// a free), the registered memory holds what the copy wrote and is still registered, and new
// managed and mapped memory work.
int Mirrors() {
  CUcontext ctx = Setup();
  CUmodule mod;
  CHECK(cuModuleLoadData(&mod, "fakecuda:builtin"));
  CUfunction fill, sleep_us;
  CHECK(cuModuleGetFunction(&fill, mod, "fill_u32"));
  CHECK(cuModuleGetFunction(&sleep_us, mod, "sleep_us"));
  CUstream st;
  CHECK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
  CUdeviceptr d;
  CHECK(cuMemAlloc_v2(&d, kBytes));
  CUdeviceptr managed;
  CHECK(cuMemAllocManaged(&managed, kBytes, CU_MEM_ATTACH_GLOBAL));
  void* mapped = nullptr;
  CHECK(cuMemHostAlloc(&mapped, kBytes, CU_MEMHOSTALLOC_DEVICEMAP));
  CUdeviceptr mapped_dev;
  CHECK(cuMemHostGetDevicePointer_v2(&mapped_dev, mapped, 0));
  std::vector<unsigned> storage(kCount + 1);
  unsigned* registered = storage.data() + 1;  // not page-aligned: mirrored over shared memory too
  CHECK(cuMemHostRegister_v2(registered, kBytes, CU_MEMHOSTREGISTER_DEVICEMAP));
  CUdeviceptr registered_dev;
  CHECK(cuMemHostGetDevicePointer_v2(&registered_dev, registered, 0));

  // Used: the host writes managed memory and the device reads it; kernels write the others.
  auto* m = reinterpret_cast<unsigned*>(managed);
  for (size_t i = 0; i < kCount; ++i) m[i] = static_cast<unsigned>(i);
  CHECK(cuMemcpyDtoD_v2(d, managed, kBytes));
  Fill(fill, mapped_dev, 3, kCount, st);
  Fill(fill, registered_dev, 4, kCount, st);
  CHECK(cuStreamSynchronize(st));
  std::vector<unsigned> h(kCount);
  CHECK(cuMemcpyDtoH_v2(h.data(), d, kBytes));
  std::printf("managed_read_by_device_sum=%llu\n", Sum(h.data()));
  std::printf("mapped_sum=%llu\n", Sum(static_cast<unsigned*>(mapped)));
  std::printf("registered_sum=%llu\n", Sum(registered));

  // In flight at the reset: a sleep, then a fill of device memory copied into the registered
  // memory, and a fill of managed memory; the reset waits for them.
  unsigned us = 20000;
  void* sleep_params[] = {&us};
  CHECK(cuLaunchKernel(sleep_us, 1, 1, 1, 1, 1, 1, 0, st, sleep_params, nullptr));
  Fill(fill, d, 8, kCount, st);
  CHECK(cuMemcpyDtoHAsync_v2(registered, d, kBytes, st));
  Fill(fill, managed, 9, kCount, st);
  std::printf("reset=%d\n", static_cast<int>(cuDevicePrimaryCtxReset_v2(0)));
  std::printf("registered_after_reset_sum=%llu\n", Sum(registered));

  // The managed and mapped memory are freed: every call naming them fails (codes compared).
  size_t size = 0;
  CUdeviceptr base = 0;
  unsigned flags = 0;
  int is_managed = 0;
  CUdeviceptr dptr = 0;
  std::printf("old_managed_free=%d\n", static_cast<int>(cuMemFree_v2(managed)));
  std::printf("old_managed_range=%d\n", static_cast<int>(cuMemGetAddressRange_v2(&base, &size, managed)));
  std::printf("old_managed_attribute=%d\n",
              static_cast<int>(cuPointerGetAttribute(&is_managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, managed)));
  std::printf("old_mapped_free=%d\n", static_cast<int>(cuMemFreeHost(mapped)));
  std::printf("old_mapped_flags=%d\n", static_cast<int>(cuMemHostGetFlags(&flags, mapped)));
  std::printf("old_mapped_device_pointer=%d\n", static_cast<int>(cuMemHostGetDevicePointer_v2(&dptr, mapped, 0)));
  // The registration stays; the program's writes to it go nowhere until a kernel may be given it.
  flags = 99;
  const CUresult registered_flags = cuMemHostGetFlags(&flags, registered);
  std::printf("registered_flags=%d:%u\n", static_cast<int>(registered_flags), flags);
  for (size_t i = 0; i < kCount; ++i) registered[i] = 1;
  CHECK(cuCtxSynchronize());

  // New objects, managed and mapped memory in the same (still retained) context.
  CUcontext ctx2;
  CHECK(cuDevicePrimaryCtxRetain(&ctx2, 0));
  CHECK(cuCtxSetCurrent(ctx2));
  std::printf("same_context=%d\n", ctx2 == ctx);
  CHECK(cuModuleLoadData(&mod, "fakecuda:builtin"));
  CHECK(cuModuleGetFunction(&fill, mod, "fill_u32"));
  CHECK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
  CHECK(cuMemAlloc_v2(&d, kBytes));
  CUdeviceptr managed2;
  CHECK(cuMemAllocManaged(&managed2, kBytes, CU_MEM_ATTACH_GLOBAL));
  auto* m2 = reinterpret_cast<unsigned*>(managed2);
  for (size_t i = 0; i < kCount; ++i) m2[i] = static_cast<unsigned>(2 * i);
  CHECK(cuMemcpyDtoD_v2(d, managed2, kBytes));
  CHECK(cuMemcpyDtoH_v2(h.data(), d, kBytes));
  std::printf("new_managed_read_by_device_sum=%llu\n", Sum(h.data()));
  Fill(fill, managed2, 6, kCount, st);
  CHECK(cuStreamSynchronize(st));
  std::printf("new_managed_sum=%llu\n", Sum(m2));
  void* mapped2 = nullptr;
  CHECK(cuMemHostAlloc(&mapped2, kBytes, CU_MEMHOSTALLOC_DEVICEMAP));
  CHECK(cuMemHostGetDevicePointer_v2(&dptr, mapped2, 0));
  Fill(fill, dptr, 7, kCount, st);
  CHECK(cuStreamSynchronize(st));
  std::printf("new_mapped_sum=%llu\n", Sum(static_cast<unsigned*>(mapped2)));
  // The registration used by kernels again, with what the host wrote since the reset.
  CHECK(cuMemHostGetDevicePointer_v2(&registered_dev, registered, 0));
  CHECK(cuMemcpyDtoH_v2(h.data(), registered_dev, kBytes));
  std::printf("registered_host_writes_seen_sum=%llu\n", Sum(h.data()));
  Fill(fill, registered_dev, 10, kCount, st);
  CHECK(cuStreamSynchronize(st));
  std::printf("registered_again_sum=%llu\n", Sum(registered));
  CHECK(cuMemHostUnregister(registered));
  CHECK(cuMemFree_v2(managed2));
  CHECK(cuMemFreeHost(mapped2));
  CHECK(cuMemFree_v2(d));
  CHECK(cuStreamDestroy_v2(st));
  CHECK(cuModuleUnload(mod));
  CHECK(cuDevicePrimaryCtxRelease_v2(0));
  CHECK(cuDevicePrimaryCtxRelease_v2(0));
  std::printf("done=1\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "reset") == 0) return Reset();
  if (argc >= 2 && std::strcmp(argv[1], "other_context") == 0) return WithOtherContext();
  if (argc >= 2 && std::strcmp(argv[1], "mirrors") == 0) return Mirrors();
  std::fprintf(stderr, "usage: reset_probe reset|other_context|mirrors\n");
  return 2;
}
