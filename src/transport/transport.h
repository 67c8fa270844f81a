// Transport: one connection between a client stub and a worker session, carrying frames
// (header + payload + optional bulk buffer) in order, in both directions.
//
// Implementations: TCP (tcp_transport.h) and shared memory (shm_transport.h); RDMA later behind
// the same interface. Connect/accept live with each implementation because their rendezvous
// differs; both run the handshake (handshake.h) before a Transport exists, so every Transport is
// an authenticated session with a negotiated version and feature set (session()).
//
// Thread safety: Send and Flush may be called from any number of threads concurrently; Receive
// from one thread at a time (it may run concurrently with Send). Close may be called from any
// thread; it wakes a blocked Receive or Send, which then return kClosed.
//
// Bounded time: nothing blocks without a deadline. Receive takes a timeout; Send and Flush are
// bounded by TransportOptions::io_timeout_ms. A peer that dies is reported as kPeerDead (or
// kPeerClosed after an orderly close) within TransportOptions::liveness_timeout_ms, never a hang.
//
// Failure: after any error other than kTimeout (from Receive when no frame arrived), the transport
// is broken and every later call returns the same error.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "transport/handshake.h"
#include "transport/transport_status.h"
#include "transport/wire.h"

namespace tf::transport {

class TlsContext;  // tls_stream.h

struct TransportOptions {
  int connect_timeout_ms = 5000;    // connect + handshake
  int io_timeout_ms = 10000;        // Send/Flush, and the rest of a frame once its header arrived
  int liveness_timeout_ms = 1500;   // how late a dead peer may be noticed (TCP keepalive; shm
                                    // checks the peer well within this)
  // Shared memory only.
  uint64_t shm_ring_bytes = 4ull << 20;   // each direction's command ring; a power of two
  uint64_t shm_arena_bytes = 64ull << 20; // bulk arena, split evenly between the two directions
  uint32_t shm_spin_ns = 20000;           // spin this long before sleeping on a futex
  // Copies a frame's bulk into the arena; nullptr: memcpy. (The client passes its multi-threaded
  // copy: one thread cannot move a large pageable copy at the memory's speed.)
  void (*shm_bulk_copy)(void* dst, const void* src, size_t n) = nullptr;
  // TCP only: a receiver with nothing to read polls the socket this long before sleeping in
  // poll(), and the sender's flusher thread waits this long for more frames before sleeping, so
  // that a stream of small asynchronous calls does not pay a wake-up per frame. 0: never spin.
  uint32_t tcp_spin_ns = 20000;
  // TCP only: this process's bulk memory for the connection (half for incoming bulk, half for
  // reserved outgoing slices; max_bulk_bytes() is a quarter). Anonymous memory, touched as used.
  uint64_t tcp_arena_bytes = 64ull << 20;
  // TCP, client: TLS, verifying the worker's certificate against this CA file (PEM); nullptr:
  // plaintext. TCP, server: serve TLS with this context (NewTlsServerContext) and refuse
  // plaintext clients (kTlsRequired); nullptr: plaintext only. See tls_stream.h.
  const char* tls_ca_file = nullptr;
  const TlsContext* tls_server = nullptr;
  // Both: spin (shm_spin_ns, tcp_spin_ns) only while *spin_load <= spin_load_max; nullptr: always.
  // The worker counts its live sessions there: many sessions spinning at once take the cores the
  // tenants' own threads need (tfusion worker --spin-sessions, docs/remote.md).
  const std::atomic<uint32_t>* spin_load = nullptr;
  uint32_t spin_load_max = 0;
  // Server: called with each accepted connection before its handshake (and before TLS). False
  // closes it at once and Accept returns kResourceExhausted without a handshake. The worker starts
  // its next acceptor here, so that one silent peer cannot hold up every other client's handshake,
  // and turns away a peer with too many handshakes under way. nullptr: nothing is called.
  bool (*on_accept)(int fd, void* ctx) = nullptr;
  void* on_accept_ctx = nullptr;
};

// How long to spin now: `base`, or 0 while the spin load is above its maximum.
inline uint32_t SpinNsNow(uint32_t base, const TransportOptions& o) {
  if (base == 0 || o.spin_load == nullptr) return base;
  return o.spin_load->load(std::memory_order_relaxed) > o.spin_load_max ? 0 : base;
}

// Where the bulk of an incoming frame should land (Transport::SetBulkPlacer): memory for
// bulk_length bytes, or nullptr for the transport's own. Given the frame's header and payload.
using BulkPlacer = uint8_t* (*)(void* ctx, const FrameHeader& header, const uint8_t* payload,
                                uint32_t payload_length, uint64_t bulk_length);

// A frame to send. The transport sets the version, and kFlagBulkFollows iff bulk_length > 0.
struct OutFrame {
  uint16_t opcode = 0;
  uint16_t flags = 0;  // kFlagReplyExpected, kFlagError
  uint64_t sequence = 0;
  const void* payload = nullptr;
  uint32_t payload_length = 0;
  const void* bulk = nullptr;
  uint64_t bulk_length = 0;
  // bulk is a slice this side got from ReserveBulk and filled in place (no copy). Reserved slices
  // are sent in the order they were reserved, before any other frame with bulk.
  bool bulk_reserved = false;
};

// A received frame. payload and bulk are views owned by the transport, valid until the next
// Receive or Close on it. On shared memory they point into memory the peer can write: copy a
// field before validating it and do not read it twice.
struct InFrame {
  FrameHeader header;
  const uint8_t* payload = nullptr;
  uint32_t payload_length = 0;
  const uint8_t* bulk = nullptr;
  uint64_t bulk_length = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;

  // Queues or writes one frame, preserving order with every other Send on this transport.
  // Returns once the caller's payload and bulk buffers may be reused. Frames without
  // kFlagReplyExpected and without bulk may be batched with later ones (delivered promptly
  // without further calls); a frame with kFlagReplyExpected or bulk is handed on before Send
  // returns, together with everything queued before it.
  // Errors: kInvalidArgument (payload or bulk over the limits below: nothing sent), kTimeout
  // (peer not draining within io_timeout_ms: broken), kPeerDead, kPeerClosed, kClosed, kIo.
  virtual TransportStatus Send(const OutFrame& frame) = 0;

  // Waits (bounded by io_timeout_ms) until every frame queued so far is handed to the kernel or
  // the ring.
  virtual TransportStatus Flush() = 0;

  // Waits up to timeout_ms (>= 0; 0 polls) for the next frame. kTimeout when none arrived (the
  // transport stays usable); other errors are final.
  virtual TransportStatus Receive(InFrame* frame, int timeout_ms) = 0;

  // Idempotent. Queued frames are flushed for at most io_timeout_ms first; the peer then sees
  // kPeerClosed after it has received them.
  virtual void Close() = 0;

  // Whether the peer is known to be gone (its process died or it closed the connection), checked
  // without reading a frame: safe to call from another thread while one thread is elsewhere
  // (the worker's watchdog asks it while the session thread is blocked in the driver).
  virtual bool PeerGone() { return false; }

  // ---- Optional capabilities. A transport that lacks one keeps the default: "unsupported". ----
  //
  // Sharing host memory with the peer (shm: a memfd passed over the rendezvous socket with
  // SCM_RIGHTS; RDMA later: a registered memory region). Used for page-locked host memory that
  // both processes map (docs/remote.md, "host regions").
  virtual bool CanShareHostMemory() const { return false; }
  // Sender: hands the peer `fd` (a memfd; the caller keeps its own descriptor) under region_id.
  // Call it before sending the frame that names the region: the peer takes offers in order.
  virtual TransportStatus OfferHostMemory(uint64_t region_id, int fd);
  // Receiver: the next offered region, which must be region_id; the caller owns *fd. Waits up to
  // timeout_ms. kProtocol when the next offer names another region (that offer is dropped),
  // kTimeout when none arrived. The transport stays usable either way.
  virtual TransportStatus TakeHostMemory(uint64_t region_id, int timeout_ms, int* fd);
  //
  // Zero-copy bulk: the memory that bulk views and reserved slices lie in, so that a worker can
  // register it with the driver once (cuMemHostRegister) and DMA to and from it directly.
  virtual bool BulkMemory(void** base, uint64_t* length) const {
    (void)base;
    (void)length;
    return false;
  }
  // Keeps the bulk view of the frame the last Receive returned valid past the next Receive, until
  // ReleaseBulk(*token). The sender gets the space back once every earlier slice is released too.
  // False (nothing held) when unsupported or the frame had no bulk.
  virtual bool HoldBulk(uint64_t* token) {
    (void)token;
    return false;
  }
  // Thread-safe (a driver callback may call it). REQUIRES: token from HoldBulk, released once.
  virtual void ReleaseBulk(uint64_t token) { (void)token; }
  // Reserves n bytes (<= max_bulk_bytes()) of outgoing bulk memory to fill in place, then send
  // with OutFrame::bulk == *data and bulk_reserved. Waits up to timeout_ms for space (kTimeout:
  // nothing reserved, the transport stays usable). kInvalidArgument when unsupported.
  virtual TransportStatus ReserveBulk(uint64_t n, int timeout_ms, void** data);
  //
  // Receiving bulk into the caller's memory (TCP: read from the socket straight into it, no
  // copy afterwards): while a placer is set, Receive asks it where each frame's bulk goes before
  // reading it, and the frame's bulk view is that memory. Set and cleared (nullptr) by the thread
  // that receives, between Receives. False when unsupported (the bulk stays in the transport's
  // memory; shm's already lies in the shared arena).
  virtual bool SetBulkPlacer(BulkPlacer place, void* ctx) {
    (void)place;
    (void)ctx;
    return false;
  }

  virtual uint32_t max_payload_bytes() const = 0;
  virtual uint64_t max_bulk_bytes() const = 0;
  virtual const ServerHello& session() const = 0;
  virtual const char* kind() const = 0;  // "tcp", "shm"
  // How the bytes travel, for logs: kind() or, over TLS, its version and cipher.
  virtual const char* description() const { return kind(); }
};

// A server endpoint that accepts clients.
class Listener {
 public:
  virtual ~Listener() = default;

  // Waits up to timeout_ms for a client, runs the handshake against policy and, on success,
  // returns the session's transport and the client's hello. A client the policy refuses is told
  // why (a Refusal frame) and the call returns kRefused with that reason; the listener stays
  // usable. *out is set only on success.
  virtual TransportStatus Accept(const ServerPolicy& policy, const TransportOptions& options,
                                 int timeout_ms, std::unique_ptr<Transport>* out,
                                 ClientHello* peer) = 0;

  // What a client passes to Connect*: "HOST:PORT" with the bound port for TCP, the socket path
  // for shared memory.
  virtual const char* address() const = 0;
  virtual void Close() = 0;
};

// Monotonic clock in nanoseconds (CLOCK_MONOTONIC).
int64_t MonotonicNowNs();

}  // namespace tf::transport
