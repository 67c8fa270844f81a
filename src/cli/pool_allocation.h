// Client side of a pooled vGPU for `tfusion run`: ask the controller for one vGPU (compute and
// VRAM on one GPU of the pool, placed by the scheduler) and release it when done.
//
// The answer carries everything needed to create the vGPU in that GPU's shared quota region
// (id = allocation id, VRAM limit in bytes, compute request and limit in ppm, QoS); the node
// agent of that node
// creates it too, within its sync interval, and removes it after the release.
//
// Thread safety: the functions are independent; each opens its own connection.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace tf::cli {

struct PoolAllocation {
  std::string id;          // allocation id (also the vGPU id in the quota region)
  std::string node;        // node name the GPU belongs to
  std::string gpu_uuid;
  int gpu_index = 0;       // the GPU's index on that node
  uint64_t vram_bytes = 0; // VRAM limit granted (the request rounded up to whole MiB)
  uint64_t share_ppm = 0;  // compute request, share of the whole GPU in millionths (1,000,000 = all of it)
  uint64_t limit_ppm = 0;  // compute limit (ceiling), same unit, >= share_ppm
  double tflops = 0;       // the request in FP16 TFLOPS on that GPU
  double tflops_limit = 0; // the limit in FP16 TFLOPS on that GPU
  std::string qos;         // low, medium, high or critical
  bool tiering = false;    // the pool oversubscribes VRAM: the vGPU gets VRAM tiering
  int64_t idle_swap_ms = -1;  // the allocation's tier idle overrides, ms (0 = never); -1: QoS default
  int64_t idle_disk_ms = -1;
  int64_t idle_zero_ms = -1;  // scale to zero after this long idle, ms; -1: never (the default)
};

// `url` "http://host:port" of the controller, `token` its bearer token. Exactly one of
// `tflops_or_0` (FP16 TFLOPS) and `percent_or_0` (of one GPU, (0, 100]) must be > 0;
// `vram_bytes` > 0. `limit_or_0` is the compute limit (ceiling) in the request's unit (TFLOPS
// or percent), at least the request; 0 = the request. `pool` and `qos` may be empty (the controller's defaults: pool "default",
// QoS medium); `tenant` may be empty (no quota applies), else its quota is checked. `idle_swap_ms`
// and `idle_disk_ms` (>= 0) are the allocation's tier idle overrides; -1: the QoS defaults. Errors: kInvalidArgument (bad input, also as the controller reports it),
// kOutOfMemory (no GPU has room), kResourceExhausted (tenant quota), kUnauthenticated (token),
// kNotFound (pool), kUnavailable (no replica reachable), kFailedPrecondition (no replica serves:
// standbys, a leader without its store). `url` may list the replicas, comma-separated: every call
// here goes to the replica that answered last and moves on past unreachable ones and 503s.
StatusOr<PoolAllocation> RequestPoolAllocation(const std::string& url, const std::string& token,
                                               double tflops_or_0, double percent_or_0,
                                               uint64_t vram_bytes, const std::string& pool,
                                               const std::string& qos, const std::string& tenant = "",
                                               double limit_or_0 = 0, int lease_s = 0,
                                               int64_t idle_swap_ms = -1, int64_t idle_disk_ms = -1,
                                               int64_t idle_zero_ms = -1);

// Renews the allocation's lease (RequestPoolAllocation with lease_s). kNotFound when it is gone.
Status RenewPoolAllocation(const std::string& url, const std::string& token, const std::string& id);
// The lease `tfusion run --controller` takes, and how often it renews it.
inline constexpr int kRunLeaseSeconds = 60;
inline constexpr int kRunRenewSeconds = 15;

// Releases an allocation. kNotFound when it is already gone.
Status ReleasePoolAllocation(const std::string& url, const std::string& token,
                             const std::string& id);

// The worker address ("HOST:PORT") node `node` registered (`tfusion hypervisor --worker-address`),
// or "" when it registered none. kNotFound for an unknown node.
StatusOr<std::string> NodeWorkerAddress(const std::string& url, const std::string& token,
                                        const std::string& node);

// Where `tfusion run --controller` runs its command once the pool has placed the vGPU: on this
// machine when the chosen GPU is one of `local_gpu_uuids` (empty on a machine without GPUs),
// else remotely through the worker `node_worker_address` of the chosen node. Without a worker
// address: kFailedPrecondition saying which node and how to give it one.
struct RunPlacement {
  bool remote = false;
  std::string worker_address;  // when remote
};
StatusOr<RunPlacement> ChooseRunPlacement(const PoolAllocation& allocation,
                                          const std::vector<std::string>& local_gpu_uuids,
                                          const std::string& node_worker_address);

// Whether a TCP connection to a node's worker ("HOST:PORT", "[v6]:PORT") opens within timeout_ms:
// kUnavailable saying why (refused, no route, timed out, unknown host) when it does not. The
// connection is closed at once; the worker counts no session for it.
Status ProbeWorkerAddress(const std::string& host_port, int timeout_ms);

// Why the controller took allocation `id` back while it was in use: "preempted by a-..." or
// "node-lost". kNotFound when it did not (it is live, was released by request, or is unknown).
StatusOr<std::string> EvictionReason(const std::string& url, const std::string& token,
                                     const std::string& id);

}  // namespace tf::cli
