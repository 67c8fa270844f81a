// A driver-API program for the remote vGPU tests: run directly on tests/fakecuda or through the
// client stub and a worker, it prints "key=value" lines the tests compare. Linked against
// libcuda.so.1 like any CUDA program; the library path decides what it gets.
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "probe_util.h"

int GraphPageable();     // graph_host_probe.cc
int GraphNodeAccess();   // graph_nodes_probe.cc
int GraphConditional();  // graph_host_probe.cc
int GraphHandles();      // graph_handles_probe.cc
int CallbackFree(int workloads, int rounds);  // callback_free_probe.cc

namespace {

using tf_probe::Fill;
using tf_probe::Kernel;
using tf_probe::Setup;



// Device queries, memory, copies, kernels, streams and events.
int Basic() {
  int version = 0;
  CHECK(cuInit(0));
  CHECK(cuDriverGetVersion(&version));
  std::printf("driver_version=%d\n", version);
  int count = 0;
  CHECK(cuDeviceGetCount(&count));
  std::printf("device_count=%d\n", count);
  CUdevice dev;
  CHECK(cuDeviceGet(&dev, 0));
  char name[256];
  CHECK(cuDeviceGetName(name, sizeof(name), dev));
  std::printf("device_name=%s\n", name);
  CUuuid uuid;
  CHECK(cuDeviceGetUuid(&uuid, dev));
  std::printf("uuid=");
  for (unsigned char b : uuid.bytes) std::printf("%02x", b);
  std::printf("\n");
  size_t total = 0;
  CHECK(cuDeviceTotalMem(&total, dev));
  std::printf("total_mib=%zu\n", total >> 20);
  int major = 0, minor = 0, sms = 0;
  CHECK(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
  CHECK(cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
  CHECK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
  std::printf("cc=%d.%d\nsms=%d\n", major, minor, sms);
  const char* ename = nullptr;
  CHECK(cuGetErrorName(CUDA_ERROR_INVALID_VALUE, &ename));
  std::printf("error_name=%s\n", ename);

  CUcontext ctx;
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
  CUcontext cur = nullptr;
  CHECK(cuCtxGetCurrent(&cur));
  std::printf("current_is_primary=%d\n", cur == ctx);
  CUdevice cdev = -1;
  CHECK(cuCtxGetDevice(&cdev));
  std::printf("ctx_device=%d\n", cdev);
  unsigned flags = 0;
  int active = 0;
  CHECK(cuDevicePrimaryCtxGetState(dev, &flags, &active));
  std::printf("primary_active=%d\n", active);

  constexpr size_t kCount = 1 << 20;  // 4 MiB of u32
  CUdeviceptr a, b;
  CHECK(cuMemAlloc(&a, kCount * 4));
  CHECK(cuMemAlloc(&b, kCount * 4));
  size_t free_b = 0, total_b = 0;
  CHECK(cuMemGetInfo(&free_b, &total_b));
  std::printf("meminfo_used_mib=%zu\n", (total_b - free_b) >> 20);

  std::vector<uint32_t> host(kCount);
  for (size_t i = 0; i < kCount; ++i) host[i] = static_cast<uint32_t>(i * 2654435761u);
  CHECK(cuMemcpyHtoD(a, host.data(), kCount * 4));
  CHECK(cuMemcpyDtoD(b, a, kCount * 4));
  std::vector<uint32_t> back(kCount);
  CHECK(cuMemcpyDtoH(back.data(), b, kCount * 4));
  std::printf("htod_dtod_dtoh_equal=%d\n", back == host);

  CUfunction fill = Kernel("fill_u32");
  size_t off = 0, psize = 0;
  CHECK(cuFuncGetParamInfo(fill, 2, &off, &psize));
  std::printf("fill_param2=%zu:%zu\n", off, psize);
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUevent e0, e1;
  CHECK(cuEventCreate(&e0, CU_EVENT_DEFAULT));
  CHECK(cuEventCreate(&e1, CU_EVENT_DEFAULT));
  CHECK(cuEventRecord(e0, s));
  Fill(fill, a, 0xC0FFEEu, kCount, s);
  CUfunction sleep_us = Kernel("sleep_us");
  unsigned us = 20000;
  void* sp[] = {&us};
  CHECK(cuLaunchKernel(sleep_us, 1, 1, 1, 1, 1, 1, 0, s, sp, nullptr));
  CHECK(cuEventRecord(e1, s));
  CHECK(cuMemcpyDtoHAsync(back.data(), a, kCount * 4, s));
  CHECK(cuStreamSynchronize(s));
  bool all = true;
  for (uint32_t v : back) all = all && v == 0xC0FFEEu;
  std::printf("kernel_fill_ok=%d\n", all);
  CHECK(cuEventSynchronize(e1));
  std::printf("event_query=%d\n", static_cast<int>(cuEventQuery(e1)));
  float ms = 0;
  CHECK(cuEventElapsedTime(&ms, e0, e1));
  std::printf("elapsed_ge_20ms=%d\n", ms >= 19.0f);

  // Async upload, memsets, and stream ordering.
  for (size_t i = 0; i < kCount; ++i) host[i] = 7;
  CHECK(cuMemcpyHtoDAsync(b, host.data(), kCount * 4, s));
  CHECK(cuMemsetD32Async(b, 5, 16, s));
  CHECK(cuMemsetD8Async(b + 64, 1, 4, s));
  CHECK(cuStreamSynchronize(s));
  // (Not reused before the sync: the fake driver reads pageable sources late, CUDA does not.)
  std::fill(host.begin(), host.end(), 9);
  CHECK(cuMemcpyDtoH(back.data(), b, kCount * 4));
  std::printf("async_htod=%u,%u,%08x,%u\n", back[0], back[15], back[16], back[kCount - 1]);
  CHECK(cuMemsetD32(b, 11, kCount));
  CHECK(cuMemsetD8(b, 0, 4));
  CHECK(cuMemcpyDtoH(back.data(), b, 8));
  std::printf("memset=%u,%u\n", back[0], back[1]);
  std::printf("stream_query=%d\n", static_cast<int>(cuStreamQuery(s)));
  CHECK(cuCtxSynchronize());

  CHECK(cuEventDestroy(e0));
  CHECK(cuEventDestroy(e1));
  CHECK(cuStreamDestroy(s));
  CHECK(cuMemFree(a));
  CHECK(cuMemFree(b));
  CHECK(cuMemGetInfo(&free_b, &total_b));
  std::printf("meminfo_after_free_used_mib=%zu\n", (total_b - free_b) >> 20);
  CHECK(cuDevicePrimaryCtxRelease(dev));
  std::printf("done=1\n");
  return 0;
}

// An asynchronous failure (armed in the worker's fake driver) surfaces at the next sync.
int Deferred() {
  Setup();
  CUfunction fill = Kernel("fill_u32");
  CUdeviceptr a;
  CHECK(cuMemAlloc(&a, 4096));
  CUstream s;
  CHECK(cuStreamCreate(&s, 0));
  void* params[3];
  size_t count = 16;
  unsigned value = 1;
  params[0] = &a;
  params[1] = &value;
  params[2] = &count;
  std::printf("launch=%d\n", static_cast<int>(cuLaunchKernel(fill, 1, 1, 1, 1, 1, 1, 0, s, params, nullptr)));
  std::printf("sync1=%d\n", static_cast<int>(cuStreamSynchronize(s)));
  std::printf("sync2=%d\n", static_cast<int>(cuStreamSynchronize(s)));
  std::printf("launch2=%d\n", static_cast<int>(cuLaunchKernel(fill, 1, 1, 1, 1, 1, 1, 0, s, params, nullptr)));
  std::printf("sync3=%d\n", static_cast<int>(cuStreamSynchronize(s)));
  return 0;
}

// Bad handles and pointers fail their call only; the session keeps working.
int BadHandles() {
  Setup();
  CUdeviceptr a;
  CHECK(cuMemAlloc(&a, 4096));
  std::vector<char> buf(8192);
  std::printf("htod_overrun=%d\n", static_cast<int>(cuMemcpyHtoD(a, buf.data(), 8192)));
  std::printf("dtoh_wild=%d\n", static_cast<int>(cuMemcpyDtoH(buf.data(), 0x1234, 16)));
  std::printf("free_inside=%d\n", static_cast<int>(cuMemFree(a + 16)));
  std::printf("stream_bogus=%d\n",
              static_cast<int>(cuStreamSynchronize(reinterpret_cast<CUstream>(0xdead0000))));
  std::printf("event_bogus=%d\n",
              static_cast<int>(cuEventQuery(reinterpret_cast<CUevent>(0xbeef0000))));
  CUfunction f;
  std::printf("module_bogus=%d\n", static_cast<int>(cuModuleGetFunction(
                                       &f, reinterpret_cast<CUmodule>(0x4000), "fill_u32")));
  // Batched decompression is not forwarded (looked up by name: the fake driver has no such entry
  // point).
  using Decompress = CUresult (*)(CUmemDecompressParams*, size_t, unsigned int, size_t*, CUstream);
  auto decompress = reinterpret_cast<Decompress>(dlsym(RTLD_DEFAULT, "cuMemBatchDecompressAsync"));
  std::printf("unsupported=%d\n",
              decompress ? static_cast<int>(decompress(nullptr, 0, 0, nullptr, nullptr)) : -1);
  // Allocation and primary contexts are generated calls: the client and the worker refuse what
  // the session's tables do not hold, the session goes on.
  std::printf("free_never_allocated=%d\n", static_cast<int>(cuMemFree(0x7f0000100000ull)));
  CUdeviceptr none = 0;
  size_t pitch = 0;
  std::printf("alloc_zero=%d\n", static_cast<int>(cuMemAlloc(&none, 0)));
  std::printf("pitch_bad_element=%d\n", static_cast<int>(cuMemAllocPitch(&none, &pitch, 64, 4, 3)));
  std::printf("pitch_zero_height=%d\n", static_cast<int>(cuMemAllocPitch(&none, &pitch, 64, 0, 4)));
  CUcontext primary = nullptr;
  std::printf("primary_retain_bad_device=%d\n", static_cast<int>(cuDevicePrimaryCtxRetain(&primary, 64)));
  std::printf("primary_release_bad_device=%d\n", static_cast<int>(cuDevicePrimaryCtxRelease(64)));
  std::printf("primary_flags_bad_device=%d\n", static_cast<int>(cuDevicePrimaryCtxSetFlags(64, 0)));
  std::printf("forged_ctx_current=%d\n", static_cast<int>(cuCtxSetCurrent(reinterpret_cast<CUcontext>(0x7f0000002000ull))));
  std::printf("forged_ctx_destroy=%d\n", static_cast<int>(cuCtxDestroy(reinterpret_cast<CUcontext>(0x7f0000002000ull))));
  // Contexts: only one the program created is destroyed, once; execution-affinity parameters are
  // not forwarded.
  CUcontext current = nullptr, made = nullptr;
  CHECK(cuCtxGetCurrent(&current));
  std::printf("ctx_destroy_primary=%d\n", static_cast<int>(cuCtxDestroy(current)));
  CHECK(cuCtxCreate(&made, nullptr, 0, 0));
  const CUresult destroyed = cuCtxDestroy(made);
  std::printf("ctx_destroy_twice=%d:%d\n", static_cast<int>(destroyed), static_cast<int>(cuCtxDestroy(made)));
  CUctxCreateParams affinity = {};
  affinity.numExecAffinityParams = 1;
  std::printf("ctx_affinity=%d\n", static_cast<int>(cuCtxCreate(&made, &affinity, 0, 0)));
  CHECK(cuCtxSetCurrent(current));
  std::printf("still_works=%d\n", static_cast<int>(cuMemcpyHtoD(a, buf.data(), 4096)));
  const CUresult freed = cuMemFree(a);
  std::printf("free_twice=%d:%d\n", static_cast<int>(freed), static_cast<int>(cuMemFree(a)));
  // Setup's retain released, then one more than the program holds.
  const CUresult released = cuDevicePrimaryCtxRelease(0);
  std::printf("primary_release_twice=%d:%d\n", static_cast<int>(released),
              static_cast<int>(cuDevicePrimaryCtxRelease(0)));
  // Lookups through cuGetProcAddress land on this library's own exports.
  void* p = nullptr;
  CUdriverProcAddressQueryResult st;
  CHECK(cuGetProcAddress("cuMemAlloc", &p, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st));
  std::printf("procaddr_is_export=%d\n", p == dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"));
  return 0;
}

// Session-scoped virtual handles (run remotely only): the program gets names, not the driver's
// handles, and a forged name, a stale one, one of another kind or of another session fails its
// call with CUDA_ERROR_INVALID_HANDLE while the session goes on.
template <class T>
uint64_t U(T h) {
  return reinterpret_cast<uint64_t>(h);
}
template <class T>
T Forge(uint64_t v) {
  return reinterpret_cast<T>(v);
}
bool LooksLikeName(uint64_t v) { return (v >> 56) > 0x40 && (v >> 56) <= 0x53; }

int VirtualHandles() {
  CUcontext ctx = Setup();
  CUmodule mod;
  CHECK(cuModuleLoadData(&mod, "fakecuda:builtin"));
  CUfunction fill;
  CHECK(cuModuleGetFunction(&fill, mod, "fill_u32"));
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUevent e;
  CHECK(cuEventCreate(&e, 0));
  std::printf("names_not_pointers=%d\n", LooksLikeName(U(ctx)) && LooksLikeName(U(mod)) &&
                                             LooksLikeName(U(fill)) && LooksLikeName(U(s)) &&
                                             LooksLikeName(U(e)));
  // Forged: one bit of the name's check flipped, a neighbour slot, a pointer-shaped value.
  std::printf("forged_stream=%d\n", static_cast<int>(cuStreamSynchronize(Forge<CUstream>(U(s) ^ (1ull << 30)))));
  std::printf("forged_event=%d\n", static_cast<int>(cuEventQuery(Forge<CUevent>(U(e) + 1))));
  std::printf("forged_module=%d\n", static_cast<int>(cuModuleGetFunction(
                                        &fill, Forge<CUmodule>(0x7f0000001000), "fill_u32")));
  // Another kind's name.
  std::printf("kind_event_as_stream=%d\n", static_cast<int>(cuStreamSynchronize(Forge<CUstream>(U(e)))));
  std::printf("kind_stream_as_event=%d\n", static_cast<int>(cuEventQuery(Forge<CUevent>(U(s)))));
  CUfunction f2 = nullptr;
  std::printf("kind_function_as_module=%d\n",
              static_cast<int>(cuModuleGetFunction(&f2, Forge<CUmodule>(U(fill)), "fill_u32")));
  std::printf("kind_context_as_event=%d\n", static_cast<int>(cuEventSynchronize(Forge<CUevent>(U(ctx)))));
  // A stream's name as the function: refused by the launch (the client knows no such function)
  // or, were it sent, by the next synchronizing call (launches are fire-and-forget).
  CUdeviceptr d;
  CHECK(cuMemAlloc(&d, 64));
  unsigned one = 1;
  size_t count = 16;
  void* params[] = {&d, &one, &count};
  CUresult launch = cuLaunchKernel(Forge<CUfunction>(U(s)), 1, 1, 1, 1, 1, 1, 0, s, params, nullptr);
  CUresult sync = cuStreamSynchronize(s);
  std::printf("kind_stream_as_function=%d\n", static_cast<int>(launch != CUDA_SUCCESS ? launch : sync));
  std::printf("after_bad_launch_sync=%d\n", static_cast<int>(cuStreamSynchronize(s)));
  // Stale: destroyed objects' names, even when the driver reuses the address for a new object.
  CUstream gone;
  CHECK(cuStreamCreate(&gone, 0));
  CHECK(cuStreamDestroy(gone));
  CUstream fresh;
  CHECK(cuStreamCreate(&fresh, 0));
  std::printf("stale_stream=%d\n", static_cast<int>(cuStreamSynchronize(gone)));
  std::printf("stale_stream_destroy=%d\n", static_cast<int>(cuStreamDestroy(gone)));
  std::printf("fresh_stream_new_name=%d\n", U(fresh) != U(gone));
  std::printf("fresh_stream=%d\n", static_cast<int>(cuStreamSynchronize(fresh)));
  CUevent old_event;
  CHECK(cuEventCreate(&old_event, 0));
  CHECK(cuEventDestroy(old_event));
  std::printf("stale_event=%d\n", static_cast<int>(cuEventQuery(old_event)));
  CUmodule old_mod;
  CHECK(cuModuleLoadData(&old_mod, "fakecuda:builtin"));
  CHECK(cuModuleUnload(old_mod));
  std::printf("stale_module=%d\n", static_cast<int>(cuModuleGetFunction(&f2, old_mod, "fill_u32")));
  std::fflush(stdout);
  // Another session's names: a forked child gets a session of its own.
  pid_t pid = fork();
  if (pid == 0) {
    Setup();
    CUstream mine;
    CHECK(cuStreamCreate(&mine, CU_STREAM_NON_BLOCKING));
    CUevent my_event;
    CHECK(cuEventCreate(&my_event, 0));
    std::printf("other_session_stream=%d\n", static_cast<int>(cuStreamSynchronize(s)));
    std::printf("other_session_event=%d\n", static_cast<int>(cuEventQuery(e)));
    std::printf("other_session_own_stream=%d\n", static_cast<int>(cuStreamSynchronize(mine)));
    std::fflush(stdout);
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  std::printf("child_status=%d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  // Nothing else changed: the session's own objects still work.
  Fill(fill, d, 7, 16, s);
  CHECK(cuEventRecord(e, s));
  CHECK(cuEventSynchronize(e));
  uint32_t v[16] = {};
  CHECK(cuMemcpyDtoH(v, d, sizeof(v)));
  std::printf("still_works=%d\n", v[0] == 7 && v[15] == 7);
  return 0;
}

// Holds memory and waits to be killed.
int Hold() {
  Setup();
  CUdeviceptr a;
  CHECK(cuMemAlloc(&a, 512ull << 20));
  std::printf("ready=1\n");
  std::fflush(stdout);
  for (;;) pause();
}

// Synchronises every 20 ms until a call fails; prints the error.
int Loop() {
  Setup();
  std::printf("ready=1\n");
  std::fflush(stdout);
  for (;;) {
    CUresult r = cuCtxSynchronize();
    if (r != CUDA_SUCCESS) {
      std::printf("loop_error=%d\n", static_cast<int>(r));
      CUdeviceptr p;
      std::printf("next_error=%d\n", static_cast<int>(cuMemAlloc(&p, 64)));
      unsigned int flags = 7;
      int active = 7;
      CUresult st = cuDevicePrimaryCtxGetState(0, &flags, &active);
      std::printf("primary_state=%d:%u:%d\n", static_cast<int>(st), flags, active);
      return 0;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// A forked child gets its own connection on first use.
int Fork() {
  Setup();
  CUdeviceptr a;
  CHECK(cuMemAlloc(&a, 4096));
  pid_t pid = fork();
  if (pid == 0) {
    CUcontext ctx = Setup();
    (void)ctx;
    CUfunction fill = Kernel("fill_u32");
    CUdeviceptr b;
    CHECK(cuMemAlloc(&b, 4096));
    Fill(fill, b, 42, 16, nullptr);
    uint32_t v[16];
    CHECK(cuMemcpyDtoH(v, b, sizeof(v)));
    std::printf("child_value=%u\n", v[15]);
    std::fflush(stdout);
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  uint32_t v = 3;
  CHECK(cuMemcpyHtoD(a, &v, 4));
  v = 0;
  CHECK(cuMemcpyDtoH(&v, a, 4));
  std::printf("parent_value=%u\nchild_status=%d\n", v, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  return 0;
}

// Per-call costs: fire-and-forget launches and synchronous round trips.
int Bench() {
  Setup();
  CUfunction sleep_us = Kernel("sleep_us");
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  unsigned us = 0;
  void* params[] = {&us};
  const int kLaunches = 20000, kTrips = 2000;
  CHECK(cuStreamSynchronize(s));
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kLaunches; ++i) CHECK(cuLaunchKernel(sleep_us, 1, 1, 1, 1, 1, 1, 0, s, params, nullptr));
  auto t1 = std::chrono::steady_clock::now();
  CHECK(cuStreamSynchronize(s));
  auto t2 = std::chrono::steady_clock::now();
  for (int i = 0; i < kTrips; ++i) CHECK(cuStreamQuery(s));
  auto t3 = std::chrono::steady_clock::now();
  std::vector<char> big(64 << 20);
  CUdeviceptr d;
  CHECK(cuMemAlloc(&d, big.size()));
  auto t4 = std::chrono::steady_clock::now();
  CHECK(cuMemcpyHtoD(d, big.data(), big.size()));
  CHECK(cuMemcpyDtoH(big.data(), d, big.size()));
  auto t5 = std::chrono::steady_clock::now();
  auto ns = [](auto a, auto b) { return std::chrono::duration<double, std::nano>(b - a).count(); };
  std::printf("launch_submit_ns=%.0f\nlaunch_drain_ns=%.0f\nroundtrip_us=%.1f\ncopy_gib_s=%.2f\n",
              ns(t0, t1) / kLaunches, ns(t0, t2) / kLaunches, ns(t2, t3) / kTrips / 1000,
              2.0 * big.size() / (1 << 30) / (ns(t4, t5) / 1e9));
  return 0;
}

// Writes the fake driver's built-in image to a new file named from path_template (mkstemp), as
// a module or library file to load from.
bool WriteBuiltinImage(char* path_template) {
  const int fd = mkstemp(path_template);
  if (fd < 0) return false;
  const bool ok = write(fd, "fakecuda:builtin", 16) == 16;
  close(fd);
  return ok;
}

// Entry points the fake driver may not export: looked up at run time ("na" when absent).
template <class F>
F Sym(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
}

const char* Which(CUcontext c, CUcontext a, CUcontext b) {
  return c == a ? "a" : c == b ? "b" : c == nullptr ? "none" : "other";
}

// What the stub answers locally: pointer and function attributes, capture state, context
// queries and the context stack.
int Local() {
  CUcontext ctx = Setup();
  CUdeviceptr a;
  CHECK(cuMemAlloc(&a, 4096));
  unsigned type = 0;
  CUcontext pctx = nullptr;
  CUdeviceptr dptr = 0, start = 0;
  size_t range = 0;
  int ordinal = -1, managed = -1, mapped = -1;
  CHECK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, a + 100));
  CHECK(cuPointerGetAttribute(&pctx, CU_POINTER_ATTRIBUTE_CONTEXT, a + 100));
  CHECK(cuPointerGetAttribute(&dptr, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, a + 100));
  CHECK(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, a + 100));
  CHECK(cuPointerGetAttribute(&range, CU_POINTER_ATTRIBUTE_RANGE_SIZE, a + 100));
  CHECK(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, a + 100));
  CHECK(cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, a + 100));
  CHECK(cuPointerGetAttribute(&mapped, CU_POINTER_ATTRIBUTE_MAPPED, a + 100));
  std::printf("ptr_type=%u\nptr_ctx_is_current=%d\nptr_dptr_ok=%d\nptr_start_ok=%d\n", type,
              pctx == ctx, dptr == a + 100, start == a);
  std::printf("ptr_range=%zu\nptr_ordinal=%d\nptr_managed=%d\nptr_mapped=%d\n", range, ordinal,
              managed, mapped);
  std::printf("ptr_unknown=%d\n", static_cast<int>(cuPointerGetAttribute(
                                       &type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, 0x10)));
  std::printf("ptr_past_end=%d\n", static_cast<int>(cuPointerGetAttribute(
                                        &type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, a + 4096)));
  if (auto get_all = Sym<CUresult (*)(unsigned, CUpointer_attribute*, void**, CUdeviceptr)>(
          "cuPointerGetAttributes")) {
    CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_RANGE_SIZE};
    unsigned t = 99;
    size_t sz = 99;
    void* data[] = {&t, &sz};
    CUresult r1 = get_all(2, attrs, data, a + 8);
    std::printf("ptr_attrs=%d:%u:%zu\n", static_cast<int>(r1), t, sz);
    CUresult r2 = get_all(2, attrs, data, 0x10);
    std::printf("ptr_attrs_unknown=%d:%u:%zu\n", static_cast<int>(r2), t, sz);
  } else {
    std::printf("ptr_attrs=na\nptr_attrs_unknown=na\n");
  }
  CHECK(cuMemFree(a));
  std::printf("ptr_after_free=%d\n", static_cast<int>(cuPointerGetAttribute(
                                          &type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, a)));

  CUfunction fill = Kernel("fill_u32");
  int max_threads = 0, regs = -1;
  CHECK(cuFuncGetAttribute(&max_threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, fill));
  CHECK(cuFuncGetAttribute(&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, fill));
  std::printf("func_max_threads=%d\nfunc_regs=%d\n", max_threads, regs);
  {
    int blocks = 0, grid = 0, block = 0, grid_cb = 0, block_cb = 0;
    size_t avail = 0;
    CHECK(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fill, 256, 0));
    CHECK(cuOccupancyAvailableDynamicSMemPerBlock(&avail, fill, 4, 128));
    CHECK(cuOccupancyMaxPotentialBlockSize(&grid, &block, fill, nullptr, 0, 0));
    CHECK(cuOccupancyMaxPotentialBlockSize(&grid_cb, &block_cb, fill,
                                           [](int bs) -> size_t { return bs * 120; }, 0, 0));
    std::printf("occupancy=%d:%zu:%d:%d:%d:%d\n", blocks, avail, grid, block, grid_cb, block_cb);
    CUlaunchAttribute cluster = {};
    cluster.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    cluster.value.clusterDim.x = 2;
    cluster.value.clusterDim.y = 1;
    cluster.value.clusterDim.z = 1;
    CUlaunchConfig cfg = {};
    cfg.gridDimX = 8;
    cfg.gridDimY = cfg.gridDimZ = 1;
    cfg.blockDimX = 128;
    cfg.blockDimY = cfg.blockDimZ = 1;
    cfg.attrs = &cluster;
    cfg.numAttrs = 1;
    int clusters = 0, cluster_size = 0;
    CHECK(cuOccupancyMaxActiveClusters(&clusters, fill, &cfg));
    CHECK(cuOccupancyMaxPotentialClusterSize(&cluster_size, fill, &cfg));
    std::printf("clusters=%d:%d\n", clusters, cluster_size);
    std::printf("occupancy_bogus=%d\n",
                static_cast<int>(cuOccupancyMaxActiveBlocksPerMultiprocessor(
                    &blocks, reinterpret_cast<CUfunction>(0x1234), 256, 0)));
  }

  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_ACTIVE;
  CHECK(cuStreamIsCapturing(s, &cs));
  std::printf("capturing=%d\n", static_cast<int>(cs));
  std::printf("capturing_bogus=%d\n", static_cast<int>(cuStreamIsCapturing(
                                           reinterpret_cast<CUstream>(0xdead0000), &cs)));

  unsigned api = 0, flags = 99;
  int least = 9, greatest = 9;
  CHECK(cuCtxGetApiVersion(ctx, &api));
  CHECK(cuCtxGetFlags(&flags));
  CHECK(cuCtxGetStreamPriorityRange(&least, &greatest));
  std::printf("ctx_api=%u\nctx_flags=%u\npriorities=%d..%d\n", api, flags, least, greatest);

  CUcontext b = nullptr, cur = nullptr, popped = nullptr;
  CHECK(cuCtxCreate(&b, nullptr, 0, 0));
  CHECK(cuCtxGetCurrent(&cur));
  std::printf("after_create=%s\n", Which(cur, ctx, b));
  CHECK(cuCtxPushCurrent(ctx));
  CHECK(cuCtxGetCurrent(&cur));
  std::printf("after_push=%s\n", Which(cur, ctx, b));
  CHECK(cuCtxPopCurrent(&popped));
  CHECK(cuCtxGetCurrent(&cur));
  std::printf("pop1=%s:%s\n", Which(popped, ctx, b), Which(cur, ctx, b));
  CHECK(cuCtxPopCurrent(&popped));
  CHECK(cuCtxGetCurrent(&cur));
  std::printf("pop2=%s:%s\n", Which(popped, ctx, b), Which(cur, ctx, b));
  CHECK(cuCtxPopCurrent(&popped));
  CHECK(cuCtxGetCurrent(&cur));
  std::printf("pop3=%s:%s\n", Which(popped, ctx, b), Which(cur, ctx, b));
  std::printf("pop_empty=%d\n", static_cast<int>(cuCtxPopCurrent(&popped)));
  CHECK(cuCtxPushCurrent(b));
  CUdeviceptr x;
  CHECK(cuMemAlloc(&x, 64));
  CHECK(cuPointerGetAttribute(&pctx, CU_POINTER_ATTRIBUTE_CONTEXT, x));
  std::printf("alloc_in_pushed=%s\n", Which(pctx, ctx, b));
  CHECK(cuMemFree(x));
  std::printf("free_null=%d\n", static_cast<int>(cuMemFree(0)));
  {
    CUdeviceptr pp = 0;
    size_t pitch = 0;
    CHECK(cuMemAllocPitch(&pp, &pitch, 1000, 3, 4));
    unsigned in = 0x77, back = 0;
    CHECK(cuMemcpyHtoD(pp + 2 * pitch + 996, &in, 4));  // the last word of the last row
    CHECK(cuMemcpyDtoH(&back, pp + 2 * pitch + 996, 4));
    CHECK(cuMemFree(pp));
    std::printf("pitch_alloc=%d:%x\n", pitch >= 1000 ? 1 : 0, back);
  }
  {
    // Virtual memory management, as PyTorch's expandable segments use it.
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t gran = 0;
    CHECK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CUdeviceptr va = 0;
    CHECK(cuMemAddressReserve(&va, 2 * gran, 0, 0, 0));
    CUmemGenericAllocationHandle h = 0;
    CHECK(cuMemCreate(&h, gran, &prop, 0));
    CHECK(cuMemMap(va, gran, 0, h, 0));
    CUmemAccessDesc access = {};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CHECK(cuMemSetAccess(va, gran, &access, 1));
    unsigned in = 0xabcd, back = 0;
    CHECK(cuMemcpyHtoD(va + 100, &in, 4));
    CHECK(cuMemcpyDtoH(&back, va + 100, 4));
    std::printf("vmm=%x\n", back);
    if (getenv("TFUSION_REMOTE") != nullptr) {
      // The worker checks mappings against the session's reservations and mappings.
      std::printf("vmm_unmapped_copy=%d\n", static_cast<int>(cuMemcpyHtoD(va + gran + 8, &in, 4)));
      std::printf("vmm_map_outside=%d\n",
                  static_cast<int>(cuMemMap(va + 4 * gran, gran, 0, h, 0)));
    } else {
      std::printf("vmm_unmapped_copy=na\nvmm_map_outside=na\n");
    }
    CHECK(cuMemUnmap(va, gran));
    CHECK(cuMemRelease(h));
    CHECK(cuMemAddressFree(va, 2 * gran));
    std::printf("vmm_done=1\n");
  }
  {
    size_t stack = 0, stack2 = 0;
    CHECK(cuCtxGetLimit(&stack, CU_LIMIT_STACK_SIZE));
    CHECK(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 4096));
    CHECK(cuCtxGetLimit(&stack2, CU_LIMIT_STACK_SIZE));
    CHECK(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, stack));
    std::printf("limits=%zu:%zu\n", stack, stack2);
  }
  {
    CUstream prio = nullptr;
    CHECK(cuStreamCreateWithPriority(&prio, CU_STREAM_NON_BLOCKING, -1));
    CUdeviceptr y;
    CHECK(cuMemAlloc(&y, 64));
    Fill(fill, y, 7, 16, prio);
    CHECK(cuStreamSynchronize(prio));
    unsigned got = 0;
    CHECK(cuMemcpyDtoH(&got, y + 60, 4));
    CHECK(cuMemFree(y));
    CHECK(cuStreamDestroy(prio));
    std::printf("priority_stream=%u\n", got);
    char path[] = "/tmp/tf-probe-module.XXXXXX";
    if (!WriteBuiltinImage(path)) return 1;
    CUmodule from_file = nullptr;
    CUfunction f2 = nullptr;
    CUresult lr = cuModuleLoad(&from_file, path);
    unlink(path);
    if (lr == CUDA_SUCCESS) lr = cuModuleGetFunction(&f2, from_file, "fill_u32");
    std::printf("module_file=%d\n", static_cast<int>(lr));
    CUdeviceptr g = 0;
    size_t gsize = 0;
    CUmodule gm = nullptr;
    CHECK(cuModuleLoadData(&gm, "fakecuda:builtin"));
    CHECK(cuModuleGetGlobal(&g, &gsize, gm, "fake_global"));
    unsigned gv = 0x5eed, gback = 0;
    CHECK(cuMemcpyHtoD(g + 8, &gv, 4));
    CHECK(cuMemcpyDtoH(&gback, g + 8, 4));
    std::printf("global=%zu:%x\n", gsize, gback);
    std::printf("global_missing=%d\n",
                static_cast<int>(cuModuleGetGlobal(&g, &gsize, gm, "no_such_global")));
    // The worker refuses a copy past the variable's end; the fake driver does not check (na).
    if (getenv("TFUSION_REMOTE") != nullptr) {
      std::printf("global_overrun=%d\n", static_cast<int>(cuMemcpyHtoD(g + 254, &gv, 4)));
    } else {
      std::printf("global_overrun=na\n");
    }
    std::printf("module_missing=%d\n",
                static_cast<int>(cuModuleLoad(&from_file, "/nonexistent/tf-module.cubin")));
  }
  std::printf("ctx_sync_v2=%d:%d\n", static_cast<int>(cuCtxSynchronize_v2(nullptr)),
              static_cast<int>(cuCtxSynchronize_v2(b)));
  CHECK(cuCtxDestroy(b));
  {
    // NVIDIA's samples (nvrtc_helper.h) pass a zeroed CUctxCreateParams: the plain form.
    CUctxCreateParams empty = {};
    CUcontext e = nullptr, back = nullptr;
    std::printf("ctx_empty_params=%d\n", static_cast<int>(cuCtxCreate(&e, &empty, 0, 0)));
    if (e != nullptr) CHECK(cuCtxDestroy(e));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuCtxGetCurrent(&back));
  }
  std::printf("done=1\n");
  return 0;
}

// Page-locked host memory: allocations, registration, copies through it.
int Host() {
  CUcontext ctx = Setup();
  void* h = nullptr;
  CHECK(cuMemAllocHost(&h, 1 << 20));
  unsigned type = 0;
  CUcontext pctx = nullptr;
  CHECK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, reinterpret_cast<CUdeviceptr>(h) + 8));
  CHECK(cuPointerGetAttribute(&pctx, CU_POINTER_ATTRIBUTE_CONTEXT, reinterpret_cast<CUdeviceptr>(h)));
  std::printf("host_type=%u\nhost_ctx_is_current=%d\n", type, pctx == ctx);
  CUdeviceptr hd = 0;
  const CUresult dptr_rc = cuMemHostGetDevicePointer(&hd, h, 0);
  std::printf("host_dptr_rc=%d\n", static_cast<int>(dptr_rc));
  if (dptr_rc == CUDA_SUCCESS) std::printf("host_dptr_is_host=%d\n", hd == reinterpret_cast<CUdeviceptr>(h));
  int map_host = -1, pageable_access = -1, managed = -1;
  CHECK(cuDeviceGetAttribute(&map_host, CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, 0));
  CHECK(cuDeviceGetAttribute(&pageable_access, CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS, 0));
  CHECK(cuDeviceGetAttribute(&managed, CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, 0));
  std::printf("attr_map_host=%d\nattr_pageable_access=%d\nattr_managed=%d\n", map_host,
              pageable_access, managed);
  auto* words = static_cast<uint32_t*>(h);
  for (int i = 0; i < (1 << 18); ++i) words[i] = i * 3u;
  CUdeviceptr d;
  CHECK(cuMemAlloc(&d, 1 << 20));
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CHECK(cuMemcpyHtoDAsync(d, h, 1 << 20, s));
  CHECK(cuMemsetD32Async(d, 7, 4, s));
  CHECK(cuStreamSynchronize(s));
  void* h2 = nullptr;
  CHECK(cuMemHostAlloc(&h2, 1 << 20, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
  CHECK(cuMemcpyDtoHAsync(h2, d, 1 << 20, s));
  CHECK(cuStreamSynchronize(s));
  auto* back = static_cast<uint32_t*>(h2);
  std::printf("pinned_roundtrip=%u,%u,%u\n", back[0], back[4], back[(1 << 18) - 1]);
  CHECK(cuMemFreeHost(h2));
  CHECK(cuMemFreeHost(h));
  std::printf("free_host_twice=%d\n", static_cast<int>(cuMemFreeHost(h)));
  auto reg = Sym<CUresult (*)(void*, size_t, unsigned)>("cuMemHostRegister_v2");
  auto unreg = Sym<CUresult (*)(void*)>("cuMemHostUnregister");
  if (reg && unreg) {
    std::vector<uint32_t> buf(1024, 5);
    std::printf("register=%d\n", static_cast<int>(reg(buf.data(), 4096, 0)));
    std::printf("register_again=%d\n", static_cast<int>(reg(buf.data() + 16, 64, 0)));
    CHECK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                reinterpret_cast<CUdeviceptr>(buf.data() + 10)));
    std::printf("registered_type=%u\n", type);
    CHECK(cuMemcpyHtoD(d, buf.data(), 4096));
    std::printf("unregister=%d\n", static_cast<int>(unreg(buf.data())));
    std::printf("unregister_again=%d\n", static_cast<int>(unreg(buf.data())));
  } else {
    std::printf("register=na\n");
  }
  CHECK(cuMemFree(d));
  std::printf("done=1\n");
  return 0;
}

uint32_t Word(CUdeviceptr p) {
  uint32_t v = 0;
  CHECK(cuMemcpyDtoH(&v, p, 4));
  return v;
}

// Stream-ordered work beyond the first slice: extended and cooperative launches, stream waits,
// 16-bit and 2D memsets, unified copies, stream-ordered allocation and pools.
int Async() {
  Setup();
  CUfunction fill = Kernel("fill_u32");
  CUfunction sleep_us = Kernel("sleep_us");
  CUstream s1, s2;
  CHECK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
  CUdeviceptr a;
  CHECK(cuMemAlloc(&a, 4096));

  // cuLaunchKernelEx with attributes.
  CUlaunchAttribute attrs[2] = {};
  attrs[0].id = CU_LAUNCH_ATTRIBUTE_PRIORITY;
  attrs[0].value.priority = -1;
  attrs[1].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
  attrs[1].value.clusterDim.x = 1;
  attrs[1].value.clusterDim.y = 1;
  attrs[1].value.clusterDim.z = 1;
  CUlaunchConfig cfg = {};
  cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
  cfg.blockDimX = cfg.blockDimY = cfg.blockDimZ = 1;
  cfg.hStream = s1;
  cfg.attrs = attrs;
  cfg.numAttrs = 2;
  unsigned value = 0x51;
  size_t count = 1024;
  void* params[] = {&a, &value, &count};
  CHECK(cuLaunchKernelEx(&cfg, fill, params, nullptr));
  CHECK(cuStreamSynchronize(s1));
  std::printf("launch_ex=%x\n", Word(a + 4092));
  value = 0x52;
  CHECK(cuLaunchCooperativeKernel(fill, 1, 1, 1, 1, 1, 1, 0, s1, params));
  CHECK(cuStreamSynchronize(s1));
  std::printf("cooperative=%x\n", Word(a));

  // s2 waits for an event recorded on s1 after a slow kernel.
  CUevent e;
  CHECK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  unsigned us = 30000;
  void* sp[] = {&us};
  CHECK(cuLaunchKernel(sleep_us, 1, 1, 1, 1, 1, 1, 0, s1, sp, nullptr));
  value = 1;
  CHECK(cuLaunchKernel(fill, 1, 1, 1, 1, 1, 1, 0, s1, params, nullptr));
  CHECK(cuEventRecordWithFlags(e, s1, CU_EVENT_RECORD_DEFAULT));
  CHECK(cuStreamWaitEvent(s2, e, 0));
  value = 2;
  CHECK(cuLaunchKernel(fill, 1, 1, 1, 1, 1, 1, 0, s2, params, nullptr));
  CHECK(cuStreamSynchronize(s2));
  CHECK(cuStreamSynchronize(s1));
  std::printf("wait_event_orders=%u\n", Word(a));

  // 16-bit and 2D memsets.
  CHECK(cuMemsetD32(a, 0, 1024));
  CHECK(cuMemsetD16(a, 0xABCD, 3));
  std::printf("memset16=%08x,%08x\n", Word(a), Word(a + 4));
  CHECK(cuMemsetD2D32(a + 256, 64, 9, 4, 3));  // 3 rows of 4 words, 64 bytes apart
  CHECK(cuMemsetD2D8Async(a + 1024, 16, 0x7f, 2, 2, s1));
  CHECK(cuStreamSynchronize(s1));
  std::printf("memset2d=%u,%u,%u,%u,%u\n", Word(a + 256), Word(a + 256 + 12), Word(a + 256 + 16),
              Word(a + 256 + 128 + 12), Word(a + 256 + 192));
  std::printf("memset2d8=%08x,%08x,%08x\n", Word(a + 1024), Word(a + 1024 + 16), Word(a + 1024 + 32));
  std::printf("memset2d_overrun=%d\n", static_cast<int>(cuMemsetD2D32(a + 4000, 64, 1, 4, 3)));

  // Unified copies: the stub tells host from device pointers.
  std::vector<uint32_t> host(256), back(256), other(256, 0);
  for (int i = 0; i < 256; ++i) host[i] = 1000 + i;
  CUdeviceptr b;
  CHECK(cuMemAlloc(&b, 1024));
  CHECK(cuMemcpy(a, reinterpret_cast<CUdeviceptr>(host.data()), 1024));
  CHECK(cuMemcpy(b, a, 1024));
  CHECK(cuMemcpy(reinterpret_cast<CUdeviceptr>(back.data()), b, 1024));
  CHECK(cuMemcpy(reinterpret_cast<CUdeviceptr>(other.data()), reinterpret_cast<CUdeviceptr>(back.data()), 1024));
  std::printf("unified_copy=%d\n", other == host);
  CHECK(cuMemsetD32Async(b, 3, 256, s1));
  CHECK(cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(back.data()), b, 1024, s1));
  CHECK(cuStreamSynchronize(s1));
  std::printf("unified_async=%u,%u\n", back[0], back[255]);

  // Stream-ordered allocations and pools.
  CUdeviceptr c;
  CHECK(cuMemAllocAsync(&c, 1 << 20, s1));
  CHECK(cuMemsetD32Async(c, 77, 1 << 18, s1));
  CHECK(cuMemcpyDtoHAsync(back.data(), c + (1 << 20) - 1024, 1024, s1));
  CHECK(cuStreamSynchronize(s1));
  std::printf("alloc_async=%u\n", back[255]);
  CHECK(cuMemFreeAsync(c, s1));
  CHECK(cuStreamSynchronize(s1));
  std::printf("free_async_twice=%d\n", static_cast<int>(cuMemFreeAsync(c, s1)));
  CUmemoryPool def = nullptr, pool = nullptr;
  CHECK(cuDeviceGetDefaultMemPool(&def, 0));
  cuuint64_t threshold = 1 << 24, got = 0;
  CHECK(cuMemPoolSetAttribute(def, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));
  CHECK(cuMemPoolGetAttribute(def, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &got));
  std::printf("pool_threshold=%llu\n", static_cast<unsigned long long>(got));
  CUmemPoolProps props = {};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = 0;
  CHECK(cuMemPoolCreate(&pool, &props));
  int reuse = 0;
  int one = 1;
  CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &one));
  CHECK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &reuse));
  std::printf("pool_reuse=%d\n", reuse);
  // An int attribute writes 4 bytes, a cuuint64_t one 8; a NULL value, a NULL pool and the
  // device's default pool (not the program's to destroy) are refused.
  int pair[2] = {-1, -1};
  CHECK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, pair));
  cuuint64_t wide[2] = {~0ull, ~0ull};
  CHECK(cuMemPoolGetAttribute(def, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, wide));
  std::printf("pool_attr_width=%d,%d,%llu,%d\n", pair[0], pair[1], static_cast<unsigned long long>(wide[0]),
              wide[1] == ~0ull);
  std::printf("pool_bad=%d:%d:%d:%d\n",
              static_cast<int>(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, nullptr)),
              static_cast<int>(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, nullptr)),
              static_cast<int>(cuMemPoolTrimTo(nullptr, 0)), static_cast<int>(cuMemPoolDestroy(def)));
  std::printf("pool_trim=%d:%d:%d\n", static_cast<int>(cuMemPoolTrimTo(pool, 0)),
              static_cast<int>(cuMemPoolTrimTo(def, 1 << 20)),
              static_cast<int>(cuMemPoolTrimTo(reinterpret_cast<CUmemoryPool>(0xbad0), 0)));
  CUdeviceptr d;
  CHECK(cuMemAllocFromPoolAsync(&d, 4096, pool, s2));
  CUmemoryPool owner = nullptr;
  CHECK(cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, d));
  std::printf("pool_owner_ok=%d\n", owner == pool);
  CHECK(cuMemsetD32Async(d, 5, 1024, s2));
  CHECK(cuStreamSynchronize(s2));
  std::printf("pool_alloc=%u\n", Word(d + 4092));
  CHECK(cuMemFreeAsync(d, s2));
  CHECK(cuStreamSynchronize(s2));
  CHECK(cuMemPoolDestroy(pool));
  std::printf("pool_destroy_twice=%d\n", static_cast<int>(cuMemPoolDestroy(pool)));
  std::printf("wait_bogus_event=%d\n", static_cast<int>(cuStreamWaitEvent(s2, reinterpret_cast<CUevent>(0xbad0), 0)));
  std::printf("after_bogus_sync=%d\n", static_cast<int>(cuStreamSynchronize(s2)));
  CHECK(cuMemFree(a));
  CHECK(cuMemFree(b));
  std::printf("done=1\n");
  return 0;
}

std::atomic<int> g_flag{0};
std::atomic<int> g_seen{-1};
char g_order[16];
std::atomic<int> g_order_len{0};
CUstream g_cb_stream = nullptr;

void Note(char c) { g_order[g_order_len++] = c; }

// Host functions in stream order: they run after the work before them, and the work after them
// waits for them.
int Callbacks() {
  Setup();
  CUfunction sleep_us = Kernel("sleep_us");
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  g_cb_stream = s;
  CUevent e;
  CHECK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  unsigned us = 20000;
  void* sp[] = {&us};
  auto t0 = std::chrono::steady_clock::now();
  CHECK(cuLaunchKernel(sleep_us, 1, 1, 1, 1, 1, 1, 0, s, sp, nullptr));
  static std::chrono::steady_clock::time_point ran_at;
  CHECK(cuLaunchHostFunc(s, [](void*) {
    ran_at = std::chrono::steady_clock::now();
    Note('1');
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the query below falls in it
    g_flag = 1;
  }, nullptr));
  CHECK(cuEventRecord(e, s));
  CHECK(cuLaunchHostFunc(s, [](void*) { g_seen = g_flag.load(); Note('2'); }, nullptr));
  CHECK(cuStreamAddCallback(s, [](CUstream st, CUresult status, void* user) {
    Note(st == g_cb_stream && status == CUDA_SUCCESS && user == &g_flag ? '3' : 'x');
  }, &g_flag, 0));
  std::this_thread::sleep_for(std::chrono::milliseconds(40));
  std::printf("event_during_host_fn=%d\n", static_cast<int>(cuEventQuery(e)));
  CHECK(cuStreamSynchronize(s));
  std::printf("host_fn_after_kernel=%d\n",
              std::chrono::duration<double, std::milli>(ran_at - t0).count() >= 19.0);
  std::printf("event_after_sync=%d\n", static_cast<int>(cuEventQuery(e)));
  std::printf("later_fn_saw_flag=%d\n", g_seen.load());
  // Nobody calls CUDA while the stream reaches the next one: it still runs.
  g_flag = 0;
  CHECK(cuLaunchHostFunc(s, [](void*) { g_flag = 7; Note('4'); }, nullptr));
  for (int i = 0; i < 200 && g_flag.load() != 7; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::printf("ran_while_idle=%d\n", g_flag.load());
  // Unloading a module waits for the context's queued work, a host function included (XLA unloads
  // modules while its host functions are pending): the unload must return after it ran.
  CUmodule extra = nullptr;
  CHECK(cuModuleLoadData(&extra, "fakecuda:builtin"));
  CHECK(cuLaunchHostFunc(s, [](void*) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    g_flag = 9;
  }, nullptr));
  CHECK(cuModuleUnload(extra));
  std::printf("unload_after_host_fn=%d\n", g_flag.load() == 9);
  CHECK(cuLaunchHostFunc(s, [](void*) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    g_flag = 11;
  }, nullptr));
  CHECK(cuModuleLoadData(&extra, "fakecuda:builtin"));
  std::printf("load_after_host_fn=%d\n", g_flag.load() == 11);
  CHECK(cuModuleUnload(extra));
  CHECK(cuStreamSynchronize(s));
  g_order[g_order_len] = 0;
  std::printf("order=%s\n", g_order);
  std::printf("done=1\n");
  return 0;
}

// 256 MiB held and a 30 s kernel waited for: the session stays inside cuCtxSynchronize (the test
// kills this process meanwhile).
int Stuck() {
  Setup();
  CUdeviceptr big;
  CHECK(cuMemAlloc(&big, 256u << 20));
  CUfunction sleep_us = Kernel("sleep_us");
  unsigned us = 30'000'000;
  void* sp[] = {&us};
  CHECK(cuLaunchKernel(sleep_us, 1, 1, 1, 1, 1, 1, 0, nullptr, sp, nullptr));
  std::printf("stuck=1\n");
  std::fflush(stdout);
  CHECK(cuCtxSynchronize());
  std::printf("done=1\n");
  return 0;
}

// Graphs: kernel nodes, instantiation, launch, updates of an instantiated graph.
int Graphs() {
  Setup();
  CUfunction fill = Kernel("fill_u32");
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr a;
  CHECK(cuMemAlloc(&a, 4096));
  CHECK(cuMemsetD32(a, 0, 1024));
  CUgraph g;
  CHECK(cuGraphCreate(&g, 0));
  CUDA_KERNEL_NODE_PARAMS p = {};
  p.func = fill;
  p.gridDimX = p.gridDimY = p.gridDimZ = 1;
  p.blockDimX = p.blockDimY = p.blockDimZ = 1;
  CUdeviceptr dst = a;
  unsigned value = 11;
  size_t count = 512;
  void* params[] = {&dst, &value, &count};
  p.kernelParams = params;
  CUgraphNode n1, n2;
  CHECK(cuGraphAddKernelNode(&n1, g, nullptr, 0, &p));
  value = 12;  // the node copied its arguments: this does not change n1
  dst = a + 2048;
  CHECK(cuGraphAddKernelNode(&n2, g, &n1, 1, &p));
  CUgraphExec e;
  CHECK(cuGraphInstantiateWithFlags(&e, g, 0));
  CHECK(cuGraphLaunch(e, s));
  CHECK(cuStreamSynchronize(s));
  std::printf("graph_run=%u,%u,%u\n", Word(a), Word(a + 2044), Word(a + 2048));
  value = 13;
  CHECK(cuGraphExecKernelNodeSetParams(e, n2, &p));
  CHECK(cuGraphLaunch(e, s));
  CHECK(cuStreamSynchronize(s));
  std::printf("graph_updated=%u,%u\n", Word(a), Word(a + 4092));
  {
    // A kernel node behind a programmatic edge (programmatic dependent launch: XLA's command
    // buffers on Hopper add nodes so), through the generic entry point.
    CUgraph pg;
    CHECK(cuGraphCreate(&pg, 0));
    CUgraphNode first, second;
    value = 21;
    dst = a;
    CHECK(cuGraphAddKernelNode(&first, pg, nullptr, 0, &p));
    CUgraphNodeParams np = {};
    np.type = CU_GRAPH_NODE_TYPE_KERNEL;
    np.kernel.func = fill;
    np.kernel.gridDimX = np.kernel.gridDimY = np.kernel.gridDimZ = 1;
    np.kernel.blockDimX = np.kernel.blockDimY = np.kernel.blockDimZ = 1;
    value = 22;
    dst = a + 2048;
    np.kernel.kernelParams = params;
    CUgraphEdgeData edge = {};
    edge.from_port = CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC;
    edge.type = CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC;
    CHECK(cuGraphAddNode_v2(&second, pg, &first, &edge, 1, &np));
    CUgraphExec pe;
    CHECK(cuGraphInstantiateWithFlags(&pe, pg, 0));
    CHECK(cuGraphLaunch(pe, s));
    CHECK(cuStreamSynchronize(s));
    std::printf("programmatic_edge=%u,%u\n", Word(a), Word(a + 2048));
    CHECK(cuGraphExecDestroy(pe));
    CHECK(cuGraphDestroy(pg));
  }
  std::printf("launch_bogus=%d\n", static_cast<int>(cuGraphLaunch(reinterpret_cast<CUgraphExec>(0x7000), s)));
  std::printf("after_bogus_sync=%d\n", static_cast<int>(cuStreamSynchronize(s)));
  std::printf("dep_bogus=%d\n", static_cast<int>(cuGraphAddKernelNode(
                                     &n2, g, reinterpret_cast<CUgraphNode*>(&a), 1, &p)));
  CHECK(cuGraphExecDestroy(e));
  CHECK(cuGraphDestroy(g));
  std::printf("destroy_twice=%d\n", static_cast<int>(cuGraphDestroy(g)));
  CHECK(cuMemFree(a));
  std::printf("done=1\n");
  return 0;
}

// Graph nodes beyond kernels: memset, memcpy (device and page-locked host), host, empty, event,
// child graph, memory nodes; queries and edits; exec updates; bad handles.
char g_host_order[16];
int g_host_order_len = 0;
void AppendOrder(void* c) { g_host_order[g_host_order_len++] = *static_cast<char*>(c); }

int GraphNodes() {
  CUcontext ctx = Setup();
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr a, b;
  CHECK(cuMemAlloc(&a, 4096));
  CHECK(cuMemAlloc(&b, 4096));
  CHECK(cuMemsetD32(b, 0, 1024));
  CUgraph g;
  CHECK(cuGraphCreate(&g, 0));
  CUDA_MEMSET_NODE_PARAMS ms = {};
  ms.dst = a;
  ms.value = 0x21;
  ms.elementSize = 4;
  ms.width = 1024;
  ms.height = 1;
  CUgraphNode nset, ncopy, nhost, nempty, nchild, nrec;
  CHECK(cuGraphAddMemsetNode(&nset, g, nullptr, 0, &ms, ctx));
  static char mark_h = 'H';
  CUDA_HOST_NODE_PARAMS hp = {AppendOrder, &mark_h};
  CHECK(cuGraphAddHostNode(&nhost, g, &nset, 1, &hp));
  CUDA_MEMCPY3D cp = {};
  cp.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  cp.srcDevice = a;
  cp.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  cp.dstDevice = b;
  cp.WidthInBytes = 2048;
  cp.Height = 1;
  cp.Depth = 1;
  CHECK(cuGraphAddMemcpyNode(&ncopy, g, &nhost, 1, &cp, ctx));
  CHECK(cuGraphAddEmptyNode(&nempty, g, &ncopy, 1));
  // A child graph: one memset at b + 3072.
  CUgraph child;
  CHECK(cuGraphCreate(&child, 0));
  CUDA_MEMSET_NODE_PARAMS cms = ms;
  cms.dst = b + 3072;
  cms.value = 0x77;
  cms.width = 256;
  CUgraphNode cn;
  CHECK(cuGraphAddMemsetNode(&cn, child, nullptr, 0, &cms, ctx));
  CHECK(cuGraphAddChildGraphNode(&nchild, g, &nempty, 1, child));
  CUevent ev;
  CHECK(cuEventCreate(&ev, 0));
  CHECK(cuGraphAddEventRecordNode(&nrec, g, &nchild, 1, ev));
  CUgraphNodeType t = CU_GRAPH_NODE_TYPE_EMPTY;
  CHECK(cuGraphNodeGetType(ncopy, &t));
  std::printf("type_memcpy=%d\n", static_cast<int>(t) == CU_GRAPH_NODE_TYPE_MEMCPY);
  CHECK(cuGraphNodeGetType(nhost, &t));
  std::printf("type_host=%d\n", static_cast<int>(t) == CU_GRAPH_NODE_TYPE_HOST);
  size_t n = 0;
  CHECK(cuGraphGetEdges(g, nullptr, nullptr, nullptr, &n));
  std::printf("edges=%zu\n", n);
  CUgraphNode roots[4];
  n = 4;
  CHECK(cuGraphGetRootNodes(g, roots, &n));
  std::printf("roots=%zu,%d\n", n, n == 1 && roots[0] == nset);
  CUgraphNode deps[4];
  n = 4;
  CHECK(cuGraphNodeGetDependencies(ncopy, deps, nullptr, &n));
  std::printf("copy_deps=%zu,%d\n", n, n == 1 && deps[0] == nhost);
  CUgraphExec e;
  CHECK(cuGraphInstantiateWithFlags(&e, g, 0));
  CHECK(cuGraphLaunch(e, s));
  CHECK(cuEventSynchronize(ev));
  CHECK(cuStreamSynchronize(s));
  g_host_order[g_host_order_len] = 0;
  std::printf("run=%x,%x,%x,%x,%s\n", Word(b), Word(b + 2044), Word(b + 2048), Word(b + 3072),
              g_host_order);
  // Exec updates: memset value, disabled copy, then a whole-graph update from a clone.
  ms.value = 0x22;
  CHECK(cuGraphExecMemsetNodeSetParams(e, nset, &ms, ctx));
  CHECK(cuGraphNodeSetEnabled(e, ncopy, 0));
  unsigned enabled = 1;
  CHECK(cuGraphNodeGetEnabled(e, ncopy, &enabled));
  CHECK(cuGraphLaunch(e, s));
  CHECK(cuStreamSynchronize(s));
  std::printf("updated=%x,%x,%u\n", Word(a), Word(b), enabled);
  CHECK(cuGraphNodeSetEnabled(e, ncopy, 1));
  CUgraph g2;
  CHECK(cuGraphClone(&g2, g));
  CUgraphExecUpdateResultInfo info = {};
  CHECK(cuGraphExecUpdate(e, g2, &info));
  CHECK(cuGraphLaunch(e, s));
  CHECK(cuStreamSynchronize(s));
  std::printf("exec_update=%d,%x,%x\n", static_cast<int>(info.result), Word(a), Word(b));
  // Graph memory: the allocation's pointer is usable after the launch and known to cuMemcpy.
  CUgraph mg;
  CHECK(cuGraphCreate(&mg, 0));
  CUDA_MEM_ALLOC_NODE_PARAMS ap = {};
  ap.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  ap.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  ap.poolProps.location.id = 0;
  ap.bytesize = 8192;
  CUgraphNode nalloc, nms2;
  CHECK(cuGraphAddMemAllocNode(&nalloc, mg, nullptr, 0, &ap));
  CUDA_MEMSET_NODE_PARAMS ms2 = ms;
  ms2.dst = ap.dptr;
  ms2.value = 0x5a;
  CHECK(cuGraphAddMemsetNode(&nms2, mg, &nalloc, 1, &ms2, ctx));
  CUgraphExec me;
  CHECK(cuGraphInstantiateWithFlags(&me, mg, 0));
  CHECK(cuGraphLaunch(me, s));
  CHECK(cuStreamSynchronize(s));
  unsigned got = 0;
  CHECK(cuMemcpy(reinterpret_cast<CUdeviceptr>(&got), ap.dptr + 4, 4));  // unified: DtoH
  CUmemorytype mt = CU_MEMORYTYPE_HOST;
  CHECK(cuPointerGetAttribute(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ap.dptr));
  std::printf("graph_alloc=%x,%d\n", got, static_cast<int>(mt));
  CHECK(cuMemFree(ap.dptr));
  std::printf("graph_alloc_freed_attr=%d\n",
              static_cast<int>(cuPointerGetAttribute(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ap.dptr)));
  // graphMemoryNodes: an allocation after the graph's free of another may get its address; it
  // outlives the graph (destroyed before the launch) and is freed with cuMemFree after.
  {
    CUgraph rg;
    CHECK(cuGraphCreate(&rg, 0));
    CUDA_MEM_ALLOC_NODE_PARAMS first = ap, second = ap;
    CUgraphNode na, nf, nb;
    CHECK(cuGraphAddMemAllocNode(&na, rg, nullptr, 0, &first));
    CHECK(cuGraphAddMemFreeNode(&nf, rg, &na, 1, first.dptr));
    CHECK(cuGraphAddMemAllocNode(&nb, rg, &nf, 1, &second));
    CUgraphExec re;
    CHECK(cuGraphInstantiateWithFlags(&re, rg, 0));
    CHECK(cuGraphDestroy(rg));
    CHECK(cuGraphLaunch(re, s));
    CHECK(cuStreamSynchronize(s));
    std::printf("graph_alloc_reused=%d,%d\n", first.dptr == second.dptr,
                static_cast<int>(cuMemFree(second.dptr)));
    // Launched again, the graph allocates it again: freed in stream order this time.
    CHECK(cuGraphLaunch(re, s));
    const CUresult again = cuMemFreeAsync(second.dptr, s);
    CHECK(cuStreamSynchronize(s));
    std::printf("graph_alloc_relaunched_free=%d\n", static_cast<int>(again));
    // Freed in a different graph: its free node is made while the address is not live (the
    // next launch of the first graph allocates it again before the free runs).
    CUgraph fg;
    CHECK(cuGraphCreate(&fg, 0));
    CUgraphNode nfree;
    const CUresult added = cuGraphAddMemFreeNode(&nfree, fg, nullptr, 0, second.dptr);
    CUresult freed_elsewhere = added;
    if (added == CUDA_SUCCESS) {
      CUgraphExec fe;
      CHECK(cuGraphInstantiateWithFlags(&fe, fg, 0));
      CHECK(cuGraphLaunch(re, s));
      freed_elsewhere = cuGraphLaunch(fe, s);
      CHECK(cuStreamSynchronize(s));
      CHECK(cuGraphExecDestroy(fe));
    }
    CHECK(cuGraphDestroy(fg));
    std::printf("graph_alloc_freed_in_other_graph=%d\n", static_cast<int>(freed_elsewhere));
    CHECK(cuGraphExecDestroy(re));
  }
  // A device-to-host memcpy node into page-locked memory.
  unsigned* pinned = nullptr;
  CHECK(cuMemAllocHost(reinterpret_cast<void**>(&pinned), 4096));
  CUgraph hg;
  CHECK(cuGraphCreate(&hg, 0));
  CUDA_MEMCPY3D dh = {};
  dh.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  dh.srcDevice = b;
  dh.dstMemoryType = CU_MEMORYTYPE_HOST;
  dh.dstHost = pinned;
  dh.WidthInBytes = 4096;
  dh.Height = 1;
  dh.Depth = 1;
  CUgraphNode ndh;
  CUresult rc = cuGraphAddMemcpyNode(&ndh, hg, nullptr, 0, &dh, ctx);
  std::printf("pinned_copy_rc=%d\n", static_cast<int>(rc));
  if (rc == CUDA_SUCCESS) {
    CUgraphExec he;
    CHECK(cuGraphInstantiateWithFlags(&he, hg, 0));
    CHECK(cuGraphLaunch(he, s));
    CHECK(cuStreamSynchronize(s));
    std::printf("pinned_copy=%x,%x\n", pinned[0], pinned[3072 / 4]);
    CHECK(cuGraphExecDestroy(he));
  }
  static unsigned pageable[1024];
  dh.dstHost = pageable;
  std::printf("pageable_copy_rc=%d\n", static_cast<int>(cuGraphAddMemcpyNode(&ndh, hg, nullptr, 0, &dh, ctx)));
  // Bad handles: refused, and the session goes on.
  CUgraphNode bogus = reinterpret_cast<CUgraphNode>(0x7000);
  std::printf("bad_node_type=%d\n", static_cast<int>(cuGraphNodeGetType(bogus, &t)));
  std::printf("bad_node_dep=%d\n", static_cast<int>(cuGraphAddEmptyNode(&nempty, g, &bogus, 1)));
  std::printf("bad_child=%d\n",
              static_cast<int>(cuGraphAddChildGraphNode(&nchild, g, nullptr, 0, reinterpret_cast<CUgraph>(0x7000))));
  std::printf("bad_exec_set=%d\n", static_cast<int>(cuGraphExecMemsetNodeSetParams(
                                       reinterpret_cast<CUgraphExec>(0x7000), nset, &ms, ctx)));
  ms.dst = 0x10;
  std::printf("bad_memset_ptr=%d\n", static_cast<int>(cuGraphAddMemsetNode(&nempty, g, nullptr, 0, &ms, ctx)));
  CHECK(cuGraphDestroyNode(nempty));
  std::printf("destroyed_node_type=%d\n", static_cast<int>(cuGraphNodeGetType(nempty, &t)));
  CHECK(cuMemsetD32(a, 1, 1));
  std::printf("after_bad=%x\n", Word(a));
  CHECK(cuGraphExecDestroy(e));
  CHECK(cuGraphExecDestroy(me));
  CHECK(cuGraphDestroy(g));
  CHECK(cuGraphDestroy(g2));
  CHECK(cuGraphDestroy(child));
  CHECK(cuGraphDestroy(mg));
  CHECK(cuGraphDestroy(hg));
  CHECK(cuMemFreeHost(pinned));
  // Left behind on purpose: a graph with a node and an executable graph (the session frees them).
  CUgraph left;
  CHECK(cuGraphCreate(&left, 0));
  CUgraphNode ln;
  CHECK(cuGraphAddEmptyNode(&ln, left, nullptr, 0));
  CUgraphExec le;
  CHECK(cuGraphInstantiateWithFlags(&le, left, 0));
  std::printf("done=1\n");
  return 0;
}

// A program whose first CUDA call is a launch: cudart loads its image and looks the kernel up
// before any context exists, then retains the primary context and launches with kernelParams.
int LibraryBeforeContext() {
  CHECK(cuInit(0));
  CUlibrary lib;
  CHECK(cuLibraryLoadData(&lib, "fakecuda:builtin", nullptr, nullptr, 0, nullptr, nullptr, 0));
  CUkernel k;
  CHECK(cuLibraryGetKernel(&k, lib, "fill_u32"));
  CUcontext current = nullptr;
  CHECK(cuCtxGetCurrent(&current));
  std::printf("context_at_lookup=%d\n", current == nullptr ? 0 : 1);
  Setup();
  CUdeviceptr a;
  CHECK(cuMemAlloc(&a, 4096));
  CHECK(cuMemsetD32(a, 0, 1024));
  Fill(reinterpret_cast<CUfunction>(k), a, 31, 256, nullptr);
  CHECK(cuCtxSynchronize());
  int threads = 0;
  CHECK(cuKernelGetAttribute(&threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, k, 0));
  std::printf("library_first_run=%u,%u\nlibrary_first_threads_positive=%d\n", Word(a), Word(a + 1024),
              threads > 0 ? 1 : 0);
  CHECK(cuLibraryUnload(lib));
  std::printf("done=1\n");
  return 0;
}

// Libraries and kernels (the family cudart loads its fat binaries with).
int Library() {
  Setup();
  CUlibrary lib;
  CUjit_option opt = CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES;
  void* optv = reinterpret_cast<void*>(static_cast<uintptr_t>(0));
  CHECK(cuLibraryLoadData(&lib, "fakecuda:builtin", &opt, &optv, 1, nullptr, nullptr, 0));
  CUkernel k;
  CHECK(cuLibraryGetKernel(&k, lib, "fill_u32"));
  const char* name = nullptr;
  std::printf("kernel_name_rc=%d\n", static_cast<int>(cuKernelGetName(&name, k)));
  std::printf("kernel_name=%s\n", name ? name : "");
  size_t off = 0, size = 0;
  CHECK(cuKernelGetParamInfo(k, 1, &off, &size));
  std::printf("kernel_param1=%zu,%zu\n", off, size);
  unsigned count = 0;
  CHECK(cuLibraryGetKernelCount(&count, lib));
  std::printf("kernel_count_positive=%d\n", count > 0 ? 1 : 0);
  std::vector<CUkernel> all(count);
  CHECK(cuLibraryEnumerateKernels(all.data(), count, lib));
  int found = 0;
  for (CUkernel e : all) found += e == k;
  std::printf("enumerated_has_fill=%d\n", found);
  CUfunction f, f_again;
  CHECK(cuKernelGetFunction(&f, k));
  CHECK(cuKernelGetFunction(&f_again, k));  // answered from the client's cache remotely
  std::printf("kernel_function_stable=%d\n", f == f_again ? 1 : 0);
  CHECK(cuFuncGetParamInfo(f, 2, &off, &size));
  std::printf("func_param2=%zu,%zu\n", off, size);
  int v = 0, before = 0, before_again = 0;
  CHECK(cuKernelGetAttribute(&before, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, k, 0));
  CHECK(cuKernelGetAttribute(&before_again, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, k, 0));
  CHECK(cuKernelSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 4096, k, 0));
  CHECK(cuKernelGetAttribute(&v, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, k, 0));
  std::printf("kernel_attr=%d\nkernel_attr_before=%d:%d\n", v, before, before_again);
  {
    // Setting a value again is answered by the client; a set through the kernel's function in
    // between must not let a later kernel set of the old value be skipped.
    int again = 0, after_func = 0, reset = 0;
    CHECK(cuKernelSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 4096, k, 0));
    CHECK(cuKernelGetAttribute(&again, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, k, 0));
    CHECK(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 1024));
    CHECK(cuKernelGetAttribute(&after_func, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, k, 0));
    CHECK(cuKernelSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 4096, k, 0));
    CHECK(cuKernelGetAttribute(&reset, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, k, 0));
    CHECK(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 1024));
    CHECK(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 1024));
    int func_twice = 0;
    CHECK(cuKernelGetAttribute(&func_twice, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, k, 0));
    CHECK(cuKernelSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 4096, k, 0));
    const int bad = static_cast<int>(
        cuKernelSetAttribute(static_cast<CUfunction_attribute>(999), 1, k, 0));
    const int bad_again = static_cast<int>(
        cuKernelSetAttribute(static_cast<CUfunction_attribute>(999), 1, k, 0));
    std::printf("kernel_attr_sets=%d,%d,%d,%d\nkernel_attr_bad=%d,%d\n", again, after_func, reset,
                func_twice, bad, bad_again);
    // Values past the device's limits fail at once (those within them need no round trip), and
    // leave the value set before in place.
    const int too_big = static_cast<int>(
        cuKernelSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 1 << 30, k, 0));
    const int func_too_big = static_cast<int>(
        cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 1 << 30));
    const int carveout_bad = static_cast<int>(
        cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 101));
    CHECK(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 50));
    int kept = 0, carveout = 0;
    CHECK(cuKernelGetAttribute(&kept, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, k, 0));
    CHECK(cuFuncGetAttribute(&carveout, CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, f));
    CHECK(cuCtxSynchronize());  // no deferred error from the sets that went fire-and-forget
    std::printf("kernel_attr_limits=%d,%d,%d,%d,%d\n", too_big, func_too_big, carveout_bad, kept,
                carveout);
  }
  {
    unsigned flags = 0;
    int active = 0, active_again = 0;
    CHECK(cuDevicePrimaryCtxGetState(0, &flags, &active));
    CUcontext extra = nullptr;
    CHECK(cuDevicePrimaryCtxRetain(&extra, 0));
    CHECK(cuDevicePrimaryCtxGetState(0, &flags, &active_again));
    CHECK(cuDevicePrimaryCtxRelease(0));
    std::printf("primary_state=%d:%d\n", active, active_again);
  }
  CUmodule mod;
  CHECK(cuLibraryGetModule(&mod, lib));
  CUmodule no_mod = nullptr;
  std::printf("library_module_bad=%d:%d\n", static_cast<int>(cuLibraryGetModule(nullptr, lib)),
              static_cast<int>(cuLibraryGetModule(&no_mod, reinterpret_cast<CUlibrary>(0xbad0))));
  CUfunction mf;
  CHECK(cuModuleGetFunction(&mf, mod, "fill_u32"));
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr a;
  CHECK(cuMemAlloc(&a, 4096));
  CHECK(cuMemsetD32(a, 0, 1024));
  Fill(f, a, 21, 256, s);                                  // function from the kernel
  Fill(reinterpret_cast<CUfunction>(k), a + 1024, 22, 256, s);  // the kernel cast to a function
  Fill(mf, a + 2048, 23, 256, s);                          // function of the library's module
  CHECK(cuStreamSynchronize(s));
  std::printf("library_run=%u,%u,%u,%u\n", Word(a), Word(a + 1024), Word(a + 2048), Word(a + 3072));
  // The names of functions handed out (XLA asks for them): from the kernel, of the module's.
  const char* fname = nullptr;
  const char* mname = nullptr;
  CUresult fr = cuFuncGetName(&fname, f);
  CUresult mr = cuFuncGetName(&mname, mf);
  std::printf("func_names=%d:%s:%d:%s\n", static_cast<int>(fr), fr == CUDA_SUCCESS ? fname : "-",
              static_cast<int>(mr), mr == CUDA_SUCCESS ? mname : "-");
  std::printf("func_name_bogus=%d\n",
              static_cast<int>(cuFuncGetName(&fname, reinterpret_cast<CUfunction>(0x7000))));
  std::printf("kernel_bogus=%d\n", static_cast<int>(cuKernelGetFunction(
                                       &f, reinterpret_cast<CUkernel>(0x7000))));
  std::printf("lib_bogus=%d\n", static_cast<int>(cuLibraryGetKernel(
                                    &k, reinterpret_cast<CUlibrary>(0x7000), "fill_u32")));
  std::printf("missing_kernel=%d\n", static_cast<int>(cuLibraryGetKernel(&k, lib, "no_such")));
  CHECK(cuLibraryUnload(lib));
  std::printf("unload_twice=%d\n", static_cast<int>(cuLibraryUnload(lib)));
  CHECK(cuMemFree(a));
  std::printf("done=1\n");
  return 0;
}

// Stream capture of kernel launches, then the captured graph instantiated and launched.
// The per-thread default-stream variants (_ptsz, _ptds) that programs built with
// --default-stream per-thread (and cudart's per-thread API) call: a NULL stream is the calling
// thread's default stream. Looked up by name, "na" where the driver has none.
int PerThread() {
  Setup();
  using HtoDAsync = CUresult (*)(CUdeviceptr, const void*, size_t, CUstream);
  using DtoH = CUresult (*)(void*, CUdeviceptr, size_t);
  using MemsetD32 = CUresult (*)(CUdeviceptr, unsigned, size_t);
  using MemsetD32Async = CUresult (*)(CUdeviceptr, unsigned, size_t, CUstream);
  using StreamSync = CUresult (*)(CUstream);
  using EventRecord = CUresult (*)(CUevent, CUstream);
  auto htod = Sym<HtoDAsync>("cuMemcpyHtoDAsync_v2_ptsz");
  auto dtoh = Sym<DtoH>("cuMemcpyDtoH_v2_ptds");
  auto memset32 = Sym<MemsetD32>("cuMemsetD32_v2_ptds");
  auto memset32_async = Sym<MemsetD32Async>("cuMemsetD32Async_ptsz");
  auto sync = Sym<StreamSync>("cuStreamSynchronize_ptsz");
  auto record = Sym<EventRecord>("cuEventRecord_ptsz");
  if (!htod || !dtoh || !memset32 || !memset32_async || !sync || !record) {
    std::printf("per_thread=na\ndone=1\n");
    return 0;
  }
  CUdeviceptr d;
  CHECK(cuMemAlloc(&d, 4096));
  std::vector<uint32_t> in(1024), out(1024, 0);
  for (uint32_t i = 0; i < 1024; ++i) in[i] = i * 7u;
  CHECK(memset32(d, 0, 1024));
  CHECK(htod(d, in.data(), 4096, nullptr));  // the per-thread default stream
  CHECK(memset32_async(d + 16, 5, 2, nullptr));
  CUevent e;
  CHECK(cuEventCreate(&e, 0));
  CHECK(record(e, nullptr));
  CHECK(sync(nullptr));
  std::printf("per_thread_event=%d\n", static_cast<int>(cuEventQuery(e)));
  CHECK(dtoh(out.data(), d, 4096));
  std::printf("per_thread=%u,%u,%u,%u,%u\n", out[0], out[3], out[4], out[5], out[1023]);
  CHECK(cuEventDestroy(e));
  CHECK(cuMemFree(d));
  std::printf("done=1\n");
  return 0;
}

int Capture() {
  Setup();
  CUfunction fill = Kernel("fill_u32");
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr a;
  CHECK(cuMemAlloc(&a, 4096));
  CHECK(cuMemsetD32(a, 0, 1024));
  CUstreamCaptureStatus st;
  CHECK(cuStreamIsCapturing(s, &st));
  std::printf("before=%d\n", static_cast<int>(st));
  CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  CHECK(cuStreamIsCapturing(s, &st));
  std::printf("during=%d\n", static_cast<int>(st));
  cuuint64_t id = 0;
  CHECK(cuStreamGetCaptureInfo(s, &st, &id, nullptr, nullptr, nullptr, nullptr));
  std::printf("info_during=%d,%d\n", static_cast<int>(st), id != 0 ? 1 : 0);
  Fill(fill, a, 31, 512, s);
  Fill(fill, a + 2048, 32, 512, s);
  CUgraph g;
  CHECK(cuStreamEndCapture(s, &g));
  CHECK(cuStreamIsCapturing(s, &st));
  std::printf("after=%d\n", static_cast<int>(st));
  CHECK(cuStreamSynchronize(s));
  std::printf("not_run_yet=%u,%u\n", Word(a), Word(a + 2048));
  CUgraphExec e;
  {
    size_t count = 0, two = 2, one = 1;
    CUgraphNode nodes[2] = {nullptr, nullptr}, first[1] = {nullptr};
    CHECK(cuGraphGetNodes(g, nullptr, &count));
    CHECK(cuGraphGetNodes(g, nodes, &two));
    CHECK(cuGraphGetNodes(g, first, &one));
    std::printf("captured_nodes=%zu:%zu:%d:%zu:%d\n", count, two,
                nodes[0] != nullptr && nodes[1] != nullptr && nodes[0] != nodes[1] ? 1 : 0, one,
                first[0] == nodes[0] ? 1 : 0);
  }
  CHECK(cuGraphInstantiateWithFlags(&e, g, 0));
  CHECK(cuGraphLaunch(e, s));
  CHECK(cuStreamSynchronize(s));
  std::printf("captured_run=%u,%u\n", Word(a), Word(a + 2048));
  std::printf("end_not_capturing=%d\n", static_cast<int>(cuStreamEndCapture(s, &g)));
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  CHECK(cuThreadExchangeStreamCaptureMode(&mode));
  std::printf("exchanged_mode=%d\n", static_cast<int>(mode));
  CHECK(cuThreadExchangeStreamCaptureMode(&mode));
  {
    // A global capture: an allocation made in relaxed mode leaves it intact (PyTorch's allocator
    // switches to relaxed around cuMemAlloc); one made in global mode invalidates it.
    CUdeviceptr b = 0, c = 0;
    CUgraph g2 = nullptr;
    CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
    CHECK(cuThreadExchangeStreamCaptureMode(&m));
    CUresult relaxed_alloc = cuMemAlloc(&b, 256);
    CHECK(cuThreadExchangeStreamCaptureMode(&m));
    Fill(fill, a, 33, 16, s);
    CUresult relaxed_end = cuStreamEndCapture(s, &g2);
    std::printf("global_relaxed_alloc=%d:%d\n", static_cast<int>(relaxed_alloc),
                static_cast<int>(relaxed_end));
    if (relaxed_end == CUDA_SUCCESS) CHECK(cuGraphDestroy(g2));
    if (relaxed_alloc == CUDA_SUCCESS) CHECK(cuMemFree(b));
    CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CUresult unsafe_alloc = cuMemAlloc(&c, 256);
    CUresult unsafe_end = cuStreamEndCapture(s, &g2);
    std::printf("global_unsafe_alloc=%d:%d\n", static_cast<int>(unsafe_alloc),
                static_cast<int>(unsafe_end));
    if (unsafe_alloc == CUDA_SUCCESS) CHECK(cuMemFree(c));
  }
  CHECK(cuGraphExecDestroy(e));
  CHECK(cuGraphDestroy(g));
  CHECK(cuMemFree(a));
  std::printf("done=1\n");
  return 0;
}

// A program thread started with a small stack (64 KiB, as some runtimes and thread pools use)
// while the driver library is loaded, and the calls it makes: the driver library must not take
// that stack for itself (its static thread-local storage comes out of every thread's stack).
int SmallStack() {
  CUcontext ctx = Setup();
  struct Args {
    CUcontext ctx;
    CUresult r = CUDA_ERROR_UNKNOWN;
    unsigned got = 0;
  } args{ctx};
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 64 * 1024);
  pthread_t t;
  const int rc = pthread_create(&t, &attr, [](void* p) -> void* {
    auto* a = static_cast<Args*>(p);
    CUdeviceptr d = 0;
    a->r = cuCtxSetCurrent(a->ctx);
    if (a->r == CUDA_SUCCESS) a->r = cuMemAlloc(&d, 4096);
    if (a->r == CUDA_SUCCESS) {
      Fill(Kernel("fill_u32"), d, 77, 16, nullptr);
      a->r = cuMemcpyDtoH(&a->got, d, sizeof(a->got));
      cuMemFree(d);
    }
    return nullptr;
  }, &args);
  pthread_attr_destroy(&attr);
  if (rc == 0) pthread_join(t, nullptr);
  std::printf("small_stack_thread=%d\nsmall_stack_calls=%d\nsmall_stack_value=%u\ndone=1\n", rc,
              static_cast<int>(args.r), args.got);
  return 0;
}

// Cache configuration hints (context, function, kernel) and a library loaded from a file.
int CacheConfig() {
  Setup();
  CUfunc_cache c = CU_FUNC_CACHE_PREFER_EQUAL;
  CHECK(cuCtxGetCacheConfig(&c));
  std::printf("ctx_cache_initial=%d\n", static_cast<int>(c));
  CHECK(cuCtxSetCacheConfig(CU_FUNC_CACHE_PREFER_L1));
  CHECK(cuCtxGetCacheConfig(&c));
  std::printf("ctx_cache_set=%d\n", static_cast<int>(c));
  std::printf("ctx_cache_bad=%d\n", static_cast<int>(cuCtxSetCacheConfig(static_cast<CUfunc_cache>(7))));
  CHECK(cuCtxGetCacheConfig(&c));
  std::printf("ctx_cache_after_bad=%d\n", static_cast<int>(c));
  std::printf("ctx_cache_null=%d\n", static_cast<int>(cuCtxGetCacheConfig(nullptr)));
  CUfunction f = Kernel("fill_u32");
  std::printf("func_cache=%d:%d:%d\n", static_cast<int>(cuFuncSetCacheConfig(f, CU_FUNC_CACHE_PREFER_SHARED)),
              static_cast<int>(cuFuncSetCacheConfig(f, static_cast<CUfunc_cache>(9))),
              static_cast<int>(cuFuncSetCacheConfig(reinterpret_cast<CUfunction>(0x5a5a0), CU_FUNC_CACHE_PREFER_L1)));
  CUlibrary lib;
  CHECK(cuLibraryLoadData(&lib, "fakecuda:builtin", nullptr, nullptr, 0, nullptr, nullptr, 0));
  CUkernel k;
  CHECK(cuLibraryGetKernel(&k, lib, "fill_u32"));
  using KernelCache = CUresult (*)(CUkernel, CUfunc_cache, CUdevice);
  if (auto set = Sym<KernelCache>("cuKernelSetCacheConfig")) {
    std::printf("kernel_cache=%d:%d\n", static_cast<int>(set(k, CU_FUNC_CACHE_PREFER_EQUAL, 0)),
                static_cast<int>(set(k, static_cast<CUfunc_cache>(4), 0)));
  } else {
    std::printf("kernel_cache=na\n");
  }
  // A kernel still launches after all of it.
  CUdeviceptr d;
  CHECK(cuMemAlloc(&d, 64));
  Fill(f, d, 41, 16, nullptr);
  unsigned got = 0;
  CHECK(cuMemcpyDtoH(&got, d + 60, 4));
  std::printf("cache_run=%u\n", got);
  CHECK(cuMemFree(d));
  using FromFile = CUresult (*)(CUlibrary*, const char*, CUjit_option*, void**, unsigned, CUlibraryOption*,
                                void**, unsigned);
  if (auto load = Sym<FromFile>("cuLibraryLoadFromFile")) {
    char path[] = "/tmp/tf-probe-library.XXXXXX";
    if (!WriteBuiltinImage(path)) return 1;
    CUlibrary from_file = nullptr;
    CUkernel k2 = nullptr;
    CUresult lr = load(&from_file, path, nullptr, nullptr, 0, nullptr, nullptr, 0);
    unlink(path);
    if (lr == CUDA_SUCCESS) lr = cuLibraryGetKernel(&k2, from_file, "fill_u32");
    std::printf("library_file=%d\nlibrary_file_missing=%d\n", static_cast<int>(lr),
                static_cast<int>(load(&from_file, "/nonexistent/tf-library.cubin", nullptr, nullptr, 0,
                                      nullptr, nullptr, 0)));
  } else {
    std::printf("library_file=na\nlibrary_file_missing=na\n");
  }
  std::printf("done=1\n");
  return 0;
}

// What cudart asks before registering its fat binaries.
int LoadingMode() {
  CHECK(cuInit(0));
  auto get = Sym<CUresult (*)(CUmoduleLoadingMode*)>("cuModuleGetLoadingMode");
  if (get == nullptr) {
    std::printf("loading_mode=na\ndone=1\n");
    return 0;
  }
  CUmoduleLoadingMode mode = CU_MODULE_EAGER_LOADING;
  CHECK(get(&mode));
  std::printf("loading_mode=%d\nloading_mode_null=%d\ndone=1\n", static_cast<int>(mode),
              static_cast<int>(get(nullptr)));
  return 0;
}

}  // namespace

// Allocates 16 MiB blocks until the driver refuses: how much the vGPU lets this process have.
int Fill16() {
  Setup();
  size_t free_b = 0, total_b = 0;
  CHECK(cuMemGetInfo(&free_b, &total_b));
  std::vector<CUdeviceptr> blocks;
  CUresult r = CUDA_SUCCESS;
  while (blocks.size() < 4096) {
    CUdeviceptr p = 0;
    r = cuMemAlloc(&p, 16u << 20);
    if (r != CUDA_SUCCESS) break;
    blocks.push_back(p);
  }
  std::printf("fill_total_mib=%zu\nfill_error=%d\nmeminfo_total_mib=%zu\n", blocks.size() * 16,
              static_cast<int>(r), total_b >> 20);
  for (CUdeviceptr p : blocks) CHECK(cuMemFree(p));
  std::printf("done=1\n");
  return 0;
}

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  const char* mode = argc > 1 ? argv[1] : "basic";
  if (!strcmp(mode, "fill")) return Fill16();
  if (!strcmp(mode, "basic")) return Basic();
  if (!strcmp(mode, "deferred")) return Deferred();
  if (!strcmp(mode, "bad")) return BadHandles();
  if (!strcmp(mode, "vhandles")) return VirtualHandles();
  if (!strcmp(mode, "stuck")) return Stuck();
  if (!strcmp(mode, "hold")) return Hold();
  if (!strcmp(mode, "loop")) return Loop();
  if (!strcmp(mode, "fork")) return Fork();
  if (!strcmp(mode, "bench")) return Bench();
  if (!strcmp(mode, "local")) return Local();
  if (!strcmp(mode, "host")) return Host();
  if (!strcmp(mode, "async")) return Async();
  if (!strcmp(mode, "callbacks")) return Callbacks();
  if (!strcmp(mode, "graphs")) return Graphs();
  if (!strcmp(mode, "graphnodes")) return GraphNodes();
  if (!strcmp(mode, "graphpageable")) return GraphPageable();
  if (!strcmp(mode, "graphconditional")) return GraphConditional();
  if (!strcmp(mode, "graphnodeaccess")) return GraphNodeAccess();
  if (!strcmp(mode, "vgraphs")) return GraphHandles();
  if (!strcmp(mode, "callbackfree")) {
    return CallbackFree(argc > 2 ? atoi(argv[2]) : 8, argc > 3 ? atoi(argv[3]) : 3);
  }
  if (!strcmp(mode, "library")) return Library();
  if (!strcmp(mode, "libraryfirst")) return LibraryBeforeContext();
  if (!strcmp(mode, "capture")) return Capture();
  if (!strcmp(mode, "perthread")) return PerThread();
  if (!strcmp(mode, "smallstack")) return SmallStack();
  if (!strcmp(mode, "loadingmode")) return LoadingMode();
  if (!strcmp(mode, "cacheconfig")) return CacheConfig();
  if (!strcmp(mode, "init")) {
    CUresult r = cuInit(0);
    std::printf("init=%d\n", static_cast<int>(r));
    return 0;
  }
  std::fprintf(stderr, "unknown mode %s\n", mode);
  return 2;
}
