#include "transport/transport_status.h"

#include <cstdarg>
#include <cstdio>

namespace tf::transport {

const char* TransportErrcName(TransportErrc code) {
  switch (code) {
    case TransportErrc::kOk: return "ok";
    case TransportErrc::kInvalidArgument: return "invalid_argument";
    case TransportErrc::kTimeout: return "timeout";
    case TransportErrc::kPeerClosed: return "peer_closed";
    case TransportErrc::kPeerDead: return "peer_dead";
    case TransportErrc::kProtocol: return "protocol";
    case TransportErrc::kRefused: return "refused";
    case TransportErrc::kIo: return "io";
    case TransportErrc::kClosed: return "closed";
    case TransportErrc::kResourceExhausted: return "resource_exhausted";
  }
  return "unknown";
}

TransportStatus TransportStatus::Error(TransportErrc code, int sys_errno, const char* fmt, ...) {
  TransportStatus s;
  s.code_ = code;
  s.sys_errno_ = sys_errno;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(s.message_, sizeof(s.message_), fmt, ap);
  va_end(ap);
  return s;
}

}  // namespace tf::transport
