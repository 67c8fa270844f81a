// Batches of stream memory operations and CU_POINTER_ATTRIBUTE_SYNC_MEMOPS of a worker session
// (client half: src/client/client_memops.cc; payloads: src/client/remote_memops.h; the single
// operations, pools by location and pool access are generated: api/remote_surface.tsv). Every
// address a message names must lie in the session's device memory, every operation and flag must
// be one cuda.h defines, every stream must be a live handle of the session; a bad one fails that
// call only and nothing reaches the driver.
//
// Threading: used by the session's replay thread only.
#pragma once

#include <cstdint>

#include "driver/driver_table.h"
#include "transport/wire.h"
#include "worker/session_handles.h"

namespace tf::worker {

class SessionMemops {
 public:
  // What the session lends to these calls.
  class Host {
   public:
    virtual ~Host() = default;
    // A stream of the session (or the NULL, legacy or per-thread stream): resolved in place.
    virtual bool KnownStream(uint64_t& s) const = 0;
    // [p, p + n) lies in one range of device memory the session may name.
    virtual bool DeviceRange(uint64_t p, uint64_t n) const = 0;
  };

  SessionMemops(const driver::DriverTable& d, Host& host) : d_(d), host_(host) {}

  // Whether fn belongs to this family.
  static bool Handles(driver::Fn fn);
  CUresult Call(driver::Fn fn, transport::Reader& rd, transport::Writer& out);

 private:
  CUresult BatchMemOp(transport::Reader& rd);
  CUresult SetAttribute(transport::Reader& rd);

  const driver::DriverTable& d_;
  Host& host_;
};

}  // namespace tf::worker
