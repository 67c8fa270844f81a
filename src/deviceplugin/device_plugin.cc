#include "deviceplugin/device_plugin.h"

#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "hypervisor/quota_regions.h"

namespace tf::deviceplugin {
namespace {

constexpr int kTickMs = 100;
constexpr int kRegisterTimeoutMs = 5000;
constexpr int kRegisterRetryMs = 2000;

void Log(const std::string& line) { std::fprintf(stderr, "device-plugin: %s\n", line.c_str()); }

grpc::Status ToGrpc(const Status& s) {
  switch (s.code()) {
    case StatusCode::kOk: return grpc::Status::OK;
    case StatusCode::kInvalidArgument: return {grpc::StatusCode::INVALID_ARGUMENT, s.message()};
    case StatusCode::kFailedPrecondition: return {grpc::StatusCode::FAILED_PRECONDITION, s.message()};
    case StatusCode::kNotFound: return {grpc::StatusCode::NOT_FOUND, s.message()};
    case StatusCode::kUnavailable: return {grpc::StatusCode::UNAVAILABLE, s.message()};
    default: return {grpc::StatusCode::INTERNAL, s.message()};
  }
}

std::vector<std::string> Ids(const google::protobuf::RepeatedPtrField<std::string>& ids) {
  return {ids.begin(), ids.end()};
}

// Which file a path names: a file deleted and made again differs even when its inode number is
// reused (the change time differs). All zero when the path does not exist.
struct FileIdentity {
  dev_t dev = 0;
  ino_t ino = 0;
  int64_t ctime_ns = 0;
  bool exists() const { return ino != 0; }
  bool operator==(const FileIdentity&) const = default;
};

FileIdentity IdentityOf(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return {};
  return {st.st_dev, st.st_ino, int64_t{st.st_ctim.tv_sec} * 1'000'000'000 + st.st_ctim.tv_nsec};
}

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

// ---- DeviceState

bool DeviceState::Refresh(hypervisor::GpuSource& source) {
  auto found = source.Discover();
  std::lock_guard<std::mutex> lock(mu_);
  const std::vector<VgpuDevice> before = table_.Devices();
  bool changed = false;
  bool reached = true;
  std::string problem;
  if (found.ok()) {
    Status st = table_.Discovered(*found, &changed);
    if (!st.ok()) problem = st.message();
  } else {
    // A full discovery fails as soon as one GPU does not answer (a GPU that fell off the bus):
    // the GPUs that still answer are healthy.
    problem = "GPU discovery: " + found.status().message();
    auto sample = source.Sample();
    if (sample.ok()) {
      std::set<std::string> present;
      for (const auto& u : *sample) present.insert(u.uuid);
      changed = table_.Present(present);
    } else {
      changed = table_.Present({});
      reached = false;
    }
  }
  if (problem != last_problem_ && !problem.empty()) Log(problem);
  last_problem_ = problem;
  if (!changed) return reached;
  ++generation_;
  // One line per GPU whose state changed.
  const std::vector<VgpuDevice> after = table_.Devices();
  const size_t per_gpu = static_cast<size_t>(table_.devices_per_gpu());
  for (size_t i = 0; i < after.size(); i += per_gpu) {
    const bool was_known = i < before.size();
    if (was_known && before[i].healthy == after[i].healthy) continue;
    Log("GPU " + after[i].gpu_uuid + (!was_known ? ": " + std::to_string(per_gpu) + " devices, healthy"
                                      : after[i].healthy ? ": healthy again"
                                                         : ": unhealthy (the driver does not report it)"));
  }
  changed_.notify_all();
  return reached;
}

std::vector<VgpuDevice> DeviceState::Devices(uint64_t* generation) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (generation) *generation = generation_;
  return table_.Devices();
}

void DeviceState::WaitForChange(uint64_t seen, const std::atomic<bool>& wake, int timeout_ms) const {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                    [&] { return generation_ != seen || wake.load(); });
}

StatusOr<ContainerBinding> DeviceState::Bind(const std::vector<std::string>& ids) const {
  std::lock_guard<std::mutex> lock(mu_);
  return table_.Bind(ids, regions_);
}

StatusOr<std::vector<std::string>> DeviceState::Prefer(const std::vector<std::string>& available,
                                                       const std::vector<std::string>& must_include,
                                                       int size) const {
  std::lock_guard<std::mutex> lock(mu_);
  return table_.Prefer(available, must_include, size);
}

// ---- the gRPC service: one per server, so a re-created server starts with a fresh one.

class DevicePlugin::Service final : public v1beta1::DevicePlugin::Service {
 public:
  explicit Service(const DeviceState* state) : state_(state) {}

  // Ends every ListAndWatch stream (before the server shuts down).
  void Stop() {
    stopping_ = true;
    state_->WakeAll();
  }

  grpc::Status GetDevicePluginOptions(grpc::ServerContext*, const v1beta1::Empty*,
                                      v1beta1::DevicePluginOptions* out) override {
    out->set_pre_start_required(false);
    out->set_get_preferred_allocation_available(true);
    return grpc::Status::OK;
  }

  grpc::Status ListAndWatch(grpc::ServerContext* ctx, const v1beta1::Empty*,
                            grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer) override {
    uint64_t sent = 0;
    bool first = true;
    while (!stopping_ && !ctx->IsCancelled()) {
      uint64_t generation = 0;
      std::vector<VgpuDevice> devices = state_->Devices(&generation);
      if (first || generation != sent) {
        v1beta1::ListAndWatchResponse r;
        for (const VgpuDevice& d : devices) {
          v1beta1::Device* out = r.add_devices();
          out->set_id(d.id);
          out->set_health(d.healthy ? kHealthy : kUnhealthy);
          if (d.numa_node >= 0) out->mutable_topology()->add_nodes()->set_id(d.numa_node);
        }
        if (!writer->Write(r)) break;  // the kubelet went away
        first = false;
        sent = generation;
        continue;
      }
      state_->WaitForChange(sent, stopping_, 500);
    }
    return grpc::Status::OK;
  }

  grpc::Status GetPreferredAllocation(grpc::ServerContext*, const v1beta1::PreferredAllocationRequest* req,
                                      v1beta1::PreferredAllocationResponse* out) override {
    if (req->container_requests_size() == 0)
      return {grpc::StatusCode::INVALID_ARGUMENT, "GetPreferredAllocation: no container request"};
    for (int i = 0; i < req->container_requests_size(); ++i) {
      const auto& c = req->container_requests(i);
      auto chosen = state_->Prefer(Ids(c.available_deviceids()), Ids(c.must_include_deviceids()), c.allocation_size());
      if (!chosen.ok()) {
        out->Clear();
        return ToGrpc(Status(chosen.status().code(), "container request " + std::to_string(i) + ": " +
                                                         chosen.status().message()));
      }
      auto* r = out->add_container_responses();
      for (const std::string& id : *chosen) r->add_deviceids(id);
    }
    return grpc::Status::OK;
  }

  grpc::Status Allocate(grpc::ServerContext*, const v1beta1::AllocateRequest* req,
                        v1beta1::AllocateResponse* out) override {
    if (req->container_requests_size() == 0) return {grpc::StatusCode::INVALID_ARGUMENT, "Allocate: no container request"};
    for (int i = 0; i < req->container_requests_size(); ++i) {
      std::vector<std::string> ids = Ids(req->container_requests(i).devices_ids());
      auto binding = state_->Bind(ids);
      if (!binding.ok()) {
        out->Clear();  // all or nothing
        Log("Allocate refused: container request " + std::to_string(i) + ": " + binding.status().message());
        return ToGrpc(Status(binding.status().code(), "container request " + std::to_string(i) + ": " +
                                                          binding.status().message()));
      }
      auto* r = out->add_container_responses();
      for (const auto& [k, v] : binding->envs) (*r->mutable_envs())[k] = v;
      for (const auto& m : binding->mounts) {
        auto* mount = r->add_mounts();
        mount->set_container_path(m.container_path);
        mount->set_host_path(m.host_path);
        mount->set_read_only(m.read_only);
      }
      Log("allocated " + binding->envs["TFUSION_DEVICE_IDS"] + " to a container");
    }
    return grpc::Status::OK;
  }

  grpc::Status PreStartContainer(grpc::ServerContext*, const v1beta1::PreStartContainerRequest* req,
                                 v1beta1::PreStartContainerResponse*) override {
    // Not asked for (pre_start_required is false); a kubelet that calls it anyway gets the IDs
    // checked and nothing done.
    auto binding = state_->Bind(Ids(req->devices_ids()));
    return binding.ok() ? grpc::Status::OK : ToGrpc(binding.status());
  }

 private:
  const DeviceState* state_;
  std::atomic<bool> stopping_{false};
};

// ---- DevicePlugin

struct DevicePlugin::Server {
  std::unique_ptr<Service> service;
  std::unique_ptr<grpc::Server> server;
  FileIdentity socket_identity;
};

DevicePlugin::DevicePlugin(DevicePluginOptions options,
                           std::function<std::unique_ptr<hypervisor::GpuSource>()> make_source)
    : options_(std::move(options)),
      socket_path_(options_.plugin_dir + "/" + EndpointFor(options_.resource_name)),
      kubelet_socket_(options_.plugin_dir + "/" + kKubeletSocket),
      make_source_(std::move(make_source)),
      state_(options_.devices_per_gpu,
             RegionMount{options_.host_region_dir.empty() ? hypervisor::DefaultRegionDir() : options_.host_region_dir,
                         options_.container_region_dir}) {}

DevicePlugin::~DevicePlugin() { StopServing(); }

Status DevicePlugin::Serve() {
  StopServing();
  unlink(socket_path_.c_str());  // a stale socket of an earlier run
  auto s = std::make_unique<Server>();
  s->service = std::make_unique<Service>(&state_);
  grpc::ServerBuilder builder;
  int bound = 0;
  builder.AddListeningPort("unix:" + socket_path_, grpc::InsecureServerCredentials(), &bound);
  builder.RegisterService(s->service.get());
  s->server = builder.BuildAndStart();
  if (!s->server) return Unavailable("cannot serve on " + socket_path_ + " (is the folder writable?)");
  s->socket_identity = IdentityOf(socket_path_);
  server_ = std::move(s);
  return Status::Ok();
}

void DevicePlugin::StopServing() {
  if (!server_) return;
  server_->service->Stop();
  server_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  server_->server->Wait();
  // Only our own socket: after a kubelet restart the path may be gone or someone else's.
  if (IdentityOf(socket_path_) == server_->socket_identity) unlink(socket_path_.c_str());
  server_.reset();
}

Status DevicePlugin::Register() const {
  auto channel = grpc::CreateChannel("unix:" + kubelet_socket_, grpc::InsecureChannelCredentials());
  auto stub = v1beta1::Registration::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(kRegisterTimeoutMs));
  v1beta1::RegisterRequest req;
  req.set_version(kApiVersion);
  req.set_endpoint(EndpointFor(options_.resource_name));
  req.set_resource_name(options_.resource_name);
  req.mutable_options()->set_pre_start_required(false);
  req.mutable_options()->set_get_preferred_allocation_available(true);
  v1beta1::Empty empty;
  grpc::Status st = stub->Register(&ctx, req, &empty);
  if (!st.ok()) return Unavailable("registering with " + kubelet_socket_ + ": " + st.error_message());
  return Status::Ok();
}

int DevicePlugin::Run() {
  sigset_t signals;
  sigemptyset(&signals);
  for (int s : {SIGTERM, SIGINT, SIGHUP}) sigaddset(&signals, s);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);  // before gRPC starts its threads

  std::unique_ptr<hypervisor::GpuSource> source = make_source_();
  if (!state_.Refresh(*source)) source = make_source_();
  uint64_t generation = 0;
  Log(std::to_string(state_.Devices(&generation).size()) + " devices of " + options_.resource_name);

  Status served = Serve();
  if (!served.ok()) {
    Log(served.message());
    return 1;
  }
  Log("serving on " + socket_path_);
  FileIdentity registered_with;  // the kubelet.sock we registered with
  int64_t next_register_ms = 0, next_refresh_ms = NowMs() + static_cast<int64_t>(options_.health_interval_seconds * 1000);
  std::string last_register_error;
  bool waiting_logged = false;
  for (;;) {
    const int64_t now = NowMs();
    // The kubelet deletes every plugin socket when it starts: serve again on a new one.
    if (IdentityOf(socket_path_) != server_->socket_identity) {
      Log("the socket " + socket_path_ + " was removed (kubelet restart?): serving on a new one");
      served = Serve();
      if (!served.ok()) {
        Log(served.message());
        return 1;
      }
      registered_with = {};
    }
    const auto kubelet = IdentityOf(kubelet_socket_);
    if (!kubelet.exists()) {
      if (!waiting_logged) Log("waiting for the kubelet: no " + kubelet_socket_);
      waiting_logged = true;
      registered_with = {};
    } else if (kubelet != registered_with && now >= next_register_ms) {
      Status st = Register();
      waiting_logged = false;
      if (st.ok()) {
        registered_with = kubelet;
        last_register_error.clear();
        Log("registered " + options_.resource_name + " with the kubelet (" + kubelet_socket_ + ")");
      } else {
        if (st.message() != last_register_error) Log(st.message() + " (retrying every 2 s)");
        last_register_error = st.message();
        next_register_ms = now + kRegisterRetryMs;
      }
    }
    if (now >= next_refresh_ms) {
      if (!state_.Refresh(*source)) source = make_source_();  // no driver: load it again next time
      next_refresh_ms = now + static_cast<int64_t>(options_.health_interval_seconds * 1000);
    }
    timespec tick{0, kTickMs * 1'000'000L};
    int sig = sigtimedwait(&signals, nullptr, &tick);
    if (sig > 0) {
      Log(std::string("stopping on ") + strsignal(sig));
      break;
    }
  }
  StopServing();
  return 0;
}

}  // namespace tf::deviceplugin
