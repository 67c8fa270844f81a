// Multicast objects of a worker session (session_multicast.h).
#include "worker/session_multicast.h"

namespace tf::worker {
namespace {

using driver::Fn;
using transport::Reader;
using transport::Writer;

#define CALL(fn, ...) (d_.fn ? d_.fn(__VA_ARGS__) : CUDA_ERROR_NOT_SUPPORTED)

// Every CUmemAllocationHandleType bit (POSIX file descriptor, Win32, Win32 KMT, fabric).
constexpr uint64_t kHandleTypeMask = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR | CU_MEM_HANDLE_TYPE_WIN32 |
                                     CU_MEM_HANDLE_TYPE_WIN32_KMT | CU_MEM_HANDLE_TYPE_FABRIC;

bool ReadProp(Reader& rd, CUmulticastObjectProp* p) {
  uint32_t devices = 0;
  uint64_t size = 0, types = 0, flags = 0;
  rd.U32(&devices);
  rd.U64(&size);
  rd.U64(&types);
  if (!rd.U64(&flags) || (types & ~kHandleTypeMask) != 0 || flags != 0) return false;
  *p = CUmulticastObjectProp{};
  p->numDevices = devices;
  p->size = size;
  p->handleTypes = types;
  p->flags = flags;
  return true;
}

// [offset, offset + n) lies inside [0, total), n > 0.
bool Inside(uint64_t offset, uint64_t n, uint64_t total) {
  return n > 0 && offset <= total && n <= total - offset;
}

}  // namespace

bool SessionMulticast::Handles(Fn fn) {
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

CUresult SessionMulticast::Call(Fn fn, Reader& rd, Writer& out) {
  switch (fn) {
    case Fn::cuMulticastCreate: {
      CUmulticastObjectProp prop;
      if (!ReadProp(rd, &prop) || !rd.Finish() || prop.size == 0 || prop.numDevices == 0) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      CUmemGenericAllocationHandle h = 0;
      CUresult r = CALL(cuMulticastCreate, &h, &prop);
      if (r != CUDA_SUCCESS) return r;
      const uint64_t wire = host_.PublishVmmHandle(h, prop.size);
      objects_[wire] = prop.size;
      out.U64(wire);
      return CUDA_SUCCESS;
    }
    case Fn::cuMulticastAddDevice: {
      uint64_t mc = 0, size = 0;
      int32_t dev = 0;
      rd.U64(&mc);
      if (!rd.I32(&dev) || !rd.Finish() || !Object(mc, &size)) return CUDA_ERROR_INVALID_VALUE;
      if (!host_.KnownDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
      return CALL(cuMulticastAddDevice, mc, dev);
    }
    case Fn::cuMulticastBindMem: {
      uint64_t mc = 0, mc_offset = 0, mem = 0, mem_offset = 0, n = 0, flags = 0, mc_size = 0, mem_size = 0;
      rd.U64(&mc);
      rd.U64(&mc_offset);
      rd.U64(&mem);
      rd.U64(&mem_offset);
      rd.U64(&n);
      if (!rd.U64(&flags) || !rd.Finish() || flags != 0) return CUDA_ERROR_INVALID_VALUE;
      if (objects_.count(mem)) return CUDA_ERROR_INVALID_VALUE;  // a multicast object is no memory
      if (!Object(mc, &mc_size) || !host_.KnownVmmHandle(mem, &mem_size)) return CUDA_ERROR_INVALID_VALUE;
      if (!Inside(mc_offset, n, mc_size) || !Inside(mem_offset, n, mem_size)) return CUDA_ERROR_INVALID_VALUE;
      return CALL(cuMulticastBindMem, mc, mc_offset, mem, mem_offset, n, flags);
    }
    case Fn::cuMulticastBindAddr: {
      uint64_t mc = 0, mc_offset = 0, p = 0, n = 0, flags = 0, mc_size = 0;
      rd.U64(&mc);
      rd.U64(&mc_offset);
      rd.U64(&p);
      rd.U64(&n);
      if (!rd.U64(&flags) || !rd.Finish() || flags != 0) return CUDA_ERROR_INVALID_VALUE;
      if (!Object(mc, &mc_size) || !Inside(mc_offset, n, mc_size) || !host_.DeviceRange(p, n)) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      return CALL(cuMulticastBindAddr, mc, mc_offset, p, n, flags);
    }
    case Fn::cuMulticastUnbind: {
      uint64_t mc = 0, mc_offset = 0, n = 0, mc_size = 0;
      int32_t dev = 0;
      rd.U64(&mc);
      rd.I32(&dev);
      rd.U64(&mc_offset);
      if (!rd.U64(&n) || !rd.Finish() || !Object(mc, &mc_size) || !Inside(mc_offset, n, mc_size)) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      if (!host_.KnownDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
      return CALL(cuMulticastUnbind, mc, dev, mc_offset, n);
    }
    default:
      return CUDA_ERROR_NOT_SUPPORTED;
  }
}

}  // namespace tf::worker
