// Kernel launches (api/remote_surface.tsv, hand:launch), with a launch configuration's attributes
// for cuLaunchKernelEx: the arguments travel by the layout the worker described with the function,
// fire-and-forget.
#include <atomic>
#include <cstring>

#include "client/client_internal.h"
#include "client/thread_scratch.h"
#include "tf_client_impl.h"

namespace tf::client {
namespace {

using driver::Fn;
using remote::Op;
using transport::Writer;

CUresult Launch(Fn fn, CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                unsigned by, unsigned bz, unsigned shmem, CUstream stream, void** params,
                void** extra) {
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (gx == 0 || gy == 0 || gz == 0 || bx == 0 || by == 0 || bz == 0) return CUDA_ERROR_INVALID_VALUE;
  if (params != nullptr && extra != nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  Session* s = l.session();
  auto it = s->functions.find(H(f));
  if (it == s->functions.end()) return CUDA_ERROR_INVALID_HANDLE;
  uint8_t* buf = ThreadScratch(Scratch::kLaunch);
  if (buf == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  Writer w(buf, ScratchBytes(Scratch::kLaunch));
  w.U64(H(f));
  w.U32(gx);
  w.U32(gy);
  w.U32(gz);
  w.U32(bx);
  w.U32(by);
  w.U32(bz);
  w.U32(shmem);
  w.U64(H(stream));
  MirrorKernelPointers(s, it->second, params);
  if (CUresult r = WriteLaunchArgs(it->second, params, extra, w); r != CUDA_SUCCESS) return r;
  if (!w.ok()) return CUDA_ERROR_INVALID_VALUE;
  return SendAsync(s, Op(fn), w);
}


CUresult LaunchEx(Fn fn, const CUlaunchConfig* config, CUfunction f, void** params, void** extra) {
  if (config == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (config->gridDimX == 0 || config->gridDimY == 0 || config->gridDimZ == 0 ||
      config->blockDimX == 0 || config->blockDimY == 0 || config->blockDimZ == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (config->numAttrs > remote::kMaxLaunchAttributes ||
      (config->numAttrs > 0 && config->attrs == nullptr)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  TF_LOCK(l);
  TF_CTX(l);
  Session* s = l.session();
  auto it = s->functions.find(H(f));
  if (it == s->functions.end()) return CUDA_ERROR_INVALID_HANDLE;
  uint8_t* buf = ThreadScratch(Scratch::kLaunchEx);
  if (buf == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  Writer w(buf, ScratchBytes(Scratch::kLaunchEx));
  w.U64(H(f));
  WriteLaunchGeometry(config, w);
  for (unsigned i = 0; i < config->numAttrs; ++i) {
    const CUlaunchAttribute& a = config->attrs[i];
    const uint32_t id = static_cast<uint32_t>(a.id);
    w.U32(id);
    if (id == CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT) {
      w.U64(H(a.value.programmaticEvent.event));
      w.I32(a.value.programmaticEvent.flags);
      w.I32(a.value.programmaticEvent.triggerAtBlockStart);
    } else if (id == CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT) {
      w.U64(H(a.value.launchCompletionEvent.event));
      w.I32(a.value.launchCompletionEvent.flags);
      w.I32(0);
    } else if (id == CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW) {
      const CUaccessPolicyWindow& apw = a.value.accessPolicyWindow;
      uint32_t ratio;
      memcpy(&ratio, &apw.hitRatio, sizeof(ratio));
      w.U64(H(apw.base_ptr));
      w.U64(apw.num_bytes);
      w.U32(ratio);
      w.U32(static_cast<uint32_t>(apw.hitProp));
      w.U32(static_cast<uint32_t>(apw.missProp));
    } else if (remote::IsPlainLaunchAttribute(id)) {
      static_assert(sizeof(a.value) == 64, "CUlaunchAttributeValue is 64 bytes");
      w.Bytes(&a.value, sizeof(a.value));
    } else {
      return Unsupported(fn);  // device-updatable graph nodes and attributes newer than us
    }
  }
  MirrorKernelPointers(s, it->second, params);
  if (CUresult r = WriteLaunchArgs(it->second, params, extra, w); r != CUDA_SUCCESS) return r;
  if (!w.ok()) return CUDA_ERROR_INVALID_VALUE;
  return SendAsync(s, Op(fn), w);
}

}  // namespace

CUresult WriteLaunchArgs(const FunctionInfo& fi, void** params, void** extra, Writer& w) {
  if (params != nullptr && extra != nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (extra != nullptr) {
    const void* buffer = nullptr;
    size_t size = 0;
    for (int i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
      if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) buffer = extra[i + 1];
      else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE) memcpy(&size, extra[i + 1], sizeof(size));
      else return CUDA_ERROR_INVALID_VALUE;
    }
    if (buffer == nullptr || size > remote::kMaxKernelParamBytes) return CUDA_ERROR_INVALID_VALUE;
    w.U32(remote::kLaunchExtraBuffer);
    w.Blob(buffer, static_cast<uint32_t>(size));
  } else if (!fi.layout_known) {
    if (params != nullptr) {
      static std::atomic<bool> logged{false};
      if (!logged.exchange(true)) {
        ClientLog("cuLaunchKernel: the worker's driver does not describe this kernel's parameters "
                  "(cuFuncGetParamInfo): cannot forward kernelParams");
      }
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    w.U32(remote::kLaunchNoParams);
  } else {
    if (params == nullptr && !fi.sizes.empty()) return CUDA_ERROR_INVALID_VALUE;
    w.U32(remote::kLaunchParams);
    w.U32(static_cast<uint32_t>(fi.sizes.size()));
    for (size_t i = 0; i < fi.sizes.size(); ++i) w.Blob(params[i], static_cast<uint32_t>(fi.sizes[i]));
  }
  return w.ok() ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult Impl_cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                             unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
                             CUstream stream, void** params, void** extra) {
  return Launch(Fn::cuLaunchKernel, f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra);
}
CUresult Impl_cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                  unsigned int bx, unsigned int by, unsigned int bz,
                                  unsigned int shmem, CUstream stream, void** params, void** extra) {
  return Launch(Fn::cuLaunchKernel_ptsz, f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra);
}

CUresult Impl_cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy,
                                        unsigned int gz, unsigned int bx, unsigned int by,
                                        unsigned int bz, unsigned int shmem, CUstream stream,
                                        void** params) {
  return Launch(Fn::cuLaunchCooperativeKernel, f, gx, gy, gz, bx, by, bz, shmem, stream, params,
                nullptr);
}
CUresult Impl_cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy,
                                             unsigned int gz, unsigned int bx, unsigned int by,
                                             unsigned int bz, unsigned int shmem, CUstream stream,
                                             void** params) {
  return Launch(Fn::cuLaunchCooperativeKernel_ptsz, f, gx, gy, gz, bx, by, bz, shmem, stream,
                params, nullptr);
}

CUresult Impl_cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void** params,
                               void** extra) {
  return LaunchEx(Fn::cuLaunchKernelEx, config, f, params, extra);
}
CUresult Impl_cuLaunchKernelEx_ptsz(const CUlaunchConfig* config, CUfunction f, void** params,
                                    void** extra) {
  return LaunchEx(Fn::cuLaunchKernelEx_ptsz, config, f, params, extra);
}

}  // namespace tf::client
