// Mirrored host memory on the worker side (remote_protocol.h kOpMirror*, docs/remote.md
// "Mirrored memory"): for each range the client mirrors, anonymous memory mapped at the client's
// address and registered with the driver (so a kernel given the address reaches it), and a twin
// holding what the client last saw. The client's changes arrive as runs (Apply); what kernels and
// copies changed goes back as kEvtMirrorData events (Pull) before every reply and host-function
// event.
//
// Threading: the session thread maps, unmaps and applies; Pull also runs on the driver's stream
// threads (host functions); Contains on the session thread. One mutex guards the table and every
// read or write of mirror and twin bytes done here.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "client/mirror_runs.h"
#include "driver/driver_table.h"
#include "transport/transport.h"
#include "worker/session_host_memory.h"

namespace tf::worker {

// The session's log line on stderr: "tfusion-worker[PID]: ..." (session.cc).
void SessionLog(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

class SessionMirrors {
 public:
  // Every mirror is charged to `host_memory` (managed ones as managed memory) while it exists.
  SessionMirrors(const driver::DriverTable& d, SessionHostMemory& host_memory)
      : d_(d), host_memory_(host_memory) {}
  SessionMirrors(const SessionMirrors&) = delete;
  SessionMirrors& operator=(const SessionMirrors&) = delete;

  // kOpMirrorMap / kOpMirrorUnmap (session thread, driver initialised, the client's context
  // current). Refusals are logged with the reason; a mirror beyond the session's limits is
  // CUDA_ERROR_OUT_OF_MEMORY.
  CUresult Call(uint16_t op, transport::Reader& rd, transport::Writer& out);

  // A kOpMirrorData message: every run is written to the mirror and its twin, or, when any run
  // lies outside the session's mirrors or the message is malformed, none is
  // (CUDA_ERROR_INVALID_VALUE, logged).
  CUresult Apply(const uint8_t* payload, uint32_t payload_len, const uint8_t* bulk,
                 uint64_t bulk_len);

  // Sends the runs where mirrors differ from their twins as kEvtMirrorData events (sequence
  // numbers from *seq) and updates the twins. Thread-safe; nothing happens without mirrors.
  // Only pages ever populated in this process are compared (mirror_runs.h ResidentSpans; the
  // device writes only pinned, populated pages). after_work_only (the session thread's replies):
  // skip the compare unless a call that may have made the device write ran since the last such
  // pull (NoteWork); a synchronizing call notes itself, so its reply still carries everything
  // finished before it.
  void Pull(transport::Transport* t, std::atomic<uint64_t>* seq, bool after_work_only = false);
  // A call is about to run that may make the device or driver write host memory (every driver
  // call, host-region copies, unmaps that synchronize).
  void NoteWork() { work_.store(true, std::memory_order_release); }

  // [p, p + n) lies wholly inside one mirror (it is device-accessible memory of this session).
  bool Contains(uint64_t p, uint64_t n) const;

  // Unregisters and unmaps every mirror (the session ends); returns how many there were.
  size_t Clear();
  // How many mirrors there are.
  size_t Count() const { return count_.load(); }

 private:
  struct Mirror {
    uint64_t len = 0;
    uint8_t* map_base = nullptr;  // page-aligned mapping that holds [address, address + len)
    uint64_t map_len = 0;
    uint8_t* twin = nullptr;      // len bytes (anonymous mapping, zero at first)
    std::vector<uint64_t> seen;   // pages populated at an earlier compare
    SessionHostMemory::Charge charge;
  };
  // The mirror holding [p, p + n), or nullptr; *base its address. REQUIRES mu_.
  const Mirror* FindLocked(uint64_t p, uint64_t n, uint64_t* base) const;
  CUresult Map(uint64_t addr, uint64_t len, uint32_t kind, transport::Writer& out);
  CUresult Unmap(uint64_t addr);
  void Release(Mirror& m);

  const driver::DriverTable& d_;
  SessionHostMemory& host_memory_;  // session thread only: Map, Unmap and Clear use it
  mutable std::mutex mu_;
  std::map<uint64_t, Mirror> mirrors_;  // client address -> mirror
  std::atomic<size_t> count_{0};
  std::atomic<bool> work_{true};  // a call that may write host memory ran since the last compare
  remote::ResidentSpans resident_;  // guarded by mu_
  std::vector<remote::MirrorRun> runs_;  // Apply's scratch (session thread)
};

}  // namespace tf::worker
