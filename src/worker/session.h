// One client's session inside its own worker process: loads the driver, replays the client's
// calls, validates every handle and pointer, and frees everything when the client goes away.
#pragma once

#include <memory>

#include "transport/transport.h"
#include "worker/worker.h"

namespace tf::worker {

// Returns the process exit code (0 after the client left). Never returns early on a client's
// mistake: a bad handle or pointer fails that call only.
int RunSession(const WorkerOptions& options, std::unique_ptr<transport::Transport> transport);

}  // namespace tf::worker
