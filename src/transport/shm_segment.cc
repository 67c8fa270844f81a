#include "transport/shm_segment.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>
#include <cstring>

namespace tf::transport::shm {

int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_ns) {
  if (timeout_ns <= 0) return;
  timespec ts;
  ts.tv_sec = static_cast<time_t>(timeout_ns / 1000000000);
  ts.tv_nsec = static_cast<long>(timeout_ns % 1000000000);
  // Not FUTEX_PRIVATE_FLAG: the word lives in a mapping shared between processes.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void Notify(std::atomic<uint32_t>* seq, std::atomic<uint32_t>* sleeping) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  // Clearing the flag makes one wake-up per sleep: frames published while the consumer is still
  // waking up cost no further system call.
  if (sleeping->load(std::memory_order_relaxed) == 0) return;
  if (sleeping->exchange(0, std::memory_order_acq_rel) == 0) return;
  seq->fetch_add(1, std::memory_order_release);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(seq), FUTEX_WAKE, 1, nullptr, nullptr, 0);
}

void WakeAll(std::atomic<uint32_t>* seq) {
  seq->fetch_add(1, std::memory_order_release);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(seq), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

TransportStatus ComputeGeometry(uint64_t ring_bytes, uint64_t arena_bytes, Geometry* out) {
  if (ring_bytes < (64u << 10) || ring_bytes > (1ull << 30) || (ring_bytes & (ring_bytes - 1))) {
    return TransportStatus::Error(TransportErrc::kInvalidArgument, 0,
                                  "shm ring size %llu: must be a power of two in [64 KiB, 1 GiB]",
                                  static_cast<unsigned long long>(ring_bytes));
  }
  if (arena_bytes < (1u << 20) || arena_bytes > (64ull << 30) || arena_bytes % 4096) {
    return TransportStatus::Error(
        TransportErrc::kInvalidArgument, 0,
        "shm arena size %llu: must be a multiple of 4 KiB in [1 MiB, 64 GiB]",
        static_cast<unsigned long long>(arena_bytes));
  }
  out->ring_bytes = ring_bytes;
  out->arena_bytes = arena_bytes;
  out->ring_offset[0] = kHeaderBytes;
  out->ring_offset[1] = kHeaderBytes + ring_bytes;
  uint64_t end = kHeaderBytes + 2 * ring_bytes;
  out->arena_offset = (end + kArenaFileAlignment - 1) / kArenaFileAlignment * kArenaFileAlignment;
  out->total_bytes = out->arena_offset + arena_bytes;
  return TransportStatus::Ok();
}

TransportStatus ValidateHeader(const SegmentHeader* h, uint64_t file_bytes, Geometry* out) {
  if (file_bytes < kHeaderBytes || memcmp(h->magic, kSegmentMagic, sizeof(kSegmentMagic)) != 0) {
    return TransportStatus::Error(TransportErrc::kProtocol, 0,
                                  "shm segment: bad magic (not a TensorFusion segment)");
  }
  if (h->layout_version != kSegmentLayoutVersion) {
    return TransportStatus::Error(TransportErrc::kProtocol, 0,
                                  "shm segment: layout version %u, this build understands %u",
                                  h->layout_version, kSegmentLayoutVersion);
  }
  Geometry g;
  TransportStatus st = ComputeGeometry(h->ring_bytes, h->arena_bytes, &g);
  if (!st.ok()) return st;
  if (h->header_bytes != kHeaderBytes || h->ring_offset[0] != g.ring_offset[0] ||
      h->ring_offset[1] != g.ring_offset[1] || h->arena_offset != g.arena_offset ||
      h->total_bytes != g.total_bytes || file_bytes < g.total_bytes) {
    return TransportStatus::Error(TransportErrc::kProtocol, 0,
                                  "shm segment: layout does not match its sizes (file %llu bytes)",
                                  static_cast<unsigned long long>(file_bytes));
  }
  *out = g;
  return TransportStatus::Ok();
}

}  // namespace tf::transport::shm
