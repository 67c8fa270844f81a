// Clock: the controller's and the node agent's only source of time, injected so that heartbeat
// timeouts and grace periods are tested on simulated time.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace tf::controller {

class Clock {
 public:
  virtual ~Clock() = default;
  // Milliseconds since an arbitrary epoch fixed for the process; never goes backwards.
  virtual int64_t NowMs() const = 0;
};

class SystemClock : public Clock {
 public:
  int64_t NowMs() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
};

// A clock that moves only when told. Thread-safe.
class FakeClock : public Clock {
 public:
  explicit FakeClock(int64_t start_ms = 1'000'000) : now_(start_ms) {}
  int64_t NowMs() const override { return now_.load(); }
  void AdvanceMs(int64_t ms) { now_.fetch_add(ms); }

 private:
  std::atomic<int64_t> now_;
};

}  // namespace tf::controller
