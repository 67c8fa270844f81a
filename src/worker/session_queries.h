// Queries and host-side encodings of a worker session (client half: src/client/client_queries.cc):
// stream attributes, context ids, PCI bus ids, function loading, and the tensor-map encodings
// (cuTensorMapEncode*, cuTensorMapReplaceAddress: 128 bytes computed by the driver from arguments
// that travel by value). Every stream, context, module and function a message names is checked
// against the session's tables first; a bad one fails that call only. Wire formats: the comments
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
  // What the session lends to these calls.
  class Host {
   public:
    virtual ~Host() = default;
    // Each Known* takes a handle's wire name (session_handles.h) and resolves it in place to the
    // real handle; false when it is not a live name of that kind in this session.
    // A stream of the session (or the NULL, legacy or per-thread stream).
    virtual bool KnownStream(uint64_t& s) const = 0;
    virtual bool KnownContext(uint64_t& c) const = 0;
    virtual bool KnownDevice(int32_t d) const = 0;
    virtual bool KnownModule(uint64_t& m) const = 0;
    virtual bool KnownFunction(uint64_t& f) const = 0;
    // The session's handle table: handles given back to the client are published in it.
    virtual HandleTable& Handles() = 0;
  };

  SessionQueries(const driver::DriverTable& d, Host& host) : d_(d), host_(host) {}

  // Whether fn belongs to this family.
  static bool Handles(driver::Fn fn);
  CUresult Call(driver::Fn fn, transport::Reader& rd, transport::Writer& out);

 private:
  CUresult StreamQuery(driver::Fn fn, transport::Reader& rd, transport::Writer& out);
  CUresult TensorMap(driver::Fn fn, transport::Reader& rd, transport::Writer& out);

  const driver::DriverTable& d_;
  Host& host_;
};

}  // namespace tf::worker
