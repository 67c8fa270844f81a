// Queries and host-side encodings of a worker session (client half: src/client/client_queries.cc):
// the tensor-map encodings (cuTensorMapEncode*, cuTensorMapReplaceAddress: 128 bytes computed by
// the driver from arguments that travel by value). PCI bus ids, stream attributes, context ids and
// function loading are generated (api/remote_surface.tsv). A bad argument fails that
// call only. Wire formats: the comments
// of each case in session_queries.cc, written by client_queries.cc.
//
// Threading: used by the session's replay thread only.
#pragma once

#include <cstdint>

#include "driver/driver_table.h"
#include "transport/wire.h"
#include "worker/session_handles.h"

namespace tf::worker {

class SessionQueries {
 public:
  explicit SessionQueries(const driver::DriverTable& d) : d_(d) {}

  // Whether fn belongs to this family.
  static bool Handles(driver::Fn fn);
  CUresult Call(driver::Fn fn, transport::Reader& rd, transport::Writer& out);

 private:
  CUresult TensorMap(driver::Fn fn, transport::Reader& rd, transport::Writer& out);

  const driver::DriverTable& d_;
};

}  // namespace tf::worker
