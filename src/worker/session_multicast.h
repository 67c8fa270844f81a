// Multicast objects of a worker session (cuMulticastCreate, cuMulticastAddDevice,
// cuMulticastBindMem, cuMulticastBindAddr, cuMulticastUnbind): what NCCL uses for NVLink SHARP
// reductions on NVSwitch systems. cuMulticastGetGranularity, which names no object, is generated
// (api/remote_surface.tsv), with the same checks of the properties.
//
// A multicast object is a CUmemGenericAllocationHandle, as cuMemCreate's are: the client holds a
// HandleKind::kMemHandle name of the session, which cuMemRelease releases (and cuMemMap maps)
// like any VMM handle of the session. This family keeps which of those names are multicast objects
// and their size, and checks every argument before the driver sees it: a name that is not one of
// the session's live multicast objects (forged, released, another session's, or a plain
// cuMemCreate handle) is CUDA_ERROR_INVALID_VALUE, as an unknown VMM handle is; a device that is
// not one of the session's is CUDA_ERROR_INVALID_DEVICE; a bound range outside the object or the
// memory, a device range outside the session's memory, flags other than 0 or handle types outside
// CUmemAllocationHandleType are CUDA_ERROR_INVALID_VALUE. The driver's own answers (on one GPU
// without NVSwitch: CUDA_ERROR_NOT_SUPPORTED) reach the client unchanged.
//
// Payloads (client: src/client/client_multicast.cc), u64 handles are wire names:
//   cuMulticastCreate          properties                  -> u64 multicast object
//   cuMulticastAddDevice       u64 object, i32 device
//   cuMulticastBindMem         u64 object, u64 object offset, u64 memory handle, u64 memory offset,
//                              u64 size, u64 flags
//   cuMulticastBindAddr        u64 object, u64 object offset, u64 device pointer, u64 size, u64 flags
//   cuMulticastUnbind          u64 object, i32 device, u64 object offset, u64 size
// where properties are u32 devices, u64 size, u64 handle types, u64 flags.
//
// Threading: used by the session's replay thread only.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <map>

#include "driver/driver_table.h"
#include "transport/wire.h"
#include "worker/session_handles.h"

namespace tf::worker {

class SessionMulticast {
 public:
  // What the session lends to these calls.
  class Host {
   public:
    virtual ~Host() = default;
    virtual HandleTable& Handles() = 0;
    virtual bool KnownDevice(int32_t d) const = 0;
    // [p, p + n) lies wholly inside one device allocation (or mapping) of the session.
    virtual bool DeviceRange(uint64_t p, uint64_t n) const = 0;
    // A VMM handle of the session (cuMemCreate, or a multicast object): resolves the wire name in
    // place and gives its size; false when it is not one.
    virtual bool KnownVmmHandle(uint64_t& h, uint64_t* size) const = 0;
    // Records a multicast object as a VMM handle of the session (released by cuMemRelease, and
    // with the session's end) and returns its wire name.
    virtual uint64_t PublishVmmHandle(uint64_t real, uint64_t size) = 0;
  };

  SessionMulticast(const driver::DriverTable& d, Host& host) : d_(d), host_(host) {}

  static bool Handles(driver::Fn fn);
  CUresult Call(driver::Fn fn, transport::Reader& rd, transport::Writer& out);

 private:
  // Resolves a multicast object's wire name in place to the driver's handle and gives its size;
  // false when it is not a live multicast object of the session.
  bool Object(uint64_t& h, uint64_t* size);

  const driver::DriverTable& d_;
  Host& host_;
  // Wire name -> bytes per device. A name released by cuMemRelease no longer resolves (names are
  // never reused in a session), and its entry is dropped when next met.
  std::map<uint64_t, uint64_t> objects_;
};

}  // namespace tf::worker
