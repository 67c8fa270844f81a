// ReplicaLoop: the background duty of one controller replica. Every period it makes sure the
// replica leads before it serves (campaigning when nobody leads, rebuilding the in-memory state
// from the store right after winning, dropping it when leadership is lost) and runs the
// Controller's liveness Tick.
#pragma once

#include "controller/controller.h"
#include "controller/periodic_thread.h"

namespace tf::controller {

class ReplicaLoop {
 public:
  // Both must outlive the loop. `election` may be null: the replica always leads (Rebuild is
  // then done by the first iteration).
  ReplicaLoop(Controller* controller, LeaderElection* election, int period_ms);
  ~ReplicaLoop();

  // Runs one iteration now (tests); Start() runs them every period on a thread.
  void RunOnce();
  void Start();
  void Stop();

 private:
  Controller* const controller_;
  LeaderElection* const election_;
  const int period_ms_;
  bool led_ = false;  // this replica served after its last rebuild (a loss of it is logged once)
  PeriodicThread thread_;
};

}  // namespace tf::controller
