// Helpers shared by the scheduler tests: small clusters built in one line.
#pragma once

#include <string>

#include "scheduler/scheduler.h"

namespace tf::sched::testing {

inline NodeSpec Node(const std::string& name, int gpus, const std::string& model = "A100-80GB",
                     double tflops = 312, int64_t vram_mib = 81920, const std::string& pool = "p") {
  NodeSpec n;
  n.name = name;
  n.pool = pool;
  for (int i = 0; i < gpus; ++i) n.gpus.push_back(GpuSpec{model, tflops, vram_mib, i < gpus / 2 ? 0 : 1, 0});
  return n;
}

inline Request Req(const std::string& id, double tflops, int64_t vram_mib = 1024, Qos qos = Qos::kMedium,
                   int gpus = 1) {
  Request r;
  r.id = id;
  r.tenant = "t";
  r.pool = "p";
  r.tflops_request = tflops;
  r.vram_request_mib = vram_mib;
  r.qos = qos;
  r.gpu_count = gpus;
  return r;
}

}  // namespace tf::sched::testing
