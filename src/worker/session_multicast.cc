// Multicast objects of a worker session (session_multicast.h): the hooks of the generated calls.
#include "worker/session_multicast.h"

namespace tf::worker {
namespace {

using driver::Fn;

// [offset, offset + n) lies inside [0, total), n > 0.
bool Inside(uint64_t offset, uint64_t n, uint64_t total) {
  return n > 0 && offset <= total && n <= total - offset;
}

}  // namespace

bool SessionMulticast::Hooked(Fn fn) {
  switch (fn) {
    case Fn::cuMulticastCreate:
    case Fn::cuMulticastAddDevice:
    case Fn::cuMulticastBindMem:
    case Fn::cuMulticastBindAddr:
    case Fn::cuMulticastUnbind:
      return true;
    default:
      return false;
  }
}

bool SessionMulticast::Object(uint64_t& h, uint64_t* size) {
  auto it = objects_.find(h);
  if (it == objects_.end()) return false;
  uint64_t real = 0;
  if (!host_.Handles().Resolve(HandleKind::kMemHandle, h, &real)) {
    objects_.erase(it);  // released
    return false;
  }
  *size = it->second;
  h = real;
  return true;
}

CUresult SessionMulticast::Check_cuMulticastCreate(CUmulticastObjectProp& prop) {
  return prop.size == 0 || prop.numDevices == 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

CUresult SessionMulticast::Done_cuMulticastCreate(CUmemGenericAllocationHandle& mc,
                                                  const CUmulticastObjectProp& prop) {
  mc = host_.PublishVmmHandle(mc, prop.size);
  objects_[mc] = prop.size;
  return CUDA_SUCCESS;
}

CUresult SessionMulticast::Check_cuMulticastAddDevice(uint64_t& mc, int32_t&) {
  uint64_t size = 0;
  return Object(mc, &size) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult SessionMulticast::Check_cuMulticastBindMem(uint64_t& mc, uint64_t& mc_offset, uint64_t& mem,
                                                    uint64_t& mem_offset, uint64_t& size, uint64_t&) {
  uint64_t mc_size = 0, mem_size = 0;
  if (objects_.count(mem)) return CUDA_ERROR_INVALID_VALUE;  // a multicast object is no memory
  if (!Object(mc, &mc_size) || !host_.KnownVmmHandle(mem, &mem_size)) return CUDA_ERROR_INVALID_VALUE;
  if (!Inside(mc_offset, size, mc_size) || !Inside(mem_offset, size, mem_size)) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

CUresult SessionMulticast::Check_cuMulticastBindAddr(uint64_t& mc, uint64_t& mc_offset, uint64_t&, uint64_t& size,
                                                     uint64_t&) {
  return ObjectRange(mc, mc_offset, size);
}

CUresult SessionMulticast::Check_cuMulticastUnbind(uint64_t& mc, int32_t&, uint64_t& mc_offset, uint64_t& size) {
  return ObjectRange(mc, mc_offset, size);
}

CUresult SessionMulticast::ObjectRange(uint64_t& mc, uint64_t offset, uint64_t n) {
  uint64_t size = 0;
  return Object(mc, &size) && Inside(offset, n, size) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

}  // namespace tf::worker
