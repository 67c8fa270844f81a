#include "controller/replica.h"

#include <cstdio>

namespace tf::controller {

ReplicaLoop::ReplicaLoop(Controller* controller, LeaderElection* election, int period_ms)
    : controller_(controller), election_(election), period_ms_(period_ms) {}

ReplicaLoop::~ReplicaLoop() { Stop(); }

void ReplicaLoop::RunOnce() {
  if (!controller_->Serving()) {
    if (led_) {  // said once: a standby that stayed silent looked like a second leader in its log
      std::fprintf(stderr, "controller: %s no longer leads (its leadership lapsed or the store fenced it off); "
                   "standing by\n", election_ ? election_->Identity().c_str() : "this replica");
      led_ = false;
    }
    controller_->StopServing();
    bool lead = true;
    if (election_) {
      StatusOr<bool> won = election_->TryAcquire();
      if (!won.ok()) {
        std::fprintf(stderr, "controller: election: %s\n", won.status().ToString().c_str());
        return;
      }
      lead = *won;
    }
    if (!lead) return;
    Status st = controller_->Rebuild();
    if (!st.ok()) {
      std::fprintf(stderr, "controller: rebuilding state from the store failed: %s\n",
                   st.ToString().c_str());
      if (election_) election_->Resign();
      return;
    }
    std::fprintf(stderr, "controller: %s leads; state rebuilt from the store\n",
                 election_ ? election_->Identity().c_str() : "this replica");
    led_ = true;
  }
  controller_->Tick();
}

void ReplicaLoop::Start() { thread_.Start(period_ms_, [this] { RunOnce(); }); }

void ReplicaLoop::Stop() { thread_.Stop(); }

}  // namespace tf::controller
