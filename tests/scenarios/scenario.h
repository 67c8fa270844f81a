// Scenario interpreter: drives a Scheduler + WorkloadQueue from a small text language, one
// command per line, in logical time (each line happens after the previous one).
//
//   pool add NAME [oversell=R] [mode=CompactFirst|LowLoadFirst|NodeCompactGPULowLoad|BestFit|FGD|FragAware]
//   node add NAME gpus=N model=M [pool=P] [tflops=T] [vram=MiB] [cpu=milli] [mem=MiB] [nvlink=all]
//   quota TENANT [tflops=T] [vram=MiB] [gpus=N]
//   submit ID (tflops=T | percent=P) [vram=MiB] [vram_limit=MiB] [gpus=N] [qos=Q] [tenant=X]
//          [pool=P] [models=A|B] [cpu=milli] [remote]
//   release ID
//   fail node NAME
//   expect placement ID node=NAME [gpus=0,1]
//   expect pending ID
//   expect preempted ID          (evicted at least once by a higher-QoS workload)
//   expect rejected ID [code]     (the submit was refused, e.g. invalid_argument)
//   expect free NODE tflops=T     (schedulable TFLOPS left on the node)
//
// '#' starts a comment. Model names go through the GPU catalog (A100 -> A100-40GB, 312 TFLOPS)
// unless tflops= and vram= are given.
#pragma once

#include <string>

#include "common/status.h"

namespace tf::sched {

// Runs a whole scenario; the first failed command or expectation is returned as an error that
// names the line.
Status RunScenario(const std::string& text);

}  // namespace tf::sched
