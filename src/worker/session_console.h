// Device printf for the remote vGPU. The driver prints kernel printf output to the session
// process's stdout at synchronizing points; the session's fd 1 goes to a pipe instead, and what
// arrives there reaches the client as kEvtConsole events (remote_protocol.h) sent before the
// reply of each call and before each host-function event, so the application sees the lines when
// its synchronizing call returns, as natively. The worker's own logs go to stderr and stay there.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

#include "transport/transport.h"

namespace tf::worker {

class ConsoleCapture {
 public:
  ConsoleCapture() = default;
  ConsoleCapture(const ConsoleCapture&) = delete;
  ConsoleCapture& operator=(const ConsoleCapture&) = delete;
  ~ConsoleCapture() { Stop(); }

  // Points fd 1 at a pipe that a thread of this object keeps draining into memory, so a writer
  // (the driver, inside a synchronizing call of the session's own thread) never blocks on a full
  // pipe. False (fd 1 unchanged, logged) when the pipe cannot be made.
  bool Start();

  // Flushes stdio's stdout, collects every byte written to fd 1 before this call and sends them
  // as kEvtConsole frames with sequence numbers from *event_seq. Thread-safe; callers' bytes go
  // out in the order they were written. A send that fails drops the bytes (the client is gone).
  void Forward(transport::Transport* t, std::atomic<uint64_t>* event_seq);

  // Restores fd 1 and joins the drain thread. Idempotent.
  void Stop();

  // Bytes held in memory at most; beyond it output is dropped (and counted) until the next
  // Forward: the driver prints at most its printf FIFO (1 MiB by default) per synchronization.
  static constexpr size_t kMaxBuffered = 64u << 20;

 private:
  void ReadAvailableLocked();  // REQUIRES mu_
  void DrainLoop();

  int read_fd_ = -1;
  int saved_stdout_ = -1;
  std::mutex send_mu_;  // orders Forward callers (session thread, host-function threads)
  std::mutex mu_;       // guards buf_, dropped_ and every read of the pipe
  std::string buf_;
  uint64_t dropped_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace tf::worker
