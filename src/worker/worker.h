// The remote vGPU worker (`tfusion worker`): accepts client stubs over TCP and/or the shared-memory
// transport, authenticates them in the handshake, and runs each client in its own session process
// forked BEFORE anything touches CUDA. The session loads the driver with dlopen (the real libcuda,
// the limiter in front of it, or tests/fakecuda), replays the client's calls, validates every
// handle and device pointer against its own tables, and frees everything when the client goes
// away. See docs/remote.md.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace tf::worker {

// The vGPU a client asks for, spelled as `tfusion run`'s flags (empty: not asked): VRAM, the
// compute request (tflops or percent), its limit (tflops_limit or percent_limit) and QoS. gpu:
// the worker's GPU it runs on, an index or a UUID as sent (empty: GPU 0); all checked by
// prepare_limits.
struct SessionLimits {
  std::string vram, tflops, percent, gpu;
  std::string tflops_limit, percent_limit, qos;
  // Limits record version 4: the tier idle timeouts of the client's pool allocation ("45000ms";
  // empty: the worker's own), for a worker with --tiering.
  std::string idle_swap, idle_disk;
  // Version 5: the allocation's idle zero timeout ("600000ms", "never"; empty: the worker's own)
  // and the allocation id the session is bound to ("a-..."; empty: none).
  std::string idle_zero, allocation;
};

// The environment variable of the client stub (src/client) that gives each limits-record field,
// in the record's order; `tfusion run --remote` and the Kubernetes webhook set them.
struct LimitsEnvVar {
  const char* name;
  std::string SessionLimits::*field;
};
inline constexpr LimitsEnvVar kLimitsEnv[] = {
    {"TFUSION_REMOTE_VRAM", &SessionLimits::vram},
    {"TFUSION_REMOTE_TFLOPS", &SessionLimits::tflops},
    {"TFUSION_REMOTE_PERCENT", &SessionLimits::percent},
    {"TFUSION_REMOTE_GPU", &SessionLimits::gpu},
    {"TFUSION_REMOTE_TFLOPS_LIMIT", &SessionLimits::tflops_limit},
    {"TFUSION_REMOTE_PERCENT_LIMIT", &SessionLimits::percent_limit},
    {"TFUSION_REMOTE_QOS", &SessionLimits::qos},
    {"TFUSION_REMOTE_IDLE_SWAP", &SessionLimits::idle_swap},
    {"TFUSION_REMOTE_IDLE_DISK", &SessionLimits::idle_disk},
    {"TFUSION_REMOTE_IDLE_ZERO", &SessionLimits::idle_zero},
    {"TFUSION_REMOTE_ALLOCATION", &SessionLimits::allocation},
};

struct WorkerOptions {
  // Each "HOST:PORT" (TCP; port 0 picks one) or "unix:/path" (shared memory, same host).
  std::vector<std::string> listen;
  // Clients must prove they hold this token, or a session ticket minted from it, by
  // challenge-response (neither crosses the wire). Empty accepts any client.
  std::string token;
  // TCP listeners serve TLS with this certificate (PEM chain, leaf first) and unencrypted key, and
  // refuse plaintext clients. Both empty: plaintext. Shared-memory listeners are unaffected.
  std::string tls_cert, tls_key;
  // The driver each session loads: a real libcuda.so.1, libtfusion-limiter.so, or the fake.
  std::string driver_path;
  // Environment set in each session before the driver is loaded (the vGPU binding of the
  // limiter: TFUSION_REGION, TFUSION_VGPU, TFUSION_REAL_LIBCUDA, ...).
  std::vector<std::pair<std::string, std::string>> session_env;
  // Per-client limits: called in the session process (pid `session`) before the driver loads
  // when the client asked for limits or a GPU; fills the environment to set and the driver to load
  // instead of driver_path (the limiter) and returns "", or returns why it cannot (the client's
  // cuInit then fails). Not set: such clients are refused.
  std::function<std::string(const SessionLimits&, pid_t session,
                            std::vector<std::pair<std::string, std::string>>* env,
                            std::string* driver)>
      prepare_limits;
  // Every session gets a vGPU through prepare_limits, even a client that asked for no limits (the
  // worker's own policy needs one: VRAM tiering).
  bool vgpu_for_every_session = false;
  // Called in the worker once a session process has exited (its vGPU, if any, can go).
  std::function<void(pid_t session)> session_ended;
  // Called in the worker every periodic_s seconds while it runs (housekeeping: what the sessions
  // of a worker killed outright left, once they have finished dying). Not set: never.
  std::function<void()> periodic;
  int64_t periodic_s = 10;
  // Scale to zero of sessions (tfusion worker --tiering): runs in a process of its own, a child of
  // the worker forked like the spares from the parent that never loads the driver, so that the
  // driver it loads (to checkpoint and restore sessions, which the driver requires to come from
  // another process) is never inherited by a session. Runs until `stop` is set or the worker
  // dies; started again (after a second) if it exits or crashes. Not set: no such process.
  std::function<void(const std::atomic<bool>& stop)> keeper;
  // When not empty, the bound addresses are written here (one per line, "tcp HOST:PORT" or
  // "unix PATH") once the worker accepts clients; written to a temporary name and renamed.
  std::string ready_file;
  // How long a session waits for the client's next frame awake (spinning) before it sleeps. A
  // session that sleeps between the calls of a busy client adds a wake-up (tens of µs) before
  // each launch it replays, and the GPU waits for it; spinning costs a core while the client is
  // active. 0: sleep at once.
  uint32_t spin_us = 200;
  // Sessions spin only while at most this many sessions of this worker are live; beyond, each
  // sleeps at once (as with spin_us 0): spinning sessions then take the cores their tenants' and
  // the other sessions' threads need (on an H100 host of 16 cores, eight GPT-2 b1 clients through
  // one worker ran at 0.79-0.80 of native spinning and 0.90-0.93 not). -1: a quarter of this
  // machine's cores, at least 1.
  int spin_sessions = -1;
  // Bytes of host memory each session may pin for its client: page-locked and mapped memory
  // (host regions, mirrors), the registered bulk arena, host-located cuMemCreate memory, and
  // managed memory when the session has no vGPU (with one, managed memory counts against its
  // VRAM quota). Beyond it the call fails with CUDA_ERROR_OUT_OF_MEMORY. 0: a quarter of this
  // machine's physical memory.
  uint64_t session_host_mem = 0;
  // Set to stop the worker (RunWorker also stops on SIGINT/SIGTERM when install_signal_handlers).
  std::atomic<bool>* stop = nullptr;
  bool install_signal_handlers = true;
};

// Runs until stopped. Returns 0 after a requested stop, 2 when a listener cannot be opened or the
// options are invalid (the reason is printed on stderr). Sessions end with the worker (they get
// SIGKILL when it exits), which their clients see as a lost connection.
int RunWorker(const WorkerOptions& options);

}  // namespace tf::worker
