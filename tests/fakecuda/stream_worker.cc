#include "stream_worker.h"

#include <utility>

namespace fakecuda {

StreamWorker::StreamWorker() : thread_([this] { Run(); }) {}

StreamWorker::~StreamWorker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_one();
  if (thread_.get_id() == std::this_thread::get_id()) {
    thread_.detach();  // destroyed by its own last work item: nothing left to wait for
  } else {
    thread_.join();
  }
}

void StreamWorker::Enqueue(std::function<void()> work) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(work));
    ++submitted_;
  }
  work_cv_.notify_one();
}

bool StreamWorker::Idle() {
  std::lock_guard<std::mutex> lock(mu_);
  return finished_ == submitted_;
}

void StreamWorker::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  size_t target = submitted_;
  if (thread_.get_id() == std::this_thread::get_id()) return;  // called from a work item
  done_cv_.wait(lock, [&] { return finished_ >= target; });
}

void StreamWorker::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ and drained
    std::function<void()> work = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    work();
    work = nullptr;  // release captured state before reporting completion
    lock.lock();
    ++finished_;
    done_cv_.notify_all();
  }
}

}  // namespace fakecuda
