// The TCP transport's bulk memory (internal): one anonymous mapping of this process, its first
// half for the bulk of incoming frames, its second for outgoing slices filled in place
// (Transport::ReserveBulk). A worker registers the whole mapping with its driver once
// (Transport::BulkMemory), so the socket reads into memory the GPU can DMA from, and the GPU
// writes into memory the socket sends from: a pageable copy over TCP costs the worker the
// kernel's socket copy and nothing else, and its DMA overlaps the network.
//
// Each half is a FIFO of slices (64-byte aligned; a slice never wraps: the tail of the half is
// skipped when it does not fit there). Space comes back up to the oldest slice still in use.
//   Incoming: Receive takes a slice per frame with bulk (nullptr when the half is full: the
//   transport then reads into a heap buffer instead, so a held slice never blocks the
//   connection); the slice is given back at the next Receive unless held, then by Release.
//   Outgoing: Reserve hands out slices in order and waits for space; Sent gives back the oldest
//   once the socket has taken its bytes.
// Thread safety: every method may be called from any thread (Release comes from a driver
// callback); one mutex guards each half.
#pragma once

#include <cstdint>
#include <deque>

#include "transport/sync.h"
#include "transport/transport_status.h"

namespace tf::transport::internal {

class TcpBulkArena {
 public:
  TcpBulkArena() = default;
  ~TcpBulkArena();
  TcpBulkArena(const TcpBulkArena&) = delete;
  TcpBulkArena& operator=(const TcpBulkArena&) = delete;

  // Maps `bytes` (rounded down to 2 x 64-byte slices' alignment, at least 2 MiB) of anonymous
  // memory; nothing is touched. False when the mapping fails.
  bool Init(uint64_t bytes);

  uint8_t* base() const { return base_; }
  uint64_t length() const { return length_; }
  uint64_t half() const { return half_; }

  // Incoming. A slice of n bytes and its id, or nullptr when the half has no room now.
  uint8_t* TakeIncoming(uint64_t n, uint64_t* id);
  void ReleaseIncoming(uint64_t id);

  // Outgoing. Waits until deadline_ns for room: kTimeout (nothing reserved) or Ok.
  // REQUIRES: 0 < n <= half().
  TransportStatus Reserve(uint64_t n, int64_t deadline_ns, uint8_t** data);
  // Whether [p, p + n) is the oldest reserved slice not yet sent.
  bool IsOldestReserved(const void* p, uint64_t n);
  // Whether a reserved slice waits to be sent.
  bool HasReserved();
  // The oldest reserved slice was sent: its space comes back.
  void Sent();
  // Wakes every Reserve (the transport is closing; they return kTimeout at once).
  void Shutdown();

 private:
  struct Slice {
    uint64_t id;
    uint64_t start;  // position of the first byte (after a skipped tail)
    uint64_t end;    // position after the last byte
    bool released;
  };
  // One half: positions are byte counters that only grow; a position's offset in the half is
  // position % half_.
  struct Half {
    Mutex mu;
    CondVar space;
    uint64_t alloc = 0;  // next position to hand out
    uint64_t free = 0;   // positions before this are free again
    uint64_t next_id = 1;
    std::deque<Slice> slices;  // handed out, not yet given back, oldest first
  };
  // Under h->mu: the start position of n bytes, or false when they do not fit now.
  bool FitLocked(Half* h, uint64_t n, uint64_t* start) const;
  void AdvanceLocked(Half* h);

  uint8_t* base_ = nullptr;
  uint64_t length_ = 0;
  uint64_t half_ = 0;
  bool shutdown_ = false;  // under out_.mu
  Half in_, out_;
};

}  // namespace tf::transport::internal
