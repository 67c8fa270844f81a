// ConsoleCapture: the session's stdout through a pipe to the client (session_console.h).
#include "worker/session_console.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "client/remote_protocol.h"

namespace tf::worker {

bool ConsoleCapture::Start() {
  if (read_fd_ >= 0) return true;
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) {
    fprintf(stderr, "tfusion-worker[%d]: device printf stays on the worker: pipe: %s\n",
            static_cast<int>(getpid()), strerror(errno));
    return false;
  }
  fflush(stdout);
  saved_stdout_ = fcntl(1, F_DUPFD_CLOEXEC, 3);
  if (saved_stdout_ < 0 || dup2(p[1], 1) < 0) {
    fprintf(stderr, "tfusion-worker[%d]: device printf stays on the worker: dup2: %s\n",
            static_cast<int>(getpid()), strerror(errno));
    if (saved_stdout_ >= 0) close(saved_stdout_);
    saved_stdout_ = -1;
    close(p[0]);
    close(p[1]);
    return false;
  }
  close(p[1]);  // fd 1 is now the only write end: restoring fd 1 ends the pipe
  fcntl(p[0], F_SETFL, fcntl(p[0], F_GETFL) | O_NONBLOCK);
  read_fd_ = p[0];
  stop_ = false;
  thread_ = std::thread([this] { DrainLoop(); });
  return true;
}

void ConsoleCapture::ReadAvailableLocked() {
  char chunk[65536];
  for (;;) {
    ssize_t n = read(read_fd_, chunk, sizeof(chunk));
    if (n > 0) {
      const size_t keep = std::min(static_cast<size_t>(n), kMaxBuffered - std::min(kMaxBuffered, buf_.size()));
      buf_.append(chunk, keep);
      dropped_ += static_cast<size_t>(n) - keep;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return;  // EAGAIN (empty), end of file, or an error: nothing more now
  }
}

void ConsoleCapture::DrainLoop() {
  while (!stop_.load(std::memory_order_relaxed)) {
    pollfd pf{read_fd_, POLLIN, 0};
    int r = poll(&pf, 1, 100);
    if (r <= 0) continue;
    std::lock_guard<std::mutex> g(mu_);
    ReadAvailableLocked();
    if (pf.revents & (POLLHUP | POLLERR)) {
      if (!(pf.revents & POLLIN)) return;  // every writer is gone
    }
  }
}

void ConsoleCapture::Forward(transport::Transport* t, std::atomic<uint64_t>* event_seq) {
  if (read_fd_ < 0) return;
  fflush(stdout);
  std::lock_guard<std::mutex> order(send_mu_);
  std::string out;
  uint64_t dropped = 0;
  {
    std::lock_guard<std::mutex> g(mu_);
    ReadAvailableLocked();
    out.swap(buf_);
    dropped = dropped_;
    dropped_ = 0;
  }
  if (dropped != 0) {
    fprintf(stderr, "tfusion-worker[%d]: dropped %llu bytes of device printf output (more than "
            "%zu MiB between two synchronizing calls)\n",
            static_cast<int>(getpid()), static_cast<unsigned long long>(dropped),
            kMaxBuffered >> 20);
  }
  const size_t chunk = std::min<size_t>(remote::kMaxConsoleChunk, t->max_payload_bytes());
  for (size_t off = 0; off < out.size(); off += chunk) {
    transport::OutFrame f;
    f.opcode = remote::kEvtConsole;
    f.sequence = (*event_seq)++;
    f.payload = out.data() + off;
    f.payload_length = static_cast<uint32_t>(std::min(chunk, out.size() - off));
    if (!t->Send(f).ok()) return;
  }
}

void ConsoleCapture::Stop() {
  if (read_fd_ < 0) return;
  fflush(stdout);
  dup2(saved_stdout_, 1);  // closes the pipe's last write end
  close(saved_stdout_);
  saved_stdout_ = -1;
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  close(read_fd_);
  read_fd_ = -1;
}

}  // namespace tf::worker
