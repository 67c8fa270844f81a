// What a pod asks TensorFusion for, in TensorFusion's own pod annotations (tensor-fusion.ai/*), and
// the canonical form the admission webhook records on the pod for the scheduler extender.
//
// Units: compute in FP16 dense TFLOPS or percent of one GPU; VRAM in MiB (annotations take
// Kubernetes quantities: 8Gi, 512Mi, 8G, plain bytes). Every error names the annotation, the
// value and the accepted form; a pod with one bad annotation is refused as a whole.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "common/status.h"

namespace tf::k8s {

inline constexpr char kDomain[] = "tensor-fusion.ai/";
inline constexpr char kEnabledLabel[] = "tensor-fusion.ai/enabled";
// Written by the webhook: the parsed request (PodGpuRequest as JSON) the extender places.
inline constexpr char kRequestAnnotation[] = "tensor-fusion.ai/vgpu-request";
// Written by the extender's bind (copied onto the pod by the API server from the Binding):
// the allocation id (the vGPU id in the node's quota region), the GPU UUIDs, the remote worker.
inline constexpr char kAllocationAnnotation[] = "tensor-fusion.ai/allocation";
inline constexpr char kGpuIdsAnnotation[] = "tensor-fusion.ai/gpu-ids";
inline constexpr char kWorkerAnnotation[] = "tensor-fusion.ai/worker-address";
// Written by the extender's bind of a remote pod when it holds the workers' token
// (--worker-token-file): the pod's own session ticket, bound to its limits and allocation.
inline constexpr char kTicketAnnotation[] = "tensor-fusion.ai/session-ticket";

// Per vGPU. Exactly one of tflops / percent is > 0; a limit is in the same unit, 0 = the request.
struct PodGpuRequest {
  double tflops = 0;
  double tflops_limit = 0;
  double percent = 0;
  double percent_limit = 0;
  int64_t vram_mib = 0;
  int gpu_count = 1;
  std::string qos = "medium";  // low | medium | high | critical
  std::string pool;            // empty: the controller's default pool
  bool local = true;           // is-local-gpu: limiter in the pod (true) or the remote client stub
  std::string gpu_model;       // empty: any; else a case-insensitive substring of the model
  std::string workload_profile;  // a controller workload whose sizes fill what the pod leaves out
};

// Sizes a workload profile supplies (a controller workload, GET /v1/workloads/NAME).
struct WorkloadDefaults {
  double tflops = 0;
  double tflops_limit = 0;
  int64_t vram_mib = 0;
  int gpu_count = 1;
  std::string qos;
  std::string pool;
};

using Annotations = std::map<std::string, std::string>;

// The workload profile a pod names (tensor-fusion.ai/workload-profile), "" when none; an invalid
// name is an error.
StatusOr<std::string> WorkloadProfileOf(const Annotations& annotations);

// Parses the tensor-fusion.ai/* annotations. `profile` (when the pod names one) supplies what the
// annotations leave out. Unknown tensor-fusion.ai/* keys and keys the system writes are refused.
StatusOr<PodGpuRequest> ParsePodAnnotations(const Annotations& annotations,
                                            const WorkloadDefaults* profile = nullptr);

// The rules every request obeys, whatever it was read from (one message per rule).
Status ValidatePodRequest(const PodGpuRequest& r);

// The recorded form (kRequestAnnotation) and back; FromJson validates as ParsePodAnnotations does.
std::string PodRequestToJson(const PodGpuRequest& r);
StatusOr<PodGpuRequest> PodRequestFromJson(std::string_view text);

// A Kubernetes quantity (controller::ParseKubeQuantity, the one parser of them: 8Gi, 512Mi, 8G,
// 1e9, plain bytes) as bytes. Fractions of a byte round up. > 0 and at most 2^63.
StatusOr<uint64_t> ParseQuantityBytes(std::string_view text);

}  // namespace tf::k8s
