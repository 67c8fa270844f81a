// `tfusion run --remote` and `tfusion worker`: the command-line glue of the remote vGPU
// (docs/remote.md). Kept free of the control-plane libraries so the worker binary stays small.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace tf::cli {

// Runs `command` with the client stub (libcuda.so.1 -> libtfusion-client.so) first on
// LD_LIBRARY_PATH and TFUSION_REMOTE / TFUSION_TOKEN set, so that its CUDA calls run on the worker
// at `remote` ("HOST:PORT", or "unix:/path" for a worker on this host). Signals are forwarded.
// Returns the command's exit status (128 + signal when killed), 2 on a usage error, 127 when the
// command cannot be started. The stub is found in $TFUSION_CLIENT_DIR, next to tfusion in the
// build tree (../client/inject) or installed (../lib/tensorfusion/client-inject).
int RunRemote(const std::string& remote, const std::string& token,
              const std::vector<std::string>& command);

// `tfusion worker`: serves remote clients until SIGINT/SIGTERM. listen: "HOST:PORT" and/or
// "unix:/path" (at least one). driver: the libcuda each session loads; empty means
// $TFUSION_REAL_LIBCUDA or the usual system locations. session_env: "KEY=VALUE" entries set in each
// session before the driver loads (e.g. the limiter's TFUSION_REGION/TFUSION_VGPU binding).
// ready_file: optional, receives the bound addresses. Returns 0 after a stop, 2 on bad options.
int RunWorkerCommand(const std::vector<std::string>& listen, const std::string& token,
                     const std::string& driver, const std::vector<std::string>& session_env,
                     const std::string& ready_file);

}  // namespace tf::cli
