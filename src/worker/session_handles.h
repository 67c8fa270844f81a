// Session-scoped virtual handles for the remote vGPU: the client never sees the driver's handles,
// only names this table chose, and the worker maps them back to the real ones. That is what lets
// a session's objects be re-created behind the same names on another context or GPU.
//
// A wire name is a 64-bit value:
//   bits 56-63  0x40 | kind        (non-canonical as an address: never a plausible pointer)
//   bits 24-55  check: the session's random salt plus the slot's generation (times an odd
//               constant), so a name of another session, or of an earlier object in the same
//               slot, fails
//   bits  0-23  slot index into a flat vector (Resolve is one bounds check and one compare)
// Names are never 0, 1 or 2: those are the null, legacy and per-thread streams, which pass as
// themselves for HandleKind::kStream. A null real handle publishes as 0 (a null output stays null).
// Once retired, a name is never handed out again within the session: a slot whose generation
// would wrap is abandoned.
//
// Values that kernels read on the GPU are not in this table (texture and surface objects, graph
// conditional handles): they stay real. Device pointers stay real addresses.
//
// Thread safety: none. One table per session, used by the session's dispatch thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <unordered_map>
#include <vector>

namespace tf::worker {

enum class HandleKind : uint8_t {
  kContext = 1,
  kStream,
  kEvent,
  kModule,
  kFunction,
  kLibrary,
  kKernel,
  kGraph,
  kGraphNode,
  kGraphExec,
  kArray,
  kMipmappedArray,
  kLinkState,
  kMemPool,
  kMemHandle,
  kUserObject,
  kExternalMemory,
  kExternalSemaphore,
  kGreenCtx,
  kDevResourceDesc,  // CUdevResourceDesc (cuDevResourceGenerateDesc): the driver never frees them
  kAsyncCallback     // CUasyncCallbackHandle (cuDeviceRegisterAsyncNotification)
};
inline constexpr int kHandleKindCount = static_cast<int>(HandleKind::kAsyncCallback);

class HandleTable {
 public:
  // A table with a random salt (getrandom; time and pid when that fails).
  HandleTable();
  // A table with a given salt (tests: two sessions with known salts).
  explicit HandleTable(uint64_t salt);

  // The wire name of a real handle: the same name while it lives (a driver that gives the same
  // handle twice, as a primary context or a module's function, gets the same name back).
  // Publish(k, 0) is 0; for kStream 0, 1 and 2 are themselves.
  uint64_t Publish(HandleKind k, uint64_t real);
  // The real handle behind a wire name. False: unknown, stale (retired), of another kind or of
  // another session; 0 is false except for kStream, whose 0, 1 and 2 resolve to themselves.
  bool Resolve(HandleKind k, uint64_t wire, uint64_t* real) const {
    if (k == HandleKind::kStream && wire <= 2) {
      *real = wire;
      return true;
    }
    const uint64_t idx = wire & kIndexMask;
    if ((wire >> 56) != (kTag | static_cast<uint64_t>(k)) || idx >= slots_.size() ||
        slots_[idx].wire != wire) {
      return false;
    }
    *real = slots_[idx].real;
    return true;
  }
  // The object was destroyed: its name fails from now on. False when the name is not live.
  bool Retire(HandleKind k, uint64_t wire);
  // Retire by the real handle (the driver's object went away: a module's functions, a graph's
  // nodes). False when it was never published.
  bool RetireReal(HandleKind k, uint64_t real);
  // Retires every live name of kind k (a primary context reset destroyed them all); how many.
  size_t RetireAll(HandleKind k);
  // Reverse lookup: the live name of a real handle. For kStream 0, 1 and 2 are themselves.
  bool WireOf(HandleKind k, uint64_t real, uint64_t* wire) const;
  // Live names of kind k.
  size_t Live(HandleKind k) const { return by_real_[static_cast<size_t>(k)].size(); }
  // Whether v has the shape of a wire name of any kind (tests: a real handle leaked to a client).
  static bool LooksLikeName(uint64_t v) {
    const uint64_t top = v >> 56;
    return top > kTag && top <= (kTag | kHandleKindCount);
  }

 private:
  static constexpr uint64_t kTag = 0x40;
  static constexpr uint64_t kIndexBits = 24;
  static constexpr uint64_t kIndexMask = (1ull << kIndexBits) - 1;
  struct Slot {
    uint64_t wire = 0;  // 0 while free
    uint64_t real = 0;
    uint32_t generation = 0;
    uint8_t kind = 0;
  };
  uint64_t NameOf(HandleKind k, uint64_t idx, uint32_t generation) const;

  uint32_t salt_;
  std::vector<Slot> slots_;
  std::deque<uint32_t> free_;  // retired slots, reused oldest first
  std::unordered_map<uint64_t, uint32_t> by_real_[kHandleKindCount + 1];  // real -> slot
};

}  // namespace tf::worker
