// A driver-API program for the remote tests of green contexts and device resources: split the
// device's SMs, make a green context of one group, run work on its streams and its context, record
// and wait events across the green and the primary context, destroy it. Run directly on
// tests/fakecuda or through the client stub and a worker, it prints "key=value" lines the tests
// compare. `green_probe green foreign` (remote runs) adds what forged, altered and another
// session's handles and resources get.
#include <cuda.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "probe_util.h"

namespace {

using tf_probe::Fill;
using tf_probe::Setup;

template <class T>
T Forge(uint64_t v) {
  return reinterpret_cast<T>(v);
}
template <class T>
uint64_t U(T h) {
  return reinterpret_cast<uint64_t>(h);
}

int Green(bool foreign) {
  CUcontext primary = Setup();
  CUdevResource dev_res;
  CHECK(cuDeviceGetDevResource(0, &dev_res, CU_DEV_RESOURCE_TYPE_SM));
  std::printf("device_sms=%u:%u:%u\n", dev_res.sm.smCount, dev_res.sm.minSmPartitionSize,
              dev_res.sm.smCoscheduledAlignment);
  unsigned possible = 0;
  CHECK(cuDevSmResourceSplitByCount(nullptr, &possible, &dev_res, nullptr, 0, 16));
  std::printf("split_query=%u\n", possible);
  CUdevResource groups[2], rest;
  unsigned n = 2;
  CHECK(cuDevSmResourceSplitByCount(groups, &n, &dev_res, &rest, 0, 16));
  std::printf("split=%u:%u:%u:%u\n", n, groups[0].sm.smCount, groups[1].sm.smCount, rest.sm.smCount);
  CUdevResourceDesc desc;
  CHECK(cuDevResourceGenerateDesc(&desc, &groups[0], 1));
  CUgreenCtx green;
  CHECK(cuGreenCtxCreate(&green, desc, 0, CU_GREEN_CTX_DEFAULT_STREAM));
  CUdevResource got;
  CHECK(cuGreenCtxGetDevResource(green, &got, CU_DEV_RESOURCE_TYPE_SM));
  CUcontext gctx;
  CHECK(cuCtxFromGreenCtx(&gctx, green));
  CUcontext gctx2;
  CHECK(cuCtxFromGreenCtx(&gctx2, green));
  CUdevResource ctx_res, primary_res;
  CHECK(cuCtxGetDevResource(gctx, &ctx_res, CU_DEV_RESOURCE_TYPE_SM));
  CHECK(cuCtxGetDevResource(primary, &primary_res, CU_DEV_RESOURCE_TYPE_SM));
  std::printf("green_sms=%u:%u:%u\n", got.sm.smCount, ctx_res.sm.smCount, primary_res.sm.smCount);
  std::printf("green_ctx=%d:%d\n", gctx != primary, gctx == gctx2);

  // Streams of the green context, and the context's own work.
  CUstream gs, ps;
  CHECK(cuGreenCtxStreamCreate(&gs, green, CU_STREAM_NON_BLOCKING, 0));
  CHECK(cuStreamCreate(&ps, CU_STREAM_NON_BLOCKING));
  CUgreenCtx of_gs = nullptr, of_ps = Forge<CUgreenCtx>(1);
  CHECK(cuStreamGetGreenCtx(gs, &of_gs));
  CHECK(cuStreamGetGreenCtx(ps, &of_ps));
  CUcontext v2ctx = nullptr;
  CUgreenCtx v2green = nullptr;
  CHECK(cuStreamGetCtx_v2(gs, &v2ctx, &v2green));
  std::printf("stream_green=%d:%d:%d\n", of_gs == green, of_ps == nullptr, v2green == green);
  unsigned long long id1 = 0, id2 = 0, id_cur = 0;
  CHECK(cuGreenCtxGetId(green, &id1));
  CHECK(cuGreenCtxGetId(green, &id2));

  CHECK(cuCtxPushCurrent(gctx));
  CHECK(cuGreenCtxGetId(nullptr, &id_cur));
  std::printf("green_id=%d:%d\n", id1 == id2, id1 == id_cur);
  CUmodule mod;
  CHECK(cuModuleLoadData(&mod, "fakecuda:builtin"));
  CUfunction fill;
  CHECK(cuModuleGetFunction(&fill, mod, "fill_u32"));
  CUdeviceptr buf;
  CHECK(cuMemAlloc(&buf, 64 * sizeof(uint32_t)));
  Fill(fill, buf, 11, 32, gs);
  CUevent from_green, from_primary;
  CHECK(cuEventCreate(&from_green, CU_EVENT_DISABLE_TIMING));
  CHECK(cuEventCreate(&from_primary, CU_EVENT_DISABLE_TIMING));
  CHECK(cuGreenCtxRecordEvent(green, from_green));
  CUstream gs_default;  // a stream made while the green context is current belongs to it too
  CHECK(cuStreamCreate(&gs_default, CU_STREAM_NON_BLOCKING));
  CUgreenCtx of_default = nullptr;
  CHECK(cuStreamGetGreenCtx(gs_default, &of_default));
  unsigned flags = 0;
  CHECK(cuCtxSetFlags(CU_CTX_SCHED_YIELD));
  // A flag outside CU_CTX_FLAGS_MASK: CUDA_ERROR_INVALID_VALUE, and the flags stay.
  std::printf("ctx_flags_bad=%d\n", static_cast<int>(cuCtxSetFlags(0x100)));
  CHECK(cuCtxGetFlags(&flags));
  std::printf("green_stream_default=%d\n", of_default == green);
  std::printf("green_ctx_flags=%u\n", flags);
  CUcontext popped;
  CHECK(cuCtxPopCurrent(&popped));

  // The primary context waits for the green context's work, then the green one for the primary's.
  CUfunction pfill = tf_probe::Kernel("fill_u32");
  CHECK(cuStreamWaitEvent(ps, from_green, 0));
  CUdeviceptr pbuf;
  CHECK(cuMemAlloc(&pbuf, 64 * sizeof(uint32_t)));
  CHECK(cuMemcpyDtoDAsync(pbuf, buf, 32 * sizeof(uint32_t), ps));
  Fill(pfill, pbuf + 32 * sizeof(uint32_t), 22, 32, ps);
  CHECK(cuEventRecord(from_primary, ps));
  CHECK(cuGreenCtxWaitEvent(green, from_primary));
  CHECK(cuCtxPushCurrent(gctx));
  CHECK(cuMemcpyDtoDAsync(buf, pbuf, 64 * sizeof(uint32_t), gs));
  CHECK(cuStreamSynchronize(gs));
  uint32_t host[64] = {};
  CHECK(cuMemcpyDtoH(host, buf, sizeof(host)));
  CHECK(cuCtxPopCurrent(&popped));
  uint64_t sum = 0;
  for (uint32_t v : host) sum += v;
  std::printf("cross_events_sum=%llu\n", static_cast<unsigned long long>(sum));

  // Bad input fails that call only.
  CUdevResource altered = groups[1];
  altered._internal_padding[0] ^= 0xff;
  CUdevResourceDesc bad_desc = nullptr;
  std::printf("altered_resource=%d\n", static_cast<int>(cuDevResourceGenerateDesc(&bad_desc, &altered, 1)));
  unsigned m = 1;
  CUdevResource again;
  std::printf("split_again=%d\n",
              static_cast<int>(cuDevSmResourceSplitByCount(&again, &m, &groups[1], nullptr, 0, 8)));
  CUgreenCtx bad_green = nullptr;
  std::printf("green_flags=%d:%d\n", static_cast<int>(cuGreenCtxCreate(&bad_green, desc, 0, 0)),
              static_cast<int>(cuGreenCtxCreate(&bad_green, desc, 0, 0x2)));
  CUstream bad_stream = nullptr;
  std::printf("green_stream_flags=%d\n", static_cast<int>(cuGreenCtxStreamCreate(&bad_stream, green, 0, 0)));
  std::printf("bad_type=%d\n", static_cast<int>(cuDeviceGetDevResource(0, &got, CU_DEV_RESOURCE_TYPE_INVALID)));
  std::printf("bad_device=%d\n", static_cast<int>(cuDeviceGetDevResource(7, &got, CU_DEV_RESOURCE_TYPE_SM)));

  // Destroyed: the green context, its context and its streams go; the primary context goes on.
  CUdevResourceDesc desc2;
  CHECK(cuDevResourceGenerateDesc(&desc2, &groups[1], 1));
  CUgreenCtx other;
  CHECK(cuGreenCtxCreate(&other, desc2, 0, CU_GREEN_CTX_DEFAULT_STREAM));
  CHECK(cuGreenCtxDestroy(green));
  unsigned long long id = 0;
  std::printf("stale_green=%d:%d:%d\n", static_cast<int>(cuGreenCtxGetId(green, &id)),
              static_cast<int>(cuCtxFromGreenCtx(&gctx2, green)), static_cast<int>(cuGreenCtxDestroy(green)));
  std::printf("stale_green_stream=%d:%d\n", static_cast<int>(cuStreamSynchronize(gs)),
              static_cast<int>(cuStreamSynchronize(gs_default)));
  std::printf("stale_green_context=%d\n", static_cast<int>(cuCtxPushCurrent(gctx)));
  CHECK(cuCtxSetCurrent(primary));
  Fill(pfill, pbuf, 5, 64, ps);
  CHECK(cuStreamSynchronize(ps));
  CHECK(cuMemcpyDtoH(host, pbuf, sizeof(host)));
  std::printf("primary_still_works=%d\n", host[0] == 5 && host[63] == 5);
  std::fflush(stdout);

  if (foreign) {
    std::printf("forged_green=%d\n", static_cast<int>(cuGreenCtxGetId(Forge<CUgreenCtx>(U(other) ^ (1ull << 30)), &id)));
    std::printf("forged_desc=%d\n", static_cast<int>(cuGreenCtxCreate(&bad_green, Forge<CUdevResourceDesc>(U(desc2) + 1), 0,
                                                                      CU_GREEN_CTX_DEFAULT_STREAM)));
    std::printf("kind_stream_as_green=%d\n", static_cast<int>(cuGreenCtxGetId(Forge<CUgreenCtx>(U(ps)), &id)));
    std::fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
      Setup();
      CUcontext c = nullptr;
      CUdevResource mine;
      CUdevResourceDesc d = nullptr;
      std::printf("other_session_green=%d:%d\n", static_cast<int>(cuGreenCtxGetId(other, &id)),
                  static_cast<int>(cuCtxFromGreenCtx(&c, other)));
      std::printf("other_session_desc=%d\n",
                  static_cast<int>(cuGreenCtxCreate(&bad_green, desc2, 0, CU_GREEN_CTX_DEFAULT_STREAM)));
      std::printf("other_session_resource=%d\n", static_cast<int>(cuDevResourceGenerateDesc(&d, &groups[0], 1)));
      std::printf("other_session_own=%d\n",
                  static_cast<int>(cuDeviceGetDevResource(0, &mine, CU_DEV_RESOURCE_TYPE_SM)));
      std::fflush(stdout);
      _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    std::printf("child_status=%d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    CHECK(cuGreenCtxGetId(other, &id));
    std::printf("other_still_works=1\n");
  }
  CHECK(cuGreenCtxDestroy(other));
  std::printf("done=1\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && !strcmp(argv[1], "green")) return Green(argc >= 3 && !strcmp(argv[2], "foreign"));
  std::fprintf(stderr, "usage: green_probe green [foreign]\n");
  return 2;
}
