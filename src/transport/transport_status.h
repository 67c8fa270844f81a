// TransportStatus: the error currency of src/transport.
//
// tf_transport links into the client stub (a guest inside the tenant's process), so it cannot use
// tf::Status (which allocates a std::string and lives in tf_common). A TransportStatus is a plain
// value: a code, the errno of the failing system call (0 when none), the refusal reason when the
// server refused the handshake, and a bounded human-readable message. Callers outside the data
// plane convert it into a tf::Status at their edge.
#pragma once

#include <cstdint>

namespace tf::transport {

enum class TransportErrc : uint8_t {
  kOk = 0,
  kInvalidArgument,  // bad address, oversize payload or bulk, bad option
  kTimeout,          // the deadline passed; the connection is still usable unless stated
  kPeerClosed,       // the peer closed the connection in an orderly way
  kPeerDead,         // the peer vanished (process died, reset, keepalive or liveness failure)
  kProtocol,         // the peer sent something malformed; the connection is broken
  kRefused,          // the server refused the handshake; see refusal_reason
  kIo,               // a system call failed; sys_errno says which
  kClosed,           // this side already closed the transport
  kResourceExhausted,  // out of memory or descriptors
};

// Stable lower-case name ("peer_dead") for logs. Never null.
const char* TransportErrcName(TransportErrc code);

class TransportStatus {
 public:
  TransportStatus() = default;

  static TransportStatus Ok() { return TransportStatus(); }
  // printf-style message, truncated to fit.
  static TransportStatus Error(TransportErrc code, int sys_errno, const char* fmt, ...)
      __attribute__((format(printf, 3, 4)));

  bool ok() const { return code_ == TransportErrc::kOk; }
  TransportErrc code() const { return code_; }
  int sys_errno() const { return sys_errno_; }
  // Only meaningful when code() == kRefused: a RefusalReason value (handshake.h).
  uint16_t refusal_reason() const { return refusal_reason_; }
  void set_refusal_reason(uint16_t reason) { refusal_reason_ = reason; }
  // "" when ok.
  const char* message() const { return message_; }

 private:
  TransportErrc code_ = TransportErrc::kOk;
  uint16_t refusal_reason_ = 0;
  int sys_errno_ = 0;
  char message_[200] = {};
};

}  // namespace tf::transport

#define TF_TRANSPORT_RETURN_IF_ERROR(expr)                \
  do {                                                    \
    ::tf::transport::TransportStatus tf_tstatus_ = (expr); \
    if (!tf_tstatus_.ok()) return tf_tstatus_;            \
  } while (0)
