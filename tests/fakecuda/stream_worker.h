// One fake CUDA stream's execution engine: a thread that runs queued work items in order, so that
// work submitted "asynchronously" really is asynchronous to the submitting thread.
#ifndef TF_TESTS_FAKECUDA_STREAM_WORKER_H_
#define TF_TESTS_FAKECUDA_STREAM_WORKER_H_

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace fakecuda {

// Thread-safe. Enqueue is a lock plus a push and a notify; work items run on the worker thread,
// one at a time, in submission order. The destructor drains the queue and joins the thread.
class StreamWorker {
 public:
  StreamWorker();
  ~StreamWorker();
  StreamWorker(const StreamWorker&) = delete;
  StreamWorker& operator=(const StreamWorker&) = delete;

  void Enqueue(std::function<void()> work);
  // True when nothing is queued or running.
  bool Idle();
  // Blocks until everything enqueued before the call has run.
  void Drain();

 private:
  void Run();

  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::deque<std::function<void()>> queue_;
  size_t submitted_ = 0;  // items ever enqueued
  size_t finished_ = 0;   // items that have completed
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace fakecuda

#endif  // TF_TESTS_FAKECUDA_STREAM_WORKER_H_
