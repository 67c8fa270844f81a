// KubeReconciler: keeps the tensor-fusion.ai/v1 custom resources and the controller's store in
// step through the Kubernetes API (docs/kubernetes.md, "Reconciler").
//
// Direction of truth:
//   - GPUPool spec (with the SchedulingConfigTemplate it names) -> our pool: created when absent,
//     its placement mode, TFLOPS oversell ratio and VRAM expansion replaced when they differ. An
//     invalid spec changes nothing and is reported in the GPUPool's Ready condition.
//   - TensorFusionWorkload spec -> one allocation per workload (tenant = its namespace, idempotent
//     through the object's uid); deleting the object releases it.
//   - Pods the scheduler extender bound (label tensor-fusion.ai/enabled=true; their allocation's
//     request_id is "pod-<uid>"): the allocation is released once the pod has ended (phase
//     Succeeded or Failed) or is gone (missing from the watched pods and from a list of its
//     namespace's, and the allocation older than kPodBindGraceMs, so that a pod the watch has not
//     delivered yet, or a watch that lags, is not taken for a deleted one).
//   - our state -> status: GPUPool (capacity, allocated, nodes), TensorFusionWorkload (where it
//     was placed), and GPUNode / GPU objects that mirror the nodes and GPUs agents registered.
//
// Mechanics: one KubeObjectCache per resource does list + watch (resuming from the last
// resourceVersion seen, bookmarks included, relisting after 410 Gone, backing off on errors);
// a worker thread reconciles everything when a cache changes and every resync period. Objects
// whose deletion must release something (a GPUPool, a TensorFusionWorkload) carry the finalizer
// kKubeFinalizer until it is released. Writes are PUTs carrying the object's resourceVersion; a
// 409 Conflict re-reads the object and tries again. A write's answer goes into the cache only
// while the cache still holds the version the write started from, so it never overwrites a newer
// object the watch delivered in the meantime. Only a replica that serves (the leader) lists,
// watches or writes.
//
// Thread safety: Start/Stop from one thread; ReconcileOnce is for tests and runs on the caller's.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "controller/clock.h"
#include "controller/controller.h"
#include "controller/kube_api.h"
#include "controller/usage_history.h"

namespace tf::controller {

inline constexpr char kKubeGroupVersion[] = "tensor-fusion.ai/v1";
inline constexpr char kKubeFinalizer[] = "tensor-fusion.ai/controller";
// The label on the GPUNode and GPU objects the reconciler creates (and may therefore delete).
inline constexpr char kKubeManagedByLabel[] = "app.kubernetes.io/managed-by";
inline constexpr char kKubeManagedByValue[] = "tensorfusion-controller";
// The label of the pods the admission webhook prepares (=true) and the extender binds.
inline constexpr char kKubePodLabel[] = "tensor-fusion.ai/enabled";

// One resource's objects, kept current by list + watch on its own thread.
class KubeObjectCache {
 public:
  // `collection` is the list path (/apis/tensor-fusion.ai/v1/gpupools); `label_selector` may be
  // empty. `changed` is called (on the cache's thread) after each list and each event;
  // `active` says whether to list and watch at all (false: the cache empties and waits).
  KubeObjectCache(const KubeApiConfig& api, std::string collection, std::string label_selector,
                  int watch_timeout_s, std::function<void()> changed, std::function<bool()> active);
  ~KubeObjectCache();

  void Start();
  void Stop();
  void Interrupt();  // breaks the current watch (leadership lost): the loop then waits or relists

  bool synced() const;  // listed since it became active
  std::map<std::string, nlohmann::json> Snapshot() const;  // by "namespace/name" or "name"
  // Our own write's answer (or a re-read) for the object we last knew at `base_rv` (empty: we knew
  // it absent). Stored only while the cache still holds that version (compare-and-swap): when the
  // watch has delivered anything else for the key meanwhile (our own write's event, or a newer
  // change such as a spec edit), the watch's copy is as new or newer and is kept, since an answer
  // stored over it would hide that change until the object's next event.
  void Update(const nlohmann::json& object, const std::string& base_rv);
  // Drops the object `key` that we found deleted, unless the cache holds another object by that
  // name (a different uid: deleted and made again meanwhile).
  void Forget(const std::string& key, const std::string& uid);

  static std::string KeyOf(const nlohmann::json& object);

 private:
  void Run();
  Status List();
  Status WatchOnce();  // kAborted: the resourceVersion expired (410), relist
  std::string Query(const std::string& extra) const;

  KubeApi api_;
  const std::string collection_, label_selector_;
  const int watch_timeout_s_;
  const std::function<void()> changed_;
  const std::function<bool()> active_;

  mutable std::mutex mu_;
  std::map<std::string, nlohmann::json> objects_;
  std::string resource_version_;
  bool synced_ = false;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// How old an allocation of a pod ("pod-<uid>") must be before a pod missing from the watched
// pods counts as deleted: the extender creates the allocation while binding, possibly before
// the pod's watch event reaches this replica.
inline constexpr int64_t kPodBindGraceMs = 20'000;

struct KubeReconcilerOptions {
  KubeApiConfig api;
  int resync_ms = 10'000;       // status refresh period when nothing changes
  int watch_timeout_s = 300;    // the server ends each watch after this; it is resumed
  int max_backoff_ms = 30'000;  // errors back off 500 ms, doubling, up to this
};

class KubeReconciler {
 public:
  // `controller` and `clock` must outlive the reconciler.
  KubeReconciler(Controller* controller, const Clock* clock, KubeReconcilerOptions options);
  ~KubeReconciler();

  void Start();
  void Stop();

  // One pass over every object (nothing while this replica does not serve or a cache has not
  // listed yet). Returns the first error met; the rest of the pass still runs.
  Status ReconcileOnce();

 private:
  using Json = nlohmann::json;
  using Objects = std::map<std::string, Json>;

  void Run();
  void Wake();
  // PUT `path` with desired(current object) until it is accepted: on 409 the object is re-read
  // and desired() asked again; desired() returning nullopt means nothing to write.
  Status Replace(KubeObjectCache& cache, const std::string& path, Json current,
                 const std::function<std::optional<Json>(const Json&)>& desired);
  Status SetFinalizer(KubeObjectCache& cache, const std::string& path, const Json& object, bool present);
  Status WriteStatus(KubeObjectCache& cache, const std::string& path, const Json& object,
                     const std::function<Json(const Json&)>& status_for);

  Status ReconcilePool(const Json& pool, const Objects& templates, const UsageSnapshot& usage,
                       const std::vector<Allocation>& allocations);
  Status ReconcileWorkload(const Json& workload, const std::vector<Allocation>& allocations);
  // Releases the allocations of pods that ended or are gone; nothing until the pods are listed.
  Status ReleaseEndedPods(const std::vector<Allocation>& allocations);
  Status MirrorNodes(const UsageSnapshot& usage);
  Status MirrorGpus(const UsageSnapshot& usage, const std::vector<Allocation>& allocations);
  // Creates the mirror object `name` of kind `kind` (collection `plural`) unless it exists.
  StatusOr<Json> EnsureMirror(KubeObjectCache& cache, const std::string& plural, const std::string& kind,
                              const std::string& name);

  Controller* const controller_;
  const Clock* const clock_;
  const KubeReconcilerOptions options_;
  KubeApi api_;  // the worker's writes and re-reads

  std::unique_ptr<KubeObjectCache> pools_, templates_, workloads_, gpunodes_, gpus_;
  // The labelled pods. Apart from the others: a chart without the pods rule leaves it unsynced,
  // which stops only the release of ended pods' allocations, not the rest.
  std::unique_ptr<KubeObjectCache> pods_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool changed_ = false;
  bool stop_ = false;
  std::thread thread_;
  std::map<std::string, std::string> last_logged_;  // per object: the last message logged (worker only)
  // Allocations of pods the watch does not show but the API server did: when to ask again (worker only).
  std::map<std::string, int64_t> pod_asked_again_ms_;
};

}  // namespace tf::controller
