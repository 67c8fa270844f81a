// Host functions in stream order (cuLaunchHostFunc, cuStreamAddCallback).
#include "client/client_internal.h"
#include "tf_client_impl.h"

namespace tf::client {

void HandleEventFrame(Session* s, const transport::InFrame& in) {
  (void)s;
  (void)in;
}

}  // namespace tf::client
