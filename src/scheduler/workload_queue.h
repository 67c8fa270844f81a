// WorkloadQueue: the admission loop around a Scheduler. Requests that do not fit wait, ordered by
// QoS (critical first) then arrival; releases and node failures retry them. A request that does not
// fit may preempt strictly lower-QoS allocations (Scheduler::PlanPreemption); victims and workloads
// displaced by a failed node go back to the queue. A suspendable victim (Request::suspendable) is
// suspended instead: it keeps its GPUs and resumes there when they have room again, ahead of
// pending workloads of its own QoS or lower.
//
// Pure like the scheduler: no clocks; callers stamp events with their own (simulated) time.
// Not thread-safe.
#pragma once

#include <map>
#include <tuple>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "scheduler/scheduler.h"

namespace tf::sched {

enum class WorkloadPhase { kPending, kRunning, kSuspended };

struct WorkloadStatus {
  WorkloadPhase phase = WorkloadPhase::kPending;
  std::string node;          // when running or suspended
  int times_preempted = 0;
  int times_displaced = 0;   // by a failed node
  std::string last_reason;   // why it is pending
};

struct QueueEvent {
  enum class Kind { kPlaced, kPreempted, kDisplaced, kSuspended, kResumed };
  Kind kind;
  std::string request_id;
  std::string node;
};

class WorkloadQueue {
 public:
  // `scheduler` is not owned and must outlive the queue.
  explicit WorkloadQueue(Scheduler* scheduler, bool allow_preemption = true);

  // Invalid requests (bad fields, unknown pool, duplicate id) are refused with their Status and
  // leave no trace. Otherwise the request is placed, placed by preemption, or queued.
  Status Submit(const Request& r);
  // Submits several at once, higher QoS first (stable within a level).
  Status SubmitBatch(std::vector<Request> rs);
  // Frees a running workload or drops a pending one, then retries the queue.
  Status Release(std::string_view id);
  // Fails a node: its workloads become pending and the queue is retried.
  Status FailNode(std::string_view name);

  // Retries the queue; call after capacity was added (a node joined, a quota was raised).
  void Retry() { RetryPending(); }

  const WorkloadStatus* status(std::string_view id) const;
  size_t pending_count() const { return pending_.size() - suspended_count_; }
  size_t suspended_count() const { return suspended_count_; }
  // Events since the last call, in order.
  std::vector<QueueEvent> TakeEvents() { return std::exchange(events_, {}); }

 private:
  // (-qos, 0 for a suspended workload waiting to resume / 1 for a pending one, arrival sequence).
  using Key = std::tuple<int, int, uint64_t>;
  bool TryPlace(const Request& r, std::string* reason);
  void Enqueue(const Request& r, std::string reason);
  void Suspend(const Request& r, const std::string& node, std::string reason);
  void Unqueue(const std::string& id);
  void RetryPending();

  Scheduler* scheduler_;
  bool allow_preemption_;
  uint64_t seq_ = 0;
  std::map<Key, Request> pending_;  // pending and suspended workloads, in retry order
  size_t suspended_count_ = 0;
  std::unordered_map<std::string, Key> pending_key_;
  std::unordered_map<std::string, WorkloadStatus> status_;
  std::vector<QueueEvent> events_;
};

}  // namespace tf::sched
