#include "transport/shm_transport.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <deque>
#include <new>

#include "transport/shm_segment.h"
#include "transport/auth_exchange.h"
#include "transport/socket_io.h"
#include "transport/sync.h"

namespace tf::transport {

using internal::DeadlineAfterMs;
using internal::Mutex;
using internal::MutexLock;
using namespace shm;  // NOLINT: this file is the segment's only user

namespace {

constexpr uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

TransportStatus ProtocolError(const char* what) {
  return TransportStatus::Error(TransportErrc::kProtocol, 0, "shm: %s", what);
}

TransportStatus SendMessage(int fd, const uint8_t* data, size_t len, int pass_fd);

class ShmTransport final : public Transport {
 public:
  ShmTransport(int side, int sock, int peer_pid, const TransportOptions& options,
               const ServerHello& session)
      : side_(side), sock_(sock), peer_pid_(peer_pid), options_(options), session_(session) {}

  ~ShmTransport() override {
    Close();
    if (arena_) munmap(arena_, geo_.arena_bytes);
    if (seg_) munmap(seg_, geo_.arena_offset);
    close(sock_);
  }

  // Maps the segment from memfd (the caller keeps ownership of memfd). REQUIRES: geometry valid.
  TransportStatus Map(int memfd, const Geometry& geo) {
    geo_ = geo;
    void* p = mmap(nullptr, geo.arena_offset, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
    if (p == MAP_FAILED) return internal::ErrnoStatus(errno, "mmap shm segment");
    seg_ = static_cast<uint8_t*>(p);
    // The arena is a separate mapping: a later step maps it at a fixed address in both processes.
    p = mmap(nullptr, geo.arena_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd,
             static_cast<off_t>(geo.arena_offset));
    if (p == MAP_FAILED) return internal::ErrnoStatus(errno, "mmap shm arena");
    arena_ = static_cast<uint8_t*>(p);
    hdr_ = reinterpret_cast<SegmentHeader*>(seg_);
    const int out_dir = side_ == kClientSide ? kClientToServer : kServerToClient;
    const int in_dir = 1 - out_dir;
    out_ring_ = &hdr_->ring[out_dir];
    in_ring_ = &hdr_->ring[in_dir];
    out_ring_data_ = seg_ + geo.ring_offset[out_dir];
    in_ring_data_ = seg_ + geo.ring_offset[in_dir];
    out_arena_ = &hdr_->arena[out_dir];
    in_arena_ = &hdr_->arena[in_dir];
    half_ = geo.arena_bytes / 2 / kArenaSliceAlignment * kArenaSliceAlignment;
    out_half_base_ = static_cast<uint64_t>(out_dir) * (geo.arena_bytes / 2);
    in_half_base_ = static_cast<uint64_t>(in_dir) * (geo.arena_bytes / 2);
    // Resume from whatever the segment says (fresh: zero); from here on each side trusts only
    // its own copies of the positions it owns.
    head_ = out_ring_->head.load(std::memory_order_relaxed);
    tail_ = in_ring_->tail.load(std::memory_order_relaxed);
    alloc_ = out_arena_->alloc_pos.load(std::memory_order_relaxed);
    free_ = in_arena_->free_pos.load(std::memory_order_relaxed);
    uint64_t payload_cap = geo.ring_bytes / 2 - kRecordPrefixBytes - kFrameHeaderSize -
                           kBulkDescriptorSize;
    max_payload_ = payload_cap < kMaxPayloadBytes ? static_cast<uint32_t>(payload_cap)
                                                  : kMaxPayloadBytes;
    max_bulk_ = half_ / 2 < kMaxBulkBytes ? half_ / 2 : kMaxBulkBytes;
    hdr_->side[side_].state.store(kSideAttached, std::memory_order_release);
    return TransportStatus::Ok();
  }

  TransportStatus Send(const OutFrame& f) override;
  TransportStatus Flush() override;
  TransportStatus Receive(InFrame* frame, int timeout_ms) override;
  void Close() override;

  uint32_t max_payload_bytes() const override { return max_payload_; }
  uint64_t max_bulk_bytes() const override { return max_bulk_; }
  const ServerHello& session() const override { return session_; }
  const char* kind() const override { return "shm"; }

  bool CanShareHostMemory() const override { return true; }
  TransportStatus OfferHostMemory(uint64_t region_id, int fd) override;
  TransportStatus TakeHostMemory(uint64_t region_id, int timeout_ms, int* fd) override;
  bool BulkMemory(void** base, uint64_t* length) const override {
    *base = arena_;
    *length = geo_.arena_bytes;
    return true;
  }
  bool HoldBulk(uint64_t* token) override;
  void ReleaseBulk(uint64_t token) override;
  TransportStatus ReserveBulk(uint64_t n, int timeout_ms, void** data) override;

 private:
  TransportStatus CheckPeer();
  bool PeerGone() override {
    const TransportStatus st = CheckPeer();
    return st.code() == TransportErrc::kPeerDead || st.code() == TransportErrc::kPeerClosed;
  }
  TransportStatus AllocBulk(uint64_t n, int64_t deadline, uint64_t* offset);
  TransportStatus Push(const uint8_t* hdr, const void* payload, uint32_t payload_length,
                       const uint8_t* desc, int64_t deadline);
  void ReleasePending();

  const int side_;
  const int sock_;
  const int peer_pid_;
  const TransportOptions options_;
  const ServerHello session_;
  std::atomic<bool> closed_{false};

  Geometry geo_;
  uint8_t* seg_ = nullptr;
  uint8_t* arena_ = nullptr;
  SegmentHeader* hdr_ = nullptr;
  RingControl* out_ring_ = nullptr;
  RingControl* in_ring_ = nullptr;
  uint8_t* out_ring_data_ = nullptr;
  uint8_t* in_ring_data_ = nullptr;
  ArenaControl* out_arena_ = nullptr;
  ArenaControl* in_arena_ = nullptr;
  uint64_t half_ = 0;           // usable bytes of one arena half
  uint64_t out_half_base_ = 0;  // arena offset of the half this side writes
  uint64_t in_half_base_ = 0;
  uint32_t max_payload_ = 0;
  uint64_t max_bulk_ = 0;

  // Producer side, serialized by tx_mu_ (held while copying into the ring, and while waiting
  // for space when the ring or arena is full, which only happens when the peer lags).
  Mutex tx_mu_;
  uint64_t head_ = 0;
  uint64_t alloc_ = 0;
  TransportStatus tx_error_;
  struct Reserved {
    uint64_t offset, length;
  };
  std::deque<Reserved> reserved_;  // ReserveBulk slices not sent yet, in allocation order

  // Consumer side (one thread).
  uint64_t tail_ = 0;
  uint64_t free_ = 0;
  uint64_t pending_record_ = 0;    // bytes of the record last returned by Receive
  uint64_t pending_free_to_ = 0;   // arena free position after releasing its bulk; 0 = none
  TransportStatus rx_error_;
  // Incoming bulk slices not yet given back, in arrival (= allocation) order: the last frame's
  // and those held (HoldBulk). The sender's space returns up to the first one still in use.
  // slices_mu_ guards them and free_ (ReleaseBulk runs on any thread).
  struct Slice {
    uint64_t end;
    bool released;
  };
  Mutex slices_mu_;
  std::deque<Slice> slices_;
  void AdvanceFreeLocked();
};

void ShmTransport::AdvanceFreeLocked() {
  uint64_t to = 0;
  while (!slices_.empty() && slices_.front().released) {
    to = slices_.front().end;
    slices_.pop_front();
  }
  if (to == 0) return;
  free_ = to;
  in_arena_->free_pos.store(free_, std::memory_order_release);
  Notify(&in_arena_->space_seq, &in_arena_->producer_sleeping);
}

bool ShmTransport::HoldBulk(uint64_t* token) {
  if (pending_free_to_ == 0) return false;
  *token = pending_free_to_;  // the slice's end position: unique for the connection's life
  pending_free_to_ = 0;       // no longer released by the next Receive
  return true;
}

void ShmTransport::ReleaseBulk(uint64_t token) {
  MutexLock l(&slices_mu_);
  for (Slice& s : slices_) {
    if (s.end == token) {
      s.released = true;
      break;
    }
  }
  AdvanceFreeLocked();
}

TransportStatus ShmTransport::ReserveBulk(uint64_t n, int timeout_ms, void** data) {
  *data = nullptr;
  if (n == 0 || n > max_bulk_) {
    return TransportStatus::Error(TransportErrc::kInvalidArgument, 0,
                                  "bulk reservation of %llu bytes (max %llu)",
                                  static_cast<unsigned long long>(n),
                                  static_cast<unsigned long long>(max_bulk_));
  }
  if (closed_.load(std::memory_order_acquire)) {
    return TransportStatus::Error(TransportErrc::kClosed, 0, "transport closed");
  }
  MutexLock l(&tx_mu_);
  if (!tx_error_.ok()) return tx_error_;
  uint64_t offset = 0;
  TransportStatus st = AllocBulk(n, DeadlineAfterMs(timeout_ms), &offset);
  if (st.code() == TransportErrc::kTimeout) return st;  // nothing reserved; still usable
  if (!st.ok()) {
    tx_error_ = st;
    return st;
  }
  reserved_.push_back({offset, n});
  *data = arena_ + offset;
  return TransportStatus::Ok();
}

TransportStatus ShmTransport::OfferHostMemory(uint64_t region_id, int fd) {
  if (closed_.load(std::memory_order_acquire)) {
    return TransportStatus::Error(TransportErrc::kClosed, 0, "transport closed");
  }
  if (fd < 0) return TransportStatus::Error(TransportErrc::kInvalidArgument, 0, "no descriptor");
  uint8_t id[8];
  for (int i = 0; i < 8; ++i) id[i] = static_cast<uint8_t>(region_id >> (8 * i));
  const int64_t deadline = DeadlineAfterMs(options_.io_timeout_ms);
  for (;;) {
    TransportStatus st = SendMessage(sock_, id, sizeof(id), fd);
    if (st.ok() || st.sys_errno() != EAGAIN) return st;
    TF_TRANSPORT_RETURN_IF_ERROR(internal::WaitFd(sock_, POLLOUT, deadline, "shm offer"));
  }
}

TransportStatus ShmTransport::TakeHostMemory(uint64_t region_id, int timeout_ms, int* fd) {
  *fd = -1;
  if (closed_.load(std::memory_order_acquire)) {
    return TransportStatus::Error(TransportErrc::kClosed, 0, "transport closed");
  }
  TF_TRANSPORT_RETURN_IF_ERROR(
      internal::WaitFd(sock_, POLLIN, DeadlineAfterMs(timeout_ms), "shm host memory offer"));
  uint8_t id[9];
  iovec iov{id, sizeof(id)};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int) * 4)];
  m.msg_control = ctl;
  m.msg_controllen = sizeof(ctl);
  ssize_t n = recvmsg(sock_, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (n < 0) {
    if (errno == EAGAIN) return TransportStatus::Error(TransportErrc::kTimeout, 0, "no offer");
    return internal::ErrnoStatus(errno, "shm host memory offer");
  }
  int got = -1;
  for (cmsghdr* c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int f;
      memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (got < 0) got = f;
      else close(f);  // never leak descriptors a peer pushes at us
    }
  }
  if (n == 0) {
    if (got >= 0) close(got);
    return TransportStatus::Error(TransportErrc::kPeerDead, 0, "peer closed its socket");
  }
  uint64_t got_id = 0;
  for (int i = 0; i < 8 && i < n; ++i) got_id |= static_cast<uint64_t>(id[i]) << (8 * i);
  if (n != 8 || got < 0 || got_id != region_id || (m.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
    if (got >= 0) close(got);
    return TransportStatus::Error(TransportErrc::kProtocol, 0,
                                  "shm: the next host memory offer is not region %llu",
                                  static_cast<unsigned long long>(region_id));
  }
  *fd = got;
  return TransportStatus::Ok();
}

TransportStatus ShmTransport::CheckPeer() {
  if (closed_.load(std::memory_order_acquire)) {
    return TransportStatus::Error(TransportErrc::kClosed, 0, "transport closed");
  }
  const int peer = 1 - side_;
  if (hdr_->side[peer].state.load(std::memory_order_acquire) == kSideClosed) {
    return TransportStatus::Error(TransportErrc::kPeerClosed, 0, "peer closed the connection");
  }
  pollfd p{sock_, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) > 0) {
    char c;
    bool gone = (p.revents & (POLLHUP | POLLRDHUP | POLLERR)) != 0;
    if (!gone && (p.revents & POLLIN)) gone = recv(sock_, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
    if (gone) {
      return TransportStatus::Error(TransportErrc::kPeerDead, 0,
                                    "peer process died (its rendezvous socket closed)");
    }
  }
  if (peer_pid_ > 0 && kill(peer_pid_, 0) != 0 && errno == ESRCH) {
    return TransportStatus::Error(TransportErrc::kPeerDead, ESRCH, "peer process %d is gone",
                                  peer_pid_);
  }
  return TransportStatus::Ok();
}

TransportStatus ShmTransport::AllocBulk(uint64_t n, int64_t deadline, uint64_t* offset) {
  const uint64_t size = AlignUp(n, kArenaSliceAlignment);
  const uint64_t off = alloc_ % half_;
  const uint64_t skip = half_ - off < size ? half_ - off : 0;
  const uint64_t need = skip + size;
  auto ready = [&] {
    return half_ - (alloc_ - out_arena_->free_pos.load(std::memory_order_acquire)) >= need;
  };
  TransportStatus st = WaitFor(ready, [&] { return CheckPeer(); }, &out_arena_->space_seq,
                               &out_arena_->producer_sleeping, deadline,
                               SpinNsNow(options_.shm_spin_ns, options_));
  if (!st.ok()) return st;
  // A peer that moved free_pos past what we allocated is broken; wait would have misfired.
  if (out_arena_->free_pos.load(std::memory_order_acquire) > alloc_) {
    return ProtocolError("peer released more bulk arena than was allocated");
  }
  *offset = out_half_base_ + (skip ? 0 : off);
  alloc_ += need;
  out_arena_->alloc_pos.store(alloc_, std::memory_order_release);
  return TransportStatus::Ok();
}

TransportStatus ShmTransport::Push(const uint8_t* hdr, const void* payload,
                                   uint32_t payload_length, const uint8_t* desc,
                                   int64_t deadline) {
  const uint64_t cap = geo_.ring_bytes;
  const uint64_t body = kFrameHeaderSize + payload_length + (desc ? kBulkDescriptorSize : 0);
  const uint64_t rec = AlignUp(kRecordPrefixBytes + body, 8);
  const uint64_t off = head_ % cap;
  const uint64_t pad = cap - off < rec ? cap - off : 0;
  auto ready = [&] {
    return cap - (head_ - out_ring_->tail.load(std::memory_order_acquire)) >= pad + rec;
  };
  TransportStatus st = WaitFor(ready, [&] { return CheckPeer(); }, &out_ring_->space_seq,
                               &out_ring_->producer_sleeping, deadline,
                               SpinNsNow(options_.shm_spin_ns, options_));
  if (!st.ok()) return st;
  if (out_ring_->tail.load(std::memory_order_acquire) > head_) {
    return ProtocolError("peer released more of the ring than was written");
  }
  uint32_t prefix[2];
  if (pad) {
    prefix[0] = static_cast<uint32_t>(pad);
    prefix[1] = kRecordPad;
    memcpy(out_ring_data_ + off, prefix, sizeof(prefix));
  }
  uint8_t* p = out_ring_data_ + (head_ + pad) % cap;
  prefix[0] = static_cast<uint32_t>(rec);
  prefix[1] = kRecordFrame;
  memcpy(p, prefix, sizeof(prefix));
  p += kRecordPrefixBytes;
  memcpy(p, hdr, kFrameHeaderSize);
  p += kFrameHeaderSize;
  if (payload_length) memcpy(p, payload, payload_length);
  p += payload_length;
  if (desc) memcpy(p, desc, kBulkDescriptorSize);
  head_ += pad + rec;
  out_ring_->head.store(head_, std::memory_order_release);
  Notify(&out_ring_->data_seq, &out_ring_->consumer_sleeping);
  return TransportStatus::Ok();
}

TransportStatus ShmTransport::Send(const OutFrame& f) {
  if (closed_.load(std::memory_order_acquire)) {
    return TransportStatus::Error(TransportErrc::kClosed, 0, "transport closed");
  }
  if (f.payload_length > max_payload_ || f.bulk_length > max_bulk_ ||
      (f.payload_length && f.payload == nullptr) || (f.bulk_length && f.bulk == nullptr) ||
      (f.flags & ~(kFlagReplyExpected | kFlagError))) {
    return TransportStatus::Error(
        TransportErrc::kInvalidArgument, 0,
        "bad frame: payload %u bytes (max %u), bulk %llu bytes (max %llu), flags 0x%x",
        f.payload_length, max_payload_, static_cast<unsigned long long>(f.bulk_length),
        static_cast<unsigned long long>(max_bulk_), f.flags);
  }
  const int64_t deadline = DeadlineAfterMs(options_.io_timeout_ms);
  FrameHeader h;
  h.version = session_.version;
  h.opcode = f.opcode;
  h.flags = static_cast<uint16_t>(f.flags | (f.bulk_length ? kFlagBulkFollows : 0));
  h.sequence = f.sequence;
  h.payload_length = f.payload_length;
  uint8_t hdr[kFrameHeaderSize];
  EncodeFrameHeader(h, hdr);

  MutexLock l(&tx_mu_);
  if (!tx_error_.ok()) return tx_error_;
  uint8_t desc[kBulkDescriptorSize];
  TransportStatus st;
  if (f.bulk_length && (f.bulk_reserved || !reserved_.empty())) {
    // A reserved slice goes out in reservation order, before any other bulk.
    if (!f.bulk_reserved || reserved_.empty() ||
        static_cast<const uint8_t*>(f.bulk) != arena_ + reserved_.front().offset ||
        f.bulk_length != reserved_.front().length) {
      return TransportStatus::Error(TransportErrc::kInvalidArgument, 0,
                                    "bulk frame out of reservation order");
    }
    BulkDescriptor d;
    d.length = f.bulk_length;
    d.arena_offset = reserved_.front().offset;
    reserved_.pop_front();
    EncodeBulkDescriptor(d, desc);
  } else if (f.bulk_length) {
    BulkDescriptor d;
    d.length = f.bulk_length;
    st = AllocBulk(f.bulk_length, deadline, &d.arena_offset);
    if (st.ok()) {
      if (options_.shm_bulk_copy != nullptr) {
        options_.shm_bulk_copy(arena_ + d.arena_offset, f.bulk, f.bulk_length);
      } else {
        memcpy(arena_ + d.arena_offset, f.bulk, f.bulk_length);
      }
      EncodeBulkDescriptor(d, desc);
    }
  }
  if (st.ok()) st = Push(hdr, f.payload, f.payload_length, f.bulk_length ? desc : nullptr, deadline);
  if (!st.ok()) tx_error_ = st;
  return st;
}

TransportStatus ShmTransport::Flush() {
  // Send publishes each frame before it returns; there is nothing to flush.
  if (closed_.load(std::memory_order_acquire)) {
    return TransportStatus::Error(TransportErrc::kClosed, 0, "transport closed");
  }
  MutexLock l(&tx_mu_);
  return tx_error_;
}

void ShmTransport::ReleasePending() {
  if (pending_record_) {
    tail_ += pending_record_;
    pending_record_ = 0;
    in_ring_->tail.store(tail_, std::memory_order_release);
    Notify(&in_ring_->space_seq, &in_ring_->producer_sleeping);
  }
  if (pending_free_to_) {
    MutexLock l(&slices_mu_);
    for (auto it = slices_.rbegin(); it != slices_.rend(); ++it) {
      if (it->end == pending_free_to_) {
        it->released = true;
        break;
      }
    }
    pending_free_to_ = 0;
    AdvanceFreeLocked();
  }
}

TransportStatus ShmTransport::Receive(InFrame* frame, int timeout_ms) {
  if (closed_.load(std::memory_order_acquire)) {
    return TransportStatus::Error(TransportErrc::kClosed, 0, "transport closed");
  }
  if (!rx_error_.ok()) return rx_error_;
  ReleasePending();
  auto fail = [&](TransportStatus s) {
    rx_error_ = s;
    return s;
  };
  const uint64_t cap = geo_.ring_bytes;
  const int64_t deadline = DeadlineAfterMs(timeout_ms);
  for (;;) {
    auto ready = [&] { return in_ring_->head.load(std::memory_order_acquire) != tail_; };
    TransportStatus st = WaitFor(ready, [&] { return CheckPeer(); }, &in_ring_->data_seq,
                                 &in_ring_->consumer_sleeping, deadline,
                                 SpinNsNow(options_.shm_spin_ns, options_));
    if (st.code() == TransportErrc::kTimeout) return st;
    if (!st.ok()) return fail(st);
    const uint64_t avail = in_ring_->head.load(std::memory_order_acquire) - tail_;
    if (avail > cap) return fail(ProtocolError("ring head out of range"));
    const uint64_t off = tail_ % cap;
    uint32_t prefix[2];
    memcpy(prefix, in_ring_data_ + off, sizeof(prefix));
    const uint64_t rec = prefix[0];
    if (rec < kRecordPrefixBytes || rec % 8 || rec > cap - off || rec > avail) {
      return fail(ProtocolError("bad ring record size"));
    }
    if (prefix[1] == kRecordPad) {
      tail_ += rec;
      in_ring_->tail.store(tail_, std::memory_order_release);
      Notify(&in_ring_->space_seq, &in_ring_->producer_sleeping);
      continue;
    }
    if (prefix[1] != kRecordFrame) return fail(ProtocolError("bad ring record kind"));
    const uint8_t* body = in_ring_data_ + off + kRecordPrefixBytes;
    const uint64_t body_len = rec - kRecordPrefixBytes;
    // Copy before validating: the peer can still write the ring.
    uint8_t hdr[kFrameHeaderSize];
    if (body_len < kFrameHeaderSize) return fail(ProtocolError("record shorter than a header"));
    memcpy(hdr, body, kFrameHeaderSize);
    FrameHeader h;
    WireError e = DecodeFrameHeader(hdr, kFrameHeaderSize, &h, max_payload_);
    if (e != WireError::kOk) {
      return fail(TransportStatus::Error(TransportErrc::kProtocol, 0, "shm frame header: %s",
                                         WireErrorName(e)));
    }
    const bool has_bulk = h.flags & kFlagBulkFollows;
    const uint64_t need = kFrameHeaderSize + h.payload_length + (has_bulk ? kBulkDescriptorSize : 0);
    if (need > body_len) return fail(ProtocolError("frame longer than its record"));
    frame->header = h;
    frame->payload = body + kFrameHeaderSize;
    frame->payload_length = h.payload_length;
    frame->bulk = nullptr;
    frame->bulk_length = 0;
    if (has_bulk) {
      uint8_t desc[kBulkDescriptorSize];
      memcpy(desc, body + kFrameHeaderSize + h.payload_length, sizeof(desc));
      BulkDescriptor d;
      e = DecodeBulkDescriptor(desc, sizeof(desc), &d, max_bulk_);
      if (e != WireError::kOk) {
        return fail(TransportStatus::Error(TransportErrc::kProtocol, 0, "shm bulk descriptor: %s",
                                           WireErrorName(e)));
      }
      // The slice must lie inside the peer's half, where the FIFO order says the next one is.
      if (d.length == 0 || d.arena_offset < in_half_base_ ||
          d.arena_offset - in_half_base_ > half_ ||
          d.length > half_ - (d.arena_offset - in_half_base_) ||
          d.arena_offset % kArenaSliceAlignment) {
        return fail(ProtocolError("bulk slice outside the peer's arena half"));
      }
      // Slices arrive in allocation order: the next one starts after the newest still in use
      // (held ones included), or at the free position when none is.
      MutexLock l(&slices_mu_);
      const uint64_t from = slices_.empty() ? free_ : slices_.back().end;
      const uint64_t rel = d.arena_offset - in_half_base_;
      const uint64_t from_off = from % half_;
      const uint64_t pos = rel >= from_off ? from + (rel - from_off) : from + (half_ - from_off) + rel;
      const uint64_t end = pos + AlignUp(d.length, kArenaSliceAlignment);
      if (end - free_ > half_ || end > in_arena_->alloc_pos.load(std::memory_order_acquire)) {
        return fail(ProtocolError("bulk slice out of allocation order"));
      }
      frame->bulk = arena_ + d.arena_offset;
      frame->bulk_length = d.length;
      slices_.push_back({end, false});
      pending_free_to_ = end;
    }
    pending_record_ = rec;
    return TransportStatus::Ok();
  }
}

void ShmTransport::Close() {
  if (closed_.exchange(true, std::memory_order_acq_rel)) return;
  if (hdr_ == nullptr) return;
  hdr_->side[side_].state.store(kSideClosed, std::memory_order_release);
  // Wake every sleeper, ours (a concurrent Receive or Send) and the peer's, so both notice.
  for (int d = 0; d < 2; ++d) {
    WakeAll(&hdr_->ring[d].data_seq);
    WakeAll(&hdr_->ring[d].space_seq);
    WakeAll(&hdr_->arena[d].space_seq);
  }
  shutdown(sock_, SHUT_RDWR);
}

// ---- rendezvous ----

TransportStatus MakeSocketAddress(const char* path, sockaddr_un* addr) {
  size_t n = path ? strlen(path) : 0;
  if (n == 0 || n >= sizeof(addr->sun_path)) {
    return TransportStatus::Error(TransportErrc::kInvalidArgument, 0,
                                  "shm socket path must be 1-%zu bytes, got %zu",
                                  sizeof(addr->sun_path) - 1, n);
  }
  memset(addr, 0, sizeof(*addr));
  addr->sun_family = AF_UNIX;
  memcpy(addr->sun_path, path, n);
  return TransportStatus::Ok();
}

int PeerPid(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return 0;
  return cred.pid;
}

int CreateSegmentFile(uint64_t size) {
  int fd = memfd_create("tfusion-transport", MFD_CLOEXEC);
  if (fd < 0) {
    char tmpl[] = "/dev/shm/tfusion-transport-XXXXXX";
    fd = mkostemp(tmpl, O_CLOEXEC);
    if (fd < 0) return -1;
    unlink(tmpl);
  }
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

class ShmListener final : public Listener {
 public:
  ShmListener(int fd, const char* path) : fd_(fd) {
    snprintf(path_, sizeof(path_), "%s", path);
  }
  ~ShmListener() override { Close(); }
  TransportStatus Accept(const ServerPolicy& policy, const TransportOptions& options,
                         int timeout_ms, std::unique_ptr<Transport>* out,
                         ClientHello* peer) override;
  const char* address() const override { return path_; }
  void Close() override {
    if (fd_ < 0) return;
    close(fd_);
    fd_ = -1;
    unlink(path_);
  }

 private:
  int fd_;
  char path_[sizeof(sockaddr_un::sun_path)];
};

TransportStatus SendMessage(int fd, const uint8_t* data, size_t len, int pass_fd) {
  iovec iov{const_cast<uint8_t*>(data), len};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int))];
  if (pass_fd >= 0) {
    memset(ctl, 0, sizeof(ctl));
    m.msg_control = ctl;
    m.msg_controllen = sizeof(ctl);
    cmsghdr* c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
  }
  // A SEQPACKET message this small goes out whole or not at all.
  if (sendmsg(fd, &m, MSG_NOSIGNAL) != static_cast<ssize_t>(len)) {
    return internal::ErrnoStatus(errno, "shm rendezvous send");
  }
  return TransportStatus::Ok();
}

// Receives one rendezvous message (a handshake frame) and at most one passed descriptor.
TransportStatus RecvMessage(int fd, int64_t deadline, FrameHeader* h, uint8_t* payload,
                            int* passed_fd) {
  if (passed_fd) *passed_fd = -1;
  TF_TRANSPORT_RETURN_IF_ERROR(internal::WaitFd(fd, POLLIN, deadline, "shm rendezvous"));
  uint8_t buf[kFrameHeaderSize + kMaxHandshakePayload + 1];
  iovec iov{buf, sizeof(buf)};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int) * 4)];
  m.msg_control = ctl;
  m.msg_controllen = sizeof(ctl);
  ssize_t n = recvmsg(fd, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (n < 0) return internal::ErrnoStatus(errno, "shm rendezvous receive");
  int got_fd = -1;
  for (cmsghdr* c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int f;
      memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (got_fd < 0 && passed_fd) got_fd = f;
      else close(f);  // never leak descriptors a peer pushes at us
    }
  }
  auto done = [&](TransportStatus s) {
    if (!s.ok() && got_fd >= 0) close(got_fd);
    else if (passed_fd) *passed_fd = got_fd;
    return s;
  };
  if (n == 0) {
    return done(TransportStatus::Error(TransportErrc::kPeerClosed, 0,
                                       "peer closed during the handshake"));
  }
  if (m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
    return done(ProtocolError("oversized handshake message"));
  }
  WireError e = DecodeFrameHeader(buf, static_cast<size_t>(n), h, kMaxHandshakePayload);
  if (e == WireError::kOk && (h->flags & kFlagBulkFollows)) e = WireError::kBadFlags;
  if (e == WireError::kOk && kFrameHeaderSize + h->payload_length != static_cast<size_t>(n)) {
    e = WireError::kMalformed;
  }
  if (e != WireError::kOk) {
    return done(TransportStatus::Error(TransportErrc::kProtocol, 0, "shm handshake frame: %s",
                                       WireErrorName(e)));
  }
  memcpy(payload, buf + kFrameHeaderSize, h->payload_length);
  return done(TransportStatus::Ok());
}

// Handshake frames as rendezvous messages; keeps the descriptor passed with the last one.
class RendezvousChannel final : public internal::HandshakeChannel {
 public:
  RendezvousChannel(int fd, int64_t deadline_ns) : fd_(fd), deadline_ns_(deadline_ns) {}
  ~RendezvousChannel() override {
    if (passed_fd_ >= 0) close(passed_fd_);
  }
  TransportStatus SendFrame(const uint8_t* frame, size_t n) override {
    return SendMessage(fd_, frame, n, -1);
  }
  TransportStatus RecvFrame(FrameHeader* h, uint8_t* payload) override {
    if (passed_fd_ >= 0) close(passed_fd_);
    passed_fd_ = -1;
    return RecvMessage(fd_, deadline_ns_, h, payload, &passed_fd_);
  }
  int TakePassedFd() {
    int fd = passed_fd_;
    passed_fd_ = -1;
    return fd;
  }

 private:
  const int fd_;
  const int64_t deadline_ns_;
  int passed_fd_ = -1;
};

TransportStatus ShmListener::Accept(const ServerPolicy& policy, const TransportOptions& options,
                                    int timeout_ms, std::unique_ptr<Transport>* out,
                                    ClientHello* peer) {
  if (fd_ < 0) return TransportStatus::Error(TransportErrc::kClosed, 0, "listener closed");
  Geometry geo;
  TF_TRANSPORT_RETURN_IF_ERROR(
      ComputeGeometry(options.shm_ring_bytes, options.shm_arena_bytes, &geo));
  TF_TRANSPORT_RETURN_IF_ERROR(
      internal::WaitFd(fd_, POLLIN, DeadlineAfterMs(timeout_ms), "shm accept"));
  int cfd = accept4(fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (cfd < 0) {
    if (errno == EAGAIN) return TransportStatus::Error(TransportErrc::kTimeout, 0, "accept");
    return internal::ErrnoStatus(errno, "shm accept");
  }
  if (options.on_accept != nullptr && !options.on_accept(cfd, options.on_accept_ctx)) {
    close(cfd);
    return TransportStatus::Error(TransportErrc::kResourceExhausted, 0, "connection turned away before its handshake");
  }
  const int64_t deadline = DeadlineAfterMs(options.connect_timeout_ms);
  RendezvousChannel ch(cfd, deadline);
  ClientHello hello;
  ServerHello accept;
  TransportStatus st = internal::ServerHandshake(&ch, policy, &accept, &hello);
  if (!st.ok()) {
    close(cfd);
    return st;
  }

  int memfd = CreateSegmentFile(geo.total_bytes);
  if (memfd < 0) {
    st = internal::ErrnoStatus(errno, "create shm segment");
    close(cfd);
    return st;
  }
  const int peer_pid = PeerPid(cfd);
  auto* t = new (std::nothrow) ShmTransport(kServerSide, cfd, peer_pid, options, accept);
  if (t == nullptr) {
    close(memfd);
    close(cfd);
    return TransportStatus::Error(TransportErrc::kResourceExhausted, 0, "out of memory");
  }
  std::unique_ptr<Transport> owned(t);
  // Initialise the header before anyone else can see the file (it is still private to us).
  void* p = mmap(nullptr, kHeaderBytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
  if (p == MAP_FAILED) {
    st = internal::ErrnoStatus(errno, "mmap shm header");
    close(memfd);
    return st;
  }
  auto* sh = static_cast<SegmentHeader*>(p);
  memcpy(sh->magic, kSegmentMagic, sizeof(kSegmentMagic));
  sh->layout_version = kSegmentLayoutVersion;
  sh->header_bytes = kHeaderBytes;
  sh->total_bytes = geo.total_bytes;
  sh->ring_bytes = geo.ring_bytes;
  sh->ring_offset[0] = geo.ring_offset[0];
  sh->ring_offset[1] = geo.ring_offset[1];
  sh->arena_offset = geo.arena_offset;
  sh->arena_bytes = geo.arena_bytes;
  sh->session_id = accept.session_id;
  sh->side[kClientSide].pid = static_cast<uint32_t>(peer_pid);
  sh->side[kServerSide].pid = static_cast<uint32_t>(getpid());
  munmap(p, kHeaderBytes);
  st = t->Map(memfd, geo);
  if (st.ok()) {
    uint8_t frame[internal::kMaxHandshakeFrame];
    st = SendMessage(cfd, frame, internal::EncodeServerHelloFrame(accept, frame), memfd);
  }
  close(memfd);
  if (!st.ok()) return st;
  *out = std::move(owned);
  if (peer) *peer = hello;
  return TransportStatus::Ok();
}

}  // namespace

TransportStatus ListenShm(const char* socket_path, std::unique_ptr<Listener>* out) {
  sockaddr_un addr;
  TF_TRANSPORT_RETURN_IF_ERROR(MakeSocketAddress(socket_path, &addr));
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return internal::ErrnoStatus(errno, "socket");
  int rc = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  if (rc != 0 && errno == EADDRINUSE) {
    // A socket file is left behind by a listener that died; replace it only if nobody answers.
    struct stat sb;
    int probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    bool live = probe >= 0 &&
                connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    if (probe >= 0) close(probe);
    if (live || stat(socket_path, &sb) != 0 || !S_ISSOCK(sb.st_mode)) {
      close(fd);
      return TransportStatus::Error(TransportErrc::kInvalidArgument, EADDRINUSE,
                                    "shm socket path \"%s\" is already in use", socket_path);
    }
    unlink(socket_path);
    rc = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  }
  if (rc != 0) {
    TransportStatus st = TransportStatus::Error(TransportErrc::kIo, errno, "cannot bind \"%s\": %s",
                                                socket_path, strerror(errno));
    close(fd);
    return st;
  }
  if (listen(fd, 64) != 0) {
    TransportStatus st = TransportStatus::Error(TransportErrc::kIo, errno,
                                                "cannot listen on \"%s\": %s", socket_path,
                                                strerror(errno));
    close(fd);
    return st;
  }
  auto* l = new (std::nothrow) ShmListener(fd, socket_path);
  if (l == nullptr) {
    close(fd);
    return TransportStatus::Error(TransportErrc::kResourceExhausted, 0, "out of memory");
  }
  out->reset(l);
  return TransportStatus::Ok();
}

TransportStatus ConnectShm(const char* socket_path, const ClientHello& hello,
                           const TransportOptions& options, std::unique_ptr<Transport>* out) {
  const int64_t deadline = DeadlineAfterMs(options.connect_timeout_ms);
  sockaddr_un addr;
  TF_TRANSPORT_RETURN_IF_ERROR(MakeSocketAddress(socket_path, &addr));
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return internal::ErrnoStatus(errno, "socket");
  // A Unix socket connect does not block; EAGAIN means the backlog is full: retry briefly.
  while (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    int err = errno;
    if (err == EAGAIN && internal::RemainingMs(deadline) > 0) {
      usleep(1000);
      continue;
    }
    close(fd);
    if (err == EAGAIN) {
      return TransportStatus::Error(TransportErrc::kTimeout, err,
                                    "connect to \"%s\": server backlog full", socket_path);
    }
    return TransportStatus::Error(err == ENOENT || err == ECONNREFUSED ? TransportErrc::kPeerDead
                                                                       : TransportErrc::kIo,
                                  err, "cannot connect to worker socket \"%s\": %s", socket_path,
                                  strerror(err));
  }
  RendezvousChannel ch(fd, deadline);
  ServerHello session;
  TransportStatus st = internal::ClientHandshake(&ch, hello, &session);
  // The segment comes with the server hello, the last message.
  int memfd = ch.TakePassedFd();
  if (st.ok() && memfd < 0) st = ProtocolError("server hello carried no segment descriptor");
  Geometry geo;
  struct stat sb;
  if (st.ok() && fstat(memfd, &sb) != 0) st = internal::ErrnoStatus(errno, "fstat shm segment");
  if (st.ok() && static_cast<uint64_t>(sb.st_size) < kHeaderBytes) {
    st = ProtocolError("segment smaller than its header");
  }
  if (st.ok()) {
    void* p = mmap(nullptr, kHeaderBytes, PROT_READ, MAP_SHARED, memfd, 0);
    if (p == MAP_FAILED) {
      st = internal::ErrnoStatus(errno, "mmap shm header");
    } else {
      const auto* sh = static_cast<const SegmentHeader*>(p);
      st = ValidateHeader(sh, static_cast<uint64_t>(sb.st_size), &geo);
      if (st.ok() && sh->session_id != session.session_id) {
        st = ProtocolError("segment belongs to another session");
      }
      munmap(p, kHeaderBytes);
    }
  }
  if (!st.ok()) {
    if (memfd >= 0) close(memfd);
    close(fd);
    return st;
  }
  auto* t = new (std::nothrow) ShmTransport(kClientSide, fd, PeerPid(fd), options, session);
  if (t == nullptr) {
    close(memfd);
    close(fd);
    return TransportStatus::Error(TransportErrc::kResourceExhausted, 0, "out of memory");
  }
  std::unique_ptr<Transport> owned(t);
  st = t->Map(memfd, geo);
  close(memfd);
  if (!st.ok()) return st;
  *out = std::move(owned);
  return TransportStatus::Ok();
}

}  // namespace tf::transport
