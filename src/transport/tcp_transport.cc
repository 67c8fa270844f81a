#include "transport/tcp_transport.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <new>
#include <utility>

#include "transport/byte_stream.h"
#include "transport/socket_io.h"
#include "transport/sync.h"
#include "transport/tcp_bulk_arena.h"
#include "transport/tcp_session_setup.h"

namespace tf::transport {

using internal::CondVar;
using internal::CpuRelax;
using internal::DeadlineAfterMs;
using internal::Mutex;
using internal::MutexLock;

namespace {

// Fire-and-forget frames queue here until the flusher writes them; a sender waits (bounded) when
// the queue is full. Frames larger than a quarter of it bypass the queue.
constexpr size_t kSendQueueBytes = 256 << 10;
constexpr size_t kRecvBufferBytes = 256 << 10;

// A malloc'd byte buffer; no exceptions, growth reports failure.
struct ByteBuf {
  uint8_t* data = nullptr;
  size_t size = 0;
  size_t cap = 0;

  ~ByteBuf() { free(data); }
  bool Reserve(size_t n) {
    if (n <= cap) return true;
    void* p = realloc(data, n);
    if (p == nullptr) return false;
    data = static_cast<uint8_t*>(p);
    cap = n;
    return true;
  }
  void Append(const void* p, size_t n) {
    if (n) memcpy(data + size, p, n);
    size += n;
  }
  void Swap(ByteBuf* o) {
    std::swap(data, o->data);
    std::swap(size, o->size);
    std::swap(cap, o->cap);
  }
};

void ConfigureSocket(int fd, const TransportOptions& o) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  int idle = o.liveness_timeout_ms / 1000;
  if (idle < 1) idle = 1;
  int intvl = 1, cnt = 2;
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
  // Unacknowledged data (a host that vanished while we send) fails the connection after this.
  unsigned user_timeout = static_cast<unsigned>(o.liveness_timeout_ms) + 2000;
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof(user_timeout));
}

TransportStatus ProtocolError(const char* what, WireError e) {
  return TransportStatus::Error(TransportErrc::kProtocol, 0, "%s: %s", what, WireErrorName(e));
}

class TcpTransport final : public Transport {
 public:
  TcpTransport(std::unique_ptr<ByteStream> io, const TransportOptions& options,
               const ServerHello& session)
      : fd_(io->fd()), io_(std::move(io)), options_(options), session_(session) {}

  ~TcpTransport() override {
    Close();
    close(fd_);
  }

  bool Start() {
    if (!queue_.Reserve(kSendQueueBytes) || !inflight_.Reserve(kSendQueueBytes) ||
        !rbuf_.Reserve(kRecvBufferBytes) || !arena_.Init(options_.tcp_arena_bytes)) {
      return false;
    }
    if (pthread_create(&flusher_, nullptr, &TcpTransport::FlusherMain, this) != 0) return false;
    flusher_started_ = true;
    return true;
  }

  TransportStatus Send(const OutFrame& f) override;
  TransportStatus Flush() override;
  TransportStatus Receive(InFrame* frame, int timeout_ms) override;
  void Close() override;
  // The peer's FIN or a reset, seen without reading (data still queued does not hide it).
  bool PeerGone() override {
    pollfd p{fd_, POLLRDHUP, 0};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
  }

  bool BulkMemory(void** base, uint64_t* length) const override {
    *base = arena_.base();
    *length = arena_.length();
    return true;
  }
  bool HoldBulk(uint64_t* token) override;
  void ReleaseBulk(uint64_t token) override { arena_.ReleaseIncoming(token); }
  TransportStatus ReserveBulk(uint64_t n, int timeout_ms, void** data) override;
  bool SetBulkPlacer(BulkPlacer place, void* ctx) override {
    placer_ = place;
    placer_ctx_ = ctx;
    return true;
  }

  uint32_t max_payload_bytes() const override { return kMaxPayloadBytes; }
  // Sent and reserved bulk: a quarter of the arena, so that two slices can be in flight in each
  // direction (as on shared memory). Received bulk may be as large as kMaxBulkBytes.
  uint64_t max_bulk_bytes() const override {
    return arena_.half() / 2 < kMaxBulkBytes ? arena_.half() / 2 : kMaxBulkBytes;
  }
  const ServerHello& session() const override { return session_; }
  const char* kind() const override { return "tcp"; }
  const char* description() const override { return io_->description(); }

 private:
  static void* FlusherMain(void* self) {
    static_cast<TcpTransport*>(self)->FlusherLoop();
    return nullptr;
  }
  void FlusherLoop();
  TransportStatus ClosedStatus() const {
    return TransportStatus::Error(TransportErrc::kClosed, 0, "transport closed");
  }
  // Makes at least n unconsumed bytes available in rbuf_ (from rstart_), reading as needed.
  TransportStatus Fill(size_t n, int64_t deadline_ns);
  TransportStatus ReadSome(int64_t deadline_ns);

  const int fd_;
  const std::unique_ptr<ByteStream> io_;  // plaintext or TLS; every byte goes through it
  const TransportOptions options_;
  const ServerHello session_;
  std::atomic<bool> closed_{false};

  // Send side. writing_ marks the single writer (the flusher or a direct sender); only it touches
  // inflight_ and the socket's send direction. No lock is held across a system call.
  Mutex tx_mu_;
  CondVar flusher_cv_;  // work for the flusher
  CondVar tx_done_cv_;  // a write finished: queue space, writer free
  ByteBuf queue_;       // guarded by tx_mu_
  ByteBuf inflight_;    // owned by the writer
  bool writing_ = false;
  bool stopping_ = false;
  TransportStatus tx_error_;  // sticky
  pthread_t flusher_{};
  bool flusher_started_ = false;

  internal::TcpBulkArena arena_;

  // Receive side, used by one thread at a time.
  ByteBuf rbuf_;
  size_t rstart_ = 0, rend_ = 0;
  size_t pending_consume_ = 0;  // bytes of the frame last returned, released at the next Receive
  uint64_t pending_slice_ = 0;  // arena slice of that frame's bulk, released at the next Receive
  ByteBuf bulk_;                // bulk that did not fit the arena, or too large for it
  BulkPlacer placer_ = nullptr;
  void* placer_ctx_ = nullptr;
  TransportStatus rx_error_;  // sticky
};

TransportStatus TcpTransport::Send(const OutFrame& f) {
  if (closed_.load(std::memory_order_acquire)) return ClosedStatus();
  if (f.payload_length > kMaxPayloadBytes || f.bulk_length > max_bulk_bytes() ||
      (f.payload_length && f.payload == nullptr) || (f.bulk_length && f.bulk == nullptr) ||
      (f.flags & ~(kFlagReplyExpected | kFlagError))) {
    return TransportStatus::Error(TransportErrc::kInvalidArgument, 0,
                                  "bad frame: payload %u bytes (max %u), bulk %llu bytes (max "
                                  "%llu), flags 0x%x",
                                  f.payload_length, kMaxPayloadBytes,
                                  static_cast<unsigned long long>(f.bulk_length),
                                  static_cast<unsigned long long>(max_bulk_bytes()), f.flags);
  }
  // Reserved slices go out in reservation order, before any other frame with bulk (as on shm).
  if (f.bulk_reserved ? !arena_.IsOldestReserved(f.bulk, f.bulk_length)
                      : f.bulk_length > 0 && arena_.HasReserved()) {
    return TransportStatus::Error(TransportErrc::kInvalidArgument, 0,
                                  "bulk frame out of order: reserved slices go first, in order");
  }
  FrameHeader h;
  h.version = session_.version;
  h.opcode = f.opcode;
  h.flags = static_cast<uint16_t>(f.flags | (f.bulk_length ? kFlagBulkFollows : 0));
  h.sequence = f.sequence;
  h.payload_length = f.payload_length;
  uint8_t hdr[kFrameHeaderSize];
  EncodeFrameHeader(h, hdr);
  const size_t small = kFrameHeaderSize + f.payload_length;
  const int64_t deadline = DeadlineAfterMs(options_.io_timeout_ms);

  MutexLock l(&tx_mu_);
  const bool direct =
      (f.flags & kFlagReplyExpected) || f.bulk_length > 0 || small > kSendQueueBytes / 4;
  if (!direct) {
    while (tx_error_.ok() && queue_.size + small > kSendQueueBytes) {
      if (!tx_done_cv_.WaitUntil(&tx_mu_, deadline) && queue_.size + small > kSendQueueBytes) {
        tx_error_ = TransportStatus::Error(TransportErrc::kTimeout, 0,
                                           "send queue full for %d ms: peer not reading",
                                           options_.io_timeout_ms);
      }
    }
    if (!tx_error_.ok()) return tx_error_;
    queue_.Append(hdr, kFrameHeaderSize);
    queue_.Append(f.payload, f.payload_length);
    if (!writing_) flusher_cv_.Signal();
    return TransportStatus::Ok();
  }

  while (tx_error_.ok() && writing_) {
    if (!tx_done_cv_.WaitUntil(&tx_mu_, deadline) && writing_) {
      tx_error_ = TransportStatus::Error(TransportErrc::kTimeout, 0,
                                         "writer busy for %d ms: peer not reading",
                                         options_.io_timeout_ms);
    }
  }
  if (!tx_error_.ok()) return tx_error_;
  writing_ = true;
  queue_.Swap(&inflight_);
  tx_mu_.Unlock();

  uint8_t desc[kBulkDescriptorSize];
  BulkDescriptor d;
  d.length = f.bulk_length;
  EncodeBulkDescriptor(d, desc);
  iovec iov[5] = {
      {inflight_.data, inflight_.size},
      {hdr, kFrameHeaderSize},
      {const_cast<void*>(f.payload), f.payload_length},
      {desc, f.bulk_length ? kBulkDescriptorSize : 0},
      {const_cast<void*>(f.bulk), static_cast<size_t>(f.bulk_length)},
  };
  TransportStatus st = io_->SendAll(iov, 5, deadline);
  if (f.bulk_reserved) arena_.Sent();  // the socket has the bytes (or the connection is broken)

  tx_mu_.Lock();
  inflight_.size = 0;
  writing_ = false;
  if (!st.ok() && tx_error_.ok()) tx_error_ = st;
  tx_done_cv_.Broadcast();
  if (queue_.size) flusher_cv_.Signal();
  return tx_error_;
}

void TcpTransport::FlusherLoop() {
  MutexLock l(&tx_mu_);
  for (;;) {
    const uint32_t spin_ns = SpinNsNow(options_.tcp_spin_ns, options_);
    if (queue_.size == 0 && spin_ns > 0) {
      // Frames of a burst of asynchronous calls come a few microseconds apart: wait for the next
      // one awake, so the caller's Send finds no sleeper to wake.
      const int64_t spin_end = MonotonicNowNs() + spin_ns;
      while (!stopping_ && queue_.size == 0 && MonotonicNowNs() < spin_end) {
        tx_mu_.Unlock();
        for (int i = 0; i < 32; ++i) CpuRelax();
        tx_mu_.Lock();
      }
    }
    while (!stopping_ && (queue_.size == 0 || writing_ || !tx_error_.ok())) {
      flusher_cv_.Wait(&tx_mu_);
    }
    if (queue_.size == 0 || writing_ || !tx_error_.ok()) break;  // stopping, nothing to write
    writing_ = true;
    queue_.Swap(&inflight_);
    tx_mu_.Unlock();
    iovec iov{inflight_.data, inflight_.size};
    TransportStatus st = io_->SendAll(&iov, 1, DeadlineAfterMs(options_.io_timeout_ms));
    tx_mu_.Lock();
    inflight_.size = 0;
    writing_ = false;
    if (!st.ok() && tx_error_.ok()) tx_error_ = st;
    tx_done_cv_.Broadcast();
  }
}

TransportStatus TcpTransport::Flush() {
  if (closed_.load(std::memory_order_acquire)) return ClosedStatus();
  const int64_t deadline = DeadlineAfterMs(options_.io_timeout_ms);
  MutexLock l(&tx_mu_);
  while (tx_error_.ok() && (queue_.size || writing_)) {
    if (!tx_done_cv_.WaitUntil(&tx_mu_, deadline) && (queue_.size || writing_)) {
      return TransportStatus::Error(TransportErrc::kTimeout, 0, "flush timed out after %d ms",
                                    options_.io_timeout_ms);
    }
  }
  return tx_error_;
}

TransportStatus TcpTransport::ReadSome(int64_t deadline_ns) {
  bool spun = false;
  int64_t spin_end = 0;
  for (;;) {
    size_t n = 0;
    TransportStatus got = io_->RecvSome(rbuf_.data + rend_, rbuf_.cap - rend_, &n);
    if (!got.ok()) {
      if (closed_.load(std::memory_order_acquire)) return ClosedStatus();
      return got;
    }
    if (n > 0) {
      rend_ += n;
      return TransportStatus::Ok();
    }
    if (!spun && SpinNsNow(options_.tcp_spin_ns, options_) > 0) {
      // Nothing yet: poll for a short while before paying for a sleep and a wake-up.
      spun = true;
      spin_end = MonotonicNowNs() + options_.tcp_spin_ns;
    }
    if (MonotonicNowNs() < spin_end) {
      CpuRelax();
      continue;
    }
    TransportStatus st = io_->WaitReadable(deadline_ns, "receive");
    if (!st.ok()) return closed_.load(std::memory_order_acquire) ? ClosedStatus() : st;
  }
}

TransportStatus TcpTransport::Fill(size_t n, int64_t deadline_ns) {
  if (rend_ - rstart_ >= n) return TransportStatus::Ok();
  if (rstart_ + n > rbuf_.cap) {
    if (n > rbuf_.cap && !rbuf_.Reserve(n)) {
      return TransportStatus::Error(TransportErrc::kResourceExhausted, ENOMEM,
                                    "receive buffer of %zu bytes", n);
    }
    memmove(rbuf_.data, rbuf_.data + rstart_, rend_ - rstart_);
    rend_ -= rstart_;
    rstart_ = 0;
  }
  while (rend_ - rstart_ < n) TF_TRANSPORT_RETURN_IF_ERROR(ReadSome(deadline_ns));
  return TransportStatus::Ok();
}

TransportStatus TcpTransport::Receive(InFrame* frame, int timeout_ms) {
  if (closed_.load(std::memory_order_acquire)) return ClosedStatus();
  if (!rx_error_.ok()) return rx_error_;
  rstart_ += pending_consume_;
  pending_consume_ = 0;
  if (rstart_ == rend_) rstart_ = rend_ = 0;
  if (pending_slice_ != 0) arena_.ReleaseIncoming(pending_slice_);
  pending_slice_ = 0;

  TransportStatus st = Fill(kFrameHeaderSize, DeadlineAfterMs(timeout_ms));
  const int64_t io_deadline = DeadlineAfterMs(options_.io_timeout_ms);
  if (st.code() == TransportErrc::kTimeout) {
    if (rend_ == rstart_) return st;  // nothing arrived: still usable
    st = Fill(kFrameHeaderSize, io_deadline);
  }
  auto fail = [&](TransportStatus s) {
    rx_error_ = s;
    return s;
  };
  if (!st.ok()) return fail(st);

  FrameHeader h;
  WireError e = DecodeFrameHeader(rbuf_.data + rstart_, kFrameHeaderSize, &h);
  if (e != WireError::kOk) return fail(ProtocolError("frame header", e));
  const bool has_bulk = h.flags & kFlagBulkFollows;
  size_t head = kFrameHeaderSize + h.payload_length + (has_bulk ? kBulkDescriptorSize : 0);
  st = Fill(head, io_deadline);
  if (!st.ok()) return fail(st);

  frame->header = h;
  frame->payload = rbuf_.data + rstart_ + kFrameHeaderSize;
  frame->payload_length = h.payload_length;
  frame->bulk = nullptr;
  frame->bulk_length = 0;
  pending_consume_ = head;
  if (has_bulk) {
    BulkDescriptor d;
    e = DecodeBulkDescriptor(rbuf_.data + rstart_ + head - kBulkDescriptorSize,
                             kBulkDescriptorSize, &d);
    if (e == WireError::kOk && d.arena_offset != 0) e = WireError::kMalformed;
    if (e != WireError::kOk) return fail(ProtocolError("bulk descriptor", e));
    // Where the bulk lands: where the receiver's placer says (a copy's destination), else a
    // slice of the arena (memory the worker registered with its driver), else the heap.
    uint8_t* dst = placer_ != nullptr && d.length > 0
                       ? placer_(placer_ctx_, h, frame->payload, h.payload_length, d.length)
                       : nullptr;
    if (dst == nullptr && d.length > 0) dst = arena_.TakeIncoming(d.length, &pending_slice_);
    if (dst == nullptr) {
      if (!bulk_.Reserve(d.length ? d.length : 1)) {
        return fail(TransportStatus::Error(TransportErrc::kResourceExhausted, ENOMEM,
                                           "bulk buffer of %llu bytes",
                                           static_cast<unsigned long long>(d.length)));
      }
      dst = bulk_.data;
    }
    // Whatever of the bulk is already buffered, then straight from the socket.
    size_t buffered = rend_ - rstart_ - head;
    if (buffered > d.length) buffered = d.length;
    memcpy(dst, rbuf_.data + rstart_ + head, buffered);
    pending_consume_ += buffered;
    if (buffered < d.length) {
      st = io_->RecvExact(dst + buffered, d.length - buffered, io_deadline);
      if (!st.ok()) return fail(closed_.load() ? ClosedStatus() : st);
    }
    frame->bulk = dst;
    frame->bulk_length = d.length;
  }
  return TransportStatus::Ok();
}

bool TcpTransport::HoldBulk(uint64_t* token) {
  if (pending_slice_ == 0) return false;
  *token = pending_slice_;
  pending_slice_ = 0;  // no longer released by the next Receive
  return true;
}

TransportStatus TcpTransport::ReserveBulk(uint64_t n, int timeout_ms, void** data) {
  *data = nullptr;
  if (n == 0 || n > max_bulk_bytes()) {
    return TransportStatus::Error(TransportErrc::kInvalidArgument, 0,
                                  "bulk reservation of %llu bytes (max %llu)",
                                  static_cast<unsigned long long>(n),
                                  static_cast<unsigned long long>(max_bulk_bytes()));
  }
  if (closed_.load(std::memory_order_acquire)) return ClosedStatus();
  {
    MutexLock l(&tx_mu_);
    if (!tx_error_.ok()) return tx_error_;
  }
  uint8_t* p = nullptr;
  TransportStatus st = arena_.Reserve(n, DeadlineAfterMs(timeout_ms), &p);
  if (!st.ok()) return closed_.load(std::memory_order_acquire) ? ClosedStatus() : st;
  *data = p;
  return TransportStatus::Ok();
}

void TcpTransport::Close() {
  if (closed_.exchange(true, std::memory_order_acq_rel)) return;
  arena_.Shutdown();
  {
    MutexLock l(&tx_mu_);
    stopping_ = true;
    flusher_cv_.Signal();
  }
  // The flusher drains the queue (bounded by io_timeout_ms) before it exits.
  if (flusher_started_) pthread_join(flusher_, nullptr);
  // Wakes a Receive blocked in poll; the descriptor itself is closed by the destructor so that
  // its number cannot be reused under a concurrent call.
  io_->Shutdown();
}

// ---- listening, connecting, handshake ----

class TcpListener final : public Listener {
 public:
  explicit TcpListener(int fd) : fd_(fd) {}
  ~TcpListener() override { Close(); }

  TransportStatus Accept(const ServerPolicy& policy, const TransportOptions& options,
                         int timeout_ms, std::unique_ptr<Transport>* out,
                         ClientHello* peer) override;
  const char* address() const override { return address_; }
  void Close() override {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

  char address_[300] = {};

 private:
  int fd_;
};

TransportStatus FormatAddress(const sockaddr_storage& ss, char* out, size_t cap) {
  char host[INET6_ADDRSTRLEN] = {};
  uint16_t port = 0;
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    port = ntohs(a->sin_port);
    snprintf(out, cap, "%s:%u", host, port);
  } else {
    auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    port = ntohs(a->sin6_port);
    snprintf(out, cap, "[%s]:%u", host, port);
  }
  return TransportStatus::Ok();
}

TransportStatus TcpListener::Accept(const ServerPolicy& policy, const TransportOptions& options,
                                    int timeout_ms, std::unique_ptr<Transport>* out,
                                    ClientHello* peer) {
  if (fd_ < 0) return TransportStatus::Error(TransportErrc::kClosed, 0, "listener closed");
  TF_TRANSPORT_RETURN_IF_ERROR(
      internal::WaitFd(fd_, POLLIN, DeadlineAfterMs(timeout_ms), "accept"));
  int cfd = accept4(fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (cfd < 0) {
    if (errno == EAGAIN) return TransportStatus::Error(TransportErrc::kTimeout, 0, "accept");
    return internal::ErrnoStatus(errno, "accept");
  }
  if (options.on_accept != nullptr && !options.on_accept(cfd, options.on_accept_ctx)) {
    close(cfd);
    return TransportStatus::Error(TransportErrc::kResourceExhausted, 0, "connection turned away before its handshake");
  }
  ConfigureSocket(cfd, options);
  std::unique_ptr<ByteStream> io;
  ServerHello accept;
  ClientHello hello;
  TransportStatus st = internal::AcceptTcpSession(cfd, policy, options, &io, &accept, &hello);
  if (!st.ok()) {
    io.reset();
    close(cfd);
    return st;
  }
  auto* t = new (std::nothrow) TcpTransport(std::move(io), options, accept);
  if (t == nullptr || !t->Start()) {
    if (t) delete t;
    else close(cfd);
    return TransportStatus::Error(TransportErrc::kResourceExhausted, 0,
                                  "cannot start the transport");
  }
  out->reset(t);
  if (peer) *peer = hello;
  return TransportStatus::Ok();
}

TransportStatus Resolve(const char* host_port, bool passive, HostPort* hp, addrinfo** res) {
  TF_TRANSPORT_RETURN_IF_ERROR(ParseHostPort(host_port, hp));
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  char port[8];
  snprintf(port, sizeof(port), "%u", hp->port);
  int rc = getaddrinfo(hp->host[0] ? hp->host : nullptr, port, &hints, res);
  if (rc != 0) {
    return TransportStatus::Error(TransportErrc::kInvalidArgument, 0, "cannot resolve \"%s\": %s",
                                  host_port, gai_strerror(rc));
  }
  return TransportStatus::Ok();
}

}  // namespace

TransportStatus ParseHostPort(const char* text, HostPort* out) {
  if (text == nullptr || text[0] == '\0') {
    return TransportStatus::Error(TransportErrc::kInvalidArgument, 0,
                                  "empty address: expected HOST:PORT");
  }
  const char* colon;
  const char* host = text;
  size_t host_len;
  if (text[0] == '[') {
    const char* close = strchr(text, ']');
    if (close == nullptr) {
      return TransportStatus::Error(TransportErrc::kInvalidArgument, 0,
                                    "missing ']' in \"%s\"", text);
    }
    host = text + 1;
    host_len = static_cast<size_t>(close - host);
    if (close[1] != ':') {
      return TransportStatus::Error(TransportErrc::kInvalidArgument, 0,
                                    "missing ':PORT' after ']' in \"%s\"", text);
    }
    colon = close + 1;
  } else {
    colon = strrchr(text, ':');
    if (colon == nullptr) {
      return TransportStatus::Error(TransportErrc::kInvalidArgument, 0,
                                    "missing ':PORT' in \"%s\"", text);
    }
    if (memchr(text, ':', static_cast<size_t>(colon - text)) != nullptr) {
      return TransportStatus::Error(TransportErrc::kInvalidArgument, 0,
                                    "IPv6 address must be in brackets: \"[ADDR]:PORT\", got \"%s\"",
                                    text);
    }
    host_len = static_cast<size_t>(colon - text);
  }
  if (host_len >= sizeof(out->host)) {
    return TransportStatus::Error(TransportErrc::kInvalidArgument, 0, "host name too long");
  }
  const char* p = colon + 1;
  if (*p == '\0') {
    return TransportStatus::Error(TransportErrc::kInvalidArgument, 0, "missing port in \"%s\"",
                                  text);
  }
  unsigned long port = 0;
  for (; *p; ++p) {
    if (*p < '0' || *p > '9') {
      return TransportStatus::Error(TransportErrc::kInvalidArgument, 0,
                                    "port is not a number in \"%s\"", text);
    }
    port = port * 10 + static_cast<unsigned long>(*p - '0');
    if (port > 65535) {
      return TransportStatus::Error(TransportErrc::kInvalidArgument, 0,
                                    "port out of range (0-65535) in \"%s\"", text);
    }
  }
  memcpy(out->host, host, host_len);
  out->host[host_len] = '\0';
  if (strcmp(out->host, "*") == 0) out->host[0] = '\0';
  out->port = static_cast<uint16_t>(port);
  return TransportStatus::Ok();
}

TransportStatus ListenTcp(const char* host_port, std::unique_ptr<Listener>* out) {
  HostPort hp;
  addrinfo* res = nullptr;
  TF_TRANSPORT_RETURN_IF_ERROR(Resolve(host_port, /*passive=*/true, &hp, &res));
  TransportStatus st = TransportStatus::Error(TransportErrc::kIo, 0, "no address for \"%s\"",
                                              host_port);
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
      st = internal::ErrnoStatus(errno, "socket");
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 64) != 0) {
      st = TransportStatus::Error(TransportErrc::kIo, errno, "cannot listen on \"%s\": %s",
                                  host_port, strerror(errno));
      close(fd);
      continue;
    }
    auto* l = new (std::nothrow) TcpListener(fd);
    if (l == nullptr) {
      close(fd);
      st = TransportStatus::Error(TransportErrc::kResourceExhausted, 0, "out of memory");
      break;
    }
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
    FormatAddress(ss, l->address_, sizeof(l->address_));
    out->reset(l);
    st = TransportStatus::Ok();
    break;
  }
  freeaddrinfo(res);
  return st;
}

TransportStatus DialTcp(const char* host_port, int timeout_ms, int* out_fd, HostPort* out_hp) {
  const int64_t deadline = DeadlineAfterMs(timeout_ms);
  HostPort hp;
  addrinfo* res = nullptr;
  TF_TRANSPORT_RETURN_IF_ERROR(Resolve(host_port, /*passive=*/false, &hp, &res));
  int fd = -1;
  TransportStatus st;
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
      st = internal::ErrnoStatus(errno, "socket");
      continue;
    }
    int err = 0;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) break;
    err = errno;
    if (err == EINPROGRESS) {
      st = internal::WaitFd(fd, POLLOUT, deadline, "connect");
      socklen_t len = sizeof(err);
      err = 0;
      if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
      if (st.ok() && err == 0) break;
    }
    if (st.code() != TransportErrc::kTimeout) {
      st = TransportStatus::Error(TransportErrc::kPeerDead, err, "cannot connect to \"%s\": %s",
                                  host_port, strerror(err));
    }
    close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  if (fd < 0) return st;
  *out_fd = fd;
  if (out_hp != nullptr) *out_hp = hp;
  return TransportStatus::Ok();
}

TransportStatus ConnectTcp(const char* host_port, const ClientHello& hello,
                           const TransportOptions& options, std::unique_ptr<Transport>* out) {
  HostPort hp;
  int fd = -1;
  TF_TRANSPORT_RETURN_IF_ERROR(DialTcp(host_port, options.connect_timeout_ms, &fd, &hp));
  ConfigureSocket(fd, options);
  std::unique_ptr<ByteStream> io;
  ServerHello session;
  TransportStatus st = internal::OpenTcpSession(fd, hp.host, hello, options, &io, &session);
  if (!st.ok()) {
    io.reset();
    close(fd);
    return st;
  }
  auto* t = new (std::nothrow) TcpTransport(std::move(io), options, session);
  if (t == nullptr || !t->Start()) {
    if (t) delete t;
    else close(fd);
    return TransportStatus::Error(TransportErrc::kResourceExhausted, 0,
                                  "cannot start the transport");
  }
  out->reset(t);
  return TransportStatus::Ok();
}

}  // namespace tf::transport
