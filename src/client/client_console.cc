// Device printf of the remote vGPU: the bytes the driver printed on the worker (kEvtConsole,
// remote_protocol.h) go to the application's stdout through stdio, as the driver's own printing
// would, and are flushed at once so they are out before the synchronizing call returns.
#include <cstdio>

#include "client/client_internal.h"

namespace tf::client {

void WriteConsole(const uint8_t* data, size_t n) {
  if (n == 0) return;
  std::fwrite(data, 1, n, stdout);
  std::fflush(stdout);
}

}  // namespace tf::client
