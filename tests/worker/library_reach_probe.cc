// A driver-API program for the remote tests of the last entry points the CUDA libraries reach that
// were forwarded: planes of multi-planar (NV12) arrays and sparse properties (`arrays`), multicast
// objects (`multicast`) and the driver's asynchronous notifications (`notify`). Run directly on
// tests/fakecuda or through the client stub and a worker, it prints "key=value" lines the tests
// compare; `foreign` (remote runs) adds what forged names and another session's names get.
#include <cuda.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "probe_util.h"

namespace {

using tf_probe::Kernel;
using tf_probe::Setup;

template <class T>
T Forge(uint64_t v) {
  return reinterpret_cast<T>(v);
}
template <class T>
uint64_t U(T h) {
  return reinterpret_cast<uint64_t>(h);
}
int I(CUresult r) { return static_cast<int>(r); }

void PrintDesc(const char* key, CUarray a) {
  CUDA_ARRAY3D_DESCRIPTOR d;
  CHECK(cuArray3DGetDescriptor(&d, a));
  std::printf("%s=%zu:%zu:%zu:%d:%u\n", key, d.Width, d.Height, d.Depth, static_cast<int>(d.Format), d.NumChannels);
}

void PrintSparse(const char* key, const CUDA_ARRAY_SPARSE_PROPERTIES& p) {
  std::printf("%s=%u:%u:%u:%u:%llu:%u\n", key, p.tileExtent.width, p.tileExtent.height, p.tileExtent.depth,
              p.miptailFirstLevel, static_cast<unsigned long long>(p.miptailSize), p.flags);
}

// Runs fn in a forked child (a session of its own remotely) and reports its exit status.
template <class Fn>
void InChild(Fn fn) {
  std::fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    Setup();
    fn();
    std::fflush(stdout);
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  std::printf("child_status=%d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

int Arrays(bool foreign) {
  Setup();
  CUDA_ARRAY3D_DESCRIPTOR nv12 = {};
  nv12.Width = 64;
  nv12.Height = 32;
  nv12.Format = CU_AD_FORMAT_NV12;
  nv12.NumChannels = 3;
  CUarray frame;
  CHECK(cuArray3DCreate(&frame, &nv12));
  CUarray luma, chroma, luma_again;
  CHECK(cuArrayGetPlane(&luma, frame, 0));
  CHECK(cuArrayGetPlane(&chroma, frame, 1));
  CHECK(cuArrayGetPlane(&luma_again, frame, 0));
  std::printf("plane_same=%d:%d\n", luma == luma_again, luma != chroma);
  PrintDesc("plane0", luma);
  PrintDesc("plane1", chroma);
  // Data through the planes.
  std::vector<unsigned char> y(64 * 32), uv(32 * 16 * 2), y_back(y.size()), uv_back(uv.size());
  for (size_t i = 0; i < y.size(); ++i) y[i] = static_cast<unsigned char>(i * 7);
  for (size_t i = 0; i < uv.size(); ++i) uv[i] = static_cast<unsigned char>(255 - i);
  CHECK(cuMemcpyHtoA(luma, 0, y.data(), y.size()));
  CHECK(cuMemcpyHtoA(chroma, 0, uv.data(), uv.size()));
  CHECK(cuMemcpyAtoH(y_back.data(), luma, 0, y_back.size()));
  CHECK(cuMemcpyAtoH(uv_back.data(), chroma, 0, uv_back.size()));
  std::printf("plane_data=%d\n", y == y_back && uv == uv_back);
  CUarray bad = nullptr;
  std::printf("plane_bad_index=%d\n", I(cuArrayGetPlane(&bad, frame, 2)));
  CUDA_ARRAY3D_DESCRIPTOR flat = {};
  flat.Width = 64;
  flat.Height = 64;
  flat.Format = CU_AD_FORMAT_FLOAT;
  flat.NumChannels = 1;
  CUarray plain;
  CHECK(cuArray3DCreate(&plain, &flat));
  std::printf("plane_not_planar=%d\n", I(cuArrayGetPlane(&bad, plain, 0)));
  std::printf("plane_of_plane=%d\n", I(cuArrayGetPlane(&bad, luma, 0)));
  std::printf("plane_null_out=%d\n", I(cuArrayGetPlane(nullptr, frame, 0)));
  std::printf("plane_destroy=%d\n", I(cuArrayDestroy(chroma)));

  // Sparse properties.
  CUDA_ARRAY3D_DESCRIPTOR sparse = flat;
  sparse.Width = 1024;
  sparse.Height = 1024;
  sparse.Flags = CUDA_ARRAY3D_SPARSE;
  CUarray sparse_array;
  CHECK(cuArray3DCreate(&sparse_array, &sparse));
  CUmipmappedArray sparse_mipmap;
  CHECK(cuMipmappedArrayCreate(&sparse_mipmap, &sparse, 11));
  CUDA_ARRAY_SPARSE_PROPERTIES props;
  CHECK(cuArrayGetSparseProperties(&props, sparse_array));
  PrintSparse("sparse_array", props);
  CHECK(cuMipmappedArrayGetSparseProperties(&props, sparse_mipmap));
  PrintSparse("sparse_mipmap", props);
  std::printf("sparse_not_sparse=%d\n", I(cuArrayGetSparseProperties(&props, plain)));
  std::printf("sparse_null_out=%d:%d\n", I(cuArrayGetSparseProperties(nullptr, sparse_array)),
              I(cuMipmappedArrayGetSparseProperties(nullptr, sparse_mipmap)));
  std::printf("sparse_wrong_kind=%d\n",
              I(cuArrayGetSparseProperties(&props, Forge<CUarray>(U(sparse_mipmap)))));

  if (foreign) {
    std::printf("forged_plane=%d\n", I(cuArrayGetPlane(&bad, Forge<CUarray>(U(frame) ^ (1ull << 30)), 0)));
    std::printf("forged_sparse=%d:%d\n",
                I(cuArrayGetSparseProperties(&props, Forge<CUarray>(U(sparse_array) ^ (1ull << 30)))),
                I(cuMipmappedArrayGetSparseProperties(&props, Forge<CUmipmappedArray>(U(sparse_mipmap) + 1))));
    InChild([&] {
      CUarray p = nullptr;
      CUDA_ARRAY_SPARSE_PROPERTIES q;
      std::printf("other_session_plane=%d\n", I(cuArrayGetPlane(&p, frame, 0)));
      std::printf("other_session_sparse=%d:%d\n", I(cuArrayGetSparseProperties(&q, sparse_array)),
                  I(cuMipmappedArrayGetSparseProperties(&q, sparse_mipmap)));
    });
    CHECK(cuArrayGetPlane(&bad, frame, 1));
    std::printf("other_still_works=%d\n", bad == chroma);
  }

  // The planes go with their array.
  CHECK(cuArrayDestroy(frame));
  CUDA_ARRAY3D_DESCRIPTOR d;
  std::printf("stale_plane=%d:%d:%d\n", I(cuArray3DGetDescriptor(&d, luma)),
              I(cuMemcpyHtoA(chroma, 0, uv.data(), 16)), I(cuArrayGetPlane(&bad, frame, 0)));
  CHECK(cuMipmappedArrayDestroy(sparse_mipmap));
  std::printf("stale_sparse=%d\n", I(cuMipmappedArrayGetSparseProperties(&props, sparse_mipmap)));
  CHECK(cuArrayDestroy(sparse_array));
  CHECK(cuArrayDestroy(plain));
  std::printf("done=1\n");
  return 0;
}

int Multicast(bool foreign) {
  Setup();
  CUmulticastObjectProp prop = {};
  prop.numDevices = 1;
  prop.size = 4u << 20;
  size_t gmin = 0, grec = 0;
  CHECK(cuMulticastGetGranularity(&gmin, &prop, CU_MULTICAST_GRANULARITY_MINIMUM));
  CHECK(cuMulticastGetGranularity(&grec, &prop, CU_MULTICAST_GRANULARITY_RECOMMENDED));
  std::printf("mc_granularity=%zu:%zu\n", gmin, grec);
  std::printf("mc_granularity_bad=%d:%d\n",
              I(cuMulticastGetGranularity(&gmin, &prop, static_cast<CUmulticastGranularity_flags>(5))),
              I(cuMulticastGetGranularity(nullptr, &prop, CU_MULTICAST_GRANULARITY_MINIMUM)));
  CUmemGenericAllocationHandle mc = 0, bad = 0;
  CHECK(cuMulticastCreate(&mc, &prop));
  CUmulticastObjectProp flagged = prop;
  flagged.flags = 1;
  CUmulticastObjectProp empty = prop;
  empty.size = 0;
  std::printf("mc_create_bad=%d:%d:%d\n", I(cuMulticastCreate(nullptr, &prop)),
              I(cuMulticastCreate(&bad, &flagged)), I(cuMulticastCreate(&bad, &empty)));
  CUmemAllocationProp mp = {};
  mp.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  mp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  mp.location.id = 0;
  CUmemGenericAllocationHandle mem;
  CHECK(cuMemCreate(&mem, 4u << 20, &mp, 0));
  std::printf("mc_bind_early=%d\n", I(cuMulticastBindMem(mc, 0, mem, 0, 2u << 20, 0)));
  CHECK(cuMulticastAddDevice(mc, 0));
  std::printf("mc_add_again=%d:%d\n", I(cuMulticastAddDevice(mc, 0)), I(cuMulticastAddDevice(mc, 99)));
  CHECK(cuMulticastBindMem(mc, 0, mem, 0, 2u << 20, 0));
  std::printf("mc_bind_bad=%d:%d:%d:%d\n", I(cuMulticastBindMem(mc, 0, mem, 0, 2u << 20, 0)),
              I(cuMulticastBindMem(mc, 2u << 20, mem, 0, 2u << 20, 1)),
              I(cuMulticastBindMem(mc, 4u << 20, mem, 0, 2u << 20, 0)),
              I(cuMulticastBindMem(mc, 2u << 20, mem, 4u << 20, 2u << 20, 0)));
  std::printf("mc_wrong_kind=%d:%d\n", I(cuMulticastAddDevice(mem, 0)),
              I(cuMulticastBindMem(mc, 2u << 20, mc, 0, 2u << 20, 0)));
  CHECK(cuMulticastUnbind(mc, 0, 0, 2u << 20));
  std::printf("mc_unbind_again=%d:%d\n", I(cuMulticastUnbind(mc, 0, 0, 2u << 20)),
              I(cuMulticastUnbind(mc, 99, 0, 2u << 20)));
  // A mapped range of the same memory, bound by address.
  CUdeviceptr va = 0;
  CHECK(cuMemAddressReserve(&va, 4u << 20, 0, 0, 0));
  CHECK(cuMemMap(va, 4u << 20, 0, mem, 0));
  CUmemAccessDesc access = {};
  access.location = mp.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CHECK(cuMemSetAccess(va, 4u << 20, &access, 1));
  CHECK(cuMulticastBindAddr(mc, 2u << 20, va, 2u << 20, 0));
  std::printf("mc_bind_addr_bad=%d:%d\n", I(cuMulticastBindAddr(mc, 0, va + (8u << 20), 2u << 20, 0)),
              I(cuMulticastBindAddr(mc, 0, va, 2u << 20, 3)));
  CHECK(cuMulticastUnbind(mc, 0, 2u << 20, 2u << 20));
  std::printf("mc_bound_ok=1\n");

  CUmemGenericAllocationHandle mc2;
  CHECK(cuMulticastCreate(&mc2, &prop));
  if (foreign) {
    std::printf("forged_mc=%d\n", I(cuMulticastAddDevice(mc2 ^ (1ull << 30), 0)));
    InChild([&] {
      std::printf("other_session_mc=%d:%d\n", I(cuMulticastAddDevice(mc2, 0)),
                  I(cuMulticastUnbind(mc, 0, 0, 2u << 20)));
    });
  }
  CHECK(cuMulticastAddDevice(mc2, 0));
  std::printf("other_still_works=1\n");
  CHECK(cuMemRelease(mc));
  std::printf("stale_mc=%d:%d\n", I(cuMulticastAddDevice(mc, 0)), I(cuMemRelease(mc)));
  CHECK(cuMemUnmap(va, 4u << 20));
  CHECK(cuMemAddressFree(va, 4u << 20));
  CHECK(cuMemRelease(mem));
  std::printf("done=1\n");  // mc2 is left to the session's end
  return 0;
}

struct Seen {
  std::atomic<int> calls{0};
  std::atomic<unsigned long long> bytes{0};
  std::atomic<int> type{0};
  std::atomic<uint64_t> handle{0};
  std::atomic<int> other_thread{0};
  std::atomic<int> nested{0};
};
pthread_t g_main;

void OnNotification(CUasyncNotificationInfo* info, void* user, CUasyncCallbackHandle h) {
  auto* s = static_cast<Seen*>(user);
  s->type = static_cast<int>(info->type);
  s->bytes = info->info.overBudget.bytesOverBudget;
  s->handle = U(h);
  s->other_thread = pthread_equal(pthread_self(), g_main) ? 0 : 1;
  CUasyncCallbackHandle nested = nullptr;
  s->nested = I(cuDeviceRegisterAsyncNotification(0, &OnNotification, user, &nested));
  s->calls.fetch_add(1);
}

// Waits (at most 5 s) until s has seen n calls.
bool WaitCalls(const Seen& s, int n) {
  for (int i = 0; i < 500 && s.calls.load() < n; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return s.calls.load() >= n;
}

void OverBudget(CUfunction notify, unsigned long long bytes) {
  void* params[] = {&bytes};
  CHECK(cuLaunchKernel(notify, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr));
  CHECK(cuCtxSynchronize());
}

int Notify(bool foreign) {
  g_main = pthread_self();
  Setup();
  CUfunction notify = Kernel("notify_over_budget");
  Seen a, b, c;
  CUasyncCallbackHandle ha, hb, hc, bad = nullptr;
  CHECK(cuDeviceRegisterAsyncNotification(0, &OnNotification, &a, &ha));
  CHECK(cuDeviceRegisterAsyncNotification(0, &OnNotification, &b, &hb));
  std::printf("register_bad=%d:%d:%d\n", I(cuDeviceRegisterAsyncNotification(0, nullptr, &a, &bad)),
              I(cuDeviceRegisterAsyncNotification(0, &OnNotification, &a, nullptr)),
              I(cuDeviceRegisterAsyncNotification(99, &OnNotification, &a, &bad)));
  OverBudget(notify, 12345);
  std::printf("notified=%d:%d\n", WaitCalls(a, 1), WaitCalls(b, 1));
  std::printf("notification=%d:%llu:%d:%d\n", a.type.load(), a.bytes.load(), a.handle.load() == U(ha),
              b.handle.load() == U(hb));
  std::printf("notification_thread=%d:%d\n", a.other_thread.load(), b.other_thread.load());
  std::printf("nested_register=%d\n", a.nested.load());
  CHECK(cuDeviceUnregisterAsyncNotification(0, hb));
  OverBudget(notify, 777);
  WaitCalls(a, 2);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  std::printf("after_unregister=%d:%d:%llu\n", a.calls.load(), b.calls.load(), a.bytes.load());
  std::printf("unregister_bad=%d:%d:%d\n", I(cuDeviceUnregisterAsyncNotification(0, hb)),
              I(cuDeviceUnregisterAsyncNotification(99, ha)),
              I(cuDeviceUnregisterAsyncNotification(0, Forge<CUasyncCallbackHandle>(U(ha) ^ (1ull << 30)))));
  if (foreign) {
    InChild([&] {
      std::printf("other_session_unregister=%d\n", I(cuDeviceUnregisterAsyncNotification(0, ha)));
    });
    OverBudget(notify, 5);
    std::printf("other_still_works=%d\n", WaitCalls(a, 3));
  }
  CHECK(cuDeviceUnregisterAsyncNotification(0, ha));
  CHECK(cuDeviceRegisterAsyncNotification(0, &OnNotification, &c, &hc));  // left to the session's end
  std::printf("done=1\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const bool foreign = argc >= 3 && !strcmp(argv[2], "foreign");
  if (argc >= 2 && !strcmp(argv[1], "arrays")) return Arrays(foreign);
  if (argc >= 2 && !strcmp(argv[1], "multicast")) return Multicast(foreign);
  if (argc >= 2 && !strcmp(argv[1], "notify")) return Notify(foreign);
  std::fprintf(stderr, "usage: library_reach_probe arrays|multicast|notify [foreign]\n");
  return 2;
}
