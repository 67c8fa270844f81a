// PeriodicThread: runs one piece of work now and then once every period on its own thread, until
// Stop(). The duty loops of a controller replica (ReplicaLoop, UsageSampler) run on one each.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace tf::controller {

class PeriodicThread {
 public:
  PeriodicThread() = default;
  PeriodicThread(const PeriodicThread&) = delete;
  PeriodicThread& operator=(const PeriodicThread&) = delete;
  ~PeriodicThread() { Stop(); }

  // Call once. `work` runs with no lock of this class held; a period starts when it returns.
  void Start(int64_t period_ms, std::function<void()> work) {
    thread_ = std::thread([this, period_ms, work = std::move(work)] {
      std::unique_lock<std::mutex> lock(mu_);
      while (!stop_) {
        lock.unlock();
        work();
        lock.lock();
        cv_.wait_for(lock, std::chrono::milliseconds(period_ms), [this] { return stop_; });
      }
    });
  }

  // Waits for a running `work` to return. Safe to call more than once, and without Start().
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace tf::controller
