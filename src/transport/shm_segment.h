// The shared-memory segment of one ShmTransport connection (internal to src/transport): its
// layout, the two single-producer/single-consumer rings and the two FIFO bulk-arena halves, and
// the futex wait/notify protocol. docs/protocol.md ("Shared-memory segment") documents the layout;
// the static_asserts below pin it.
//
// Both processes run the same build on the same host, so control words are native atomics; the
// frames inside the rings are the same little-endian encoding as on TCP. Neither side trusts the
// other: every position and length read from the segment is checked before it is used, and each
// side keeps its own copy of the positions it owns.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "transport/sync.h"
#include "transport/transport_status.h"

namespace tf::transport::shm {

inline constexpr char kSegmentMagic[8] = {'T', 'F', 'S', 'H', 'M', 'S', 'G', '1'};
inline constexpr uint32_t kSegmentLayoutVersion = 1;
inline constexpr uint64_t kHeaderBytes = 4096;
// The arena starts on a 2 MiB boundary of the file so that it can later be mapped on its own at a
// fixed address (same virtual address in both processes) and registered with cuMemHostRegister.
inline constexpr uint64_t kArenaFileAlignment = 2ull << 20;
inline constexpr uint64_t kArenaSliceAlignment = 64;
inline constexpr uint32_t kRecordPrefixBytes = 8;  // u32 size, u32 kind
inline constexpr uint32_t kRecordFrame = 1;
inline constexpr uint32_t kRecordPad = 2;

// Directions: 0 client->worker (commands), 1 worker->client (replies, events).
inline constexpr int kClientToServer = 0;
inline constexpr int kServerToClient = 1;
// Sides, indexing SegmentHeader::side.
inline constexpr int kClientSide = 0;
inline constexpr int kServerSide = 1;

inline constexpr uint32_t kSideEmpty = 0;
inline constexpr uint32_t kSideAttached = 1;
inline constexpr uint32_t kSideClosed = 2;  // orderly close: no more frames from this side

struct alignas(64) SideControl {
  std::atomic<uint32_t> state;  // kSide*
  uint32_t pid;                 // as the segment's creator sees it (SO_PEERCRED); informational
};

struct alignas(64) RingControl {
  // Producer's line.
  std::atomic<uint64_t> head;               // bytes ever published
  std::atomic<uint32_t> data_seq;           // futex word the consumer sleeps on
  std::atomic<uint32_t> consumer_sleeping;  // 1 while the consumer may be in futex_wait
  // Consumer's line.
  alignas(64) std::atomic<uint64_t> tail;   // bytes ever released
  std::atomic<uint32_t> space_seq;          // futex word the producer sleeps on (ring full)
  std::atomic<uint32_t> producer_sleeping;
};

struct alignas(64) ArenaControl {
  std::atomic<uint64_t> alloc_pos;  // producer: bytes ever allocated in this half (with skips)
  alignas(64) std::atomic<uint64_t> free_pos;  // consumer: bytes ever released
  std::atomic<uint32_t> space_seq;
  std::atomic<uint32_t> producer_sleeping;
};

struct SegmentHeader {
  char magic[8];
  uint32_t layout_version;
  uint32_t header_bytes;     // kHeaderBytes
  uint64_t total_bytes;      // the file's size
  uint64_t ring_bytes;       // each ring's data area, a power of two
  uint64_t ring_offset[2];   // [direction]
  uint64_t arena_offset;     // multiple of kArenaFileAlignment
  uint64_t arena_bytes;      // both halves; direction d owns [d * arena_bytes/2, (d+1) * ...)
  uint64_t session_id;
  uint64_t reserved[6];
  SideControl side[2];
  RingControl ring[2];
  ArenaControl arena[2];
};
static_assert(sizeof(SegmentHeader) <= kHeaderBytes);
static_assert(offsetof(SegmentHeader, side) == 128);
static_assert(offsetof(SegmentHeader, ring) == 256);
static_assert(offsetof(SegmentHeader, arena) == 512);
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

struct Geometry {
  uint64_t ring_bytes = 0;
  uint64_t arena_bytes = 0;
  uint64_t ring_offset[2] = {};
  uint64_t arena_offset = 0;
  uint64_t total_bytes = 0;
};
// kInvalidArgument unless ring_bytes is a power of two in [64 KiB, 1 GiB] and arena_bytes a
// multiple of 4 KiB in [1 MiB, 64 GiB].
TransportStatus ComputeGeometry(uint64_t ring_bytes, uint64_t arena_bytes, Geometry* out);

// Checks a mapped header against the file size: magic, version, and that the geometry it states is
// exactly what ComputeGeometry gives for its ring and arena sizes.
TransportStatus ValidateHeader(const SegmentHeader* h, uint64_t file_bytes, Geometry* out);

// Futex wait/notify over a (seq, sleeping) pair. The waiter spins for spin_ns, then sleeps in
// slices of at most kLivenessSliceNs, calling check() before each sleep; a non-ok result ends
// the wait.
inline constexpr int64_t kLivenessSliceNs = 10 * 1000 * 1000;

void Notify(std::atomic<uint32_t>* seq, std::atomic<uint32_t>* sleeping);
// Wakes every sleeper on seq unconditionally (Close).
void WakeAll(std::atomic<uint32_t>* seq);

template <typename Ready, typename Check>
TransportStatus WaitFor(Ready ready, Check check, std::atomic<uint32_t>* seq,
                        std::atomic<uint32_t>* sleeping, int64_t deadline_ns, int64_t spin_ns);

using internal::CpuRelax;
int64_t NowNs();
// futex_wait on a shared mapping for at most timeout_ns; spurious returns are fine.
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_ns);

template <typename Ready, typename Check>
TransportStatus WaitFor(Ready ready, Check check, std::atomic<uint32_t>* seq,
                        std::atomic<uint32_t>* sleeping, int64_t deadline_ns, int64_t spin_ns) {
  if (ready()) return TransportStatus::Ok();
  const int64_t spin_end = NowNs() + spin_ns;
  do {
    for (int i = 0; i < 4; ++i) CpuRelax();
    if (ready()) return TransportStatus::Ok();
  } while (NowNs() < spin_end);
  for (;;) {
    uint32_t s = seq->load(std::memory_order_acquire);
    sleeping->store(1, std::memory_order_seq_cst);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (ready()) {
      sleeping->store(0, std::memory_order_relaxed);
      return TransportStatus::Ok();
    }
    TransportStatus st = check();
    int64_t now = NowNs();
    if (st.ok() && now >= deadline_ns) {
      st = TransportStatus::Error(TransportErrc::kTimeout, 0, "timed out");
    }
    if (!st.ok()) {
      sleeping->store(0, std::memory_order_relaxed);
      return st;
    }
    int64_t slice = deadline_ns - now;
    if (slice > kLivenessSliceNs) slice = kLivenessSliceNs;
    FutexWait(seq, s, slice);
    sleeping->store(0, std::memory_order_relaxed);
    if (ready()) return TransportStatus::Ok();
  }
}

}  // namespace tf::transport::shm
