// PlacementEngine: the controller's narrow view of the scheduler. Given one request and the GPUs
// of the requested pool, it picks a node and the GPUs on it; it does no I/O and changes nothing
// (the controller commits the decision to the store and then updates its own view).
//
// The default engine (CompactFirstPlacement) packs: among GPUs with room it picks the one left
// with the least free compute, so large holes stay open for large requests. The scheduler library
// in src/scheduler plugs in behind the same interface.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "controller/model.h"

namespace tf::controller {

struct PlacementRequest {
  std::string pool;
  double tflops = 0;      // per vGPU
  int64_t vram_mib = 0;   // per vGPU
  int gpu_count = 1;      // all on one node
  Qos qos = Qos::kMedium;
  std::string gpu_model;  // empty: any model; otherwise a case-insensitive substring of it
};

struct PlacementDecision {
  std::string node;
  std::vector<std::string> gpu_uuids;  // gpu_count distinct GPUs of `node`
};

class PlacementEngine {
 public:
  virtual ~PlacementEngine() = default;
  // `pool_gpus`: every GPU of the request's pool, grouped by node (consecutive entries share a
  // node). kOutOfMemory when no node has gpu_count GPUs with room for the request.
  virtual StatusOr<PlacementDecision> Place(const PlacementRequest& request,
                                            const std::vector<const Gpu*>& pool_gpus) = 0;
  // Tells a stateful engine that an allocation is gone. The default engine keeps no state.
  virtual void Release(const Allocation& allocation) { (void)allocation; }
};

std::unique_ptr<PlacementEngine> MakeCompactFirstPlacement();

}  // namespace tf::controller
