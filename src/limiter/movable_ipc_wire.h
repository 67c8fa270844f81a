// The formats of legacy IPC of movable memory (movable_ipc.h): the CUipcMemHandle we hand out for
// a movable range, and the two messages the importer and the exporter exchange over a unix
// socket. Both ends are this library; a handle and a message never leave the host, so numbers are
// in the host's byte order, but every field has a fixed offset (no struct is sent raw) and every
// decoder checks magic, version, reserved bytes, sizes and counts before anything is used.
//
// Handle (CU_IPC_HANDLE_SIZE = 64 bytes):
//   0  8 bytes magic "TFMOVIPC"      8  u16 version (1)     10 u16 0     12 u32 exporter pid
//   16 u64 secret (the exporter's, random per process)      24 u64 export id (>= 1)
//   32 u64 offset of the exported address in the range     40 u64 range size (bytes)
//   48..63 zero
// Request (importer -> exporter, 32 bytes):
//   0  "TFIPCREQ"   8 u16 version   10 u16 0   12 u32 0   16 u64 export id   24 u64 secret
// Reply (exporter -> importer, 32 + 16 * kMaxChunks bytes), with one file descriptor per chunk
// attached (SCM_RIGHTS), in chunk order:
//   0  "TFIPCREP"   8 u16 version   10 u16 status (IpcStatus)   12 u32 chunk count
//   16 u64 range size   24 u64 0   32 + 16 i: chunk i's u64 offset and u64 size
#pragma once

#include <cstddef>
#include <cstdint>

namespace tf::limiter::ipcwire {

inline constexpr uint16_t kVersion = 1;
inline constexpr size_t kHandleBytes = 64;
inline constexpr size_t kRequestBytes = 32;
inline constexpr uint32_t kMaxChunks = 16;
inline constexpr size_t kReplyBytes = 32 + 16 * kMaxChunks;

struct Handle {
  uint32_t pid = 0;
  uint64_t secret = 0;
  uint64_t export_id = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
};

enum class HandleKind { kNotOurs, kOurs, kMalformed };

void EncodeHandle(const Handle& h, char out[kHandleBytes]);
// kNotOurs: another magic (the driver's handle); kMalformed: our magic with a wrong version,
// non-zero reserved bytes, pid 0, export id 0, size 0 or an offset outside the range.
HandleKind DecodeHandle(const char in[kHandleBytes], Handle* h);

struct Request {
  uint64_t export_id = 0;
  uint64_t secret = 0;
};
void EncodeRequest(const Request& r, char out[kRequestBytes]);
bool DecodeRequest(const char in[kRequestBytes], Request* r);

enum class IpcStatus : uint16_t { kOk = 0, kUnknownExport = 1, kBadRequest = 2, kExportFailed = 3 };

struct Chunk {
  uint64_t offset = 0;
  uint64_t size = 0;
};
struct Reply {
  IpcStatus status = IpcStatus::kBadRequest;
  uint32_t count = 0;  // chunks, 0 unless kOk
  uint64_t size = 0;   // the range's bytes, 0 unless kOk
  Chunk chunks[kMaxChunks];
};
void EncodeReply(const Reply& r, char out[kReplyBytes]);
// False for a wrong magic, version or reserved field, an unknown status, or (kOk) a count outside
// 1..kMaxChunks or chunks that do not tile [0, size) in order with non-zero sizes.
bool DecodeReply(const char in[kReplyBytes], Reply* r);

// CLOCK_MONOTONIC in milliseconds: the deadlines below.
int64_t NowMs();

// The abstract unix socket name an exporter listens on, derived from its pid and secret
// (`out` gets a leading NUL, as abstract names have); returns its length for sockaddr_un.
size_t SocketName(uint32_t pid, uint64_t secret, char* out, size_t cap);

// Socket I/O with a deadline (every call waits at most `timeout_ms` in all). SendWithFds sends
// `len` bytes and `nfds` descriptors in one message. RecvWithFds receives exactly `len` bytes in
// one message and at most `max_fds` descriptors into `fds` (*nfds gets how many); false on a
// timeout, a short or truncated message, or descriptors beyond `max_fds` (every descriptor
// received is closed then).
bool SendWithFds(int sock, const void* buf, size_t len, const int* fds, uint32_t nfds, int timeout_ms);
bool RecvWithFds(int sock, void* buf, size_t len, int* fds, uint32_t max_fds, uint32_t* nfds, int timeout_ms);

}  // namespace tf::limiter::ipcwire
