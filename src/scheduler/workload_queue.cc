#include "scheduler/workload_queue.h"

#include <algorithm>
#include <set>
#include <tuple>

namespace tf::sched {

WorkloadQueue::WorkloadQueue(Scheduler* scheduler, bool allow_preemption)
    : scheduler_(scheduler), allow_preemption_(allow_preemption) {}

bool WorkloadQueue::TryPlace(const Request& r, std::string* reason) {
  StatusOr<Placement> p = scheduler_->Schedule(r);
  if (p.ok()) {
    status_[r.id] = WorkloadStatus{WorkloadPhase::kRunning, p->node_name, status_[r.id].times_preempted,
                                   status_[r.id].times_displaced, ""};
    events_.push_back({QueueEvent::Kind::kPlaced, r.id, p->node_name});
    return true;
  }
  *reason = p.status().ToString();
  if (!allow_preemption_ || p.status().code() != StatusCode::kUnavailable || r.qos == Qos::kLow) return false;
  StatusOr<PreemptionPlan> plan = scheduler_->PlanPreemption(r);
  if (!plan.ok()) return false;
  StatusOr<std::vector<Request>> victims = scheduler_->ExecutePreemption(r, *plan);
  if (!victims.ok()) return false;
  WorkloadStatus& st = status_[r.id];
  st.phase = WorkloadPhase::kRunning;
  st.node = plan->placement.node_name;
  st.last_reason.clear();
  events_.push_back({QueueEvent::Kind::kPlaced, r.id, st.node});
  for (const Request& v : *victims) {
    WorkloadStatus& vs = status_[v.id];
    events_.push_back({QueueEvent::Kind::kPreempted, v.id, vs.node});
    ++vs.times_preempted;
    Enqueue(v, "preempted by '" + r.id + "'");
  }
  for (const std::string& id : plan->suspended) {
    const Allocation* a = scheduler_->state().FindAllocation(id);
    if (a == nullptr) continue;
    WorkloadStatus& vs = status_[id];
    events_.push_back({QueueEvent::Kind::kSuspended, id, vs.node});
    ++vs.times_preempted;
    Suspend(a->request, vs.node, "suspended by '" + r.id + "'");
  }
  return true;
}

void WorkloadQueue::Suspend(const Request& r, const std::string& node, std::string reason) {
  Key key{-static_cast<int>(r.qos), 0, seq_++};
  pending_.emplace(key, r);
  pending_key_[r.id] = key;
  ++suspended_count_;
  WorkloadStatus& st = status_[r.id];
  st.phase = WorkloadPhase::kSuspended;
  st.node = node;
  st.last_reason = std::move(reason);
}

void WorkloadQueue::Unqueue(const std::string& id) {
  auto k = pending_key_.find(id);
  if (k == pending_key_.end()) return;
  if (std::get<1>(k->second) == 0) --suspended_count_;
  pending_.erase(k->second);
  pending_key_.erase(k);
}

void WorkloadQueue::Enqueue(const Request& r, std::string reason) {
  Key key{-static_cast<int>(r.qos), 1, seq_++};
  pending_.emplace(key, r);
  pending_key_[r.id] = key;
  WorkloadStatus& st = status_[r.id];
  st.phase = WorkloadPhase::kPending;
  st.node.clear();
  st.last_reason = std::move(reason);
}

Status WorkloadQueue::Submit(const Request& r) {
  TF_RETURN_IF_ERROR(ValidateRequest(r));
  if (status_.count(r.id)) return AlreadyExists("workload '" + r.id + "' already exists");
  if (!r.pool.empty() && scheduler_->state().PoolIndex(r.pool) < 0) {
    return NotFound("workload '" + r.id + "': pool '" + r.pool + "' does not exist");
  }
  std::string reason;
  if (!TryPlace(r, &reason)) Enqueue(r, std::move(reason));
  return Status::Ok();
}

Status WorkloadQueue::SubmitBatch(std::vector<Request> rs) {
  std::stable_sort(rs.begin(), rs.end(), [](const Request& a, const Request& b) { return a.qos > b.qos; });
  Status first;
  for (const Request& r : rs) {
    Status s = Submit(r);
    if (!s.ok() && first.ok()) first = s;
  }
  return first;
}

Status WorkloadQueue::Release(std::string_view id) {
  auto st = status_.find(std::string(id));
  if (st == status_.end()) return NotFound("workload '" + std::string(id) + "' does not exist");
  if (st->second.phase == WorkloadPhase::kPending) {
    Unqueue(st->first);
    status_.erase(st);
    return Status::Ok();
  }
  StatusOr<Request> r = scheduler_->Release(id);
  if (!r.ok()) return r.status();
  Unqueue(st->first);  // a suspended workload waits in the queue too
  status_.erase(st);
  RetryPending();
  return Status::Ok();
}

Status WorkloadQueue::FailNode(std::string_view name) {
  StatusOr<std::vector<Request>> displaced = scheduler_->FailNode(name);
  if (!displaced.ok()) return displaced.status();
  for (const Request& r : *displaced) {
    Unqueue(r.id);  // a suspended one starts over as pending
    ++status_[r.id].times_displaced;
    events_.push_back({QueueEvent::Kind::kDisplaced, r.id, std::string(name)});
    Enqueue(r, "node '" + std::string(name) + "' failed");
  }
  RetryPending();
  return Status::Ok();
}

void WorkloadQueue::RetryPending() {
  // One pass in QoS order. Requests of a shape that just failed are skipped for the rest of the
  // pass: the same shape cannot fit either, which keeps a long queue cheap to retry.
  using Shape = std::tuple<std::string, std::string, double, double, int64_t, int, int64_t, int64_t,
                           std::vector<std::string>, int, bool>;
  std::set<Shape> failed;
  for (auto it = pending_.begin(); it != pending_.end();) {
    const Request& r = it->second;
    if (std::get<1>(it->first) == 0) {  // suspended: resumes on its own GPUs when they have room
      std::string id = r.id;
      if (!scheduler_->Resume(id).ok()) {
        ++it;
        continue;
      }
      WorkloadStatus& st = status_[id];
      st.phase = WorkloadPhase::kRunning;
      st.last_reason.clear();
      events_.push_back({QueueEvent::Kind::kResumed, id, st.node});
      --suspended_count_;
      pending_key_.erase(id);
      it = pending_.erase(it);
      continue;
    }
    Shape shape{r.pool, r.tenant, r.tflops_request, r.compute_percent_request, r.vram_request_mib, r.gpu_count,
                r.cpu_milli, r.memory_mib, r.gpu_models, static_cast<int>(r.qos), r.remote};
    if (failed.count(shape)) {
      ++it;
      continue;
    }
    std::string reason;
    std::string id = r.id;
    if (TryPlace(r, &reason)) {
      pending_key_.erase(id);
      it = pending_.erase(it);  // victims enqueued by a preemption sort after `it`: lower QoS
    } else {
      failed.insert(std::move(shape));
      status_[id].last_reason = std::move(reason);
      ++it;
    }
  }
}

}  // namespace tf::sched

namespace tf::sched {

const WorkloadStatus* WorkloadQueue::status(std::string_view id) const {
  auto it = status_.find(std::string(id));
  return it == status_.end() ? nullptr : &it->second;
}

}  // namespace tf::sched
