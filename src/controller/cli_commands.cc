#include "controller/cli_commands.h"

#include <httplib.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <climits>
#include <cstdlib>
#include <ctime>
#include <sstream>
#include <thread>

#include "controller/api_server.h"
#include "controller/etcd_store.h"
#include "controller/http_client.h"
#include "controller/k8s_reconciler.h"
#include "controller/replica.h"
#include "controller/self_signed_ca.h"
#include "controller/sqlite_store.h"
#include "controller/usage_history.h"
#include "controller/tls_files.h"
#include "hypervisor/mps.h"
#include "hypervisor/node_agent.h"
#include "hypervisor/nvml_gpu_source.h"

namespace tf::controller {

// Control characters (an escape sequence a node or tenant wrote, a newline that breaks the table)
// and UTF-8 C1 controls become '?'. Stored values are checked as they come in; this also covers
// what a store written before that holds.
std::string PrintableCell(const std::string& cell) {
  std::string out = cell;
  for (size_t i = 0; i < out.size(); ++i) {
    const auto c = static_cast<unsigned char>(out[i]);
    if (c < 0x20 || c == 0x7f) {
      out[i] = '?';
    } else if (c == 0xc2 && i + 1 < out.size() && static_cast<unsigned char>(out[i + 1]) >= 0x80 &&
               static_cast<unsigned char>(out[i + 1]) <= 0x9f) {
      out.replace(i, 2, "?");
    }
  }
  return out;
}

namespace {

using nlohmann::json;

std::atomic<bool> g_stop{false};

void OnSignal(int) { g_stop.store(true); }

void InstallSignalHandlers() {
  g_stop.store(false);
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

void SleepUntilStop(int ms) {
  for (int waited = 0; waited < ms && !g_stop.load(); waited += 50)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

StatusOr<std::string> ResolveToken(const std::string& token, const std::string& file) {
  if (!token.empty()) return token;
  if (file.empty()) return InvalidArgument("a bearer token is required (--token or --token-file)");
  std::ifstream in(file);
  std::string t;
  if (!in || !std::getline(in, t) || t.empty()) return InvalidArgument("cannot read a token from " + file);
  return t;
}

std::string NewToken() {
  std::random_device rd;
  std::ostringstream o;
  for (int i = 0; i < 8; ++i) o << std::hex << std::setw(8) << std::setfill('0') << rd();
  return o.str();
}

// Checks the server's TLS files (when given) before anything is opened; prints what is served.
Status CheckTlsAtStart(const ServerTlsFiles& tls, const char* who) {
  if (!tls.enabled()) return Status::Ok();
  StatusOr<std::string> cert = CheckServerTls(tls, static_cast<int64_t>(std::time(nullptr)));
  if (!cert.ok()) return cert.status();
  std::fprintf(stderr, "%s: TLS certificate %s (%s)\n", who, tls.cert_file.c_str(), cert->c_str());
  return Status::Ok();
}

// A plain-HTTP API reachable from the network: say that tokens cross it in clear.
// A plaintext API off loopback carries bearer tokens in clear: refused unless --insecure-listen
// allows it, and then still warned about at every start.
Status CheckPlaintextListen(const std::string& host, bool tls, bool insecure_listen, const char* who) {
  if (tls || IsLoopbackHost(host)) return Status::Ok();
  if (!insecure_listen) {
    return FailedPrecondition(std::string(who) + ": refusing to serve the API on " + host +
                              " without TLS: bearer tokens (and everything else) would cross the network in "
                              "clear. Serve HTTPS with --tls-cert/--tls-key (tfusion up: --tls), listen on "
                              "127.0.0.1, or pass --insecure-listen to allow plaintext on a trusted network");
  }
  std::fprintf(stderr,
               "%s: WARNING: the API listens on %s without TLS (--insecure-listen): bearer tokens (and everything "
               "else) cross the network in clear\n",
               who, host.c_str());
  return Status::Ok();
}

// The URL this machine reaches an API listening on `host` by (a wildcard address: loopback).
std::string LocalUrl(const std::string& host, int port, bool tls) {
  std::string h = host.empty() || host == "0.0.0.0" ? "127.0.0.1" : host == "::" ? "::1" : host;
  if (h.find(':') != std::string::npos) h = "[" + h + "]";
  return std::string(tls ? "https://" : "http://") + h + ":" + std::to_string(port);
}

std::string DefaultIdentity() {
  char host[128] = {};
  gethostname(host, sizeof host - 1);
  return std::string(host) + ":" + std::to_string(getpid());
}

// A running controller: store, election, state machine, API and the replica loop.
struct ControllerRuntime {
  std::unique_ptr<Store> store;
  std::unique_ptr<LeaderElection> election;
  SystemClock clock;
  std::unique_ptr<Controller> controller;
  std::unique_ptr<ApiServer> api;
  std::unique_ptr<ReplicaLoop> loop;
  std::unique_ptr<UsageHistory> history;
  std::unique_ptr<UsageSampler> sampler;
  std::unique_ptr<KubeReconciler> kube;
  int port = 0;

  Status Start(const ControllerOptions& o, const std::string& token) {
    std::optional<KubeReconcilerOptions> kube_options;
    if (!o.kube_api.empty()) {
      StatusOr<KubeApiConfig> api = ResolveKubeApiConfig(o.kube_api, o.kube_token_file, o.kube_ca_file);
      if (!api.ok()) return api.status();
      kube_options.emplace();
      kube_options->api = *api;
      kube_options->resync_ms = o.kube_resync_seconds * 1000;
    }
    StatusOr<std::unique_ptr<Store>> s = OpenStore(o.store, o.durability);
    if (!s.ok()) return s.status();
    store = std::move(s).value();
    StatusOr<std::unique_ptr<LeaderElection>> e =
        MakeLeaderElection(store.get(), o.identity.empty() ? DefaultIdentity() : o.identity,
                           o.leader_ttl_seconds);
    if (!e.ok()) return e.status();
    election = std::move(e).value();
    ControllerConfig cfg;
    cfg.heartbeat_timeout_ms = o.heartbeat_timeout_ms;
    cfg.lost_grace_ms = o.lost_grace_ms;
    controller = std::make_unique<Controller>(store.get(), &clock, MakeSchedulerPlacement(),
                                              election.get(), cfg);
    loop = std::make_unique<ReplicaLoop>(controller.get(), election.get(), 500);
    loop->RunOnce();  // lead (and rebuild) before the first request when nobody else leads
    api = std::make_unique<ApiServer>(controller.get(), token, ServerTlsFiles{o.tls_cert, o.tls_key});
    history = std::make_unique<UsageHistory>(int64_t{o.history_interval_seconds} * 1000, kUsageHistoryRetentionMs);
    sampler = std::make_unique<UsageSampler>(controller.get(), history.get(), &clock);
    api->SetUsageHistory(history.get());
    if (auto* etcd = dynamic_cast<EtcdLeaderElection*>(election.get())) {
      api->SetLeaderLookup([etcd] {
        StatusOr<std::string> leader = etcd->CurrentLeader();
        return leader.ok() ? *leader : std::string();
      });
    } else if (auto* lock = dynamic_cast<SqliteLeaderLock*>(election.get())) {
      api->SetLeaderLookup([lock] { return lock->CurrentLeader(); });
    }
    StatusOr<int> p = api->Bind(o.listen_host, o.port);
    if (!p.ok()) return p.status();
    port = *p;
    api->Start();
    loop->Start();
    sampler->Start();
    if (kube_options) {
      kube = std::make_unique<KubeReconciler>(controller.get(), &clock, *kube_options);
      kube->Start();
      std::fprintf(stderr, "controller: reconciling Kubernetes objects with %s while this replica leads\n",
                   kube_options->api.url.c_str());
    }
    return Status::Ok();
  }
  void Stop() {
    if (kube) kube->Stop();
    if (sampler) sampler->Stop();
    if (loop) loop->Stop();
    if (api) api->Stop();
    if (election) election->Resign();
  }
};

// The node agent with its metrics endpoint and heartbeat loop, until g_stop.
int AgentLoop(const HypervisorOptions& o, const std::string& token) {
  hypervisor::NvmlGpuSource source(o.nvml_library);
  hypervisor::QuotaRegions regions(o.region_dir);
  SystemClock clock;
  hypervisor::NodeAgentOptions ao{o.controller_url, token, o.node_name, o.pool, "", "",
                                  int64_t{o.stop_grace_seconds} * 1000, o.worker_address, o.credential_file};
  ao.ca_file = o.ca_file;
  ao.host_tier_budget_bytes = o.host_tier_budget_bytes;
  ao.disk_tier_dir = o.disk_tier_dir;
  if (!o.catalog_overrides_file.empty()) {
    std::ifstream in(o.catalog_overrides_file);
    if (!in) {
      std::fprintf(stderr, "hypervisor: cannot read %s\n", o.catalog_overrides_file.c_str());
      return 2;
    }
    std::stringstream ss;
    ss << in.rdbuf();
    ao.catalog_overrides = ss.str();
  }
  httplib::Server metrics;
  metrics.set_socket_options(ExclusiveListenSocket);
  std::thread metrics_thread;
  if (o.metrics_port >= 0) {
    int port = o.metrics_port == 0 ? metrics.bind_to_any_port(o.metrics_host)
                                   : (metrics.bind_to_port(o.metrics_host, o.metrics_port) ? o.metrics_port : -1);
    if (port <= 0) {
      std::fprintf(stderr, "hypervisor: cannot listen for metrics on %s:%d: the port is in use (another agent?)\n",
                   o.metrics_host.c_str(), o.metrics_port);
      return 1;
    }
    ao.address = o.metrics_host + ":" + std::to_string(port);
    std::fprintf(stderr, "hypervisor: metrics at http://%s/metrics\n", ao.address.c_str());
  }
  if (!o.mps_pipe_dir.empty()) {
    // Tenants started on this machine (tfusion run) find the operator's MPS daemon here. Published
    // once the metrics port is ours, so that a second agent that fails to start leaves it alone.
    if (Status mps = hypervisor::PublishMpsPipeDirectory(regions.dir(), o.mps_pipe_dir); !mps.ok()) {
      std::fprintf(stderr, "hypervisor: %s\n", mps.ToString().c_str());
      return 2;
    }
    std::fprintf(stderr, "hypervisor: MPS: tenants run under the MPS daemon of %s\n", o.mps_pipe_dir.c_str());
  }
  struct WithdrawMps {
    const hypervisor::QuotaRegions& regions;
    bool published;
    ~WithdrawMps() {
      if (published) hypervisor::WithdrawMpsPipeDirectory(regions.dir());
    }
  } withdraw_mps{regions, !o.mps_pipe_dir.empty()};
  hypervisor::NodeAgent agent(ao, &source, &regions, &clock);
  if (o.metrics_port >= 0) {
    metrics.Get("/metrics", [&agent](const httplib::Request&, httplib::Response& res) {
      res.set_content(agent.MetricsText(), "text/plain; version=0.0.4");
    });
    metrics_thread = std::thread([&metrics] { metrics.listen_after_bind(); });
  }
  Status st = agent.Start();
  while (!st.ok() && !g_stop.load()) {
    // A refused token or controller certificate, or a registration the controller refuses as
    // such (a bad node name: 400; a node token for another node: 403), will not get better by
    // retrying.
    const bool final = st.code() == StatusCode::kUnauthenticated || st.code() == StatusCode::kInvalidArgument ||
                       st.code() == StatusCode::kPermissionDenied;
    std::fprintf(stderr, "hypervisor: %s%s\n", st.ToString().c_str(), final ? "" : " (retrying)");
    if (final) break;
    SleepUntilStop(2000);
    st = agent.Start();
  }
  if (st.ok()) {
    std::fprintf(stderr, "hypervisor: node %s registered with %s (%zu GPU(s)%s%s)\n",
                 agent.node_name().c_str(), o.controller_url.c_str(), agent.gpus().size(),
                 agent.discovery_message().empty() ? "" : ": ", agent.discovery_message().c_str());
  }
  int rc = st.ok() ? 0 : 1;
  // vGPU limits follow allocations within sync_interval_ms; heartbeats every heartbeat_interval_ms.
  const int tick_ms = std::max(50, std::min(o.sync_interval_ms, o.heartbeat_interval_ms));
  int64_t since_heartbeat_ms = 0;
  std::string last_sync_error;
  while (st.ok() && !g_stop.load()) {
    Status sync = agent.SyncAllocations();
    if (!sync.ok() && sync.ToString() != last_sync_error)
      std::fprintf(stderr, "hypervisor: syncing vGPUs: %s\n", sync.ToString().c_str());
    last_sync_error = sync.ok() ? "" : sync.ToString();
    SleepUntilStop(tick_ms);
    if (g_stop.load()) break;
    since_heartbeat_ms += tick_ms;
    if (since_heartbeat_ms < o.heartbeat_interval_ms) continue;
    since_heartbeat_ms = 0;
    Status hb = agent.HeartbeatOnce();
    if (!hb.ok()) std::fprintf(stderr, "hypervisor: %s\n", hb.ToString().c_str());
  }
  regions.DetachAll();
  if (metrics_thread.joinable()) {
    metrics.stop();
    metrics_thread.join();
  }
  return rc;
}

// ---- client helpers ----

std::ostream& Out(const ClientOptions& c) { return c.out ? *c.out : std::cout; }

// The client's token and where it came from (for the message of a 401).
StatusOr<std::string> ClientToken(const ClientOptions& c, std::string* source) {
  if (!c.token.empty()) {
    *source = "--token or TFUSION_TOKEN";
    return c.token;
  }
  std::string file = c.token_file;
  if (file.empty() && access(".tfusion/token", R_OK) == 0) file = ".tfusion/token";
  if (file.empty()) {
    *source = "nowhere: no --token, TFUSION_TOKEN, --token-file or .tfusion/token here";
    return std::string();
  }
  *source = "the file " + file;
  std::ifstream in(file);
  std::string t;
  if (!in || !std::getline(in, t) || t.empty()) return InvalidArgument("cannot read a token from " + file);
  return t;
}

StatusOr<json> Call(const ClientOptions& c, const std::string& method, const std::string& path,
                    const std::string& body = "") {
  std::string source;
  StatusOr<std::string> token = ClientToken(c, &source);
  if (!token.ok()) return token.status();
  // A comma list of replicas: the one that serves answers. A write goes to another replica only when
  // the first did not take it (ReplicaClient's writes_once).
  ReplicaClient client(c.url, *token, 5000, c.ca_file, /*writes_once=*/true);
  StatusOr<HttpResponse> r = method == "GET"    ? client.Get(path)
                             : method == "POST" ? client.PostOnce(path, body)
                             : method == "PUT"  ? client.Put(path, body)
                             : method == "PATCH" ? client.Patch(path, body)
                                                : client.Delete(path);
  if (!r.ok()) return r.status();
  json j = json::parse(r->body, nullptr, false);
  if (r->status >= 300) {
    std::string msg = (!j.is_discarded() && j.contains("error")) ? j["error"].value("message", r->body) : r->body;
    StatusCode code = r->status == 400   ? StatusCode::kInvalidArgument
                      : r->status == 401 ? StatusCode::kUnauthenticated
                      : r->status == 404 ? StatusCode::kNotFound
                      : r->status == 409 ? StatusCode::kFailedPrecondition
                                         : StatusCode::kUnavailable;
    if (r->status == 401) {
      msg += " (the token came from " + source + "; `tfusion up` writes it to .tfusion/token in the folder it "
             "was started from: pass --token-file, --token or TFUSION_TOKEN)";
    }
    return Status(code, "HTTP " + std::to_string(r->status) + ": " + msg);
  }
  if (j.is_discarded()) return Internal("the controller answered something that is not JSON");
  return j;
}

// A whole list, fetched in pages of 1,000 (the API's `limit` / `after` / `next`): {field: [...]}.
StatusOr<json> CallList(const ClientOptions& c, const std::string& path, const char* field) {
  json all = json::array();
  std::string after;
  for (int page = 0; page < 100000; ++page) {
    std::string url = path + (path.find('?') == std::string::npos ? "?" : "&") + "limit=1000";
    if (!after.empty()) url += "&after=" + after;  // keys are [A-Za-z0-9._:-]: nothing to escape
    StatusOr<json> r = Call(c, "GET", url);
    if (!r.ok()) return r.status();
    if (!r->contains(field) || !(*r)[field].is_array()) return Internal(std::string("the answer has no '") + field + "' list");
    for (json& item : (*r)[field]) all.push_back(std::move(item));
    if (!r->contains("next")) break;
    after = (*r)["next"].get<std::string>();
  }
  return json{{field, std::move(all)}};
}

int Fail(const Status& s) {
  std::fprintf(stderr, "error: %s\n", s.message().c_str());
  return 1;
}

// A name the user typed that goes into a URL path: checked here, so "a/b" is not a route.
// Returns 0 when valid, else prints why and returns the exit code of a usage error.
int CheckName(const char* what, const std::string& name) {
  Status st = ValidateName(what, name);
  if (st.ok()) return 0;
  Fail(st);
  return 2;
}

// Prints rows as left-aligned columns sized to their widest cell.
void PrintTable(std::ostream& out, const std::vector<std::vector<std::string>>& table) {
  std::vector<std::vector<std::string>> rows = table;
  for (auto& r : rows)
    for (std::string& cell : r) cell = PrintableCell(cell);
  std::vector<size_t> w;
  for (const auto& r : rows)
    for (size_t i = 0; i < r.size(); ++i) {
      if (w.size() <= i) w.push_back(0);
      w[i] = std::max(w[i], r[i].size());
    }
  for (const auto& r : rows) {
    std::string line;
    for (size_t i = 0; i < r.size(); ++i) {
      line += r[i];
      if (i + 1 < r.size()) line += std::string(w[i] - r[i].size() + 2, ' ');
    }
    out << line << "\n";
  }
}

std::string Fixed(double v, int digits = 1) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(digits) << v;
  return o.str();
}

}  // namespace

void RequestShutdown() { g_stop.store(true); }

int RunController(const ControllerOptions& o) {
  StatusOr<std::string> token = ResolveToken(o.token, o.token_file);
  if (!token.ok()) {
    Fail(token.status());
    return 2;
  }
  if (StatusOr<SqliteDurability> d = ParseSqliteDurability(o.durability); !d.ok()) return Fail(d.status()), 2;
  if (Status tls = CheckTlsAtStart({o.tls_cert, o.tls_key}, "controller"); !tls.ok()) return Fail(tls), 2;
  if (Status plain = CheckPlaintextListen(o.listen_host, !o.tls_cert.empty(), o.insecure_listen, "controller");
      !plain.ok())
    return Fail(plain), 2;
  if (!o.kube_api.empty()) {
    StatusOr<KubeApiConfig> api = ResolveKubeApiConfig(o.kube_api, o.kube_token_file, o.kube_ca_file);
    if (!api.ok()) return Fail(api.status()), 2;
  }
  InstallSignalHandlers();
  ControllerRuntime rt;
  Status st = rt.Start(o, *token);
  if (!st.ok()) {
    rt.Stop();
    return Fail(st);
  }
  const bool sqlite = rt.store->Describe().rfind("sqlite:", 0) == 0;
  std::printf("tfusion controller listening on %s://%s:%d (store %s%s%s, %s)\n", rt.api->tls() ? "https" : "http",
              o.listen_host.c_str(),
              rt.port, rt.store->Describe().c_str(), sqlite ? ", durability " : "",
              sqlite ? o.durability.c_str() : "", rt.controller->Serving() ? "leader" : "standby");
  std::fflush(stdout);
  while (!g_stop.load()) SleepUntilStop(1000);
  rt.Stop();
  return 0;
}

namespace {
// --disk-tier: a folder this user can write (where the node's tenants keep swapped VRAM on disk).
Status CheckDiskTierDir(const std::string& dir) {
  struct stat st;
  if (dir.empty()) return Status::Ok();
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || access(dir.c_str(), W_OK) != 0)
    return InvalidArgument("--disk-tier " + dir + ": not a folder this user can write");
  return Status::Ok();
}
}  // namespace

int RunHypervisor(const HypervisorOptions& o) {
  if (Status st = CheckDiskTierDir(o.disk_tier_dir); !st.ok()) return Fail(st), 2;
  StatusOr<std::string> token = ResolveToken(o.token, o.token_file);
  if (!token.ok()) {
    Fail(token.status());
    return 2;
  }
  if (!o.worker_address.empty()) {
    Status st = ValidateWorkerAddress(o.worker_address);
    if (!st.ok()) return Fail(st), 2;
  }
  if (!o.ca_file.empty()) {
    if (Status ca = CheckCaFile(o.ca_file); !ca.ok()) return Fail(ca), 2;
  }
  if (!o.mps_pipe_dir.empty()) {
    if (Status mps = hypervisor::CheckMpsPipeDirectory("--mps-pipe-dir", o.mps_pipe_dir); !mps.ok()) return Fail(mps), 2;
  }
  InstallSignalHandlers();
  return AgentLoop(o, *token);
}

int RunUp(const UpOptions& o) {
  if (Status st = CheckDiskTierDir(o.disk_tier_dir); !st.ok()) return Fail(st), 2;
  if (StatusOr<SqliteDurability> d = ParseSqliteDurability(o.durability); !d.ok()) return Fail(d.status()), 2;
  const ServerTlsFiles own_tls{o.tls_cert, o.tls_key};
  if (o.tls && own_tls.enabled())
    return Fail(InvalidArgument("--tls makes its own certificate: give either --tls or --tls-cert/--tls-key")), 2;
  if (!o.tls && !o.tls_names.empty()) return Fail(InvalidArgument("--tls-name needs --tls")), 2;
  if (Status tls = CheckTlsAtStart(own_tls, "tfusion up"); !tls.ok()) return Fail(tls), 2;
  if (Status plain = CheckPlaintextListen(o.listen_host, o.tls || own_tls.enabled(), o.insecure_listen, "tfusion up");
      !plain.ok())
    return Fail(plain), 2;
  if (!o.ca_file.empty()) {
    if (Status ca = CheckCaFile(o.ca_file); !ca.ok()) return Fail(ca), 2;
  }
  if (!o.mps_pipe_dir.empty()) {
    if (Status mps = hypervisor::CheckMpsPipeDirectory("--mps-pipe-dir", o.mps_pipe_dir); !mps.ok()) return Fail(mps), 2;
  }
  ::mkdir(o.state_dir.c_str(), 0700);
  ControllerOptions co;
  co.listen_host = o.listen_host;
  co.port = o.port;
  co.store = "sqlite:" + o.state_dir + "/state.db";
  co.durability = o.durability;
  co.tls_cert = o.tls_cert;
  co.tls_key = o.tls_key;
  co.insecure_listen = o.insecure_listen;
  std::string ca_file = o.ca_file;
  std::string ca_line;
  if (o.tls) {
    std::vector<std::string> names = ServerNamesFor(o.listen_host);
    for (const std::string& n : o.tls_names)
      if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
    StatusOr<SelfSignedTls> made =
        EnsureSelfSignedTls(o.state_dir + "/tls", names, static_cast<int64_t>(std::time(nullptr)));
    if (!made.ok()) return Fail(made.status());
    co.tls_cert = made->cert_file;
    co.tls_key = made->key_file;
    char abs[PATH_MAX];
    ca_file = ::realpath(made->ca_file.c_str(), abs) ? std::string(abs) : made->ca_file;
    std::string names_text;
    for (const std::string& n : names) names_text += (names_text.empty() ? "" : ", ") + n;
    std::fprintf(stderr, "tfusion up: TLS: %s CA %s; %s server certificate for %s\n",
                 made->ca_created ? "made the" : "using the", ca_file.c_str(),
                 made->cert_issued ? "issued a" : "kept the", names_text.c_str());
    ca_line = "  ca:         " + ca_file + " (clients: --ca-file or TFUSION_CA_FILE)\n";
  }
  std::string token = o.token;
  const std::string token_path = o.state_dir + "/token";
  if (token.empty()) {
    std::ifstream in(token_path);
    std::getline(in, token);
  }
  if (token.empty()) {
    token = NewToken();
    std::ofstream out(token_path);
    out << token << "\n";
    ::chmod(token_path.c_str(), 0600);
  }
  InstallSignalHandlers();
  co.history_interval_seconds = o.history_interval_seconds;
  ControllerRuntime rt;
  Status st = rt.Start(co, token);
  if (!st.ok()) {
    rt.Stop();
    return Fail(st);
  }
  if (!rt.controller->Serving()) {
    rt.Stop();
    return Fail(FailedPrecondition("another controller already uses " + co.store));
  }
  const std::string url = LocalUrl(o.listen_host, rt.port, rt.api->tls());
  std::printf("tfusion is up\n  controller: %s\n  console:    %s/console/\n%s  token:      %s (saved in %s)\n"
              "  store:      %s (durability %s)\n",
              url.c_str(), url.c_str(), ca_line.c_str(), token.c_str(), token_path.c_str(), rt.store->Describe().c_str(),
              o.durability.c_str());
  std::fflush(stdout);
  HypervisorOptions ho;
  ho.controller_url = url;
  ho.ca_file = ca_file;
  ho.metrics_host = o.listen_host;
  ho.metrics_port = o.metrics_port;
  ho.nvml_library = o.nvml_library;
  ho.region_dir = o.region_dir;
  ho.credential_file = o.state_dir + "/node-credential";
  ho.stop_grace_seconds = o.stop_grace_seconds;
  ho.mps_pipe_dir = o.mps_pipe_dir;
  ho.host_tier_budget_bytes = o.host_tier_budget_bytes;
  ho.disk_tier_dir = o.disk_tier_dir;
  int rc = AgentLoop(ho, token);
  if (rc != 0 && !g_stop.load()) {
    // `up` is the controller and this machine's agent: a controller alone, saying it is up, would
    // serve no GPU of this machine and not say why.
    std::fprintf(stderr, "tfusion up: this machine's node agent did not start (above): stopping\n");
  }
  rt.Stop();
  return rc;
}

int PoolList(const ClientOptions& c) {
  StatusOr<json> pools = CallList(c, "/v1/pools", "pools");
  if (!pools.ok()) return Fail(pools.status());
  StatusOr<json> gpus = CallList(c, "/v1/gpus", "gpus");
  if (!gpus.ok()) return Fail(gpus.status());
  std::vector<std::vector<std::string>> rows{
      {"POOL", "MODE", "OVERSELL", "VRAM+HOST%", "VRAM+DISK%", "GPUS", "TFLOPS", "ALLOC_TFLOPS", "VRAM_MIB",
       "ALLOC_VRAM_MIB", "SCHED_VRAM_MIB"}};
  for (const json& p : (*pools)["pools"]) {
    std::string name = p.value("name", "");
    int n = 0;
    double t = 0, ut = 0;
    int64_t v = 0, uv = 0, sv = 0;
    for (const json& g : (*gpus)["gpus"]) {
      if (g.value("pool", "") != name) continue;
      ++n;
      t += g.value("tflops", 0.0);
      ut += g.value("used_tflops", 0.0);
      v += g.value("vram_mib", int64_t{0});
      uv += g.value("used_vram_mib", int64_t{0});
      // What placement counts: VRAM plus the expansion the nodes' tier budgets allow.
      sv += g.value("schedulable_vram_mib", g.value("vram_mib", int64_t{0}));
    }
    rows.push_back({name, p.value("placement_mode", ""), Fixed(p.value("tflops_oversell_ratio", 1.0), 2),
                    std::to_string(p.value("vram_expand_to_host_percent", 0)),
                    std::to_string(p.value("vram_expand_to_disk_percent", 0)), std::to_string(n), Fixed(t), Fixed(ut), std::to_string(v), std::to_string(uv),
                    std::to_string(sv)});
  }
  PrintTable(Out(c), rows);
  return 0;
}

int PoolCreate(const ClientOptions& c, const PoolSettings& pool) {
  if (int rc = CheckName("pool name", pool.name)) return rc;
  json body = {{"name", pool.name}};
  if (pool.placement_mode) body["placement_mode"] = *pool.placement_mode;
  if (pool.tflops_oversell_ratio) body["tflops_oversell_ratio"] = *pool.tflops_oversell_ratio;
  if (pool.vram_expand_to_host_percent) body["vram_expand_to_host_percent"] = *pool.vram_expand_to_host_percent;
  if (pool.vram_expand_to_disk_percent) body["vram_expand_to_disk_percent"] = *pool.vram_expand_to_disk_percent;
  StatusOr<json> r = Call(c, "POST", "/v1/pools", body.dump());
  if (!r.ok()) return Fail(r.status());
  Out(c) << "pool " << pool.name << " created: placement mode " << r->value("placement_mode", "")
         << ", TFLOPS oversell ratio " << r->value("tflops_oversell_ratio", 1.0) << ", VRAM expanded "
         << r->value("vram_expand_to_host_percent", 0) << "% into host memory and "
         << r->value("vram_expand_to_disk_percent", 0) << "% onto disk\n";
  return 0;
}

int PoolSet(const ClientOptions& c, const PoolSettings& pool) {
  if (int rc = CheckName("pool name", pool.name)) return rc;
  if (!pool.placement_mode && !pool.tflops_oversell_ratio && !pool.vram_expand_to_host_percent &&
      !pool.vram_expand_to_disk_percent)
    return Fail(InvalidArgument("nothing to change: give --mode, --oversell, --vram-expand-host or --vram-expand-disk")), 2;
  json body = json::object();  // what is not given keeps its value (PATCH)
  if (pool.placement_mode) body["placement_mode"] = *pool.placement_mode;
  if (pool.tflops_oversell_ratio) body["tflops_oversell_ratio"] = *pool.tflops_oversell_ratio;
  if (pool.vram_expand_to_host_percent) body["vram_expand_to_host_percent"] = *pool.vram_expand_to_host_percent;
  if (pool.vram_expand_to_disk_percent) body["vram_expand_to_disk_percent"] = *pool.vram_expand_to_disk_percent;
  StatusOr<json> r = Call(c, "PATCH", "/v1/pools/" + pool.name, body.dump());
  if (!r.ok()) return Fail(r.status());
  Out(c) << "pool " << pool.name << ": placement mode " << r->value("placement_mode", "")
         << ", TFLOPS oversell ratio " << r->value("tflops_oversell_ratio", 1.0) << ", VRAM expanded "
         << r->value("vram_expand_to_host_percent", 0) << "% into host memory and "
         << r->value("vram_expand_to_disk_percent", 0) << "% onto disk\n";
  return 0;
}

int PoolDelete(const ClientOptions& c, const std::string& name) {
  if (int rc = CheckName("pool name", name)) return rc;
  StatusOr<json> r = Call(c, "DELETE", "/v1/pools/" + name);
  if (!r.ok()) return Fail(r.status());
  Out(c) << "pool " << name << " deleted\n";
  return 0;
}

int NodeRemove(const ClientOptions& c, const std::string& name) {
  if (int rc = CheckName("node name", name)) return rc;
  StatusOr<json> r = Call(c, "DELETE", "/v1/nodes/" + name);
  if (!r.ok()) return Fail(r.status());
  Out(c) << "node " << name << " removed (its agent may enroll again)\n";
  return 0;
}

int NodeCordon(const ClientOptions& c, const std::string& name, bool cordon) {
  if (int rc = CheckName("node name", name)) return rc;
  StatusOr<json> r = Call(c, "POST", "/v1/nodes/" + name + (cordon ? "/cordon" : "/uncordon"));
  if (!r.ok()) return Fail(r.status());
  const int64_t held = r->value("allocations", int64_t{0});
  if (cordon) {
    Out(c) << "node " << name << " cordoned: it takes no new allocations and keeps its " << held
           << " allocation(s); drained once `tfusion node ls` shows 0 under ALLOCS\n";
  } else {
    Out(c) << "node " << name << " uncordoned: it takes new allocations again\n";
  }
  return 0;
}

int AllocationTier(const ClientOptions& c, const std::string& id, bool freeze, bool zero) {
  if (int rc = CheckName("allocation id", id)) return rc;
  const json body = freeze ? json{{"level", zero ? "zero" : "host"}} : json::object();
  StatusOr<json> r = Call(c, "POST", "/v1/allocations/" + id + (freeze ? "/freeze" : "/thaw"), body.dump());
  if (!r.ok()) return Fail(r.status());
  Out(c) << (freeze ? zero ? "freeze to zero" : "freeze" : "thaw") << " of allocation " << id << " requested (node "
         << r->value("node", "") << "); its node agent passes it on within a second: tfusion ps shows the state\n";
  return 0;
}

int AllocationPatch(const ClientOptions& c, const std::string& id, const IdlePatch& patch) {
  if (int rc = CheckName("allocation id", id)) return rc;
  json body = json::object();
  for (auto [field, value] : {std::pair{"idle_swap_ms", &patch.idle_swap_ms}, std::pair{"idle_disk_ms", &patch.idle_disk_ms},
                              std::pair{"idle_zero_ms", &patch.idle_zero_ms}}) {
    if (!*value) continue;
    body[field] = **value < 0 ? json(nullptr) : json(**value);
  }
  if (body.empty()) {
    std::fprintf(stderr, "tfusion patch: nothing to change: give --idle-swap, --idle-disk or --idle-zero\n");
    return 2;
  }
  StatusOr<json> r = Call(c, "PATCH", "/v1/allocations/" + id, body.dump());
  if (!r.ok()) return Fail(r.status());
  auto shown = [&](const char* field) {
    return r->contains(field) ? TierIdleText(r->value(field, int64_t{0})) : std::string("QoS default");
  };
  Out(c) << "allocation " << id << ": idle swap " << shown("idle_swap_ms") << ", idle disk " << shown("idle_disk_ms")
         << ", idle zero " << shown("idle_zero_ms") << " (its node agent applies them within a second)\n";
  return 0;
}

int TokenCreate(const ClientOptions& c, const TokenSpec& t) {
  if (t.role == "tenant" && t.tenant.empty())
    return Fail(InvalidArgument("token create --role tenant needs --tenant NAME (the tenant it speaks for)")), 2;
  if (t.role == "node" && t.node.empty())
    return Fail(InvalidArgument("token create --role node needs --node NAME (the node whose agent holds it)")), 2;
  json body = {{"role", t.role}};
  if (!t.tenant.empty()) body["tenant"] = t.tenant;
  if (!t.node.empty()) body["node"] = t.node;
  if (!t.description.empty()) body["description"] = t.description;
  StatusOr<json> r = Call(c, "POST", "/v1/tokens", body.dump());
  if (!r.ok()) return Fail(r.status());
  Out(c) << r->value("token", "") << "\n";
  std::cerr << "token " << r->value("id", "") << " (" << r->value("role", "")
            << (t.tenant.empty() ? "" : ", tenant " + t.tenant) << (t.node.empty() ? "" : ", node " + t.node)
            << "): shown this once; the controller keeps only its hash. Give it to its holder as a token "
               "file (--token-file) or TFUSION_TOKEN.\n";
  return 0;
}

int TokenList(const ClientOptions& c) {
  StatusOr<json> tokens = CallList(c, "/v1/tokens", "tokens");
  if (!tokens.ok()) return Fail(tokens.status());
  std::vector<std::vector<std::string>> rows{{"ID", "ROLE", "TENANT", "NODE", "CREATED (UTC)", "DESCRIPTION"}};
  for (const json& t : (*tokens)["tokens"]) {
    const int64_t ms = t.value("created_ms", int64_t{0});
    std::string created = "-";
    if (ms > 0) {
      const time_t secs = static_cast<time_t>(ms / 1000);
      std::tm tm{};
      char buf[32];
      if (gmtime_r(&secs, &tm) != nullptr && std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm) > 0) created = buf;
    }
    rows.push_back({t.value("id", ""), t.value("role", ""), t.value("tenant", ""), t.value("node", ""), created,
                    t.value("description", "")});
  }
  PrintTable(Out(c), rows);
  return 0;
}

int TokenRevoke(const ClientOptions& c, const std::string& id) {
  if (int rc = CheckName("token id", id)) return rc;
  StatusOr<json> r = Call(c, "DELETE", "/v1/tokens/" + id);
  if (!r.ok()) return Fail(r.status());
  Out(c) << "token " << id << " revoked\n";
  return 0;
}

int NodeList(const ClientOptions& c) {
  StatusOr<json> nodes = CallList(c, "/v1/nodes", "nodes");
  if (!nodes.ok()) return Fail(nodes.status());
  StatusOr<json> gpus = CallList(c, "/v1/gpus", "gpus");
  if (!gpus.ok()) return Fail(gpus.status());
  std::vector<std::vector<std::string>> rows{
      {"NODE", "POOL", "STATE", "GPUS", "ALLOCS", "TFLOPS", "VRAM_MIB", "ADDRESS", "WORKER", "SCHED_VRAM_MIB",
       "HOST_TIER_MIB", "DISK_TIER_MIB"}};
  // A tier budget as the agent reported it; "-" when it did not (the pool's expansion counts in full).
  auto budget = [](int64_t mib) { return mib < 0 ? std::string("-") : std::to_string(mib); };
  for (const json& n : (*nodes)["nodes"]) {
    std::string name = n.value("name", "");
    int count = 0;
    double t = 0;
    int64_t v = 0, sv = 0, host = -1;
    for (const json& g : (*gpus)["gpus"])
      if (g.value("node", "") == name) {
        ++count;
        t += g.value("tflops", 0.0);
        v += g.value("vram_mib", int64_t{0});
        sv += g.value("schedulable_vram_mib", g.value("vram_mib", int64_t{0}));
        if (const int64_t h = g.value("host_tier_budget_mib", int64_t{-1}); h >= 0) host = std::max<int64_t>(host, 0) + h;
      }
    // A cordoned node reads "ready,cordoned" (one word: the table splits on blanks).
    const std::string state = n.value("state", "") + (n.value("cordoned", false) ? ",cordoned" : "");
    rows.push_back({name, n.value("pool", ""), state, std::to_string(count),
                    std::to_string(n.value("allocations", int64_t{0})), Fixed(t),
                    std::to_string(v), n.value("address", ""),
                    n.value("worker_address", "").empty() ? "-" : n.value("worker_address", ""), std::to_string(sv),
                    budget(host), budget(n.value("disk_tier_budget_mib", int64_t{-1}))});
  }
  PrintTable(Out(c), rows);
  return 0;
}

namespace {

// The quota table: limits ("-" = none) beside what the tenant's live allocations hold.
int PrintQuotas(const ClientOptions& c, const std::string& only_tenant) {
  StatusOr<json> quotas = CallList(c, "/v1/quotas", "quotas");
  if (!quotas.ok()) return Fail(quotas.status());
  StatusOr<json> allocs = CallList(c, "/v1/allocations", "allocations");
  if (!allocs.ok()) return Fail(allocs.status());
  std::vector<std::vector<std::string>> rows{
      {"TENANT", "TFLOPS", "MAX_TFLOPS", "VRAM_MIB", "MAX_VRAM_MIB", "GPUS", "MAX_GPUS", "MAX_QOS"}};
  auto limit = [](double v, int digits) { return v > 0 ? Fixed(v, digits) : std::string("-"); };
  for (const json& q : (*quotas)["quotas"]) {
    const std::string tenant = q.value("tenant", "");
    if (!only_tenant.empty() && tenant != only_tenant) continue;
    double t = 0;
    int64_t v = 0, g = 0;
    for (const json& a : (*allocs)["allocations"]) {
      if (a.value("tenant", "") != tenant) continue;
      for (const json& vg : a["vgpus"]) {
        t += vg.value("tflops", 0.0);
        v += vg.value("vram_mib", int64_t{0});
        ++g;
      }
    }
    rows.push_back({tenant, Fixed(t), limit(q.value("max_tflops", 0.0), 1), std::to_string(v),
                    limit(static_cast<double>(q.value("max_vram_mib", int64_t{0})), 0), std::to_string(g),
                    limit(q.value("max_gpus", 0), 0), q.value("max_qos", "").empty() ? "-" : q.value("max_qos", "")});
  }
  if (!only_tenant.empty() && rows.size() == 1)
    return Fail(NotFound("tenant '" + only_tenant + "' has no quota (set one with: tfusion quota set " +
                         only_tenant + " --tflops N --vram SIZE --gpus N)"));
  PrintTable(Out(c), rows);
  return 0;
}

}  // namespace

int QuotaSet(const ClientOptions& c, const QuotaSettings& q) {
  if (int rc = CheckName("tenant", q.tenant)) return rc;
  if (!q.max_tflops && !q.max_vram_mib && !q.max_gpus && !q.max_qos)
    return Fail(InvalidArgument("nothing to set: give --tflops, --vram, --gpus (0 = no limit) and/or --max-qos")), 2;
  StatusOr<json> quotas = CallList(c, "/v1/quotas", "quotas");
  if (!quotas.ok()) return Fail(quotas.status());
  json current = {{"max_tflops", 0.0}, {"max_vram_mib", 0}, {"max_gpus", 0}};
  for (const json& e : (*quotas)["quotas"])
    if (e.value("tenant", "") == q.tenant) current = e;
  json body = {{"max_tflops", q.max_tflops.value_or(current.value("max_tflops", 0.0))},
               {"max_vram_mib", q.max_vram_mib.value_or(current.value("max_vram_mib", int64_t{0}))},
               {"max_gpus", q.max_gpus.value_or(current.value("max_gpus", 0))},
               {"max_qos", q.max_qos.value_or(current.value("max_qos", ""))}};
  StatusOr<json> r = Call(c, "PUT", "/v1/quotas/" + q.tenant, body.dump());
  if (!r.ok()) return Fail(r.status());
  return PrintQuotas(c, q.tenant);
}

int QuotaGet(const ClientOptions& c, const std::string& tenant) {
  if (int rc = CheckName("tenant", tenant)) return rc;
  return PrintQuotas(c, tenant);
}

int QuotaList(const ClientOptions& c) { return PrintQuotas(c, ""); }

int QuotaRemove(const ClientOptions& c, const std::string& tenant) {
  if (int rc = CheckName("tenant", tenant)) return rc;
  StatusOr<json> r = Call(c, "DELETE", "/v1/quotas/" + tenant);
  if (!r.ok()) return Fail(r.status());
  Out(c) << "quota of tenant " << tenant << " removed (its allocations stay; new ones are not limited)\n";
  return 0;
}

namespace {

// An allocation's compute summed over its vGPUs, TFLOPS; records without a limit: the request.
struct ComputeSums {
  double request = 0, limit = 0;
};
ComputeSums SumCompute(const json& allocation) {
  ComputeSums s;
  for (const json& g : allocation["vgpus"]) {
    const double t = g.value("tflops", 0.0);
    s.request += t;
    s.limit += std::max(t, g.value("tflops_limit", t));
  }
  return s;
}

// "25.0%" for a share in ppm; "-" when absent.
std::string SharePercent(const json& vgpu, const char* key, const char* fallback) {
  const uint64_t ppm = vgpu.value(key, vgpu.value(fallback, uint64_t{0}));
  return ppm == 0 ? "-" : Fixed(ppm / 10'000.0) + "%";
}

// "; idle: swap 30s, disk never" for an allocation with tiering: the timeouts its node applied
// (the last heartbeat), else its overrides not yet applied ("pending"); "" when neither is known.
std::string TierIdleSuffix(const json& a) {
  if (!a.value("tiering", false)) return "";
  for (const json& v : a["vgpus"]) {
    if (v.contains("applied_idle_swap_ms")) {
      const int64_t zero = v.value("applied_idle_zero_ms", int64_t{0});
      return "; idle: swap " + TierIdleText(v.value("applied_idle_swap_ms", int64_t{0})) + ", disk " +
             TierIdleText(v.value("applied_idle_disk_ms", int64_t{0})) + (zero > 0 ? ", zero " + TierIdleText(zero) : "");
    }
  }
  std::string s;
  for (const char* field : {"idle_swap_ms", "idle_disk_ms", "idle_zero_ms"}) {
    if (!a.contains(field)) continue;
    const std::string name = std::string(field).substr(5, 4);  // swap, disk, zero
    s += std::string(s.empty() ? "" : ",") + " " + name + " " + TierIdleText(a.value(field, int64_t{0}));
  }
  return s.empty() ? "" : "; idle (pending):" + s;
}

}  // namespace

int Ps(const ClientOptions& c) {
  StatusOr<json> allocs = CallList(c, "/v1/allocations", "allocations");
  if (!allocs.ok()) return Fail(allocs.status());
  StatusOr<json> evictions = CallList(c, "/v1/evictions", "evictions");
  if (!evictions.ok()) return Fail(evictions.status());
  std::vector<std::vector<std::string>> rows{
      {"ALLOCATION", "TENANT", "WORKLOAD", "POOL", "NODE", "QOS", "GPUS", "TFLOPS", "TFLOPS_LIMIT", "VRAM_MIB", "STATE"}};
  auto row = [&rows](const json& a, const std::string& state) {
    std::string gpus;
    int64_t v = 0;
    for (const json& g : a["vgpus"]) {
      gpus += (gpus.empty() ? "" : ",") + g.value("gpu", "");
      v += g.value("vram_mib", int64_t{0});
    }
    const ComputeSums c = SumCompute(a);
    const std::string tenant = a.value("tenant", "");
    rows.push_back({a.value("id", ""), tenant.empty() ? "-" : tenant,
                    a.value("workload", "-").empty() ? "-" : a.value("workload", "-"),
                    a.value("pool", ""), a.value("node", ""), a.value("qos", ""), gpus, Fixed(c.request),
                    Fixed(c.limit), std::to_string(v), state});
  };
  for (const json& a : (*allocs)["allocations"]) {
    // VRAM tiering, as the node last reported it: "running, swapped 30720 MiB".
    std::string tier;
    int64_t swapped = 0;
    for (const json& v : a["vgpus"]) {
      if (!v.contains("tier_state")) continue;
      const std::string s = v.value("tier_state", "");
      tier = tier.empty() || tier == s ? s : "mixed";
      swapped += v.value("swapped_mib", int64_t{0});
    }
    if (!tier.empty() && swapped > 0) tier += " " + std::to_string(swapped) + " MiB";
    // Preempted with its VRAM swapped out: "suspended by a-..., swapped 30720 MiB".
    std::string state = a.value("suspended", false) ? "suspended by " + a.value("suspended_by", "") : "running";
    row(a, (tier.empty() ? state : state + ", " + tier) + TierIdleSuffix(a));
  }
  // Allocations the controller took back: "preempted by a-...: stopping" until the node agent
  // reports their processes gone, then "...: stopped".
  for (const json& e : (*evictions)["evictions"]) {
    if (!e.is_object() || !e.contains("allocation")) continue;
    std::string state = e.value("reason", "evicted");
    if (!e.value("preempted_by", "").empty()) state += " by " + e.value("preempted_by", "");
    state += ": " + e.value("state", "");
    if (e.value("state", "") == "stopped" && e.value("processes_stopped", 0) > 0)
      state += " (" + std::to_string(e.value("processes_stopped", 0)) + " process(es) signalled)";
    row(e["allocation"], state);
  }
  PrintTable(Out(c), rows);
  return 0;
}

namespace {

// One frame of `tfusion top`: the GPU table and the allocations' vGPUs (request, limit, use over
// the node's last heartbeat interval, time throttled), or the error that prevented it.
Status TopTable(const ClientOptions& c, std::ostream& out) {
  StatusOr<json> gpus = CallList(c, "/v1/gpus", "gpus");
  if (!gpus.ok()) return gpus.status();
  StatusOr<json> allocs = CallList(c, "/v1/allocations", "allocations");
  if (!allocs.ok()) return allocs.status();
  std::vector<std::vector<std::string>> rows{
      {"GPU", "NODE", "MODEL", "UTIL%", "MEM_USED_MIB", "ALLOC_TFLOPS", "ALLOC_VRAM_MIB", "UNPOOLED"}};
  for (const json& g : (*gpus)["gpus"]) {
    // What vGPUs outside the pool hold there (placement counts it as used): "-" when none.
    const double unpooled_tflops = g.value("unpooled_tflops", 0.0);
    const int64_t unpooled_vram = g.value("unpooled_vram_mib", int64_t{0});
    rows.push_back({g.value("uuid", ""), g.value("node", ""), g.value("model", ""),
                    Fixed(g.value("utilization_percent", 0.0), 0),
                    std::to_string(g.value("memory_used_mib", int64_t{0})),
                    Fixed(g.value("used_tflops", 0.0)) + "/" + Fixed(g.value("tflops", 0.0)),
                    std::to_string(g.value("used_vram_mib", int64_t{0})) + "/" +
                        std::to_string(g.value("vram_mib", int64_t{0})),
                    unpooled_tflops > 0 || unpooled_vram > 0
                        ? Fixed(unpooled_tflops) + " TFLOPS, " + std::to_string(unpooled_vram) + " MiB"
                        : "-"});
  }
  PrintTable(out, rows);
  std::vector<std::vector<std::string>> vgpus{
      {"ALLOCATION", "GPU", "QOS", "REQ_TFLOPS", "LIMIT_TFLOPS", "REQ%", "LIMIT%", "USE%", "THROTTLED_S", "TURNS_S",
       "VRAM_MIB"}};
  for (const json& a : (*allocs)["allocations"]) {
    for (const json& v : a["vgpus"]) {
      const double t = v.value("tflops", 0.0);
      vgpus.push_back({a.value("id", ""), v.value("gpu", ""), a.value("qos", ""), Fixed(t),
                       Fixed(std::max(t, v.value("tflops_limit", t))), SharePercent(v, "share_ppm", "share_ppm"),
                       SharePercent(v, "limit_ppm", "share_ppm"),
                       v.contains("use_percent") ? Fixed(v.value("use_percent", 0.0)) + "%" : "-",
                       v.contains("throttled_seconds") ? Fixed(v.value("throttled_seconds", 0.0)) : "-",
                       v.contains("turn_seconds") ? Fixed(v.value("turn_seconds", 0.0)) : "-",
                       std::to_string(v.value("vram_mib", int64_t{0}))});
    }
  }
  if (vgpus.size() > 1) {
    out << "\n";
    PrintTable(out, vgpus);
  }
  return Status::Ok();
}

}  // namespace

int Top(const ClientOptions& c, const TopOptions& o) {
  if (o.once) {
    Status st = TopTable(c, Out(c));
    return st.ok() ? 0 : Fail(st);
  }
  InstallSignalHandlers();
  const bool terminal = c.out == nullptr && isatty(STDOUT_FILENO);
  const int interval_ms = static_cast<int>(o.interval_seconds * 1000 + 0.5);
  while (!g_stop.load()) {
    std::ostringstream frame;
    const std::time_t now = std::time(nullptr);
    char clock[16] = {};
    std::strftime(clock, sizeof clock, "%H:%M:%S", std::localtime(&now));
    frame << "tfusion top - " << c.url << " - " << clock << " (every " << o.interval_seconds
          << " s; Ctrl-C quits)\n\n";
    Status st = TopTable(c, frame);
    if (!st.ok()) frame << "error: " << st.message() << " (retrying)\n";
    std::ostream& out = Out(c);
    if (terminal) out << "\033[H\033[2J";  // home + clear: redraw in place, like top
    out << frame.str() << (terminal ? "" : "\n");
    out.flush();
    SleepUntilStop(interval_ms);
  }
  return 0;
}

}  // namespace tf::controller
