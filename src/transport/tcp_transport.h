// TCP transport: remote vGPU over the network (or loopback when shared memory is not available).
//
// - TCP_NODELAY; fire-and-forget frames are copied into a send queue and written by a flusher
//   thread, which writes everything queued while its previous write was in progress in one
//   sendmsg (batching without timers). A frame that expects a reply, carries bulk, or is large is
//   written by the calling thread together with the queue ahead of it (header, payload, bulk
//   descriptor and bulk in one sendmsg, no extra copy of the bulk).
// - Bulk memory (tcp_bulk_arena.h): incoming bulk is read from the socket into a slice of this
//   process's arena (which a worker registers with its driver, then DMAs from the slice while the
//   next one arrives: HoldBulk/ReleaseBulk), or straight into the receiver's memory
//   (SetBulkPlacer); outgoing slices are reserved in the arena, filled in place and sent from it
//   (ReserveBulk). max_bulk_bytes() is a quarter of TransportOptions::tcp_arena_bytes.
// - A process that dies is noticed at once (the kernel resets or closes its sockets); a host that
//   goes silent is noticed by TCP keepalive plus TCP_USER_TIMEOUT after about
//   liveness_timeout_ms + 2 s.
// - Addresses are "HOST:PORT": an IPv4 literal, a host name, or an IPv6 literal in brackets
//   ("[::1]:7000"). For listening, HOST may be "*" or empty (all interfaces) and PORT may be 0
//   (the kernel picks; Listener::address() reports it).
#pragma once

#include <cstdint>
#include <memory>

#include "transport/transport.h"

namespace tf::transport {

struct HostPort {
  char host[256] = {};  // without brackets; "" means any address
  uint16_t port = 0;
};

// kInvalidArgument with a message naming the problem ("missing ':PORT' in \"gpu1\"", "port
// 70000 out of range", "IPv6 address must be in brackets").
TransportStatus ParseHostPort(const char* text, HostPort* out);

TransportStatus ListenTcp(const char* host_port, std::unique_ptr<Listener>* out);

// Opens a TCP connection to `host_port` within timeout_ms, trying each address it resolves to:
// *fd is the connected socket (non-blocking, close-on-exec), *hp the parsed address when given.
// kTimeout when nothing answered in time; kPeerDead with the errno (refused, no route) otherwise.
// ConnectTcp's first step, before its handshake.
TransportStatus DialTcp(const char* host_port, int timeout_ms, int* fd, HostPort* hp = nullptr);

// Connects, sends `hello` and waits for the server's answer, all within
// options.connect_timeout_ms. A refusal returns kRefused with the server's reason and message.
TransportStatus ConnectTcp(const char* host_port, const ClientHello& hello,
                           const TransportOptions& options, std::unique_ptr<Transport>* out);

}  // namespace tf::transport
