// Shared-memory transport: client stub and worker on the same host.
//
// Rendezvous: the worker listens on a Unix domain socket (SOCK_SEQPACKET) at a path. A client
// connects and sends its hello; the worker answers with its hello and, attached to it via
// SCM_RIGHTS, a memfd holding the connection's segment (shm_segment.h): two single-producer/
// single-consumer rings (client->worker commands, worker->client replies) and a bulk arena split
// into one FIFO half per direction. Frames travel through the rings; a frame's bulk buffer is
// copied into the sender's arena half and referenced by offset. Waiting spins briefly
// (TransportOptions::shm_spin_ns), then sleeps on a futex in the segment.
//
// Liveness: the socket stays open for the life of the connection. While waiting, each side checks
// the peer's state word in the segment (orderly close), whether the peer's end of the socket has
// closed (the kernel closes it when the process dies, zombie or not) and whether the peer's pid
// (SO_PEERCRED) still exists, at least every 10 ms. A killed peer is reported as kPeerDead within
// tens of milliseconds.
//
// Limits: payload up to min(kMaxPayloadBytes, ring/2 - overhead); bulk up to a quarter of the arena
// per frame (so two slices can be in flight per direction).
#pragma once

#include <memory>

#include "transport/transport.h"

namespace tf::transport {

// Binds and listens on a Unix socket path (at most 107 bytes). A stale socket file whose listener
// is gone is replaced; a live one is an error (kInvalidArgument, "already in use").
TransportStatus ListenShm(const char* socket_path, std::unique_ptr<Listener>* out);

TransportStatus ConnectShm(const char* socket_path, const ClientHello& hello,
                           const TransportOptions& options, std::unique_ptr<Transport>* out);

}  // namespace tf::transport
