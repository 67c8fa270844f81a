// The names a worker session gives the client for its driver objects (contexts, streams, events,
// modules, ...): every handle that crosses the wire is looked up here by kind, so that a value the
// session never handed out, one it retired, or one of another kind fails its call with a CUDA error
// instead of reaching the driver. The null, legacy and per-thread streams (0, 1, 2) are not in the
// table: callers pass them as themselves.
//
// This implementation is the identity (a handle's wire name is its real value), backed by one set
// per kind; session-scoped virtual names may replace it behind the same interface.
//
// Threading: used by the session's replay thread only.
#pragma once

#include <cstdint>
#include <unordered_set>

namespace tf::worker {

enum class HandleKind : uint8_t {
  kContext = 1, kStream, kEvent, kModule, kFunction, kLibrary,
  kKernel, kGraph, kGraphNode, kGraphExec, kArray, kMipmappedArray, kLinkState, kMemPool,
  kMemHandle, kUserObject, kExternalMemory, kExternalSemaphore, kGreenCtx
};
inline constexpr int kHandleKinds = static_cast<int>(HandleKind::kGreenCtx) + 1;

class HandleTable {  // one per session
 public:
  // The wire name of a real handle (the same name while it lives).
  uint64_t Publish(HandleKind k, uint64_t real);
  // False: unknown, stale, of another kind or of another session.
  bool Resolve(HandleKind k, uint64_t wire, uint64_t* real) const;
  // The object was destroyed; false when it was not known.
  bool Retire(HandleKind k, uint64_t wire);
  // Reverse lookup: the wire name of a real handle already published.
  bool WireOf(HandleKind k, uint64_t real, uint64_t* wire) const;

 private:
  std::unordered_set<uint64_t> live_[kHandleKinds];
};

}  // namespace tf::worker
