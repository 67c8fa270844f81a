// Multicast objects of a worker session (cuMulticastCreate, cuMulticastAddDevice,
// cuMulticastBindMem, cuMulticastBindAddr, cuMulticastUnbind): what NCCL uses for NVLink SHARP
// reductions on NVSwitch systems. The calls are generated (api/remote_surface.tsv, `hook=`): the
// generated half decodes them and checks the device, the flags (0), the handle types
// (CUmemAllocationHandleType) and a bound address range (inside the session's device memory);
// this family's hooks then check what only its table knows.
//
// A multicast object is a CUmemGenericAllocationHandle, as cuMemCreate's are: the client holds a
// HandleKind::kMemHandle name of the session, which cuMemRelease releases (and cuMemMap maps)
// like any VMM handle of the session. This family keeps which of those names are multicast objects
// and their size: a name that is not one of the session's live multicast objects (forged,
// released, another session's, or a plain cuMemCreate handle) is CUDA_ERROR_INVALID_VALUE, as an
// unknown VMM handle is; so are an object of no devices or no bytes and a bound range outside the
// object or the memory. The driver's own answers (on one GPU without NVSwitch:
// CUDA_ERROR_NOT_SUPPORTED) reach the client unchanged.
//
// Threading: used by the session's replay thread only.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <map>

#include "worker/generated_calls.h"
#include "worker/session_handles.h"

namespace tf::worker {

class SessionMulticast : public GeneratedHooks {
 public:
  // What the session lends to these calls.
  class Host {
   public:
    virtual ~Host() = default;
    virtual HandleTable& Handles() = 0;
    // A VMM handle of the session (cuMemCreate, or a multicast object): resolves the wire name in
    // place and gives its size; false when it is not one.
    virtual bool KnownVmmHandle(uint64_t& h, uint64_t* size) const = 0;
    // Records a multicast object as a VMM handle of the session (released by cuMemRelease, and
    // with the session's end) and returns its wire name.
    virtual uint64_t PublishVmmHandle(uint64_t real, uint64_t size) = 0;
  };

  explicit SessionMulticast(Host& host) : host_(host) {}

  // Whether fn is one of this family's generated calls (its hooks serve them).
  static bool Hooked(driver::Fn fn);

  CUresult Check_cuMulticastCreate(CUmulticastObjectProp& prop) override;
  CUresult Done_cuMulticastCreate(CUmemGenericAllocationHandle& mc, const CUmulticastObjectProp& prop) override;
  CUresult Check_cuMulticastAddDevice(uint64_t& mc, int32_t& dev) override;
  CUresult Check_cuMulticastBindMem(uint64_t& mc, uint64_t& mc_offset, uint64_t& mem, uint64_t& mem_offset,
                                    uint64_t& size, uint64_t& flags) override;
  CUresult Check_cuMulticastBindAddr(uint64_t& mc, uint64_t& mc_offset, uint64_t& ptr, uint64_t& size,
                                     uint64_t& flags) override;
  CUresult Check_cuMulticastUnbind(uint64_t& mc, int32_t& dev, uint64_t& mc_offset, uint64_t& size) override;

 private:
  // Resolves a multicast object's wire name in place to the driver's handle and gives its size;
  // false when it is not a live multicast object of the session.
  bool Object(uint64_t& h, uint64_t* size);
  // Object, and [offset, offset + n) lies inside it (n > 0); else CUDA_ERROR_INVALID_VALUE.
  CUresult ObjectRange(uint64_t& mc, uint64_t offset, uint64_t n);

  Host& host_;
  // Wire name -> bytes per device. A name released by cuMemRelease no longer resolves (names are
  // never reused in a session), and its entry is dropped when next met.
  std::map<uint64_t, uint64_t> objects_;
};

}  // namespace tf::worker
