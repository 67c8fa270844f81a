// Stream attributes and function loading of the fake driver.
//
// A stream keeps what cuStreamSetAttribute gave it for each of the attributes a stream has (the
// access-policy window, the synchronization policy, the memory-synchronization domain and its
// map); the priority attribute is the stream's priority (clamped to the range cuCtxGetStreamPriorityRange
// answers, as cuStreamCreateWithPriority does), so cuStreamGetPriority sees it. Other launch
// attributes are not stream attributes: CUDA_ERROR_INVALID_VALUE.
//
// Functions are loaded when their module is (the driver's eager loading): cuFuncIsLoaded answers
// CU_FUNCTION_LOADING_STATE_LOADED and cuFuncLoad has nothing left to do.
#include <algorithm>
#include <mutex>

#include "fake_driver.h"

using fakecuda::Driver;
using fakecuda::Stream;

namespace {

bool StreamAttribute(CUstreamAttrID attr) {
  switch (attr) {
    case CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW:
    case CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY:
    case CU_LAUNCH_ATTRIBUTE_PRIORITY:
    case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP:
    case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN:
      return true;
    default:
      return false;
  }
}

}  // namespace

extern "C" {

CUresult cuStreamGetAttribute(CUstream handle, CUstreamAttrID attr, CUstreamAttrValue* value) {
  FAKECUDA_ENTER();
  if (value == nullptr || !StreamAttribute(attr)) return CUDA_ERROR_INVALID_VALUE;
  CUresult err = CUDA_SUCCESS;
  std::shared_ptr<Stream> stream = fakecuda::ResolveStream(handle, &err);
  if (stream == nullptr) return err;
  std::lock_guard<std::mutex> lock(Driver::Get().mu);
  CUstreamAttrValue v{};
  if (attr == CU_LAUNCH_ATTRIBUTE_PRIORITY) {
    v.priority = stream->priority;
  } else if (auto it = stream->attributes.find(attr); it != stream->attributes.end()) {
    v = it->second;
  }
  *value = v;
  return CUDA_SUCCESS;
}

CUresult cuStreamSetAttribute(CUstream handle, CUstreamAttrID attr, const CUstreamAttrValue* value) {
  FAKECUDA_ENTER();
  if (value == nullptr || !StreamAttribute(attr)) return CUDA_ERROR_INVALID_VALUE;
  CUresult err = CUDA_SUCCESS;
  std::shared_ptr<Stream> stream = fakecuda::ResolveStream(handle, &err);
  if (stream == nullptr) return err;
  std::lock_guard<std::mutex> lock(Driver::Get().mu);
  if (attr == CU_LAUNCH_ATTRIBUTE_PRIORITY) {
    stream->priority = std::clamp(value->priority, -5, 0);
  } else {
    stream->attributes[attr] = *value;
  }
  return CUDA_SUCCESS;
}

CUresult cuFuncIsLoaded(CUfunctionLoadingState* state, CUfunction function) {
  FAKECUDA_ENTER();
  if (state == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (fakecuda::FindKernel(function) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  *state = CU_FUNCTION_LOADING_STATE_LOADED;
  return CUDA_SUCCESS;
}

CUresult cuFuncLoad(CUfunction function) {
  FAKECUDA_ENTER();
  return fakecuda::FindKernel(function) == nullptr ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
}

}  // extern "C"
