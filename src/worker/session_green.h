// Green contexts and device resources of a worker session (cuGreenCtx*, cuDevSmResourceSplitByCount,
// cuDevResourceGenerateDesc, cuDeviceGetDevResource, cuCtxGetDevResource, cuCtxFromGreenCtx): the
// hand-written half of the family whose other calls are generated (api/remote_surface.tsv:
// cuGreenCtxStreamCreate, cuGreenCtxRecordEvent/WaitEvent, cuGreenCtxGetId, cuStreamGetGreenCtx,
// cuCtxSetFlags).
//
// Names: a green context is a HandleKind::kGreenCtx name; its CUcontext (the driver's
// cuCtxFromGreenCtx) is published as an ordinary context of the session when the green context is
// created, so every context call, launch, copy and stream of the session works on it. A resource
// descriptor (CUdevResourceDesc, a driver pointer the driver never frees) is a kDevResourceDesc
// name. A CUdevResource is a plain 144-byte structure whose hidden fields only the driver reads:
// the session accepts back only a structure it handed out itself, byte for byte (a forged or
// altered one is CUDA_ERROR_INVALID_VALUE and reaches no driver).
//
// Payloads (client: src/client/client_green.cc), u64 handles are wire names:
//   cuDeviceGetDevResource      i32 device, u32 type          -> resource
//   cuCtxGetDevResource         u64 context, u32 type         -> resource
//   cuGreenCtxGetDevResource    u64 green, u32 type           -> resource
//   cuDevSmResourceSplitByCount u8 want_result, u32 groups, resource input, u8 want_remaining,
//                               u32 flags, u32 min_count      -> u32 groups, [groups x resource],
//                                                                [resource remaining]
//   cuDevResourceGenerateDesc   u32 n, n x resource           -> u64 descriptor
//   cuGreenCtxCreate            u64 descriptor, i32 device, u32 flags -> u64 green
//   cuCtxFromGreenCtx           u64 green                     -> u64 context, i32 device, context info
//   cuGreenCtxDestroy           u64 green                     -> u64 context, u32 n, n x u64 stream
//                                                                (the names that went with it)
// where a resource is sizeof(CUdevResource) bytes.
//
// Threading: used by the session's replay thread only.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "driver/driver_table.h"
#include "transport/wire.h"
#include "worker/session_handles.h"

namespace tf::worker {

class SessionGreen {
 public:
  // What the session lends to these calls.
  class Host {
   public:
    virtual ~Host() = default;
    virtual HandleTable& Handles() = 0;
    virtual bool KnownDevice(int32_t d) const = 0;
    // Resolves a context's wire name in place; false when it is not one of the session's.
    virtual bool KnownContext(uint64_t& c) const = 0;
    // A green context's CUcontext joins (or leaves) the session's contexts.
    virtual void GreenContextAdded(uint64_t ctx) = 0;
    virtual void GreenContextRemoved(uint64_t ctx) = 0;
    // The description of a context the client caches (session.cc WriteContextInfo).
    virtual void WriteGreenContextInfo(uint64_t ctx, int32_t dev, transport::Writer& out) = 0;
    // The session's streams (real handles), and one that went away with its green context.
    virtual std::vector<uint64_t> SessionStreams() const = 0;
    virtual void StreamGone(uint64_t stream) = 0;
  };

  SessionGreen(const driver::DriverTable& d, Host& host) : d_(d), host_(host) {}

  static bool Handles(driver::Fn fn);
  CUresult Call(driver::Fn fn, transport::Reader& rd, transport::Writer& out);
  // Destroys the green contexts the client left. The session's streams are destroyed already.
  void Cleanup();

  // The most resources one split may return (more than any GPU has SMs).
  static constexpr uint32_t kMaxGroups = 256;
  // The most resources one descriptor may combine.
  static constexpr uint32_t kMaxDescResources = 64;
  // The resources remembered as handed out (oldest forgotten first).
  static constexpr size_t kMaxIssued = 4096;

 private:
  struct Green {
    uint64_t ctx = 0;  // real CUcontext (cuCtxFromGreenCtx)
    int32_t device = 0;
  };
  // A resource the driver gave: remembered, then written to out.
  void Issue(const CUdevResource& r, transport::Writer& out);
  // Reads a resource and checks that this session handed it out.
  bool ReadIssued(transport::Reader& rd, CUdevResource* r) const;
  CUresult GetResource(driver::Fn fn, transport::Reader& rd, transport::Writer& out);
  CUresult Split(transport::Reader& rd, transport::Writer& out);
  CUresult Create(transport::Reader& rd, transport::Writer& out);
  CUresult Destroy(transport::Reader& rd, transport::Writer& out);

  const driver::DriverTable& d_;
  Host& host_;
  std::map<uint64_t, Green> greens_;  // real green context -> its context and device
  std::set<std::string> issued_;      // resources handed out, as bytes
  std::deque<std::string> issued_order_;
};

}  // namespace tf::worker
