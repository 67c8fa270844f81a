// The mutating admission webhook (admission.k8s.io/v1 AdmissionReview) for pods labelled
// tensor-fusion.ai/enabled=true: parses the pod's tensor-fusion.ai/* annotations and answers with a
// JSON patch that injects the limiter (local vGPU) or the client stub (remote vGPU), sets the
// scheduler, and records the parsed request for the scheduler extender. Bad annotations are
// refused (allowed: false) with a message naming the annotation and the accepted form.
//
// What the patch adds (paths created when absent, appended to when present):
//   spec.schedulerName                     the extender's scheduler profile
//   spec.volumes                           "tensorfusion-lib" (emptyDir); local: "tensorfusion-shm"
//                                          (hostPath of the node's quota regions)
//   spec.initContainers[0]                 "tensorfusion-init": copies the libraries from the image
//   every container's volumeMounts, env    the limiter's or the stub's environment; the GPU, the
//                                          vGPU id and the worker come from the annotations the
//                                          extender's Binding puts on the pod (downward API)
//   metadata.annotations                   tensor-fusion.ai/vgpu-request (the parsed request)
//
// Thread safety: HandleAdmissionReview may be called from several threads at once.
#pragma once

#include <functional>
#include <string>

#include "common/status.h"
#include "k8s/pod_request.h"
#include "worker/worker.h"

namespace tf::k8s {

struct WebhookOptions {
  std::string scheduler_name = "tensor-fusion-scheduler";
  // Holds the libraries under /opt/tensorfusion/lib/{limiter,client}/ (docs/kubernetes.md).
  std::string limiter_image = "tensorfusion/tensorfusion-lib:latest";
  // Remote pods: the Secret (key "token") holding what the client stub presents to the worker;
  // empty: no TFUSION_TOKEN is injected.
  std::string worker_token_secret;
  // Remote pods: TFUSION_TOKEN is the session ticket the extender's bind mints for each pod
  // (kTicketAnnotation, downward API), bound to its limits and allocation. Excludes
  // worker_token_secret.
  bool pod_tickets = false;
  // The node agents' quota regions on the host (their $TFUSION_SHM_DIR; the chart's
  // agent.hostShmDir): local pods get it mounted at kRegionDir.
  std::string host_shm_dir = "/dev/shm/tensorfusion";
  // A workload profile's sizes (the controller's workload of that name); kNotFound when unknown.
  std::function<StatusOr<WorkloadDefaults>(const std::string& name)> lookup_profile;
};

// Where the init container puts the libraries in every container.
inline constexpr char kLibMount[] = "/tensorfusion";
// Where local pods see the node's quota regions (WebhookOptions::host_shm_dir on the host).
inline constexpr char kRegionDir[] = "/dev/shm/tensorfusion";

struct WebhookReply {
  int http_status = 200;
  std::string body;  // an AdmissionReview (200) or {"error": "..."} (400)
};

// `body` is the AdmissionReview the API server POSTed. A body that is not an AdmissionReview v1
// with request.uid gets 400; everything else gets 200 and a response echoing the uid.
WebhookReply HandleAdmissionReview(const std::string& body, const WebhookOptions& options);

// The vGPU limits a remote pod's client stub sends the worker, as the webhook writes them into the
// pod's environment, without the GPU and the allocation (the Binding's annotations give those).
worker::SessionLimits RemotePodLimits(const PodGpuRequest& r);

}  // namespace tf::k8s
