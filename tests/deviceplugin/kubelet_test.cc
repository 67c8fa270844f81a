// `tfusion device-plugin` against a test kubelet that speaks the real v1beta1 gRPC protocol: the
// test serves Registration on a temporary kubelet.sock and calls the plugin's socket with the
// generated client stubs, as the kubelet's device manager does. The plugin is the real binary,
// finding its GPUs through the fake NVML (2 GPUs; FAKENVML_LOST_FILE loses one).
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "deviceplugin/v1beta1/api.grpc.pb.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr int kDevicesPerGpu = 4;
constexpr char kResource[] = "tensor-fusion.ai/vgpu";
constexpr char kEndpoint[] = "tensor-fusion.ai_vgpu.sock";
constexpr char kHostShm[] = "/var/run/tf-test-host-shm";
constexpr char kContainerShm[] = "/dev/shm/tensorfusion";

// The UUIDs the fake NVML gives its GPUs, asked of the fake itself.
std::vector<std::string> FakeGpuUuids(int count) {
  using Init = int (*)();
  using Handle = int (*)(unsigned, void**);
  using Uuid = int (*)(void*, char*, unsigned);
  void* lib = dlopen(FAKENVML_LIBRARY_PATH, RTLD_NOW | RTLD_LOCAL);
  EXPECT_NE(lib, nullptr) << dlerror();
  if (lib == nullptr) return {};
  auto init = reinterpret_cast<Init>(dlsym(lib, "nvmlInit_v2"));
  auto handle = reinterpret_cast<Handle>(dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
  auto uuid = reinterpret_cast<Uuid>(dlsym(lib, "nvmlDeviceGetUUID"));
  std::vector<std::string> out;
  setenv("FAKECUDA_DEVICES", std::to_string(count).c_str(), 1);
  EXPECT_EQ(init(), 0);
  for (int i = 0; i < count; ++i) {
    void* h = nullptr;
    char buf[96] = {};
    EXPECT_EQ(handle(static_cast<unsigned>(i), &h), 0);
    EXPECT_EQ(uuid(h, buf, sizeof buf), 0);
    out.push_back(buf);
  }
  return out;
}

// The kubelet's Registration service on <dir>/kubelet.sock; records every request.
class FakeKubelet final : public v1beta1::Registration::Service {
 public:
  explicit FakeKubelet(const std::string& socket) {
    grpc::ServerBuilder b;
    b.AddListeningPort("unix:" + socket, grpc::InsecureServerCredentials());
    b.RegisterService(this);
    server_ = b.BuildAndStart();
  }
  ~FakeKubelet() override { Stop(); }
  bool serving() const { return server_ != nullptr; }
  void Stop() {
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + 1s);
    server_.reset();
  }

  grpc::Status Register(grpc::ServerContext*, const v1beta1::RegisterRequest* r, v1beta1::Empty*) override {
    std::lock_guard<std::mutex> lock(mu_);
    requests_.push_back(*r);
    cv_.notify_all();
    return grpc::Status::OK;
  }

  std::optional<v1beta1::RegisterRequest> WaitForRegistration(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return !requests_.empty(); })) return std::nullopt;
    return requests_.front();
  }
  size_t registrations() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_.size();
  }

 private:
  std::unique_ptr<grpc::Server> server_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<v1beta1::RegisterRequest> requests_;
};

// A ListAndWatch stream read on its own thread, so the test can wait for a message with a timeout.
class DeviceStream {
 public:
  explicit DeviceStream(v1beta1::DevicePlugin::Stub* stub) {
    reader_ = stub->ListAndWatch(&ctx_, v1beta1::Empty());
    thread_ = std::thread([this] {
      v1beta1::ListAndWatchResponse r;
      while (reader_->Read(&r)) {
        std::lock_guard<std::mutex> lock(mu_);
        queue_.push_back(r);
        cv_.notify_all();
      }
      std::lock_guard<std::mutex> lock(mu_);
      ended_ = true;
      cv_.notify_all();
    });
  }
  ~DeviceStream() {
    ctx_.TryCancel();
    thread_.join();
  }
  std::optional<v1beta1::ListAndWatchResponse> Next(std::chrono::milliseconds timeout = 10s) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return !queue_.empty() || ended_; });
    if (queue_.empty()) return std::nullopt;
    auto r = queue_.front();
    queue_.pop_front();
    return r;
  }
  // Whether the server ended the stream within `timeout`.
  bool Ends(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return ended_; });
  }

 private:
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReader<v1beta1::ListAndWatchResponse>> reader_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<v1beta1::ListAndWatchResponse> queue_;
  bool ended_ = false;
};

std::map<std::string, std::string> Health(const v1beta1::ListAndWatchResponse& r) {
  std::map<std::string, std::string> out;
  for (const auto& d : r.devices()) out[d.id()] = d.health();
  return out;
}

bool IsSocket(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
}

bool WaitFor(const std::function<bool()>& cond, std::chrono::milliseconds timeout = 10s) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return cond();
}

class KubeletTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tfdp-XXXXXX";  // short: unix socket paths are limited to 107 characters
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    plugin_dir_ = root_ + "/device-plugins";
    fs::create_directories(plugin_dir_);
    lost_file_ = root_ + "/lost-gpus";
    kubelet_ = std::make_unique<FakeKubelet>(plugin_dir_ + "/kubelet.sock");
    ASSERT_TRUE(kubelet_->serving());
    uuids_ = FakeGpuUuids(2);
    ASSERT_EQ(uuids_.size(), 2u);
  }

  void TearDown() override {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    kubelet_.reset();
    if (HasFailure()) std::cerr << "--- plugin log\n" << Log();
    fs::remove_all(root_);
  }

  // Runs `tfusion device-plugin` with `args` (beside the test's NVML and folders); returns its pid.
  pid_t Spawn(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {TFUSION_BIN, "device-plugin"};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) env.push_back(*e);
    env.push_back("FAKECUDA_DEVICES=2");
    env.push_back("FAKENVML_LOST_FILE=" + lost_file_);
    std::vector<char*> cargv, cenv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    for (auto& e : env) cenv.push_back(e.data());
    cenv.push_back(nullptr);
    posix_spawn_file_actions_t files;
    posix_spawn_file_actions_init(&files);
    posix_spawn_file_actions_addopen(&files, 1, (root_ + "/plugin.log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&files, 1, 2);
    pid_t pid = -1;
    EXPECT_EQ(posix_spawn(&pid, cargv[0], &files, nullptr, cargv.data(), cenv.data()), 0);
    posix_spawn_file_actions_destroy(&files);
    return pid;
  }

  void StartPlugin() {
    pid_ = Spawn({"--plugin-dir", plugin_dir_, "--devices-per-gpu", std::to_string(kDevicesPerGpu), "--nvml",
                  FAKENVML_LIBRARY_PATH, "--host-shm-dir", kHostShm, "--container-shm-dir", kContainerShm,
                  "--health-interval", "0.1"});
    ASSERT_GT(pid_, 0);
    registration_ = kubelet_->WaitForRegistration(15s);
    ASSERT_TRUE(registration_.has_value()) << "the plugin did not register";
    stub_ = Stub();
  }

  std::unique_ptr<v1beta1::DevicePlugin::Stub> Stub() {
    auto channel = grpc::CreateChannel("unix:" + plugin_dir_ + "/" + kEndpoint, grpc::InsecureChannelCredentials());
    return v1beta1::DevicePlugin::NewStub(channel);
  }

  // Exit status of the plugin within `timeout`, or -1.
  int WaitExit(pid_t pid, std::chrono::milliseconds timeout) {
    int status = 0;
    bool exited = WaitFor([&] { return waitpid(pid, &status, WNOHANG) == pid; }, timeout);
    if (!exited) return -1;
    if (pid == pid_) pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  std::string Log() const {
    std::ifstream in(root_ + "/plugin.log");
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  grpc::Status Allocate(const std::vector<std::vector<std::string>>& containers, v1beta1::AllocateResponse* out) {
    v1beta1::AllocateRequest req;
    for (const auto& ids : containers) {
      auto* c = req.add_container_requests();
      for (const auto& id : ids) c->add_devices_ids(id);
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 5s);
    return stub_->Allocate(&ctx, req, out);
  }

  std::string Id(int gpu, int slot) const { return uuids_[gpu] + "::" + std::to_string(slot); }

  std::string root_, plugin_dir_, lost_file_;
  std::vector<std::string> uuids_;
  std::unique_ptr<FakeKubelet> kubelet_;
  pid_t pid_ = -1;
  std::optional<v1beta1::RegisterRequest> registration_;
  std::unique_ptr<v1beta1::DevicePlugin::Stub> stub_;
};

TEST_F(KubeletTest, RegistersItsResourceAndEndpointWithTheV1beta1Version) {
  StartPlugin();
  EXPECT_EQ(registration_->version(), "v1beta1");
  EXPECT_EQ(registration_->resource_name(), kResource);
  EXPECT_EQ(registration_->endpoint(), kEndpoint);  // relative to the device-plugin folder
  EXPECT_TRUE(registration_->options().get_preferred_allocation_available());
  EXPECT_FALSE(registration_->options().pre_start_required());
  EXPECT_TRUE(IsSocket(plugin_dir_ + "/" + kEndpoint));

  // What the kubelet asks right after registering.
  grpc::ClientContext ctx;
  v1beta1::DevicePluginOptions options;
  ASSERT_TRUE(stub_->GetDevicePluginOptions(&ctx, v1beta1::Empty(), &options).ok());
  EXPECT_TRUE(options.get_preferred_allocation_available());
  EXPECT_FALSE(options.pre_start_required());
}

TEST_F(KubeletTest, ListAndWatchStreamsDevicesPerGpuSlotAllHealthy) {
  StartPlugin();
  DeviceStream stream(stub_.get());
  auto first = stream.Next();
  ASSERT_TRUE(first.has_value());
  std::vector<std::string> ids, expected;
  for (const auto& d : first->devices()) {
    ids.push_back(d.id());
    EXPECT_EQ(d.health(), "Healthy") << d.id();
    EXPECT_LE(d.id().size(), 63u);
  }
  for (int gpu = 0; gpu < 2; ++gpu)
    for (int slot = 0; slot < kDevicesPerGpu; ++slot) expected.push_back(Id(gpu, slot));
  EXPECT_EQ(ids, expected);
}

TEST_F(KubeletTest, AllocateBindsEachContainerToTheGpuOfItsDevices) {
  StartPlugin();
  v1beta1::AllocateResponse r;
  grpc::Status st = Allocate({{Id(0, 1)}, {Id(1, 0), Id(1, 2)}, {Id(0, 3), Id(1, 3)}}, &r);
  ASSERT_TRUE(st.ok()) << st.error_message();
  ASSERT_EQ(r.container_responses_size(), 3);

  // One device of GPU 0.
  const auto& one = r.container_responses(0);
  std::map<std::string, std::string> envs(one.envs().begin(), one.envs().end());
  EXPECT_EQ(envs, (std::map<std::string, std::string>{
                      {"NVIDIA_VISIBLE_DEVICES", uuids_[0]},
                      {"CUDA_VISIBLE_DEVICES", uuids_[0]},
                      {"TFUSION_GPU_UUID", uuids_[0]},
                      {"TFUSION_REGION", std::string(kContainerShm) + "/gpu-" + uuids_[0] + ".region"},
                      {"TFUSION_DEVICE_IDS", Id(0, 1)},
                  }));
  ASSERT_EQ(one.mounts_size(), 1);
  EXPECT_EQ(one.mounts(0).container_path(), kContainerShm);
  EXPECT_EQ(one.mounts(0).host_path(), kHostShm);
  EXPECT_FALSE(one.mounts(0).read_only());  // the limiter writes its process and VRAM there
  EXPECT_EQ(one.devices_size(), 0);

  // Two devices of GPU 1: still one GPU.
  const auto& two = r.container_responses(1);
  EXPECT_EQ(two.envs().at("NVIDIA_VISIBLE_DEVICES"), uuids_[1]);
  EXPECT_EQ(two.envs().at("TFUSION_GPU_UUID"), uuids_[1]);
  EXPECT_EQ(two.envs().at("TFUSION_DEVICE_IDS"), Id(1, 0) + "," + Id(1, 2));

  // Devices of two GPUs: both visible, no single region to bind to.
  const auto& both = r.container_responses(2);
  EXPECT_EQ(both.envs().at("NVIDIA_VISIBLE_DEVICES"), uuids_[0] + "," + uuids_[1]);
  EXPECT_EQ(both.envs().at("CUDA_VISIBLE_DEVICES"), uuids_[0] + "," + uuids_[1]);
  EXPECT_EQ(both.envs().count("TFUSION_REGION"), 0u);
  EXPECT_EQ(both.envs().count("TFUSION_GPU_UUID"), 0u);
  EXPECT_EQ(both.mounts_size(), 1);
}

TEST_F(KubeletTest, PreferredAllocationPacksOntoOneGpu) {
  StartPlugin();
  auto prefer = [&](const std::vector<std::string>& available, const std::vector<std::string>& must, int size,
                    std::vector<std::string>* out) {
    v1beta1::PreferredAllocationRequest req;
    auto* c = req.add_container_requests();
    for (const auto& id : available) c->add_available_deviceids(id);
    for (const auto& id : must) c->add_must_include_deviceids(id);
    c->set_allocation_size(size);
    grpc::ClientContext ctx;
    v1beta1::PreferredAllocationResponse r;
    grpc::Status st = stub_->GetPreferredAllocation(&ctx, req, &r);
    if (st.ok() && r.container_responses_size() == 1)
      *out = {r.container_responses(0).deviceids().begin(), r.container_responses(0).deviceids().end()};
    return st;
  };
  std::vector<std::string> out;
  // GPU 0 has one free slot, GPU 1 three: two devices go to GPU 1 (the whole request on one GPU).
  ASSERT_TRUE(prefer({Id(0, 2), Id(1, 0), Id(1, 1), Id(1, 3)}, {}, 2, &out).ok());
  EXPECT_EQ(out, (std::vector<std::string>{Id(1, 0), Id(1, 1)}));
  // One device: the tightest GPU, keeping GPU 1's three free slots together.
  ASSERT_TRUE(prefer({Id(0, 2), Id(1, 0), Id(1, 1), Id(1, 3)}, {}, 1, &out).ok());
  EXPECT_EQ(out, (std::vector<std::string>{Id(0, 2)}));
  // A device that must be included pulls the rest onto its GPU.
  ASSERT_TRUE(prefer({Id(0, 0), Id(0, 1), Id(1, 0), Id(1, 3)}, {Id(1, 3)}, 2, &out).ok());
  EXPECT_EQ(out, (std::vector<std::string>{Id(1, 3), Id(1, 0)}));
  // Bad requests are refused.
  EXPECT_EQ(prefer({Id(0, 0)}, {}, 2, &out).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(prefer({Id(0, 0)}, {Id(1, 0)}, 1, &out).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(prefer({"GPU-unknown::0"}, {}, 1, &out).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(KubeletTest, UnknownDeviceIdsAreRefusedWithInvalidArgumentAndNothingAllocated) {
  StartPlugin();
  struct Case {
    std::vector<std::vector<std::string>> containers;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{{"GPU-00000000-0000-0000-0000-000000000000::0"}},
       "container request 0: unknown device ID 'GPU-00000000-0000-0000-0000-000000000000::0'"},
      {{{Id(0, kDevicesPerGpu)}}, "container request 0: unknown device ID '" + Id(0, kDevicesPerGpu) + "'"},
      {{{uuids_[0]}}, "container request 0: unknown device ID '" + uuids_[0] + "'"},
      {{{Id(0, 0) + "x"}}, "unknown device ID"},
      {{{Id(0, 0)}, {Id(1, 0), "bogus"}}, "container request 1: unknown device ID 'bogus'"},
      {{{Id(0, 1), Id(0, 1)}}, "container request 0: device ID '" + Id(0, 1) + "' is named twice"},
      {{{}}, "container request 0: a container request names no device"},
      {{}, "Allocate: no container request"},
  };
  for (const Case& c : cases) {
    v1beta1::AllocateResponse r;
    grpc::Status st = Allocate(c.containers, &r);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.message;
    EXPECT_NE(st.error_message().find(c.message), std::string::npos) << st.error_message();
    EXPECT_EQ(r.container_responses_size(), 0);
  }
  EXPECT_NE(Log().find("Allocate refused"), std::string::npos);
  // The plugin still serves.
  v1beta1::AllocateResponse r;
  EXPECT_TRUE(Allocate({{Id(1, 1)}}, &r).ok());
}

TEST_F(KubeletTest, ALostGpuTurnsItsDevicesUnhealthyAndBackWhenItReturns) {
  StartPlugin();
  DeviceStream stream(stub_.get());
  ASSERT_TRUE(stream.Next().has_value());

  { std::ofstream(lost_file_) << "1\n"; }  // GPU 1 falls off the bus
  auto lost = stream.Next();
  ASSERT_TRUE(lost.has_value()) << "no update after the GPU was lost";
  auto health = Health(*lost);
  ASSERT_EQ(health.size(), 2u * kDevicesPerGpu);  // its devices stay listed, marked
  for (int slot = 0; slot < kDevicesPerGpu; ++slot) {
    EXPECT_EQ(health[Id(0, slot)], "Healthy");
    EXPECT_EQ(health[Id(1, slot)], "Unhealthy");
  }
  v1beta1::AllocateResponse r;
  grpc::Status st = Allocate({{Id(1, 0)}}, &r);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(st.error_message().find("unhealthy"), std::string::npos) << st.error_message();
  EXPECT_NE(Log().find(uuids_[1] + ": unhealthy"), std::string::npos);

  { std::ofstream(lost_file_) << ""; }  // back
  auto back = stream.Next();
  ASSERT_TRUE(back.has_value()) << "no update after the GPU came back";
  for (const auto& [id, h] : Health(*back)) EXPECT_EQ(h, "Healthy") << id;
  EXPECT_TRUE(Allocate({{Id(1, 0)}}, &r).ok());
}

TEST_F(KubeletTest, RegistersAgainWhenTheKubeletRestarts) {
  StartPlugin();
  const std::string socket = plugin_dir_ + "/" + kEndpoint;
  // A kubelet restart: the old one goes away, the new one deletes every plugin socket and
  // serves a new kubelet.sock.
  kubelet_->Stop();
  fs::remove(plugin_dir_ + "/kubelet.sock");
  fs::remove(socket);
  kubelet_ = std::make_unique<FakeKubelet>(plugin_dir_ + "/kubelet.sock");
  ASSERT_TRUE(kubelet_->serving());
  auto again = kubelet_->WaitForRegistration(15s);
  ASSERT_TRUE(again.has_value()) << "no registration with the restarted kubelet";
  EXPECT_EQ(again->resource_name(), kResource);
  EXPECT_EQ(again->endpoint(), kEndpoint);
  EXPECT_TRUE(IsSocket(socket));
  stub_ = Stub();
  DeviceStream stream(stub_.get());
  auto list = stream.Next();
  ASSERT_TRUE(list.has_value()) << "the new socket does not serve";
  EXPECT_EQ(list->devices_size(), 2 * kDevicesPerGpu);

  // Only kubelet.sock re-created (the plugin socket kept): registers again as well.
  kubelet_->Stop();
  fs::remove(plugin_dir_ + "/kubelet.sock");
  kubelet_ = std::make_unique<FakeKubelet>(plugin_dir_ + "/kubelet.sock");
  ASSERT_TRUE(kubelet_->WaitForRegistration(15s).has_value());
  EXPECT_EQ(kubelet_->registrations(), 1u);
}

TEST_F(KubeletTest, SigtermEndsTheStreamsRemovesTheSocketAndExitsZero) {
  StartPlugin();
  DeviceStream stream(stub_.get());
  ASSERT_TRUE(stream.Next().has_value());
  ASSERT_EQ(kill(pid_, SIGTERM), 0);
  EXPECT_TRUE(stream.Ends(5s));
  EXPECT_EQ(WaitExit(pid_, 10s), 0);
  EXPECT_FALSE(fs::exists(plugin_dir_ + "/" + kEndpoint));
}

TEST_F(KubeletTest, BadFlagsAreRefusedAndNothingIsServed) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--plugin-dir", plugin_dir_, "--devices-per-gpu", "0"}, "--devices-per-gpu 0: must be 1 to 1000"},
      {{"--plugin-dir", plugin_dir_, "--resource-name", "vgpu"}, "--resource-name vgpu: not an extended resource name"},
      {{"--plugin-dir", plugin_dir_, "--resource-name", "kubernetes.io/vgpu"}, "not an extended resource name"},
      {{"--plugin-dir", plugin_dir_, "--resource-name", "Tensor-Fusion.ai/vgpu"}, "not an extended resource name"},
      {{"--plugin-dir", root_ + "/missing"}, "--plugin-dir " + root_ + "/missing: not an existing folder"},
      {{"--plugin-dir", plugin_dir_, "--health-interval", "0"}, "--health-interval"},
      {{"--plugin-dir", plugin_dir_, "--container-shm-dir", "relative"}, "--container-shm-dir relative: must be an absolute path"},
  };
  for (const auto& [args, message] : cases) {
    pid_t pid = Spawn(args);
    EXPECT_EQ(WaitExit(pid, 10s), 2) << message;
    EXPECT_NE(Log().find(message), std::string::npos) << message << "\n" << Log();
  }
  EXPECT_EQ(kubelet_->registrations(), 0u);
  for (const auto& e : fs::directory_iterator(plugin_dir_))
    EXPECT_EQ(e.path().filename(), "kubelet.sock") << "left behind: " << e.path();
}

}  // namespace
