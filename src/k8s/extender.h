// The Kubernetes scheduler extender (filter, prioritize, bind over HTTP/JSON, the extender v1
// types ExtenderArgs, ExtenderFilterResult, HostPriorityList, ExtenderBindingArgs,
// ExtenderBindingResult) for pods the admission webhook prepared (annotation
// tensor-fusion.ai/vgpu-request).
//
// Filter and prioritize read the controller's state through its API (pools, nodes, GPUs,
// allocations, quotas) and ask the placement library, through the controller's own adapter
// (controller::PlacementEngine), where the pod's vGPU fits and how the pool's placement mode ranks
// each node. Kubernetes node names are the controller's node names (the node agent registers with
// --node = the Kubernetes node name). A local pod (is-local-gpu) needs its GPU on the node it runs
// on; a remote pod runs on any node while its vGPU is anywhere in the pool.
//
// Bind creates the allocation in the controller (request_id = the pod's uid, so a retried bind
// gets the same allocation back instead of a second one; local pods on exactly the chosen node)
// and then POSTs the pod's Binding to the API server, with annotations the pod's environment reads
// (allocation id, GPU UUID, worker address). A failed binding releases the allocation. With the
// workers' token (TicketOptions), a remote pod's Binding also carries its own session ticket
// (kTicketAnnotation), bound to the limits the webhook gave the pod, its GPU and its allocation:
// the pod never sees a credential that opens anything else.
//
// Thread safety: the handlers may run concurrently; each builds its own view of the state.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "common/status.h"
#include "controller/http_client.h"
#include "controller/kube_api.h"

namespace tf::k8s {

struct ExtenderReply {
  int http_status = 200;
  std::string body;
};

// Per-pod session tickets for remote pods.
struct TicketOptions {
  std::string worker_token_file;  // the workers' token (read at each bind: a rotated one applies); empty: none
  int64_t ttl_s = 365 * 24 * 3600;  // how long a pod's ticket opens sessions
};

// The workers' token from `path`: its first line, as `tfusion worker --token-file` reads it.
StatusOr<std::string> ReadWorkerToken(const std::string& path);

class Extender {
 public:
  // Both must outlive the extender. `kube` is the Kubernetes API client the controller's reconciler
  // uses too (it reads pods and creates their Bindings).
  Extender(controller::HttpClient* controller, controller::KubeApi* kube, TicketOptions tickets = {})
      : controller_(controller), kube_(kube), tickets_(std::move(tickets)) {}

  ExtenderReply Filter(const std::string& body) const;
  ExtenderReply Prioritize(const std::string& body) const;
  ExtenderReply Bind(const std::string& body) const;

 private:
  controller::HttpClient* const controller_;
  controller::KubeApi* const kube_;
  const TicketOptions tickets_;
};

}  // namespace tf::k8s
