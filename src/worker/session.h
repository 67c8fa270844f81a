// One client's session inside its own worker process: loads the driver, replays the client's
// calls, validates every handle and pointer, and frees everything when the client goes away.
#pragma once

#include <memory>

#include "transport/transport.h"
#include "worker/worker.h"

namespace tf::worker {

// Returns the process exit code (0 after the client left). Never returns early on a client's
// mistake: a bad handle or pointer fails that call only.
// credential_id: what the client's credential is named by in its handshake (a session ticket's
// id binds the session to the limits the ticket was made for).
int RunSession(const WorkerOptions& options, std::unique_ptr<transport::Transport> transport,
               const std::string& credential_id = "");

}  // namespace tf::worker
