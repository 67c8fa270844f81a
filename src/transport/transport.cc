// The defaults of Transport's optional capabilities: unsupported.
#include "transport/transport.h"

namespace tf::transport {

TransportStatus Transport::OfferHostMemory(uint64_t region_id, int fd) {
  (void)region_id;
  (void)fd;
  return TransportStatus::Error(TransportErrc::kInvalidArgument, 0,
                                "the %s transport cannot share host memory", kind());
}

TransportStatus Transport::TakeHostMemory(uint64_t region_id, int timeout_ms, int* fd) {
  (void)region_id;
  (void)timeout_ms;
  *fd = -1;
  return TransportStatus::Error(TransportErrc::kInvalidArgument, 0,
                                "the %s transport cannot share host memory", kind());
}

TransportStatus Transport::ReserveBulk(uint64_t n, int timeout_ms, void** data) {
  (void)n;
  (void)timeout_ms;
  *data = nullptr;
  return TransportStatus::Error(TransportErrc::kInvalidArgument, 0,
                                "the %s transport has no bulk memory to reserve", kind());
}

}  // namespace tf::transport
