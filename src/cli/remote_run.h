// `tfusion run --remote` and `tfusion worker`: the command-line glue of the remote vGPU
// (docs/remote.md). Kept free of the control-plane libraries so the worker binary stays small.
#pragma once

#include "worker/worker.h"

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
// vram/tflops/percent (the compute request), tflops_limit/percent_limit (its ceiling) and qos:
// the vGPU the client asks the worker for, spelled as `tfusion run`'s flags (empty: not given;
// nothing at all: what the worker gives every session); the worker enforces them with the
// limiter. gpu: the worker's GPU to run on, its index or UUID (empty: the worker's GPU 0); the
// session sees it alone, as device 0. A pool allocation adds its tier idle timeouts and its id
// (the worker binds the session's vGPU to it). The same record the worker receives, field for
// field: the session ticket is bound to its digest (worker/session_ticket.h).
using RemoteLimits = worker::SessionLimits;
int RunRemote(const std::string& remote, const std::string& token,
              const std::vector<std::string>& command, const RemoteLimits& limits = {});

// `tfusion worker`: serves remote clients until SIGINT/SIGTERM. listen: "HOST:PORT" and/or
// "unix:/path" (at least one). driver: the libcuda each session loads; empty means
// $TFUSION_REAL_LIBCUDA or the usual system locations. session_env: "KEY=VALUE" entries set in each
// session before the driver loads (e.g. the limiter's TFUSION_REGION/TFUSION_VGPU binding).
// ready_file: optional, receives the bound addresses. hooks: how clients that ask for limits of
// their own get a vGPU (worker::WorkerOptions; `tfusion worker` makes one per session with the
// limiter, see main.cc); without them such clients are refused. Returns 0 after a stop, 2 on bad
// options (an unparsable --session-host-mem included).
struct WorkerHooks {
  decltype(worker::WorkerOptions::prepare_limits) prepare_limits;
  decltype(worker::WorkerOptions::session_ended) session_ended;
  decltype(worker::WorkerOptions::periodic) periodic;
  decltype(worker::WorkerOptions::keeper) keeper;  // tfusion worker --tiering: the sessions' zero keeper
  uint32_t spin_us = worker::WorkerOptions{}.spin_us;  // tfusion worker --spin-us
  int spin_sessions = worker::WorkerOptions{}.spin_sessions;  // tfusion worker --spin-sessions
  bool vgpu_for_every_session = false;                 // tfusion worker --tiering
  std::string session_host_mem;  // tfusion worker --session-host-mem as typed ("": the default)
  // tfusion worker --tls-cert/--tls-key: TCP clients only over TLS. Without them, a TCP listener
  // off loopback is warned about at start.
  std::string tls_cert, tls_key;
};
int RunWorkerCommand(const std::vector<std::string>& listen, const std::string& token,
                     const std::string& driver, const std::vector<std::string>& session_env,
                     const std::string& ready_file, const WorkerHooks& hooks = {});

}  // namespace tf::cli
