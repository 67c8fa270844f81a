// Every kernel-submission entry point goes through the compute gate of the process's vGPU:
// plain, extended (cuLaunchKernelEx), cooperative, legacy grid launches and CUDA graphs, in
// their legacy-stream and per-thread-stream (_ptsz) forms.
#include "limiter/compute_gate.h"
#include "limiter/compute_governor.h"
#include "limiter/export_support.h"
#include "limiter/tiering.h"

namespace tf::limiter {
namespace {

template <typename Call>
inline CUresult GovernedLaunch(CUstream stream, bool per_thread, Call&& call);

// Tiering: the launch waits for the tenant's memory to be resident, then is governed as usual.
template <typename Call>
inline CUresult SlowLaunch(CUstream stream, bool per_thread, Call&& call) {
  if (g_tiering) return WithResidentMemory([&] { return GovernedLaunch(stream, per_thread, call); });
  return GovernedLaunch(stream, per_thread, call);
}

template <typename Call>
inline CUresult GovernedLaunch(CUstream stream, bool per_thread, Call&& call) {
  ComputeGovernor& governor = ComputeGovernor::Instance();
  if (governor.governed()) {
    ComputeGovernor::Track* t = governor.Before(stream, per_thread);
    CUresult r = call();
    governor.After(t, r);
    return r;
  }
  ComputeGate& gate = ComputeGate::Instance();
  if (!gate.throttled()) return call();
  gate.Enter(stream, per_thread);
  CUresult r = call();
  gate.Exit();
  return r;
}

template <typename Call>
inline CUresult Gated(CUstream stream, bool per_thread, Call&& call) {
  if (__builtin_expect(!g_launch_governed, 1)) return call();
  return SlowLaunch(stream, per_thread, call);
}

}  // namespace

CUresult Hook_cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                             unsigned int bx, unsigned int by, unsigned int bz,
                             unsigned int sharedMemBytes, CUstream hStream, void** kernelParams,
                             void** extra) {
  TF_REAL_OR_MISSING(cuLaunchKernel)
  return Gated(hStream, false, [&] {
    return fn(f, gx, gy, gz, bx, by, bz, sharedMemBytes, hStream, kernelParams, extra);
  });
}

CUresult Hook_cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                  unsigned int bx, unsigned int by, unsigned int bz,
                                  unsigned int sharedMemBytes, CUstream hStream, void** kernelParams,
                                  void** extra) {
  TF_REAL_OR_MISSING(cuLaunchKernel_ptsz)
  return Gated(hStream, true, [&] {
    return fn(f, gx, gy, gz, bx, by, bz, sharedMemBytes, hStream, kernelParams, extra);
  });
}

CUresult Hook_cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void** kernelParams,
                               void** extra) {
  TF_REAL_OR_MISSING(cuLaunchKernelEx)
  CUstream s = config ? config->hStream : nullptr;
  return Gated(s, false, [&] { return fn(config, f, kernelParams, extra); });
}

CUresult Hook_cuLaunchKernelEx_ptsz(const CUlaunchConfig* config, CUfunction f, void** kernelParams,
                                    void** extra) {
  TF_REAL_OR_MISSING(cuLaunchKernelEx_ptsz)
  CUstream s = config ? config->hStream : nullptr;
  return Gated(s, true, [&] { return fn(config, f, kernelParams, extra); });
}

CUresult Hook_cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy,
                                        unsigned int gz, unsigned int bx, unsigned int by,
                                        unsigned int bz, unsigned int sharedMemBytes,
                                        CUstream hStream, void** kernelParams) {
  TF_REAL_OR_MISSING(cuLaunchCooperativeKernel)
  return Gated(hStream, false, [&] {
    return fn(f, gx, gy, gz, bx, by, bz, sharedMemBytes, hStream, kernelParams);
  });
}

CUresult Hook_cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy,
                                             unsigned int gz, unsigned int bx, unsigned int by,
                                             unsigned int bz, unsigned int sharedMemBytes,
                                             CUstream hStream, void** kernelParams) {
  TF_REAL_OR_MISSING(cuLaunchCooperativeKernel_ptsz)
  return Gated(hStream, true, [&] {
    return fn(f, gx, gy, gz, bx, by, bz, sharedMemBytes, hStream, kernelParams);
  });
}

CUresult Hook_cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS* launchParamsList,
                                                   unsigned int numDevices, unsigned int flags) {
  TF_REAL_OR_MISSING(cuLaunchCooperativeKernelMultiDevice)
  CUstream s = (launchParamsList && numDevices) ? launchParamsList[0].hStream : nullptr;
  return Gated(s, false, [&] { return fn(launchParamsList, numDevices, flags); });
}

CUresult Hook_cuLaunch(CUfunction f) {
  TF_REAL_OR_MISSING(cuLaunch)
  return Gated(nullptr, false, [&] { return fn(f); });
}

CUresult Hook_cuLaunchGrid(CUfunction f, int grid_width, int grid_height) {
  TF_REAL_OR_MISSING(cuLaunchGrid)
  return Gated(nullptr, false, [&] { return fn(f, grid_width, grid_height); });
}

CUresult Hook_cuLaunchGridAsync(CUfunction f, int grid_width, int grid_height, CUstream hStream) {
  TF_REAL_OR_MISSING(cuLaunchGridAsync)
  return Gated(hStream, false, [&] { return fn(f, grid_width, grid_height, hStream); });
}

CUresult Hook_cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
  TF_REAL_OR_MISSING(cuGraphLaunch)
  return Gated(hStream, false, [&] { return fn(hGraphExec, hStream); });
}

CUresult Hook_cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
  TF_REAL_OR_MISSING(cuGraphLaunch_ptsz)
  return Gated(hStream, true, [&] { return fn(hGraphExec, hStream); });
}

// ---- destruction of streams and contexts: close the compute lease first ----

#define TF_QUIESCED(name, stream, context, ...)                                        \
  TF_REAL_OR_MISSING(name)                                                             \
  if (ComputeGate::Instance().throttled()) ComputeGate::Instance().Quiesce(context);   \
  if (ComputeGovernor::Instance().governed()) ComputeGovernor::Instance().Forget(stream, context); \
  return fn(__VA_ARGS__);

CUresult Hook_cuStreamDestroy(CUstream hStream) { TF_QUIESCED(cuStreamDestroy, hStream, false, hStream) }
CUresult Hook_cuStreamDestroy_v2(CUstream hStream) {
  TF_QUIESCED(cuStreamDestroy_v2, hStream, false, hStream)
}
CUresult Hook_cuCtxDestroy(CUcontext ctx) { TF_QUIESCED(cuCtxDestroy, nullptr, true, ctx) }
CUresult Hook_cuCtxDestroy_v2(CUcontext ctx) { TF_QUIESCED(cuCtxDestroy_v2, nullptr, true, ctx) }
CUresult Hook_cuDevicePrimaryCtxRelease(CUdevice dev) {
  TF_QUIESCED(cuDevicePrimaryCtxRelease, nullptr, true, dev)
}
CUresult Hook_cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  TF_QUIESCED(cuDevicePrimaryCtxRelease_v2, nullptr, true, dev)
}
CUresult Hook_cuDevicePrimaryCtxReset(CUdevice dev) {
  TF_QUIESCED(cuDevicePrimaryCtxReset, nullptr, true, dev)
}
CUresult Hook_cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  TF_QUIESCED(cuDevicePrimaryCtxReset_v2, nullptr, true, dev)
}
#undef TF_QUIESCED

// ---- stream capture: the governor stops querying streams while a capture begins or runs ----

namespace {
template <typename Call>
CUresult CaptureBegin(Call&& call) {
  ComputeGovernor& g = ComputeGovernor::Instance();
  if (!g.governed() && !g_tiering) return call();
  if (g_tiering) {
    // No swap-out starts from here on, and a swapped tenant is restored before the capture starts:
    // a restore inside it would be calls a global-mode capture forbids.
    g_tier_captures.fetch_add(1, std::memory_order_acq_rel);
    CUresult w = TierWait();
    if (w != CUDA_SUCCESS) {
      g_tier_captures.fetch_sub(1, std::memory_order_acq_rel);
      return w;
    }
  }
  if (g.governed()) g.CaptureBegins();
  CUresult r = call();
  if (r != CUDA_SUCCESS) {
    if (g.governed()) g.CaptureEnds();
    if (g_tiering) g_tier_captures.fetch_sub(1, std::memory_order_acq_rel);
  }
  return r;
}
template <typename Call>
CUresult CaptureEnd(Call&& call) {
  ComputeGovernor& g = ComputeGovernor::Instance();
  if (!g.governed() && !g_tiering) return call();
  CUresult r = call();
  // The capture is over whatever the result (an invalidated capture ends here too), unless the
  // stream was not capturing at all.
  if (r != CUDA_ERROR_ILLEGAL_STATE && r != CUDA_ERROR_INVALID_HANDLE && r != CUDA_ERROR_INVALID_VALUE) {
    if (g.governed()) g.CaptureEnds();
    if (g_tiering && g_tier_captures.fetch_sub(1, std::memory_order_acq_rel) <= 0) {
      g_tier_captures.store(0, std::memory_order_release);
    }
  }
  return r;
}
}  // namespace

CUresult Hook_cuStreamBeginCapture(CUstream hStream) {
  TF_REAL_OR_MISSING(cuStreamBeginCapture)
  return CaptureBegin([&] { return fn(hStream); });
}
CUresult Hook_cuStreamBeginCapture_ptsz(CUstream hStream) {
  TF_REAL_OR_MISSING(cuStreamBeginCapture_ptsz)
  return CaptureBegin([&] { return fn(hStream); });
}
CUresult Hook_cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
  TF_REAL_OR_MISSING(cuStreamBeginCapture_v2)
  return CaptureBegin([&] { return fn(hStream, mode); });
}
CUresult Hook_cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode) {
  TF_REAL_OR_MISSING(cuStreamBeginCapture_v2_ptsz)
  return CaptureBegin([&] { return fn(hStream, mode); });
}
CUresult Hook_cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph, const CUgraphNode* dependencies,
                                          const CUgraphEdgeData* dependencyData, size_t numDependencies,
                                          CUstreamCaptureMode mode) {
  TF_REAL_OR_MISSING(cuStreamBeginCaptureToGraph)
  return CaptureBegin([&] { return fn(hStream, hGraph, dependencies, dependencyData, numDependencies, mode); });
}
CUresult Hook_cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph,
                                               const CUgraphNode* dependencies,
                                               const CUgraphEdgeData* dependencyData,
                                               size_t numDependencies, CUstreamCaptureMode mode) {
  TF_REAL_OR_MISSING(cuStreamBeginCaptureToGraph_ptsz)
  return CaptureBegin([&] { return fn(hStream, hGraph, dependencies, dependencyData, numDependencies, mode); });
}
CUresult Hook_cuStreamEndCapture(CUstream hStream, CUgraph* phGraph) {
  TF_REAL_OR_MISSING(cuStreamEndCapture)
  return CaptureEnd([&] { return fn(hStream, phGraph); });
}
CUresult Hook_cuStreamEndCapture_ptsz(CUstream hStream, CUgraph* phGraph) {
  TF_REAL_OR_MISSING(cuStreamEndCapture_ptsz)
  return CaptureEnd([&] { return fn(hStream, phGraph); });
}

}  // namespace tf::limiter
