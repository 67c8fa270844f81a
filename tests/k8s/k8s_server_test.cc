// `tfusion k8s` as Kubernetes would use it: recorded AdmissionReview and extender payloads
// (tests/k8s/payloads/) POSTed over real HTTPS (a CA and certificate made with openssl for the
// test) to a running `tfusion k8s`, which talks to a running `tfusion controller` with seeded
// nodes and GPUs, and to a small fake Kubernetes API server in this test that serves the pod and
// records Binding requests. No real API server or kube-scheduler is involved.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "../common/test_ca.h"
#include "controller/base64.h"

namespace {

using json = nlohmann::json;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

json Payload(const std::string& name) {
  return json::parse(ReadFile(std::string(TF_K8S_PAYLOADS) + "/" + name));
}

int Sh(const std::string& cmd) { return system(cmd.c_str()); }

pid_t Spawn(const std::string& cmd) {
  pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

std::string WaitFor(const std::string& log, const std::regex& re) {
  for (int i = 0; i < 300; ++i) {
    std::smatch m;
    std::string text = ReadFile(log);
    if (std::regex_search(text, m, re)) return m.str(1);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return "";
}

// The fake API server: serves pods by namespace/name and records Binding POSTs. A binding is
// answered 201 and sets the pod's spec.nodeName (a second one gets 409, as the real server does),
// unless `binding_status` says otherwise.
class FakeApiServer {
 public:
  FakeApiServer(const std::string& cert, const std::string& key) : server_(cert.c_str(), key.c_str()) {
    server_.Get(R"(/api/v1/namespaces/([^/]+)/pods/([^/]+))", [this](const httplib::Request& req, httplib::Response& res) {
      std::lock_guard<std::mutex> lock(mu_);
      authorization_ = req.get_header_value("Authorization");
      auto it = pods_.find(std::string(req.matches[1]) + "/" + std::string(req.matches[2]));
      if (it == pods_.end()) {
        res.status = 404;
        res.set_content(R"({"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404})",
                        "application/json");
        return;
      }
      res.set_content(it->second.dump(), "application/json");
    });
    server_.Post(R"(/api/v1/namespaces/([^/]+)/pods/([^/]+)/binding)",
                 [this](const httplib::Request& req, httplib::Response& res) {
                   std::lock_guard<std::mutex> lock(mu_);
                   authorization_ = req.get_header_value("Authorization");
                   bindings_.push_back(json::parse(req.body));
                   json& pod = pods_[std::string(req.matches[1]) + "/" + std::string(req.matches[2])];
                   if (binding_status_ != 201) {
                     res.status = binding_status_;
                     res.set_content(R"({"kind":"Status","status":"Failure","message":"etcdserver: request timed out"})",
                                     "application/json");
                     return;
                   }
                   if (!pod["spec"].value("nodeName", "").empty()) {
                     res.status = 409;
                     res.set_content(R"({"kind":"Status","status":"Failure","reason":"Conflict","code":409})",
                                     "application/json");
                     return;
                   }
                   pod["spec"]["nodeName"] = bindings_.back()["target"]["name"];
                   for (auto& [k, v] : bindings_.back()["metadata"]["annotations"].items()) pod["metadata"]["annotations"][k] = v;
                   res.status = 201;
                   res.set_content(R"({"kind":"Status","apiVersion":"v1","status":"Success","code":201})", "application/json");
                 });
    server_.set_logger([this](const httplib::Request& req, const httplib::Response&) {
      std::lock_guard<std::mutex> lock(mu_);
      requests_.push_back({req.method, req.path});
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
  }
  ~FakeApiServer() {
    server_.stop();
    thread_.join();
  }
  int port() const { return port_; }
  void AddPod(const json& pod) {
    std::lock_guard<std::mutex> lock(mu_);
    pods_[pod["metadata"]["namespace"].get<std::string>() + "/" + pod["metadata"]["name"].get<std::string>()] = pod;
  }
  json Pod(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    return pods_[key];
  }
  std::vector<json> bindings() {
    std::lock_guard<std::mutex> lock(mu_);
    return bindings_;
  }
  std::string authorization() {
    std::lock_guard<std::mutex> lock(mu_);
    return authorization_;
  }
  // Every request as (method, path).
  std::vector<std::pair<std::string, std::string>> requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }
  void set_binding_status(int s) {
    std::lock_guard<std::mutex> lock(mu_);
    binding_status_ = s;
  }

 private:
  httplib::SSLServer server_;
  int port_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::map<std::string, json> pods_;
  std::vector<json> bindings_;
  std::string authorization_;
  int binding_status_ = 201;
  std::vector<std::pair<std::string, std::string>> requests_;
};

// The RBAC (apiGroup, resource, verb) a core-API request needs, as the API server derives it.
std::string AccessOf(const std::string& method, const std::string& path) {
  std::smatch m;
  static const std::regex kCore(R"(^/api/v1/(?:namespaces/[^/]+/)?([^/]+)(?:/([^/]+)(?:/([^/]+))?)?$)");
  if (!std::regex_match(path, m, kCore)) return "not a core API path: " + path;
  const std::string resource = m.str(1) + (m[3].matched ? "/" + m.str(3) : "");
  const std::map<std::string, std::string> verbs = {
      {"POST", "create"}, {"PUT", "update"}, {"PATCH", "patch"}, {"DELETE", "delete"}};
  const std::string verb = method == "GET" ? (m[2].matched ? "get" : "list") : verbs.at(method);
  return "/" + resource + "/" + verb;  // apiGroup "" first
}

class K8sServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tf-k8s-XXXXXX";
    dir_ = mkdtemp(tmpl);
    // A CA and a server certificate for 127.0.0.1, made now (nothing secret is in the tree).
    const std::string d = dir_ + "/";
    ASSERT_EQ(tf::testing::MakeTestCa(dir_), "");
    std::ofstream(d + "token") << "controller-secret\n";
    std::ofstream(d + "kube-token") << "kube-sa-token\n";

    controller_ = Spawn(std::string(TF_TFUSION) + " controller --listen 127.0.0.1 --port 0 --store sqlite:" + d +
                        "state.db --token-file " + d + "token > " + d + "controller.log 2>&1");
    const std::string port = WaitFor(d + "controller.log", std::regex("listening on http://127.0.0.1:([0-9]+)"));
    ASSERT_FALSE(port.empty()) << ReadFile(d + "controller.log");
    controller_url_ = "http://127.0.0.1:" + port;
    ctl_ = std::make_unique<httplib::Client>(controller_url_);
    ctl_->set_bearer_token_auth("controller-secret");
    // gpu-a: two empty GPUs; gpu-b: one GPU almost full; gpu-d: one GPU partly used and a worker.
    Register(R"({"name":"gpu-a","gpus":[{"uuid":"GPU-a0","model":"H100-SXM","index":0,"tflops":100,"vram_mib":81920},
                                         {"uuid":"GPU-a1","model":"H100-SXM","index":1,"tflops":100,"vram_mib":81920}]})");
    Register(R"({"name":"gpu-b","gpus":[{"uuid":"GPU-b0","model":"H100-SXM","index":0,"tflops":100,"vram_mib":81920}]})");
    Register(R"({"name":"gpu-d","worker_address":"10.0.0.4:7600",
                 "gpus":[{"uuid":"GPU-d0","model":"H100-SXM","index":0,"tflops":100,"vram_mib":81920}]})");
    auto full = ctl_->Post("/v1/allocations", R"({"tflops":95,"vram_mib":1024,"node":"gpu-b"})", "application/json");
    ASSERT_TRUE(full && full->status == 201) << (full ? full->body : "no answer");
    auto part = ctl_->Post("/v1/allocations", R"({"tflops":30,"vram_mib":1024,"node":"gpu-d"})", "application/json");
    ASSERT_TRUE(part && part->status == 201) << (part ? part->body : "no answer");

    api_ = std::make_unique<FakeApiServer>(d + "server.pem", d + "server.key");
    k8s_ = Spawn(std::string(TF_TFUSION) + " k8s --listen 127.0.0.1 --port 0 --tls-cert " + d + "server.pem --tls-key " +
                 d + "server.key --controller " + controller_url_ + " --token-file " + d +
                 "token --limiter-image registry.example/tensorfusion-lib:0.1 --host-shm-dir /run/tf-regions --kube-api https://127.0.0.1:" +
                 std::to_string(api_->port()) + " --kube-token-file " + d + "kube-token --kube-ca-file " + d +
                 "ca.pem > " + d + "k8s.log 2>&1");
    const std::string k8s_port = WaitFor(d + "k8s.log", std::regex("listening on https://127.0.0.1:([0-9]+)"));
    ASSERT_FALSE(k8s_port.empty()) << ReadFile(d + "k8s.log");
    hook_ = std::make_unique<httplib::Client>("https://127.0.0.1:" + k8s_port);
    hook_->set_ca_cert_path((d + "ca.pem").c_str());
    hook_->enable_server_certificate_verification(true);
    hook_->set_read_timeout(20, 0);
  }

  void TearDown() override {
    for (pid_t p : {k8s_, controller_}) {
      if (p > 0) {
        kill(p, SIGTERM);
        waitpid(p, nullptr, 0);
      }
    }
    api_.reset();
    EXPECT_EQ(Sh("rm -rf '" + dir_ + "'"), 0);
  }

  void Register(const std::string& body) {
    auto r = ctl_->Post("/v1/nodes", body, "application/json");
    ASSERT_TRUE(r && r->status == 200) << (r ? r->body : "no answer");
  }

  // POSTs to tfusion k8s over HTTPS; the answer's status and JSON body.
  std::pair<int, json> Post(const std::string& path, const std::string& body) {
    auto r = hook_->Post(path.c_str(), body, "application/json");
    if (!r) return {-1, json()};
    return {r->status, json::parse(r->body, nullptr, false)};
  }

  json Mutate(const json& review) {
    auto [status, answer] = Post("/mutate", review.dump());
    EXPECT_EQ(status, 200) << answer.dump();
    EXPECT_EQ(answer["apiVersion"], "admission.k8s.io/v1");
    EXPECT_EQ(answer["kind"], "AdmissionReview");
    EXPECT_EQ(answer["response"]["uid"], review["request"]["uid"]) << "the response echoes the uid";
    return answer["response"];
  }

  // The pod after applying the response's JSON patch (RFC 6902, nlohmann's implementation).
  static json Patched(const json& pod, const json& response) {
    EXPECT_EQ(response.value("patchType", ""), "JSONPatch");
    auto ops = tf::controller::Base64Decode(response.value("patch", ""));
    EXPECT_TRUE(ops.has_value());
    return pod.patch(json::parse(*ops));
  }

  json Allocations() {
    auto r = ctl_->Get("/v1/allocations");
    return r && r->status == 200 ? json::parse(r->body)["allocations"] : json();
  }
  json Gpu(const std::string& uuid) {
    auto r = ctl_->Get("/v1/gpus");
    EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no answer");
    const json all = json::parse(r->body);
    for (const json& g : all["gpus"])
      if (g["uuid"] == uuid) return g;
    ADD_FAILURE() << "no GPU " << uuid << " in " << r->body;
    return json();
  }

  std::string dir_, controller_url_;
  pid_t controller_ = -1, k8s_ = -1;
  std::unique_ptr<httplib::Client> ctl_, hook_;
  std::unique_ptr<FakeApiServer> api_;
};

json EnvNamed(const json& container, const std::string& name) {
  for (const json& e : container.at("env"))
    if (e["name"] == name) return e;
  return json();
}

TEST_F(K8sServerTest, ALocalPodGetsTheLimiterTheSchedulerAndItsRecordedRequest) {
  json review = Payload("admission-review-local.json");
  json response = Mutate(review);
  ASSERT_EQ(response["allowed"], true) << response.dump();
  json pod = Patched(review["request"]["object"], response);
  EXPECT_EQ(pod["spec"]["schedulerName"], "tensor-fusion-scheduler");
  // Volumes: the service account's stays; ours are appended.
  ASSERT_EQ(pod["spec"]["volumes"].size(), 3u);
  EXPECT_EQ(pod["spec"]["volumes"][0]["name"], "kube-api-access-7xk2p");
  EXPECT_EQ(pod["spec"]["volumes"][1], json::parse(R"({"name":"tensorfusion-lib","emptyDir":{}})"));
  // The agents' quota regions from where they keep them on the host (--host-shm-dir), where the
  // limiter looks for them in the pod.
  EXPECT_EQ(pod["spec"]["volumes"][2],
            json::parse(R"({"name":"tensorfusion-shm","hostPath":{"path":"/run/tf-regions","type":"Directory"}})"));
  // The init container array did not exist: it is created with ours.
  ASSERT_EQ(pod["spec"]["initContainers"].size(), 1u);
  EXPECT_EQ(pod["spec"]["initContainers"][0]["image"], "registry.example/tensorfusion-lib:0.1");
  EXPECT_EQ(pod["spec"]["initContainers"][0]["volumeMounts"][0]["mountPath"], "/tensorfusion");
  for (const json& c : pod["spec"]["containers"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    ASSERT_EQ(c["volumeMounts"].size(), 3u);
    EXPECT_EQ(c["volumeMounts"][1]["mountPath"], "/tensorfusion");
    EXPECT_EQ(c["volumeMounts"][2]["mountPath"], "/dev/shm/tensorfusion");
    EXPECT_EQ(EnvNamed(c, "LD_PRELOAD")["value"],
              "/tensorfusion/limiter/libcuda.so.1:/tensorfusion/limiter/libnvidia-ml.so.1");
    EXPECT_EQ(EnvNamed(c, "TFUSION_VGPU")["valueFrom"]["fieldRef"]["fieldPath"],
              "metadata.annotations['tensor-fusion.ai/allocation']");
    EXPECT_EQ(EnvNamed(c, "TFUSION_GPU_UUID")["valueFrom"]["fieldRef"]["fieldPath"],
              "metadata.annotations['tensor-fusion.ai/gpu-ids']");
    EXPECT_EQ(EnvNamed(c, "TFUSION_REGION")["value"], "/dev/shm/tensorfusion/gpu-$(TFUSION_GPU_UUID).region");
    EXPECT_EQ(EnvNamed(c, "CUDA_VISIBLE_DEVICES")["value"], "$(TFUSION_GPU_UUID)");
  }
  // The trainer's own env stays first; the logger had none and gets ours.
  EXPECT_EQ(pod["spec"]["containers"][0]["env"][0], json::parse(R"({"name":"EPOCHS","value":"3"})"));
  EXPECT_EQ(pod["spec"]["containers"][1]["env"][0]["name"], "TFUSION_GPU_UUID");
  // The parsed request is recorded for the extender (a TFLOPS limit above the request: QoS medium).
  EXPECT_EQ(json::parse(pod["metadata"]["annotations"]["tensor-fusion.ai/vgpu-request"].get<std::string>()),
            json::parse(R"({"gpu_count":1,"local":true,"qos":"medium","tflops":10.0,"tflops_limit":20.0,"vram_mib":8192})"));
  EXPECT_EQ(pod["metadata"]["annotations"]["tensor-fusion.ai/vram-request"], "8Gi") << "the pod's own annotations stay";
}

TEST_F(K8sServerTest, ARemotePodGetsTheClientStubBeforeItsOwnInitContainersAndPreloads) {
  json review = Payload("admission-review-remote.json");
  json response = Mutate(review);
  ASSERT_EQ(response["allowed"], true) << response.dump();
  json pod = Patched(review["request"]["object"], response);
  ASSERT_EQ(pod["spec"]["initContainers"].size(), 2u);
  EXPECT_EQ(pod["spec"]["initContainers"][0]["name"], "tensorfusion-init");
  EXPECT_EQ(pod["spec"]["initContainers"][1]["name"], "fetch-model");
  EXPECT_EQ(pod["spec"]["volumes"], json::parse(R"([{"name":"tensorfusion-lib","emptyDir":{}}])"))
      << "volumes created; no quota-region mount for a remote pod";
  const json& c = pod["spec"]["containers"][0];
  EXPECT_EQ(c["volumeMounts"], json::parse(R"([{"name":"tensorfusion-lib","mountPath":"/tensorfusion","readOnly":true}])"));
  EXPECT_EQ(c["env"][0]["name"], "LD_PRELOAD");
  EXPECT_EQ(c["env"][0]["value"],
            "/tensorfusion/client/libcuda.so.1:/tensorfusion/client/libnvidia-ml.so.1:/usr/lib/libjemalloc.so.2")
      << "ours first, the container's own preload kept";
  EXPECT_EQ(EnvNamed(c, "TFUSION_REMOTE")["valueFrom"]["fieldRef"]["fieldPath"],
            "metadata.annotations['tensor-fusion.ai/worker-address']");
  EXPECT_EQ(EnvNamed(c, "TFUSION_REMOTE_VRAM")["value"], "4096MiB");
  EXPECT_EQ(EnvNamed(c, "TFUSION_REMOTE_PERCENT")["value"], "25");
  // The worker gets the limit and the QoS too (the session's vGPU bursts to 60%, borrows last).
  EXPECT_EQ(EnvNamed(c, "TFUSION_REMOTE_PERCENT_LIMIT")["value"], "60");
  EXPECT_EQ(EnvNamed(c, "TFUSION_REMOTE_QOS")["value"], "low");
  EXPECT_TRUE(EnvNamed(c, "TFUSION_VGPU").is_null());
  EXPECT_EQ(json::parse(pod["metadata"]["annotations"]["tensor-fusion.ai/vgpu-request"].get<std::string>())["local"], false);
}

TEST_F(K8sServerTest, BadAnnotationsAreRefusedWithTheExactMessage) {
  const std::vector<std::pair<std::pair<std::string, std::string>, std::string>> cases = {
      {{"tensor-fusion.ai/vram-request", "lots"},
       "tensor-fusion.ai/vram-request: \"lots\" is not a quantity (expected e.g. 8Gi)"},
      {{"tensor-fusion.ai/tflops-limit", "5"},
       "tensor-fusion.ai/tflops-limit: \"5\" is below the request of 10 TFLOPS (the limit is the ceiling: give at "
       "least the request)"},
      {{"tensor-fusion.ai/qos", "gold"},
       "tensor-fusion.ai/qos: \"gold\" is not a QoS level (expected low, medium, high or critical)"},
      {{"tensor-fusion.ai/gpu-count", "200"},
       "tensor-fusion.ai/gpu-count: \"200\" is out of range (expected a whole number from 1 to 64)"},
      {{"tensor-fusion.ai/workload-profile", "nope"},
       "tensor-fusion.ai/workload-profile: \"nope\": no workload of that name is known to the controller (POST "
       "/v1/workloads)"},
  };
  for (const auto& [kv, message] : cases) {
    json review = Payload("admission-review-local.json");
    review["request"]["object"]["metadata"]["annotations"][kv.first] = kv.second;
    json response = Mutate(review);
    EXPECT_EQ(response["allowed"], false) << kv.first;
    EXPECT_EQ(response["status"]["message"], message);
    EXPECT_EQ(response["status"]["code"], 400);
    EXPECT_FALSE(response.contains("patch"));
  }
}

TEST_F(K8sServerTest, AWorkloadProfileOfTheControllerSizesThePod) {
  auto w = ctl_->Post("/v1/workloads", R"({"name":"llm","tflops":30,"vram_mib":4096,"qos":"critical"})",
                      "application/json");
  ASSERT_TRUE(w && w->status == 201) << (w ? w->body : "no answer");
  json review = Payload("admission-review-local.json");
  review["request"]["object"]["metadata"]["annotations"] = {{"tensor-fusion.ai/workload-profile", "llm"}};
  json response = Mutate(review);
  ASSERT_EQ(response["allowed"], true) << response.dump();
  json pod = Patched(review["request"]["object"], response);
  json recorded = json::parse(pod["metadata"]["annotations"]["tensor-fusion.ai/vgpu-request"].get<std::string>());
  EXPECT_EQ(recorded["tflops"], 30.0);
  EXPECT_EQ(recorded["vram_mib"], 4096);
  EXPECT_EQ(recorded["qos"], "critical");
  EXPECT_EQ(recorded["workload_profile"], "llm");
}

TEST_F(K8sServerTest, PodsWithoutTheLabelAndOtherOperationsAreAdmittedUnchanged) {
  json review = Payload("admission-review-local.json");
  review["request"]["object"]["metadata"]["labels"].erase("tensor-fusion.ai/enabled");
  json response = Mutate(review);
  EXPECT_EQ(response["allowed"], true);
  EXPECT_FALSE(response.contains("patch"));
  review = Payload("admission-review-local.json");
  review["request"]["operation"] = "UPDATE";
  response = Mutate(review);
  EXPECT_EQ(response["allowed"], true);
  EXPECT_FALSE(response.contains("patch"));
  review = Payload("admission-review-local.json");
  review["request"]["kind"]["kind"] = "Deployment";
  response = Mutate(review);
  EXPECT_EQ(response["allowed"], false);
}

TEST_F(K8sServerTest, MalformedReviewsGet400AndTheServerKeepsServing) {
  json no_uid = Payload("admission-review-local.json");
  no_uid["request"].erase("uid");
  json number_uid = Payload("admission-review-local.json");
  number_uid["request"]["uid"] = 5;
  json old_version = Payload("admission-review-local.json");
  old_version["apiVersion"] = "admission.k8s.io/v1beta1";
  json bad_containers = Payload("admission-review-local.json");
  bad_containers["request"]["object"]["spec"]["containers"] = "trainer";
  json bad_env = Payload("admission-review-local.json");
  bad_env["request"]["object"]["spec"]["containers"][0]["env"][0] = 7;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{not json", "the body is not JSON"},
      {"[1,2]", "the body is not a JSON object"},
      {no_uid.dump(), "request.uid is missing"},
      {number_uid.dump(), "request.uid must be a string"},
      {old_version.dump(), "apiVersion must be admission.k8s.io/v1 (got \"admission.k8s.io/v1beta1\")"},
      {R"({"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"})", "request is missing"},
      {bad_containers.dump(), "the pod has no containers"},
  };
  for (const auto& [body, message] : cases) {
    auto [status, answer] = Post("/mutate", body);
    EXPECT_EQ(status, 400) << body.substr(0, 80);
    EXPECT_EQ(answer["error"], message);
  }
  auto [status, answer] = Post("/mutate", bad_env.dump());
  EXPECT_EQ(status, 400) << answer.dump();
  auto [fstatus, fanswer] = Post("/filter", R"({"pod": {}})");
  EXPECT_EQ(fstatus, 400);
  EXPECT_EQ(fanswer["error"], "ExtenderArgs has neither nodes nor nodenames");
  auto [bstatus, banswer] = Post("/bind", R"({"podName":"x","podNamespace":"ml/../../etc","podUID":"u","node":"n"})");
  EXPECT_EQ(bstatus, 400);
  EXPECT_EQ(banswer["error"], "podNamespace must be a DNS label (got \"ml/../../etc\")");
  auto health = hook_->Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

TEST_F(K8sServerTest, FilterKeepsTheNodesWhoseGpusHoldThePodWithAReasonForEachOther) {
  auto [status, result] = Post("/filter", Payload("extender-args.json").dump());
  ASSERT_EQ(status, 200) << result.dump();
  std::vector<std::string> kept;
  for (const json& n : result["nodes"]["items"]) kept.push_back(n["metadata"]["name"].get<std::string>());
  EXPECT_EQ(kept, (std::vector<std::string>{"gpu-a", "gpu-d"}));
  EXPECT_EQ(result["nodes"]["items"][0]["status"]["allocatable"]["cpu"], "63") << "nodes are echoed whole";
  EXPECT_EQ(result["failedNodes"]["gpu-b"],
            "no room for the vGPU: 0 of its GPUs have 10 TFLOPS and 8192 MiB VRAM free (needs 1); the most free: 5 "
            "TFLOPS, 80896 MiB VRAM");
  EXPECT_EQ(result["failedAndUnresolvableNodes"]["cpu-c"],
            "the node is not registered with the TensorFusion controller (no node agent)");

  // The same with nodenames (nodeCacheCapable: true).
  json args = Payload("extender-args.json");
  args["nodenames"] = {"gpu-a", "gpu-b"};
  args.erase("nodes");
  auto [s2, by_name] = Post("/filter", args.dump());
  EXPECT_EQ(by_name["nodenames"], json::parse(R"(["gpu-a"])"));
  EXPECT_TRUE(by_name["failedNodes"].contains("gpu-b"));
}

TEST_F(K8sServerTest, PrioritizeScoresByThePoolsPlacementMode) {
  // NodeCompactGPULowLoad (the default): the more loaded node that fits first.
  auto [status, list] = Post("/prioritize", Payload("extender-args.json").dump());
  ASSERT_EQ(status, 200) << list.dump();
  std::map<std::string, int> score;
  for (const json& h : list) score[h["host"].get<std::string>()] = h["score"].get<int>();
  EXPECT_EQ(score["gpu-d"], 10);
  EXPECT_EQ(score["gpu-a"], 1);
  EXPECT_EQ(score["gpu-b"], 0) << "no room";
  EXPECT_EQ(score["cpu-c"], 0) << "not a TensorFusion node";
  // LowLoadFirst: the emptier node first.
  auto set = ctl_->Put("/v1/pools/default", R"({"placement_mode":"LowLoadFirst"})", "application/json");
  ASSERT_TRUE(set && set->status == 200) << (set ? set->body : "no answer");
  auto [s2, spread] = Post("/prioritize", Payload("extender-args.json").dump());
  for (const json& h : spread) score[h["host"].get<std::string>()] = h["score"].get<int>();
  EXPECT_EQ(score["gpu-a"], 10);
  EXPECT_EQ(score["gpu-d"], 1);
}

TEST_F(K8sServerTest, BindReservesTheVgpuOnceAndBindsThePodWithItsAllocation) {
  json args = Payload("extender-args.json");
  api_->AddPod(args["pod"]);
  const size_t before = Allocations().size();
  auto [status, result] = Post("/bind", Payload("extender-binding-args.json").dump());
  ASSERT_EQ(status, 200);
  EXPECT_FALSE(result.contains("error")) << result.dump();
  ASSERT_EQ(api_->bindings().size(), 1u);
  const json binding = api_->bindings()[0];
  EXPECT_EQ(binding["kind"], "Binding");
  EXPECT_EQ(binding["target"], json::parse(R"({"apiVersion":"v1","kind":"Node","name":"gpu-a"})"));
  EXPECT_EQ(api_->authorization(), "Bearer kube-sa-token");
  json allocations = Allocations();
  ASSERT_EQ(allocations.size(), before + 1);
  json mine;
  for (const json& a : allocations)
    if (a["request_id"] == "pod-5e0b6c1d-93a2-4f0e-8d7b-2a6c4e1f0b37") mine = a;
  ASSERT_FALSE(mine.is_null()) << allocations.dump();
  EXPECT_EQ(mine["node"], "gpu-a");
  EXPECT_EQ(mine["tenant"], "ml");
  EXPECT_EQ(mine["qos"], "high");
  EXPECT_EQ(mine["vgpus"][0]["tflops"], 10.0);
  EXPECT_EQ(mine["vgpus"][0]["tflops_limit"], 20.0);
  EXPECT_EQ(binding["metadata"]["annotations"]["tensor-fusion.ai/allocation"], mine["id"]);
  EXPECT_EQ(binding["metadata"]["annotations"]["tensor-fusion.ai/gpu-ids"], mine["vgpus"][0]["gpu"]);
  EXPECT_EQ(api_->Pod("ml/train-0")["spec"]["nodeName"], "gpu-a");

  // kube-scheduler retries a bind whose answer it lost: the same allocation, no second one.
  auto [s2, again] = Post("/bind", Payload("extender-binding-args.json").dump());
  EXPECT_FALSE(again.contains("error")) << again.dump();
  EXPECT_EQ(Allocations().size(), before + 1);
  EXPECT_EQ(Gpu(mine["vgpus"][0]["gpu"])["used_tflops"], 10.0);

  // The calls made are exactly those listed for the webhook in the table next to the code, which
  // the chart's Role must grant (tests/deploy/test_rbac.py).
  std::set<std::string> made, listed;
  for (const auto& [method, path] : api_->requests()) made.insert(AccessOf(method, path));
  const json table = json::parse(ReadFile(TF_KUBE_API_ACCESS));
  for (const json& rule : table["components"]["webhook"]["rules"])
    for (const json& verb : rule["verbs"])
      listed.insert(rule["apiGroup"].get<std::string>() + "/" + rule["resource"].get<std::string>() + "/" +
                    verb.get<std::string>());
  EXPECT_EQ(made, listed);
}

TEST_F(K8sServerTest, AFailedBindingReleasesTheAllocation) {
  api_->AddPod(Payload("extender-args.json")["pod"]);
  api_->set_binding_status(500);
  const json before = Allocations();
  auto [status, result] = Post("/bind", Payload("extender-binding-args.json").dump());
  ASSERT_EQ(status, 200);
  const std::string error = result.value("error", "");
  EXPECT_NE(error.find("binding pod ml/train-0 to gpu-a failed: HTTP 500"), std::string::npos) << error;
  EXPECT_NE(error.find("released"), std::string::npos) << error;
  EXPECT_EQ(Allocations(), before) << "nothing is left reserved";
  EXPECT_EQ(Gpu("GPU-a0")["used_tflops"], 0.0);
  EXPECT_EQ(Gpu("GPU-a1")["used_tflops"], 0.0);
}

TEST_F(K8sServerTest, APodLargerThanThePoolIsRefusedEverywhereAndChangesNothing) {
  json args = Payload("extender-args.json");
  args["pod"]["metadata"]["annotations"]["tensor-fusion.ai/vgpu-request"] =
      R"({"gpu_count":1,"local":true,"qos":"high","tflops":10,"vram_mib":204800})";
  auto [status, result] = Post("/filter", args.dump());
  ASSERT_EQ(status, 200);
  EXPECT_TRUE(result["nodes"]["items"].empty()) << result.dump();
  EXPECT_NE(result["failedNodes"]["gpu-a"].get<std::string>().find("204800 MiB VRAM"), std::string::npos);
  api_->AddPod(args["pod"]);
  const json before = Allocations();
  auto [s2, bound] = Post("/bind", Payload("extender-binding-args.json").dump());
  EXPECT_NE(bound.value("error", "").find("controller refused the vGPU"), std::string::npos) << bound.dump();
  EXPECT_EQ(Allocations(), before);
  EXPECT_TRUE(api_->bindings().empty());
}

TEST_F(K8sServerTest, ARemotePodRunsOnAnyNodeAndLearnsItsWorker) {
  json args = Payload("extender-args.json");
  args["pod"]["metadata"]["annotations"]["tensor-fusion.ai/vgpu-request"] =
      R"({"gpu_count":1,"local":false,"qos":"medium","percent":50,"vram_mib":1024})";
  auto [status, result] = Post("/filter", args.dump());
  EXPECT_EQ(result["nodes"]["items"].size(), 4u) << result.dump();
  // gpu-d is the only node with a worker; make it the only one with room.
  auto fill = ctl_->Post("/v1/allocations", R"({"percent":60,"vram_mib":1024,"node":"gpu-a"})", "application/json");
  ASSERT_TRUE(fill && fill->status == 201);
  auto fill2 = ctl_->Post("/v1/allocations", R"({"percent":60,"vram_mib":1024,"node":"gpu-a"})", "application/json");
  ASSERT_TRUE(fill2 && fill2->status == 201);
  api_->AddPod(args["pod"]);
  json bind = Payload("extender-binding-args.json");
  bind["node"] = "cpu-c";
  auto [s2, bound] = Post("/bind", bind.dump());
  EXPECT_FALSE(bound.contains("error")) << bound.dump();
  ASSERT_EQ(api_->bindings().size(), 1u);
  EXPECT_EQ(api_->bindings()[0]["target"]["name"], "cpu-c");
  EXPECT_EQ(api_->bindings()[0]["metadata"]["annotations"]["tensor-fusion.ai/worker-address"], "10.0.0.4:7600");
  EXPECT_EQ(api_->bindings()[0]["metadata"]["annotations"]["tensor-fusion.ai/gpu-ids"], "GPU-d0");
}

}  // namespace

namespace {

// Runs `tfusion k8s` with `args` (and `env` before it) until it listens or exits; its port, or ""
// with its exit status and output in `why`.
struct Started {
  pid_t pid = -1;
  std::string port, log;
};
Started StartK8s(const std::string& dir, const std::string& name, const std::string& env, const std::string& args) {
  Started s;
  const std::string log = dir + "/" + name + ".log";
  s.pid = Spawn(env + " " + std::string(TF_TFUSION) + " k8s --listen 127.0.0.1 --port 0 --tls-cert " + dir +
                "/server.pem --tls-key " + dir + "/server.key --token-file " + dir + "/token " + args + " > " + log +
                " 2>&1");
  for (int i = 0; i < 300 && s.port.empty(); ++i) {
    std::smatch m;
    s.log = ReadFile(log);
    if (std::regex_search(s.log, m, std::regex("listening on https://127.0.0.1:([0-9]+)"))) s.port = m.str(1);
    int st = 0;
    if (s.port.empty() && waitpid(s.pid, &st, WNOHANG) == s.pid) {
      s.log = ReadFile(log) + " [exit " + std::to_string(WIFEXITED(st) ? WEXITSTATUS(st) : -1) + "]";
      s.pid = -1;
      return s;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return s;
}

void StopK8s(Started& s) {
  if (s.pid > 0) {
    kill(s.pid, SIGTERM);
    waitpid(s.pid, nullptr, 0);
  }
}

}  // namespace

// `tfusion k8s --controller https://...` verifies the controller against --ca-file (or
// TFUSION_CA_FILE), like every other client, and refuses a certificate of another CA.
TEST_F(K8sServerTest, AnHttpsControllerIsVerifiedAgainstTheCaFile) {
  const std::string d = dir_ + "/";
  pid_t tls_controller = Spawn(std::string(TF_TFUSION) + " controller --listen 127.0.0.1 --port 0 --store sqlite:" +
                               d + "tls-state.db --token-file " + d + "token --tls-cert " + d +
                               "server.pem --tls-key " + d + "server.key > " + d + "tls-controller.log 2>&1");
  const std::string port = WaitFor(d + "tls-controller.log", std::regex("listening on https://127.0.0.1:([0-9]+)"));
  ASSERT_FALSE(port.empty()) << ReadFile(d + "tls-controller.log");
  const std::string url = "https://127.0.0.1:" + port;
  const std::string kube = " --kube-api https://127.0.0.1:" + std::to_string(api_->port()) + " --kube-token-file " +
                           d + "kube-token --kube-ca-file " + d + "ca.pem";
  auto filter = [&](const Started& s) {
    httplib::Client c("https://127.0.0.1:" + s.port);
    c.set_ca_cert_path((d + "ca.pem").c_str());
    c.enable_server_certificate_verification(true);
    c.set_read_timeout(20, 0);
    auto r = c.Post("/filter", Payload("extender-args.json").dump(), "application/json");
    return r ? json::parse(r->body, nullptr, false) : json();
  };

  Started flag = StartK8s(dir_, "k8s-ca-flag", "", "--controller " + url + " --ca-file " + d + "ca.pem" + kube);
  ASSERT_FALSE(flag.port.empty()) << flag.log;
  json ok = filter(flag);
  EXPECT_FALSE(ok.contains("error")) << ok.dump();
  // That controller has no nodes: every node is reported as unknown to it, which it had to be asked.
  EXPECT_EQ(ok["failedAndUnresolvableNodes"]["gpu-a"], "the node is not registered with the TensorFusion controller (no node agent)")
      << ok.dump();
  StopK8s(flag);

  Started env = StartK8s(dir_, "k8s-ca-env", "env TFUSION_CA_FILE=" + d + "ca.pem", "--controller " + url + kube);
  ASSERT_FALSE(env.port.empty()) << env.log;
  EXPECT_FALSE(filter(env).contains("error")) << filter(env).dump();
  StopK8s(env);

  Started other = StartK8s(dir_, "k8s-ca-other", "", "--controller " + url + " --ca-file " + d + "other.pem" + kube);
  ASSERT_FALSE(other.port.empty()) << other.log;
  const std::string why = filter(other).value("error", "");
  EXPECT_NE(why.find("GET " + url + "/v1/"), std::string::npos) << why;
  EXPECT_NE(why.find("the server's TLS certificate was not accepted"), std::string::npos) << why;
  EXPECT_NE(why.find("the CA file " + d + "other.pem"), std::string::npos) << why;
  StopK8s(other);

  Started missing = StartK8s(dir_, "k8s-ca-missing", "", "--controller " + url + " --ca-file " + d + "nope.pem" + kube);
  EXPECT_TRUE(missing.port.empty());
  EXPECT_NE(missing.log.find(d + "nope.pem"), std::string::npos) << missing.log;
  EXPECT_NE(missing.log.find("[exit 2]"), std::string::npos) << missing.log;

  kill(tls_controller, SIGTERM);
  waitpid(tls_controller, nullptr, 0);
}

// The value a container's environment entry has once the kubelet made it: a fieldRef to an
// annotation reads the pod's (the Binding's) annotation, $(NAME) expands an earlier entry.
std::map<std::string, std::string> Resolved(const json& container, const json& annotations) {
  std::map<std::string, std::string> out;
  for (const json& e : container.at("env")) {
    std::string value;
    if (e.contains("valueFrom")) {
      const std::string path = e["valueFrom"]["fieldRef"]["fieldPath"];
      const std::string key = path.substr(std::string("metadata.annotations['").size());
      value = annotations.value(key.substr(0, key.size() - 2), "");
    } else {
      value = e["value"];
      for (const auto& [name, v] : out) {
        for (size_t at; (at = value.find("$(" + name + ")")) != std::string::npos;)
          value.replace(at, name.size() + 3, v);
      }
    }
    out[e["name"]] = value;
  }
  return out;
}

// With the workers' token (--worker-token-file) the extender mints each remote pod its own
// session ticket at bind, bound to the limits the webhook put in the pod's environment, its GPU and
// its allocation. End to end on a real worker (fake driver): the pod's program, with the
// environment the kubelet would give it, opens its session and gets its VRAM limit; the same
// program asking for more, or without its limits, is refused; no pod sees the workers' token.
TEST_F(K8sServerTest, ARemotePodGetsItsOwnTicketBoundToItsLimitsAndAllocation) {
  const std::string d = dir_ + "/";
  std::ofstream(d + "worker-token") << "workers-secret\n";
  const std::string fake = "TFUSION_SHM_DIR=" + d + "shm FAKECUDA_DEVICES=1 FAKECUDA_SHM_NAME=tf-k8s-" +
                           std::to_string(getpid()) + " ";
  pid_t worker = Spawn("env " + fake + TF_TFUSION + " worker --listen 127.0.0.1:0 --token-file " + d +
                       "worker-token --driver " + TF_FAKECUDA + " --nvml " + TF_FAKENVML + " --ready-file " + d +
                       "ready > " + d + "worker.log 2>&1");
  const std::string address = WaitFor(d + "ready", std::regex("tcp (127.0.0.1:[0-9]+)"));
  ASSERT_FALSE(address.empty()) << ReadFile(d + "worker.log");
  auto pool = ctl_->Post("/v1/pools", R"({"name":"remote"})", "application/json");
  ASSERT_TRUE(pool && pool->status == 201) << (pool ? pool->body : "no answer");
  const std::string uuid = "GPU-fa4ec0da-0000-4000-8000-000000000000";  // the fake's device 0
  Register(R"({"name":"gpu-w","pool":"remote","worker_address":")" + address + R"(","gpus":[{"uuid":")" + uuid +
           R"(","model":"H100-SXM","index":0,"tflops":100,"vram_mib":16384}]})");
  const std::string kube = " --kube-api https://127.0.0.1:" + std::to_string(api_->port()) + " --kube-token-file " +
                           d + "kube-token --kube-ca-file " + d + "ca.pem";
  Started both = StartK8s(dir_, "k8s-both", "", "--controller " + controller_url_ + " --worker-token-file " + d +
                          "worker-token --worker-token-secret shared" + kube);
  EXPECT_TRUE(both.port.empty());
  EXPECT_NE(both.log.find("not both"), std::string::npos) << both.log;
  Started missing = StartK8s(dir_, "k8s-no-token", "", "--controller " + controller_url_ + " --worker-token-file " +
                             d + "nope" + kube);
  EXPECT_NE(missing.log.find("cannot read the workers' token file " + d + "nope"), std::string::npos) << missing.log;
  EXPECT_NE(missing.log.find("[exit 2]"), std::string::npos) << missing.log;
  Started k = StartK8s(dir_, "k8s-tickets", "", "--controller " + controller_url_ + " --worker-token-file " + d +
                       "worker-token" + kube);
  ASSERT_FALSE(k.port.empty()) << k.log;
  httplib::Client hook("https://127.0.0.1:" + k.port);
  hook.set_ca_cert_path((d + "ca.pem").c_str());
  hook.enable_server_certificate_verification(true);
  hook.set_read_timeout(20, 0);

  // Admission: the ticket and the allocation come from the Binding's annotations.
  json review = Payload("admission-review-remote.json");
  json& meta = review["request"]["object"]["metadata"];
  meta["annotations"]["tensor-fusion.ai/vram-request"] = "64Mi";
  meta["annotations"]["tensor-fusion.ai/gpupool"] = "remote";
  auto mutated = hook.Post("/mutate", review.dump(), "application/json");
  ASSERT_TRUE(mutated && mutated->status == 200);
  ASSERT_EQ(json::parse(mutated->body)["response"]["allowed"], true) << mutated->body;
  json pod = Patched(review["request"]["object"], json::parse(mutated->body)["response"]);
  const json& c = pod["spec"]["containers"][0];
  EXPECT_EQ(EnvNamed(c, "TFUSION_TOKEN")["valueFrom"]["fieldRef"]["fieldPath"],
            "metadata.annotations['tensor-fusion.ai/session-ticket']");
  EXPECT_EQ(EnvNamed(c, "TFUSION_REMOTE_ALLOCATION")["valueFrom"]["fieldRef"]["fieldPath"],
            "metadata.annotations['tensor-fusion.ai/allocation']");
  EXPECT_EQ(pod.dump().find("secretKeyRef"), std::string::npos) << "no shared credential";

  // Bind: the extender places the vGPU on gpu-w and puts the pod's ticket on the Binding.
  pod["metadata"]["uid"] = "7c1d2e3f-4a5b-4c6d-8e7f-901a2b3c4d5e";
  api_->AddPod(pod);
  json bind = {{"podName", "infer"}, {"podNamespace", "serving"}, {"podUID", pod["metadata"]["uid"]}, {"node", "cpu-c"}};
  auto bound = hook.Post("/bind", bind.dump(), "application/json");
  ASSERT_TRUE(bound && bound->status == 200);
  EXPECT_FALSE(json::parse(bound->body).contains("error")) << bound->body;
  ASSERT_EQ(api_->bindings().size(), 1u);
  const json annotations = api_->bindings()[0]["metadata"]["annotations"];
  EXPECT_EQ(annotations["tensor-fusion.ai/gpu-ids"], uuid);
  EXPECT_EQ(annotations["tensor-fusion.ai/worker-address"], address);
  const std::string ticket = annotations.value("tensor-fusion.ai/session-ticket", "");
  EXPECT_EQ(ticket.rfind("tkt2.", 0), 0u) << ticket;
  EXPECT_EQ(ticket.find("workers-secret"), std::string::npos);

  // The pod's program, with the environment the kubelet resolves, through the client stub.
  std::string env = fake + "LD_LIBRARY_PATH=" + std::string(TF_TFUSION).substr(0, std::string(TF_TFUSION).rfind('/')) +
                    "/../client/inject ";
  for (const auto& [name, value] : Resolved(c, annotations)) {
    if (name != "LD_PRELOAD") env += name + "='" + value + "' ";
  }
  auto probe = [&](const std::string& extra, const std::string& mode) {
    Sh("env " + env + extra + " timeout 60 " + TF_REMOTE_PROBE + " " + mode + " > " + d + "probe.out 2>&1");
    return ReadFile(d + "probe.out");
  };
  const std::string own = probe("", "fill");
  EXPECT_NE(own.find("fill_total_mib=64\n"), std::string::npos) << own << ReadFile(d + "worker.log");
  for (const std::string& extra : {std::string("TFUSION_REMOTE_VRAM=16GiB"), std::string("TFUSION_REMOTE_ALLOCATION=")}) {
    const std::string out = probe(extra, "init");
    EXPECT_EQ(out.find("init=0\n"), std::string::npos) << extra << ": " << out;
    EXPECT_NE(out.find("not those its session ticket was made for"), std::string::npos) << extra << ": " << out;
  }
  EXPECT_NE(ReadFile(d + "worker.log").find("allocation " + annotations.value("tensor-fusion.ai/allocation", "?")),
            std::string::npos)
      << "the session was bound to the pod's allocation: " << ReadFile(d + "worker.log");
  StopK8s(k);
  kill(worker, SIGTERM);
  waitpid(worker, nullptr, 0);
  Sh("rm -f /dev/shm/tf-k8s-" + std::to_string(getpid()) + "*");
}

// The Kubernetes API flags, now read by the controller's client: https only, in-cluster by default.
TEST_F(K8sServerTest, BadKubernetesApiFlagsStopItAtStart) {
  const std::string d = dir_ + "/";
  struct Case {
    std::string env, args, message;
  } cases[] = {
      {"", "--kube-api http://127.0.0.1:8001", "--kube-api http://127.0.0.1:8001: must be an https:// URL"},
      {"", "--kube-api ftp://x", "--kube-api 'ftp://x' is not an http(s)://HOST[:PORT] URL or in-cluster"},
      {"env -u KUBERNETES_SERVICE_HOST", "", "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set"},
      {"", "--kube-api https://127.0.0.1:6443 --kube-ca-file " + d + "nope.pem", "--kube-ca-file: cannot read " + d + "nope.pem"},
      {"", "--kube-api https://127.0.0.1:6443 --kube-ca-file " + d + "ca.pem --kube-token-file " + d + "nope",
       "--kube-token-file: cannot read a token from " + d + "nope"},
  };
  for (const Case& c : cases) {
    Started s = StartK8s(dir_, "k8s-bad", c.env, "--controller " + controller_url_ + " " + c.args);
    EXPECT_TRUE(s.port.empty()) << c.args;
    StopK8s(s);
    EXPECT_NE(s.log.find(c.message), std::string::npos) << c.args << ": " << s.log;
    EXPECT_NE(s.log.find("[exit 2]"), std::string::npos) << s.log;
  }
}
