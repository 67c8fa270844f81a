// Queries and host-side encodings of a worker session (client half: src/client/client_queries.cc):
// cuTensorMapReplaceAddress (a 128-byte map the driver rewrites: an input and an output). The
// tensor-map encodings, PCI bus ids, stream attributes, context ids and function loading are
// generated (api/remote_surface.tsv). A bad argument fails that call only. Wire format: the
// comment in session_queries.cc, written by client_queries.cc.
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
  CUresult ReplaceAddress(transport::Reader& rd, transport::Writer& out);

  const driver::DriverTable& d_;
};

}  // namespace tf::worker
