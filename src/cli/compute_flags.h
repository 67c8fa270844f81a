// The compute part of `tfusion run`: a request (guaranteed under contention) and a limit (the
// ceiling it may burst to when the GPU has idle capacity), each in FP16 dense TFLOPS or in percent
// of the GPU, and a QoS level (who borrows idle capacity first). Every message about these flags
// is written here, once, for the local, pooled and remote paths.
//
// A request alone keeps the meaning a single value always had: limit = request (a hard cap).
// Without any request the vGPU gets the whole GPU. A limit without a request is refused.
// Units may be mixed on a local GPU (--tflops 100 --percent-limit 50): both are converted to a
// share of that GPU through the catalog, on a remote worker through the worker's. The pool
// decides the GPU only after placement, so there (--controller) the limit must be in the
// request's unit.
#pragma once

#include <cstdint>
#include <string>

#include "common/gpu_catalog.h"
#include "common/status.h"

namespace tf::cli {

// The flags as typed; empty = not given.
struct ComputeFlags {
  std::string tflops;         // --tflops: request, FP16 dense TFLOPS
  std::string percent;        // --percent: request, percent of the GPU, (0, 100]
  std::string tflops_limit;   // --tflops-limit: ceiling, TFLOPS
  std::string percent_limit;  // --percent-limit: ceiling, percent, (0, 100]
};

// The shares of one GPU, in parts per million (1,000,000 = the whole GPU).
struct ComputeShares {
  uint64_t request_ppm = 1'000'000;
  uint64_t limit_ppm = 1'000'000;
};

// The GPU the flags are resolved against (messages name it).
struct GpuForShares {
  int index = 0;
  std::string name;
  double capacity_tflops = 0;  // from the catalog; 0: the catalog lacks the model
};

// Checks what needs no GPU: numbers, at most one request and one limit flag, no limit without a
// request, and a limit below the request when both are in the same unit.
Status CheckComputeFlags(const ComputeFlags& f);

// Request and limit as shares of `gpu`. TFLOPS need the GPU's capacity; a TFLOPS value above it
// and a limit below the request (after conversion) are refused.
StatusOr<ComputeShares> ResolveComputeShares(const ComputeFlags& f, const GpuForShares& gpu);

// The request and limit the pool is asked for (--controller), in one unit: either tflops (with
// tflops_limit, 0 = the request) or percent (with percent_limit). No flag at all: 100 percent.
struct PoolCompute {
  double tflops = 0, tflops_limit = 0;
  double percent = 0, percent_limit = 0;
};
StatusOr<PoolCompute> PoolComputeFromFlags(const ComputeFlags& f);

// `tfusion run --remote`: what can be checked before the worker's GPU is known (the flags as
// CheckComputeFlags, and the QoS name); the worker resolves request and limit against its GPU.
Status CheckRemoteComputeFlags(const ComputeFlags& f, const std::string& qos);

// --qos as the region stores it: 0 low, 1 medium (also when empty), 2 high, 3 critical. The
// same names and message as the controller's API.
StatusOr<uint32_t> ParseQosFlag(const std::string& text);

// The catalog with $TFUSION_CATALOG_OVERRIDES applied (kInvalidArgument naming the file when it
// cannot be read or parsed).
StatusOr<GpuCatalog> LoadCatalog();

}  // namespace tf::cli
