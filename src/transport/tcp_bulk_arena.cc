#include "transport/tcp_bulk_arena.h"

#include <sys/mman.h>

namespace tf::transport::internal {

namespace {
constexpr uint64_t kAlign = 64;
constexpr uint64_t kMinBytes = 2ull << 20;
uint64_t AlignUp(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
}  // namespace

TcpBulkArena::~TcpBulkArena() {
  if (base_ != nullptr) munmap(base_, length_);
}

bool TcpBulkArena::Init(uint64_t bytes) {
  if (bytes < kMinBytes) bytes = kMinBytes;
  half_ = bytes / 2 / kAlign * kAlign;
  length_ = 2 * half_;
  void* p = mmap(nullptr, length_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    length_ = half_ = 0;
    return false;
  }
  base_ = static_cast<uint8_t*>(p);
  return true;
}

bool TcpBulkArena::FitLocked(Half* h, uint64_t n, uint64_t* start) const {
  const uint64_t size = AlignUp(n);
  uint64_t pos = h->alloc;
  const uint64_t off = pos % half_;
  if (off + size > half_) pos += half_ - off;  // skip the tail: a slice never wraps
  if (pos + size - h->free > half_) return false;
  *start = pos;
  return true;
}

void TcpBulkArena::AdvanceLocked(Half* h) {
  bool moved = false;
  while (!h->slices.empty() && h->slices.front().released) {
    h->free = h->slices.front().end;
    h->slices.pop_front();
    moved = true;
  }
  if (h->slices.empty()) {
    // Nothing in use: start over at the beginning of the half, so the next slices do not wrap.
    h->alloc = h->free = (h->alloc + half_ - 1) / half_ * half_;
  }
  if (moved) h->space.Broadcast();
}

uint8_t* TcpBulkArena::TakeIncoming(uint64_t n, uint64_t* id) {
  if (base_ == nullptr || n == 0 || n > half_) return nullptr;
  MutexLock l(&in_.mu);
  uint64_t start = 0;
  if (!FitLocked(&in_, n, &start)) return nullptr;
  in_.alloc = start + AlignUp(n);
  *id = in_.next_id++;
  in_.slices.push_back({*id, start, in_.alloc, false});
  return base_ + start % half_;
}

void TcpBulkArena::ReleaseIncoming(uint64_t id) {
  MutexLock l(&in_.mu);
  for (Slice& s : in_.slices) {
    if (s.id == id) {
      s.released = true;
      break;
    }
  }
  AdvanceLocked(&in_);
}

TransportStatus TcpBulkArena::Reserve(uint64_t n, int64_t deadline_ns, uint8_t** data) {
  *data = nullptr;
  MutexLock l(&out_.mu);
  uint64_t start = 0;
  while (!FitLocked(&out_, n, &start)) {
    if (shutdown_ || !out_.space.WaitUntil(&out_.mu, deadline_ns)) {
      if (!shutdown_ && FitLocked(&out_, n, &start)) break;
      return TransportStatus::Error(TransportErrc::kTimeout, 0,
                                    "no room for %llu bytes of outgoing bulk",
                                    static_cast<unsigned long long>(n));
    }
  }
  out_.alloc = start + AlignUp(n);
  out_.slices.push_back({out_.next_id++, start, out_.alloc, false});
  *data = base_ + half_ + start % half_;
  return TransportStatus::Ok();
}

bool TcpBulkArena::IsOldestReserved(const void* p, uint64_t n) {
  MutexLock l(&out_.mu);
  if (out_.slices.empty()) return false;
  const Slice& s = out_.slices.front();
  return p == base_ + half_ + s.start % half_ && AlignUp(n) == s.end - s.start;
}

bool TcpBulkArena::HasReserved() {
  MutexLock l(&out_.mu);
  return !out_.slices.empty();
}

void TcpBulkArena::Sent() {
  MutexLock l(&out_.mu);
  if (out_.slices.empty()) return;
  out_.slices.front().released = true;
  AdvanceLocked(&out_);
}

void TcpBulkArena::Shutdown() {
  MutexLock l(&out_.mu);
  shutdown_ = true;
  out_.space.Broadcast();
}

}  // namespace tf::transport::internal
