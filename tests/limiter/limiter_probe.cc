// A driver-API program run under `tfusion run` in the fake-driver tests: it exercises what the
// limiter enforces and prints "key=value" lines the tests check. Linked against libcuda.so.1
// like any CUDA program; the library path decides whether it gets the driver or the limiter.
#include <cuda.h>
#include <dlfcn.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

#define CHECK(call)                                                        \
  do {                                                                     \
    CUresult r_ = (call);                                                  \
    if (r_ != CUDA_SUCCESS) {                                              \
      std::printf("error=%s:%d\n", #call, static_cast<int>(r_));           \
      std::exit(3);                                                        \
    }                                                                      \
  } while (0)

constexpr size_t kChunk = 64ull << 20;

CUcontext Setup() {
  CHECK(cuInit(0));
  CUdevice dev;
  CHECK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
  return ctx;
}

// Allocates 64 MiB chunks until refused; prints the total and the error; frees one chunk and
// shows a new allocation then succeeds.
int Alloc() {
  Setup();
  std::vector<CUdeviceptr> got;
  CUresult last = CUDA_SUCCESS;
  for (int i = 0; i < 4096; ++i) {
    CUdeviceptr p;
    last = cuMemAlloc(&p, kChunk);
    if (last != CUDA_SUCCESS) break;
    got.push_back(p);
  }
  size_t free = 0, total = 0;
  CHECK(cuMemGetInfo(&free, &total));
  std::printf("allocated_mib=%zu\nerror=%d\nfree_mib=%zu\ntotal_mib=%zu\n", got.size() * 64,
              static_cast<int>(last), free >> 20, total >> 20);
  size_t dev_total = 0;
  CHECK(cuDeviceTotalMem(&dev_total, 0));
  std::printf("device_total_mib=%zu\n", dev_total >> 20);
  if (got.empty()) return 1;
  CHECK(cuMemFree(got.back()));
  got.pop_back();
  CUdeviceptr again;
  std::printf("realloc_after_free=%d\n", static_cast<int>(cuMemAlloc(&again, kChunk)));
  return 0;
}

// Calls alloc() (which returns a CUresult and an object) until it is refused, prints
// path=<MiB obtained>:<error>, then hands every object to release().
template <typename T, typename Alloc, typename Release>
void UntilRefused(const char* path, Alloc alloc, Release release) {
  std::vector<T> got;
  CUresult r;
  for (;;) {
    T obj{};
    r = alloc(&obj);
    if (r != CUDA_SUCCESS) break;
    got.push_back(obj);
  }
  std::printf("%s=%zu:%d\n", path, got.size() * 64, static_cast<int>(r));
  for (const T& obj : got) release(obj);
}

// The other allocation paths, each until refused: prints path=<mib>:<error>.
int Paths() {
  Setup();
  UntilRefused<CUdeviceptr>(
      "pitch", [](CUdeviceptr* p) { size_t pitch; return cuMemAllocPitch(p, &pitch, 8192, kChunk / 8192, 4); },
      [](CUdeviceptr p) { cuMemFree(p); });
  UntilRefused<CUdeviceptr>(
      "async", [](CUdeviceptr* p) { return cuMemAllocAsync(p, kChunk, nullptr); },
      [](CUdeviceptr p) { cuMemFreeAsync(p, nullptr); });
  cuStreamSynchronize(nullptr);
  CUmemPoolProps props = {};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = 0;
  CUmemoryPool pool;
  CHECK(cuMemPoolCreate(&pool, &props));
  UntilRefused<CUdeviceptr>(
      "pool", [pool](CUdeviceptr* p) { return cuMemAllocFromPoolAsync(p, kChunk, pool, nullptr); },
      [](CUdeviceptr p) { cuMemFreeAsync(p, nullptr); });
  cuStreamSynchronize(nullptr);
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  UntilRefused<CUmemGenericAllocationHandle>(
      "vmm", [&prop](CUmemGenericAllocationHandle* h) { return cuMemCreate(h, kChunk, &prop, 0); },
      [](CUmemGenericAllocationHandle h) { cuMemRelease(h); });
  UntilRefused<CUdeviceptr>(
      "managed", [](CUdeviceptr* p) { return cuMemAllocManaged(p, kChunk, CU_MEM_ATTACH_GLOBAL); },
      [](CUdeviceptr p) { cuMemFree(p); });
  CUDA_ARRAY3D_DESCRIPTOR d = {};
  d.Width = 4096;
  d.Height = 4096;
  d.Depth = 1;
  d.Format = CU_AD_FORMAT_FLOAT;
  d.NumChannels = 1;  // 64 MiB
  UntilRefused<CUarray>(
      "array3d", [&d](CUarray* a) { return cuArray3DCreate(a, &d); }, [](CUarray a) { cuArrayDestroy(a); });
  CUgraph g;
  CHECK(cuGraphCreate(&g, 0));
  CUDA_MEM_ALLOC_NODE_PARAMS np = {};
  np.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  np.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  np.poolProps.location.id = 0;
  np.bytesize = kChunk;
  UntilRefused<CUgraphNode>(
      "graph_node", [&](CUgraphNode* n) { return cuGraphAddMemAllocNode(n, g, nullptr, 0, &np); },
      [](CUgraphNode) {});
  CHECK(cuGraphDestroy(g));
  size_t free = 0, total = 0;
  CHECK(cuMemGetInfo(&free, &total));
  std::printf("free_after_mib=%zu\ntotal_mib=%zu\n", free >> 20, total >> 20);
  return 0;
}

// Every way of finding an entry point lands in the same library as the direct call.
int ProcAddr() {
  Setup();
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  auto lib_of = [](void* p) {
    Dl_info info{};
    if (p == nullptr || dladdr(p, &info) == 0 || info.dli_fname == nullptr) return std::string("none");
    char resolved[4096];
    std::string f = realpath(info.dli_fname, resolved) ? resolved : info.dli_fname;
    return f.substr(f.rfind('/') + 1) + ":" + (info.dli_sname ? info.dli_sname : "?");
  };
  struct Case {
    const char* base;
    cuuint64_t flags;
  } cases[] = {{"cuMemAlloc", CU_GET_PROC_ADDRESS_DEFAULT},
               {"cuLaunchKernel", CU_GET_PROC_ADDRESS_DEFAULT},
               {"cuLaunchKernel", CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM},
               {"cuGraphLaunch", CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM},
               {"cuMemGetInfo", CU_GET_PROC_ADDRESS_DEFAULT},
               {"cuGetProcAddress", CU_GET_PROC_ADDRESS_DEFAULT}};
  for (const auto& c : cases) {
    void* p = nullptr;
    CUdriverProcAddressQueryResult st;
    CUresult r = cuGetProcAddress(c.base, &p, 13000, c.flags, &st);
    std::printf("gpa_%s_%llu=%d:%s\n", c.base, static_cast<unsigned long long>(c.flags), static_cast<int>(r),
                lib_of(p).c_str());
  }
  void* p = nullptr;
  CUdriverProcAddressQueryResult st;
  std::printf("gpa_unknown=%d\n", static_cast<int>(cuGetProcAddress("cuNoSuchThing", &p, 13000, 0, &st)));
  std::printf("dlsym_cuMemAlloc_v2=%s\n", lib_of(dlsym(h, "cuMemAlloc_v2")).c_str());
  std::printf("dlsym_cuLaunchKernelEx=%s\n", lib_of(dlsym(h, "cuLaunchKernelEx")).c_str());
  std::printf("direct_cuMemAlloc=%s\n", lib_of(reinterpret_cast<void*>(&cuMemAlloc)).c_str());
  return 0;
}

// Holds `mib` of VRAM until killed.
int Hold(size_t mib) {
  Setup();
  CUdeviceptr p;
  CHECK(cuMemAlloc(&p, mib << 20));
  std::printf("holding=%zu\n", mib);
  std::fflush(stdout);
  for (;;) pause();
}

// Launches `seconds` worth of sleep kernels of `kernel_us` (2 ms by default) open-loop (4 in
// flight) and reports how many completed per second: the kernel time share this process got.
// With `gap_us`, one kernel at a time: each waited for, then `gap_us` on the host before the next.
int Launch(double seconds, unsigned kernel_us, unsigned gap_us) {
  Setup();
  CUmodule mod;
  CHECK(cuModuleLoadData(&mod, "fakecuda:builtin"));
  CUfunction f;
  CHECK(cuModuleGetFunction(&f, mod, "sleep_us"));
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  unsigned us = kernel_us;
  void* params[] = {&us};
  auto t0 = std::chrono::steady_clock::now();
  long launched = 0;
  CUevent done[4];
  for (auto& e : done) CHECK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  for (;;) {
    double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (el >= seconds) break;
    CUevent& e = done[launched % 4];
    if (launched >= 4) CHECK(cuEventSynchronize(e));
    CHECK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params, nullptr));
    CHECK(cuEventRecord(e, s));
    ++launched;
    if (gap_us > 0) {
      CHECK(cuStreamSynchronize(s));
      usleep(gap_us);
    }
  }
  CHECK(cuStreamSynchronize(s));
  double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("kernels=%ld\nseconds=%.3f\nbusy_fraction=%.3f\n", launched, el, launched * (kernel_us / 1e6) / el);
  // Tear down like a tidy program does, while a compute lease may still be open.
  CHECK(cuStreamDestroy(s));
  CHECK(cuDevicePrimaryCtxRelease(0));
  return 0;
}

// Launches n no-op kernels back to back (for instruction counts of the launch path).
// A busy tenant: writes a new pattern into `mib` of device memory and reads it back, over and
// over for `seconds` (a freeze meanwhile swaps it out, and its next copy straight back in);
// prints "busy_ready" once started, then the rounds and the bytes that did not come back.
int Busy(size_t mib, double seconds) {
  Setup();
  const size_t bytes = mib << 20;
  CUdeviceptr d;
  CHECK(cuMemAlloc(&d, bytes));
  std::vector<unsigned char> out(bytes), back(bytes);
  std::printf("busy_ready=1\n");
  std::fflush(stdout);
  long rounds = 0, mismatches = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    for (size_t i = 0; i < bytes; i += 4096) out[i] = static_cast<unsigned char>(rounds + i / 4096);
    CHECK(cuMemcpyHtoD(d, out.data(), bytes));
    CHECK(cuMemcpyDtoH(back.data(), d, bytes));
    for (size_t i = 0; i < bytes; i += 4096) mismatches += back[i] != out[i];
    ++rounds;
  }
  std::printf("busy_rounds=%ld\nbusy_mismatches=%ld\n", rounds, mismatches);
  return 0;
}

int LaunchLoop(long n) {
  Setup();
  CUmodule mod;
  CHECK(cuModuleLoadData(&mod, "fakecuda:builtin"));
  CUfunction f;
  CHECK(cuModuleGetFunction(&f, mod, "sleep_us"));
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  static unsigned us = 0;
  void* params[] = {&us};
  for (long i = 0; i < n; ++i) CHECK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params, nullptr));
  CHECK(cuStreamSynchronize(s));
  std::printf("launched=%ld\n", n);
  return 0;
}

// VRAM tiering, driven by the test through files in `dir`: fills three buffers, says "ready" and
// waits for "go" (the test freezes the vGPU meanwhile); then makes host-only calls and an
// allocation while swapped, says "hostonly" and waits for "go2"; then reads every buffer back
// (which resumes the tenant) and launches a kernel, printing whether the contents survived; then
// says "verified" and waits for "go3" (a second freeze and an explicit thaw) and checks again.
bool WaitFile(const std::string& path) {
  for (int i = 0; i < 6000; ++i) {
    if (access(path.c_str(), F_OK) == 0) return true;
    usleep(10'000);
  }
  return false;
}

void Touch(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f) std::fclose(f);
}

// Three device buffers (3 MiB, 64 MiB, 130 MiB + 12345 bytes) filled with known pseudo-random
// bytes, for the tiering probes: whatever moves them must bring every byte back.
struct KnownBuffers {
  static constexpr int kCount = 3;
  size_t sizes[kCount] = {3u << 20, 64u << 20, (130u << 20) + 12345};
  CUdeviceptr bufs[kCount] = {};
  std::vector<std::vector<unsigned char>> want{kCount};

  void Fill() {
    for (int i = 0; i < kCount; ++i) {
      CHECK(cuMemAlloc(&bufs[i], sizes[i]));
      want[i].resize(sizes[i]);
      uint32_t x = 0x9E3779B9u * (i + 1);
      for (auto& b : want[i]) {
        x ^= x << 13; x ^= x >> 17; x ^= x << 5;
        b = static_cast<unsigned char>(x);
      }
      CHECK(cuMemcpyHtoD(bufs[i], want[i].data(), sizes[i]));
    }
    CHECK(cuCtxSynchronize());
  }
  // Reads every buffer back (a GPU call) and prints "<round>_identical=<buffers unchanged>".
  void Verify(const char* round) const {
    int same = 0;
    for (int i = 0; i < kCount; ++i) {
      std::vector<unsigned char> got(sizes[i]);
      CHECK(cuMemcpyDtoH(got.data(), bufs[i], sizes[i]));
      same += got == want[i];
    }
    std::printf("%s_identical=%d\n", round, same);
    std::fflush(stdout);
  }
};

// Fills the first 256 words of `buf` with `value` by a kernel and returns the first word read back.
unsigned FillAndReadFirst(CUdeviceptr buf, unsigned value) {
  CUmodule mod;
  CHECK(cuModuleLoadData(&mod, "fakecuda:builtin"));
  CUfunction fill;
  CHECK(cuModuleGetFunction(&fill, mod, "fill_u32"));
  size_t n = 256;
  void* params[] = {&buf, &value, &n};
  CHECK(cuLaunchKernel(fill, 1, 1, 1, 256, 1, 1, 0, nullptr, params, nullptr));
  unsigned first = 0;
  CHECK(cuMemcpyDtoH(&first, buf, sizeof(first)));
  return first;
}

// With LIMITER_PROBE_FSIZE_MIB set: between "ready" and "go" (while the test freezes the tenant)
// no file of the process may grow past that many MiB (RLIMIT_FSIZE, as `ulimit -f` sets it; SIGXFSZ
// keeps its default action). Outside that window it is lifted: the fake driver backs device memory
// with memfds, which the limit would also stop.
void LimitFileSize(bool on) {
  const char* mib = std::getenv("LIMITER_PROBE_FSIZE_MIB");
  if (mib == nullptr) return;
  rlimit lim{};
  CHECK(getrlimit(RLIMIT_FSIZE, &lim) == 0 ? CUDA_SUCCESS : CUDA_ERROR_OPERATING_SYSTEM);
  lim.rlim_cur = on ? static_cast<rlim_t>(std::strtoull(mib, nullptr, 10)) << 20 : lim.rlim_max;
  CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0 ? CUDA_SUCCESS : CUDA_ERROR_OPERATING_SYSTEM);
}

int Tier(const std::string& dir) {
  Setup();
  KnownBuffers known;
  known.Fill();
  auto& bufs = known.bufs;
  LimitFileSize(true);
  Touch(dir + "/ready");
  if (!WaitFile(dir + "/go")) return 4;
  LimitFileSize(false);
  size_t free = 0, total = 0;
  CHECK(cuMemGetInfo(&free, &total));
  CUdevice dev;
  CHECK(cuCtxGetDevice(&dev));
  CUdeviceptr late;
  CHECK(cuMemAlloc(&late, 1u << 20));
  Touch(dir + "/hostonly");
  if (!WaitFile(dir + "/go2")) return 4;
  auto verify = [&](const char* round) { known.Verify(round); };
  verify("first");
  const unsigned value = 0xC0FFEE;
  unsigned first = FillAndReadFirst(late, value);
  std::printf("kernel_after_resume=%s\n", first == value ? "ok" : "wrong");
  std::fflush(stdout);
  Touch(dir + "/verified");
  if (!WaitFile(dir + "/go3")) return 4;
  verify("second");
  CHECK(cuMemcpyDtoH(&first, late, sizeof(first)));
  std::printf("late_buffer=%s\n", first == value ? "ok" : "wrong");
  for (auto b : bufs) CHECK(cuMemFree(b));
  CHECK(cuMemFree(late));
  std::printf("freed=1\n");
  return 0;
}

// Tiering faults, driven through files in `dir`. Fills the known buffers, says "ready" and waits
// for "go" (the test freezes the vGPU meanwhile). Then, as `mode` says:
//   retry: reads one buffer (a GPU call), prints "resume_error=<CUresult>" without exiting on an
//          error, says "refused" and waits for "go2";
//   busy:  queues a kernel that sleeps `sleep_ms` on the default stream (a swap-out requested now
//          stays "swapping out" until it ends), says "launched" and waits for "go2".
// Then verifies every buffer (which resumes the tenant), says "verified", waits for "go3" and
// verifies again.
int TierFault(const std::string& dir, const std::string& mode, unsigned sleep_ms) {
  Setup();
  KnownBuffers known;
  known.Fill();
  Touch(dir + "/ready");
  if (!WaitFile(dir + "/go")) return 4;
  if (mode == "retry") {
    unsigned char first = 0;
    CUresult e = cuMemcpyDtoH(&first, known.bufs[0], 1);
    std::printf("resume_error=%d\n", static_cast<int>(e));
    std::fflush(stdout);
    Touch(dir + "/refused");
  } else {
    CUmodule mod;
    CHECK(cuModuleLoadData(&mod, "fakecuda:builtin"));
    CUfunction f;
    CHECK(cuModuleGetFunction(&f, mod, "sleep_us"));
    unsigned us = sleep_ms * 1000u;
    void* params[] = {&us};
    CHECK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr));
    Touch(dir + "/launched");
  }
  if (!WaitFile(dir + "/go2")) return 4;
  known.Verify("first");
  Touch(dir + "/verified");
  if (!WaitFile(dir + "/go3")) return 4;
  known.Verify("second");
  for (auto b : known.bufs) CHECK(cuMemFree(b));
  std::printf("freed=1\n");
  return 0;
}

// A pool of device 0 whose memory may be exported with `handle_types` (none: a private pool).
CUmemoryPool ExportablePool(CUmemAllocationHandleType handle_types) {
  CUmemPoolProps props = {};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.handleTypes = handle_types;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = 0;
  CUmemoryPool pool;
  CHECK(cuMemPoolCreate(&pool, &props));
  return pool;
}

cuuint64_t PoolMib(CUmemoryPool pool, CUmemPool_attribute attr) {
  cuuint64_t v = 0;
  CHECK(cuMemPoolGetAttribute(pool, attr, &v));
  return v >> 20;
}

// Stream-ordered pools under tiering, driven through files in `dir`. First the stream order of a
// free: a buffer written by a kernel that runs after a 300 ms sleep on the stream is freed right
// behind it, and an allocation made meanwhile must get other memory; after the stream drained, the
// next allocation reuses it (and finds the kernel's write). Then three buffers with known bytes:
// one of the default pool, one of a private pool, one of a pool with an export handle type (fixed),
// the pool attributes, "ready"; at "go" (the test froze the tenant meanwhile) every byte is read
// back, at "go2" (after a second freeze and a thaw) again.
int Pools(const std::string& dir) {
  Setup();
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUmemoryPool def;
  CHECK(cuDeviceGetDefaultMemPool(&def, 0));
  cuuint64_t keep_all = ~0ull;  // what PyTorch's cudaMallocAsync backend sets
  CHECK(cuMemPoolSetAttribute(def, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_all));
  CUmemoryPool mine = ExportablePool(CU_MEM_HANDLE_TYPE_NONE);
  CUmemoryPool shared = ExportablePool(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);

  CUmodule mod;
  CHECK(cuModuleLoadData(&mod, "fakecuda:builtin"));
  CUfunction sleep_fn, fill;
  CHECK(cuModuleGetFunction(&sleep_fn, mod, "sleep_us"));
  CHECK(cuModuleGetFunction(&fill, mod, "fill_u32"));
  CUdeviceptr x, y, z;
  CHECK(cuMemAllocAsync(&x, 2u << 20, s));
  unsigned us = 300'000, value = 0xABCD;
  size_t n = 256;
  void* sleep_params[] = {&us};
  void* fill_params[] = {&x, &value, &n};
  CHECK(cuLaunchKernel(sleep_fn, 1, 1, 1, 1, 1, 1, 0, s, sleep_params, nullptr));
  CHECK(cuLaunchKernel(fill, 1, 1, 1, 256, 1, 1, 0, s, fill_params, nullptr));
  CHECK(cuMemFreeAsync(x, s));
  CHECK(cuMemAllocAsync(&y, 2u << 20, s));
  std::printf("reused_while_pending=%d\n", y == x ? 1 : 0);
  CHECK(cuStreamSynchronize(s));
  CHECK(cuMemAllocAsync(&z, 2u << 20, s));
  std::printf("reused_after_free=%d\n", z == x ? 1 : 0);
  unsigned first = 0;
  CHECK(cuMemcpyDtoH(&first, z, sizeof(first)));
  std::printf("write_before_free_landed=%d\n", first == value ? 1 : 0);
  CHECK(cuMemFreeAsync(y, s));
  CHECK(cuMemFreeAsync(z, s));
  CHECK(cuStreamSynchronize(s));
  std::printf("default_after_frees=%llu/%llu\n", static_cast<unsigned long long>(PoolMib(def, CU_MEMPOOL_ATTR_USED_MEM_CURRENT)),
              static_cast<unsigned long long>(PoolMib(def, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)));

  const size_t sizes[3] = {(5u << 20) + 17, 40u << 20, 8u << 20};
  CUdeviceptr bufs[3];
  CHECK(cuMemAllocAsync(&bufs[0], sizes[0], s));
  CHECK(cuMemAllocFromPoolAsync(&bufs[1], sizes[1], mine, s));
  CHECK(cuMemAllocFromPoolAsync(&bufs[2], sizes[2], shared, s));
  std::vector<std::vector<unsigned char>> want(3);
  for (int i = 0; i < 3; ++i) {
    want[i].resize(sizes[i]);
    uint32_t r = 0x51ED270Bu * (i + 1);
    for (auto& b : want[i]) {
      r ^= r << 13; r ^= r >> 17; r ^= r << 5;
      b = static_cast<unsigned char>(r);
    }
    CHECK(cuMemcpyHtoDAsync(bufs[i], want[i].data(), sizes[i], s));
  }
  CHECK(cuStreamSynchronize(s));
  auto attrs = [&](const char* when) {
    std::printf("%s_default=%llu/%llu high %llu/%llu\n%s_mine=%llu/%llu\n", when,
                static_cast<unsigned long long>(PoolMib(def, CU_MEMPOOL_ATTR_USED_MEM_CURRENT)),
                static_cast<unsigned long long>(PoolMib(def, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)),
                static_cast<unsigned long long>(PoolMib(def, CU_MEMPOOL_ATTR_USED_MEM_HIGH)),
                static_cast<unsigned long long>(PoolMib(def, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)), when,
                static_cast<unsigned long long>(PoolMib(mine, CU_MEMPOOL_ATTR_USED_MEM_CURRENT)),
                static_cast<unsigned long long>(PoolMib(mine, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)));
  };
  attrs("filled");
  CHECK(cuMemPoolTrimTo(def, 0));
  cuuint64_t zero = 0;
  CHECK(cuMemPoolSetAttribute(def, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &zero));
  attrs("trimmed");
  std::fflush(stdout);
  Touch(dir + "/ready");
  auto verify = [&](const char* round) {
    int same = 0;
    for (int i = 0; i < 3; ++i) {
      std::vector<unsigned char> got(sizes[i]);
      CHECK(cuMemcpyDtoH(got.data(), bufs[i], sizes[i]));
      same += got == want[i];
    }
    std::printf("%s_identical=%d\n", round, same);
    attrs(round);
    std::fflush(stdout);
  };
  if (!WaitFile(dir + "/go")) return 4;
  verify("first");
  Touch(dir + "/verified");
  if (!WaitFile(dir + "/go2")) return 4;
  verify("second");
  CHECK(cuMemFree(bufs[0]));  // a stream-ordered allocation may be freed synchronously too
  CHECK(cuMemFreeAsync(bufs[1], s));
  CHECK(cuMemFreeAsync(bufs[2], s));
  CHECK(cuStreamSynchronize(s));
  CHECK(cuMemPoolDestroy(mine));
  CHECK(cuMemPoolDestroy(shared));
  std::printf("freed=1\n");
  return 0;
}

// Scale to zero, driven through files in `dir`: three movable buffers and one fixed buffer (from a
// stream-ordered pool with an export handle type) with known contents; says "ready" (and its pid); at "go" makes one GPU call and says
// its result; at "go2" (after a failed first call) tries again; then checks every byte of all four.
// `fixed`: what holds the 1 MiB that cannot move: "pool" (an exportable pool) or "array" (a CUDA
// array: remote sessions refuse exportable pools).
int Zero(const std::string& dir, const std::string& fixed = "pool") {
  Setup();
  const size_t sizes[] = {3u << 20, 64u << 20, (9u << 20) + 777};
  CUdeviceptr bufs[4] = {};
  CUarray array = nullptr;
  std::vector<std::vector<unsigned char>> want(4);
  const size_t pitch = 4096;
  if (fixed == "array") {
    CUDA_ARRAY_DESCRIPTOR d = {};
    d.Width = pitch;
    d.Height = 256;
    d.Format = CU_AD_FORMAT_UNSIGNED_INT8;
    d.NumChannels = 1;
    CHECK(cuArrayCreate(&array, &d));  // fixed: arrays do not move
  } else {
    CUmemoryPool exported = ExportablePool(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    CHECK(cuMemAllocFromPoolAsync(&bufs[3], pitch * 256, exported, nullptr));  // fixed: it cannot move
    CHECK(cuStreamSynchronize(nullptr));
  }
  for (int i = 0; i < 4; ++i) {
    const size_t n = i < 3 ? sizes[i] : pitch * 256;
    if (i < 3) CHECK(cuMemAlloc(&bufs[i], n));
    want[i].resize(n);
    uint32_t x = 0x7F4A7C15u * (i + 1);
    for (auto& b : want[i]) {
      x ^= x << 13; x ^= x >> 17; x ^= x << 5;
      b = static_cast<unsigned char>(x);
    }
    if (i == 3 && array != nullptr) CHECK(cuMemcpyHtoA(array, 0, want[i].data(), n));
    else CHECK(cuMemcpyHtoD(bufs[i], want[i].data(), n));
  }
  CHECK(cuCtxSynchronize());
  if (FILE* f = std::fopen((dir + "/pid").c_str(), "w")) {
    std::fprintf(f, "%d\n", static_cast<int>(getpid()));
    std::fclose(f);
  }
  Touch(dir + "/ready");
  if (!WaitFile(dir + "/go")) return 4;
  unsigned char probe = 0;
  CUresult first = cuMemcpyDtoH(&probe, bufs[0], 1);
  std::printf("first_call=%d\n", static_cast<int>(first));
  std::fflush(stdout);
  if (first != CUDA_SUCCESS) {
    Touch(dir + "/failed");
    if (!WaitFile(dir + "/go2")) return 4;
  }
  int same = 0;
  for (int i = 0; i < 4; ++i) {
    std::vector<unsigned char> got(want[i].size());
    if (i == 3 && array != nullptr) CHECK(cuMemcpyAtoH(got.data(), array, 0, got.size()));
    else CHECK(cuMemcpyDtoH(got.data(), bufs[i], got.size()));
    same += got == want[i];
  }
  std::printf("zero_identical=%d\n", same);
  std::fflush(stdout);
  Touch(dir + "/verified");
  if (!WaitFile(dir + "/go3")) return 4;
  for (auto b : bufs) {
    if (b != 0) CHECK(cuMemFree(b));
  }
  if (array != nullptr) CHECK(cuArrayDestroy(array));
  std::printf("freed=1\n");
  return 0;
}

// Preemption, driven by the test through files in `dir`: fills the known buffers, says "ready"
// and waits for "go" (the test has the vGPU suspended meanwhile); then makes host-only calls and
// says "hostonly"; then reads the buffers back, a GPU call that must wait while the vGPU is held,
// and prints how long it waited, whether every byte came back, and a kernel's result.
int Suspended(const std::string& dir) {
  Setup();
  KnownBuffers known;
  known.Fill();
  Touch(dir + "/ready");
  if (!WaitFile(dir + "/go")) return 4;
  size_t free = 0, total = 0;
  CHECK(cuMemGetInfo(&free, &total));
  int count = 0;
  CHECK(cuDeviceGetCount(&count));
  std::printf("hostonly=ok\n");
  std::fflush(stdout);
  Touch(dir + "/hostonly");
  auto t0 = std::chrono::steady_clock::now();
  known.Verify("resumed");
  std::printf("waited_ms=%lld\n", static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                       std::chrono::steady_clock::now() - t0).count()));
  const unsigned value = 0xBEEF;
  std::printf("kernel_after_resume=%s\n", FillAndReadFirst(known.bufs[0], value) == value ? "ok" : "wrong");
  for (auto b : known.bufs) CHECK(cuMemFree(b));
  std::printf("freed=1\n");
  return 0;
}


// The tenant's own VMM memory under tiering, laid out as PyTorch's expandable segments lay it out,
// driven through files in `dir`. In one reserved range of 32 MiB: A (4 MiB) at 0, B (2 MiB) at 4
// MiB and C (6 MiB) at 6 MiB, B and C made accessible by one call spanning both, B mapped a second
// time at 30 MiB, E (2 MiB) at 12 MiB left read-only. D (2 MiB) is mapped at 14 MiB, written and
// unmapped again (the handle kept, mapped nowhere); G (2 MiB) is created and never mapped. F (8 MiB,
// exportable) is mapped in a range of its own and exported. Every mapping holds known bytes.
// "ready"; at "go" (frozen meanwhile) host-only calls on the handles (properties, a retain by
// address and its release, G released), "hostonly"; at "go2" every byte is read back at every
// address, D is mapped again and read, "verified"; at "go3" (frozen and thawed again) once more,
// then everything is unmapped, released and freed.
namespace vmm {

constexpr size_t kMiB = 1u << 20;

std::vector<unsigned char> Pattern(size_t n, uint32_t seed) {
  std::vector<unsigned char> v(n);
  uint32_t x = seed;
  for (auto& b : v) {
    x ^= x << 13; x ^= x >> 17; x ^= x << 5;
    b = static_cast<unsigned char>(x);
  }
  return v;
}

// rdma: GPUDirect RDMA capable, as PyTorch asks for every expandable segment (it still moves).
CUmemGenericAllocationHandle Create(size_t bytes, bool exportable = false, bool rdma = false) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.allocFlags.gpuDirectRDMACapable = rdma ? 1 : 0;
  if (exportable) prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CUmemGenericAllocationHandle h = 0;
  CHECK(cuMemCreate(&h, bytes, &prop, 0));
  return h;
}

void Access(CUdeviceptr at, size_t bytes, CUmemAccess_flags flags) {
  CUmemAccessDesc d = {};
  d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.location.id = 0;
  d.flags = flags;
  CHECK(cuMemSetAccess(at, bytes, &d, 1));
}

bool Same(CUdeviceptr at, const std::vector<unsigned char>& want) {
  std::vector<unsigned char> got(want.size());
  CHECK(cuMemcpyDtoH(got.data(), at, got.size()));
  return got == want;
}

int Run(const std::string& dir) {
  Setup();
  CUdeviceptr r = 0, r2 = 0;
  CHECK(cuMemAddressReserve(&r, 32 * kMiB, 0, 0, 0));
  CHECK(cuMemAddressReserve(&r2, 8 * kMiB, 0, 0, 0));
  CUmemGenericAllocationHandle a = Create(4 * kMiB, false, true), b = Create(2 * kMiB), c = Create(6 * kMiB),
                               d = Create(2 * kMiB), e = Create(2 * kMiB), f = Create(8 * kMiB, true),
                               g = Create(2 * kMiB);
  CHECK(cuMemMap(r, 4 * kMiB, 0, a, 0));
  CHECK(cuMemMap(r + 4 * kMiB, 2 * kMiB, 0, b, 0));
  CHECK(cuMemMap(r + 6 * kMiB, 6 * kMiB, 0, c, 0));
  CHECK(cuMemMap(r + 30 * kMiB, 2 * kMiB, 0, b, 0));
  CHECK(cuMemMap(r + 12 * kMiB, 2 * kMiB, 0, e, 0));
  CHECK(cuMemMap(r + 14 * kMiB, 2 * kMiB, 0, d, 0));
  CHECK(cuMemMap(r2, 8 * kMiB, 0, f, 0));
  Access(r, 4 * kMiB, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  Access(r + 4 * kMiB, 8 * kMiB, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);  // B and C in one call
  Access(r + 30 * kMiB, 2 * kMiB, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  Access(r + 12 * kMiB, 4 * kMiB, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);  // E and D
  Access(r2, 8 * kMiB, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  const auto wa = Pattern(4 * kMiB, 11), wb = Pattern(2 * kMiB, 12), wc = Pattern(6 * kMiB, 13),
             wd = Pattern(2 * kMiB, 14), we = Pattern(2 * kMiB, 15), wf = Pattern(8 * kMiB, 16);
  CHECK(cuMemcpyHtoD(r, wa.data(), wa.size()));
  CHECK(cuMemcpyHtoD(r + 30 * kMiB, wb.data(), wb.size()));  // through the second mapping of B
  CHECK(cuMemcpyHtoD(r + 6 * kMiB, wc.data(), wc.size()));
  CHECK(cuMemcpyHtoD(r + 12 * kMiB, we.data(), we.size()));
  CHECK(cuMemcpyHtoD(r + 14 * kMiB, wd.data(), wd.size()));
  CHECK(cuMemcpyHtoD(r2, wf.data(), wf.size()));
  CHECK(cuCtxSynchronize());
  Access(r + 12 * kMiB, 2 * kMiB, CU_MEM_ACCESS_FLAGS_PROT_READ);  // E: read-only from now on
  CHECK(cuMemUnmap(r + 14 * kMiB, 2 * kMiB));                      // D: mapped nowhere
  int fd = -1;
  CHECK(cuMemExportToShareableHandle(&fd, f, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  std::printf("exported=%d\n", fd >= 0 ? 1 : 0);
  std::fflush(stdout);
  Touch(dir + "/ready");
  if (!WaitFile(dir + "/go")) return 4;

  // Host-only: none of these brings the tenant back.
  CUmemAllocationProp prop = {};
  CHECK(cuMemGetAllocationPropertiesFromHandle(&prop, c));
  CUmemGenericAllocationHandle retained = 0;
  CHECK(cuMemRetainAllocationHandle(&retained, reinterpret_cast<void*>(r + 7 * kMiB)));
  std::printf("props_while_swapped=%s\nretained_is_c=%d\n",
              prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE && prop.location.id == 0 ? "ok" : "wrong",
              retained == c ? 1 : 0);
  CHECK(cuMemRelease(retained));
  CHECK(cuMemRelease(g));
  std::fflush(stdout);
  Touch(dir + "/hostonly");
  if (!WaitFile(dir + "/go2")) return 4;

  auto verify = [&](const char* round) {
    int same = Same(r, wa) + Same(r + 4 * kMiB, wb) + Same(r + 30 * kMiB, wb) + Same(r + 6 * kMiB, wc) +
               Same(r + 12 * kMiB, we) + Same(r2, wf);
    std::printf("%s_identical=%d\n", round, same);
    // B's two mappings still alias one physical allocation.
    const unsigned char mark = static_cast<unsigned char>(wb[0] ^ 0xFF);
    CHECK(cuMemcpyHtoD(r + 4 * kMiB, &mark, 1));
    unsigned char seen = 0;
    CHECK(cuMemcpyDtoH(&seen, r + 30 * kMiB, 1));
    std::printf("%s_alias=%d\n", round, seen == mark ? 1 : 0);
    CHECK(cuMemcpyHtoD(r + 4 * kMiB, wb.data(), 1));
    // D, mapped nowhere while it moved, maps again with its bytes.
    CHECK(cuMemMap(r + 14 * kMiB, 2 * kMiB, 0, d, 0));
    Access(r + 14 * kMiB, 2 * kMiB, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    std::printf("%s_unmapped_handle=%d\n", round, Same(r + 14 * kMiB, wd) ? 1 : 0);
    CHECK(cuMemUnmap(r + 14 * kMiB, 2 * kMiB));
    std::fflush(stdout);
  };
  verify("first");
  Touch(dir + "/verified");
  if (!WaitFile(dir + "/go3")) return 4;
  verify("second");
  CHECK(cuMemUnmap(r, 4 * kMiB));
  CHECK(cuMemUnmap(r + 4 * kMiB, 2 * kMiB));
  CHECK(cuMemUnmap(r + 6 * kMiB, 6 * kMiB));
  CHECK(cuMemUnmap(r + 12 * kMiB, 2 * kMiB));
  CHECK(cuMemUnmap(r + 30 * kMiB, 2 * kMiB));
  CHECK(cuMemUnmap(r2, 8 * kMiB));
  for (CUmemGenericAllocationHandle h : {a, b, c, d, e, f}) CHECK(cuMemRelease(h));
  std::printf("second_release=%d\n", static_cast<int>(cuMemRelease(a)));
  CHECK(cuMemAddressFree(r, 32 * kMiB));
  CHECK(cuMemAddressFree(r2, 8 * kMiB));
  close(fd);
  std::printf("freed=1\n");
  return 0;
}

}  // namespace vmm

// Graph memory nodes under tiering, driven through files in `dir`. 200 MiB of known buffers and a
// 2 MiB `out` buffer move; graph A allocates 32 MiB, fills it, copies its first word to `out` and
// frees it (the driver keeps the 32 MiB reserved for A's next launch); "ready", then at "go" (the
// test froze the tenant meanwhile) the graph memory is read while swapped (host-only calls), A
// runs again and graph B allocates 8 MiB and fills it without freeing it (a live graph
// allocation); "ready2", then at "go2" (a second freeze and a thaw) B's memory and the buffers
// are read back.
namespace graphmem {

constexpr size_t kFreedBytes = 32u << 20;
constexpr size_t kLiveBytes = 8u << 20;
constexpr unsigned kFreedWord = 0x11223344u;
constexpr unsigned kLiveWord = 0x5a5a5a5au;

cuuint64_t GraphMiB(CUgraphMem_attribute attr) {
  cuuint64_t v = 0;
  CHECK(cuDeviceGetGraphMemAttribute(0, attr, &v));
  return v >> 20;
}

void PrintGraphMemory(const char* when) {
  std::printf("%s_reserved_mib=%llu\n%s_used_mib=%llu\n", when,
              static_cast<unsigned long long>(GraphMiB(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT)), when,
              static_cast<unsigned long long>(GraphMiB(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT)));
  std::fflush(stdout);
}

// An allocation node of `bytes` on device 0 and a memset node filling it with `word` after it.
CUgraphNode AllocAndFill(CUgraph g, CUcontext ctx, size_t bytes, unsigned word, CUdeviceptr* dptr) {
  CUDA_MEM_ALLOC_NODE_PARAMS ap = {};
  ap.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  ap.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  ap.poolProps.location.id = 0;
  ap.bytesize = bytes;
  CUgraphNode alloc, fill;
  CHECK(cuGraphAddMemAllocNode(&alloc, g, nullptr, 0, &ap));
  CUDA_MEMSET_NODE_PARAMS ms = {};
  ms.dst = ap.dptr;
  ms.elementSize = 4;
  ms.width = bytes / 4;
  ms.height = 1;
  ms.value = word;
  CHECK(cuGraphAddMemsetNode(&fill, g, &alloc, 1, &ms, ctx));
  *dptr = ap.dptr;
  return fill;
}

int Run(const std::string& dir) {
  CUcontext ctx = Setup();
  KnownBuffers known;
  known.Fill();
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr out;
  CHECK(cuMemAlloc(&out, 4096));

  CUgraph ga;
  CHECK(cuGraphCreate(&ga, 0));
  CUdeviceptr a = 0;
  CUgraphNode filled = AllocAndFill(ga, ctx, kFreedBytes, kFreedWord, &a);
  CUDA_MEMCPY3D copy = {};
  copy.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  copy.srcDevice = a;
  copy.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  copy.dstDevice = out;
  copy.WidthInBytes = 4096;
  copy.Height = 1;
  copy.Depth = 1;
  CUgraphNode copied, freed;
  CHECK(cuGraphAddMemcpyNode(&copied, ga, &filled, 1, &copy, ctx));
  CHECK(cuGraphAddMemFreeNode(&freed, ga, &copied, 1, a));
  CUgraphExec ea;
  CHECK(cuGraphInstantiateWithFlags(&ea, ga, 0));
  auto run_a = [&](const char* round) {
    unsigned word = 0;
    CHECK(cuMemsetD32(out, 0, 1024));
    CHECK(cuGraphLaunch(ea, s));
    CHECK(cuStreamSynchronize(s));
    CHECK(cuMemcpyDtoH(&word, out, sizeof(word)));
    std::printf("%s_graph_output=%s\n", round, word == kFreedWord ? "ok" : "wrong");
  };
  run_a("first");
  PrintGraphMemory("before");
  Touch(dir + "/ready");
  if (!WaitFile(dir + "/go")) return 4;
  PrintGraphMemory("swapped");
  known.Verify("first");
  run_a("second");

  CUgraph gb;
  CHECK(cuGraphCreate(&gb, 0));
  CUdeviceptr live = 0;
  AllocAndFill(gb, ctx, kLiveBytes, kLiveWord, &live);
  CUgraphExec eb;
  CHECK(cuGraphInstantiateWithFlags(&eb, gb, 0));
  CHECK(cuGraphLaunch(eb, s));
  CHECK(cuStreamSynchronize(s));
  PrintGraphMemory("live");
  Touch(dir + "/ready2");
  if (!WaitFile(dir + "/go2")) return 4;
  std::vector<unsigned> got(kLiveBytes / 4);
  CHECK(cuMemcpyDtoH(got.data(), live, kLiveBytes));
  bool intact = true;
  for (unsigned w : got) intact = intact && w == kLiveWord;
  std::printf("live_graph_allocation_intact=%d\n", intact ? 1 : 0);
  known.Verify("second");
  run_a("third");
  CHECK(cuMemFree(live));  // back to the driver's graph memory pool
  CHECK(cuGraphExecDestroy(eb));
  CHECK(cuGraphExecDestroy(ea));
  CHECK(cuGraphDestroy(gb));
  CHECK(cuGraphDestroy(ga));
  CHECK(cuDeviceGraphMemTrim(0));
  PrintGraphMemory("end");
  for (auto b : known.bufs) CHECK(cuMemFree(b));
  CHECK(cuMemFree(out));
  std::printf("freed=1\n");
  return 0;
}

}  // namespace graphmem
}  // namespace

// A pitched allocation with known rows: says "ready" with its pitch, waits for "go" (the test
// freezes the tenant meanwhile), reads every row back and says how many came back unchanged.
int Pitched(const std::string& dir) {
  Setup();
  const size_t width = 3000, height = 700;
  CUdeviceptr p = 0;
  size_t pitch = 0;
  CHECK(cuMemAllocPitch(&p, &pitch, width, height, 8));
  std::vector<unsigned char> want(width * height);
  uint32_t x = 0x2545F491u;
  for (auto& b : want) {
    x ^= x << 13; x ^= x >> 17; x ^= x << 5;
    b = static_cast<unsigned char>(x);
  }
  CUDA_MEMCPY2D c = {};
  c.srcMemoryType = CU_MEMORYTYPE_HOST;
  c.srcHost = want.data();
  c.srcPitch = width;
  c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  c.dstDevice = p;
  c.dstPitch = pitch;
  c.WidthInBytes = width;
  c.Height = height;
  CHECK(cuMemcpy2D(&c));
  std::printf("pitch=%zu\n", pitch);
  std::fflush(stdout);
  Touch(dir + "/ready");
  if (!WaitFile(dir + "/go")) return 4;
  std::vector<unsigned char> got(width * height);
  c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  c.srcDevice = p;
  c.srcPitch = pitch;
  c.dstMemoryType = CU_MEMORYTYPE_HOST;
  c.dstHost = got.data();
  c.dstPitch = width;
  CHECK(cuMemcpy2D(&c));
  std::printf("pitched_identical=%d\n", got == want ? 1 : 0);
  std::printf("bad_element=%d\n", static_cast<int>(cuMemAllocPitch(&p, &pitch, width, height, 3)));
  CHECK(cuMemFree(p));
  std::printf("freed=1\n");
  return 0;
}

// Legacy IPC of a tiered tenant's cudaMalloc memory, through files in `dir`. The exporter ("ipc")
// allocates A (8 MiB, exported with cuIpcGetMemHandle; the handle goes to dir/handle) and B
// (16 MiB, not exported), both with known bytes, and tries to export stream-ordered memory (the
// driver refuses a pool's memory); "ready". At "go" it reads both back (a GPU call: it resumes
// if frozen), says whether the second half of A holds what the opener wrote there, and writes new
// bytes into all of A, "written"; at "go2" it frees them. The opener ("ipcopen", another process)
// maps A from the handle, opens it a second time, tries forged handles, "opened"; at "check1" it
// reads A (first or new bytes?) and writes its own bytes into A's second half, "checked1"; at
// "check2" it reads A again, closes it and closes it once more. "ipcopenonce" opens the handle
// and says what the open returned.
namespace ipc {

constexpr size_t kA = 8u << 20, kB = 16u << 20;
using vmm::Pattern;

bool Holds(CUdeviceptr p, const std::vector<unsigned char>& want) {
  std::vector<unsigned char> got(want.size());
  CHECK(cuMemcpyDtoH(got.data(), p, got.size()));
  return got == want;
}

std::vector<unsigned char> Half(const std::vector<unsigned char>& v, bool second) {
  return second ? std::vector<unsigned char>(v.begin() + v.size() / 2, v.end())
                : std::vector<unsigned char>(v.begin(), v.begin() + v.size() / 2);
}

int Export(const std::string& dir) {
  Setup();
  CUdeviceptr a, b;
  CHECK(cuMemAlloc(&a, kA));
  CHECK(cuMemAlloc(&b, kB));
  const auto a1 = Pattern(kA, 0x1234567u), a2 = Pattern(kA, 0x7654321u), bb = Pattern(kB, 0xBADC0DEu);
  const auto w = Pattern(kA, 0x0FE4E12u);  // the opener's, in A's second half
  CHECK(cuMemcpyHtoD(a, a1.data(), kA));
  CHECK(cuMemcpyHtoD(b, bb.data(), kB));
  CUipcMemHandle h;
  CHECK(cuIpcGetMemHandle(&h, a + 4096));  // any address inside it names the allocation
  CUipcMemHandle again;
  CHECK(cuIpcGetMemHandle(&again, a));
  FILE* f = std::fopen((dir + "/handle.tmp").c_str(), "wb");
  if (f == nullptr || std::fwrite(&h, sizeof(h), 1, f) != 1) return 5;
  std::fclose(f);
  std::rename((dir + "/handle.tmp").c_str(), (dir + "/handle").c_str());
  CUdeviceptr own = 0;
  std::printf("open_own_handle=%d\n", static_cast<int>(cuIpcOpenMemHandle(&own, h, 0)));
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr pooled;
  CHECK(cuMemAllocAsync(&pooled, 2u << 20, s));
  CUipcMemHandle refused;
  std::printf("ipc_exported=1\nipc_of_pool_memory=%d\n", static_cast<int>(cuIpcGetMemHandle(&refused, pooled)));
  CHECK(cuMemFreeAsync(pooled, s));
  CHECK(cuStreamSynchronize(s));
  CUmemoryPool def;
  CHECK(cuDeviceGetDefaultMemPool(&def, 0));
  CHECK(cuMemPoolTrimTo(def, 0));  // nothing of the pool left to move or count
  std::fflush(stdout);
  Touch(dir + "/ready");
  if (!WaitFile(dir + "/go")) return 4;
  std::vector<unsigned char> got(kA);
  CHECK(cuMemcpyDtoH(got.data(), a, kA));
  std::printf("first_identical=%d\nopener_write_seen=%d\n",
              static_cast<int>(Half(got, false) == Half(a1, false)) + static_cast<int>(Holds(b, bb)),
              static_cast<int>(Half(got, true) == Half(w, true)));
  CHECK(cuMemcpyHtoD(a, a2.data(), kA));
  CHECK(cuCtxSynchronize());
  std::fflush(stdout);
  Touch(dir + "/written");
  if (!WaitFile(dir + "/go2")) return 4;
  CHECK(cuMemFree(a));
  CHECK(cuMemFree(b));
  std::printf("freed=1\n");
  return 0;
}

bool ReadHandle(const std::string& dir, CUipcMemHandle* h) {
  if (!WaitFile(dir + "/handle")) return false;
  FILE* f = std::fopen((dir + "/handle").c_str(), "rb");
  bool ok = f != nullptr && std::fread(h, sizeof(*h), 1, f) == 1;
  if (f != nullptr) std::fclose(f);
  return ok;
}

// What opening a copy of `h` with `len` bytes at `at` replaced by `bytes` returns.
int OpenForged(CUipcMemHandle h, size_t at, const void* bytes, size_t len) {
  std::memcpy(h.reserved + at, bytes, len);
  CUdeviceptr p = 0;
  CUresult r = cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  if (r == CUDA_SUCCESS) cuIpcCloseMemHandle(p);
  return static_cast<int>(r);
}

int Open(const std::string& dir) {
  Setup();
  CUipcMemHandle h;
  if (!ReadHandle(dir, &h)) return 5;
  size_t free_before = 0, free_after = 0, total = 0;
  CHECK(cuMemGetInfo(&free_before, &total));
  CUdeviceptr p, p2;
  CHECK(cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
  CHECK(cuMemGetInfo(&free_after, &total));
  std::printf("opener_charged_mib=%lld\n",
              (static_cast<long long>(free_before) - static_cast<long long>(free_after)) >> 20);
  CHECK(cuIpcOpenMemHandle(&p2, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
  std::printf("open_again_same=%d\n", p2 == p ? 1 : 0);
  CHECK(cuIpcCloseMemHandle(p2));  // one open left
  // Forged: a wrong secret, a wrong export id, another pid, another version (our magic each time).
  uint64_t word = 0;
  std::memcpy(&word, h.reserved + 16, 8);
  word ^= 0x5A5A5A5A5A5A5A5Aull;
  const int wrong_secret = OpenForged(h, 16, &word, 8);
  std::memcpy(&word, h.reserved + 24, 8);
  word += 1000;
  const int wrong_export = OpenForged(h, 24, &word, 8);
  const uint32_t pid = static_cast<uint32_t>(getppid());
  const int wrong_pid = OpenForged(h, 12, &pid, 4);
  const uint16_t version = 2;
  const int wrong_version = OpenForged(h, 8, &version, 2);
  std::printf("forged_secret=%d\nforged_export=%d\nforged_pid=%d\nforged_version=%d\n", wrong_secret, wrong_export,
              wrong_pid, wrong_version);
  std::fflush(stdout);
  Touch(dir + "/opened");
  const auto a1 = Pattern(kA, 0x1234567u), a2 = Pattern(kA, 0x7654321u), w = Pattern(kA, 0x0FE4E12u);
  auto say = [&](const char* key) {
    std::vector<unsigned char> got(kA);
    CHECK(cuMemcpyDtoH(got.data(), p, kA));
    std::printf("%s=%s\n", key, got == a1 ? "first" : got == a2 ? "new" : "other");
    std::fflush(stdout);
  };
  if (!WaitFile(dir + "/check1")) return 4;
  say("opener_check1");
  CHECK(cuMemcpyHtoD(p + kA / 2, w.data() + kA / 2, kA / 2));
  CHECK(cuCtxSynchronize());
  Touch(dir + "/checked1");
  if (!WaitFile(dir + "/check2")) return 4;
  say("opener_check2");
  CHECK(cuIpcCloseMemHandle(p));
  std::printf("second_close=%d\n", static_cast<int>(cuIpcCloseMemHandle(p)));
  return 0;
}

int OpenOnce(const std::string& dir) {
  Setup();
  CUipcMemHandle h;
  if (!ReadHandle(dir, &h)) return 5;
  CUdeviceptr p = 0;
  std::printf("open=%d\n", static_cast<int>(cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)));
  return 0;
}

}  // namespace ipc

int main(int argc, char** argv) {
  std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "alloc") return Alloc();
  if (cmd == "paths") return Paths();
  if (cmd == "procaddr") return ProcAddr();
  if (cmd == "hold" && argc > 2) return Hold(std::strtoull(argv[2], nullptr, 10));
  if (cmd == "launch" && argc > 2) {
    return Launch(std::atof(argv[2]), argc > 3 ? std::atoi(argv[3]) : 2000, argc > 4 ? std::atoi(argv[4]) : 0);
  }
  if (cmd == "launchloop" && argc > 2) return LaunchLoop(std::atol(argv[2]));
  if (cmd == "busy" && argc > 3) return Busy(std::strtoull(argv[2], nullptr, 10), std::atof(argv[3]));
  if (cmd == "tier" && argc > 2) return Tier(argv[2]);
  if (cmd == "tierfault" && argc > 3) return TierFault(argv[2], argv[3], argc > 4 ? std::atoi(argv[4]) : 0);
  if (cmd == "zero" && argc > 2) return Zero(argv[2], argc > 3 ? argv[3] : "pool");
  if (cmd == "pitched" && argc > 2) return Pitched(argv[2]);
  if (cmd == "pools" && argc > 2) return Pools(argv[2]);
  if (cmd == "vmm" && argc > 2) return vmm::Run(argv[2]);
  if (cmd == "graphmem" && argc > 2) return graphmem::Run(argv[2]);
  if (cmd == "suspended" && argc > 2) return Suspended(argv[2]);
  if (cmd == "ipc" && argc > 2) return ipc::Export(argv[2]);
  if (cmd == "ipcopen" && argc > 2) return ipc::Open(argv[2]);
  if (cmd == "ipcopenonce" && argc > 2) return ipc::OpenOnce(argv[2]);
  std::fprintf(stderr, "usage: limiter_probe alloc|paths|procaddr|hold MIB|launch SECONDS [KERNEL_US [GAP_US]]\n");
  return 2;
}
