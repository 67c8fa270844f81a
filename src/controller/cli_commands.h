// Entry points that the `tfusion` CLI (src/cli) calls: the daemons (controller, node agent, the
// all-in-one `up`) and the client commands that print tables. No argument parsing here: the CLI
// fills the option structs. Every function returns a process exit code (0 ok, 1 failure, 2 bad
// options) and prints errors to stderr.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

namespace tf::controller {

struct ControllerOptions {
  std::string listen_host = "127.0.0.1";
  int port = 9300;                        // 0: any free port (printed)
  std::string store = "sqlite:tfusion-state.db";  // "sqlite:PATH" or "etcd:http://H:P[,...]"
  std::string durability = "power";      // SQLite: "power" or "process" (sqlite_store.h)
  std::string token;                      // bearer token; or read from token_file
  std::string token_file;
  std::string identity;                   // replica identity for leader election; default host:pid
  int leader_ttl_seconds = 10;            // etcd lease TTL
  int64_t heartbeat_timeout_ms = 15'000;  // a node silent this long is marked lost
  int64_t lost_grace_ms = 60'000;         // a lost node's allocations are released after this
  int history_interval_seconds = 5;       // usage history (console charts): one sample this often
  std::string tls_cert;                   // PEM certificate (chain) and key: serve HTTPS only
  std::string tls_key;
  bool insecure_listen = false;           // plain HTTP off loopback without the warning
  // Kubernetes reconciler (docs/kubernetes.md, "Reconciler"): the API server's URL or "in-cluster";
  // empty: off. Token and CA files default to the pod's service account.
  std::string kube_api;
  std::string kube_token_file;
  std::string kube_ca_file;
  int kube_resync_seconds = 10;           // status refresh when nothing changes
};

// The usage history (GET /v1/history) keeps the samples of this long.
inline constexpr int64_t kUsageHistoryRetentionMs = 3'600'000;

struct HypervisorOptions {
  std::string controller_url = "http://127.0.0.1:9300";
  std::string token;
  std::string token_file;
  std::string node_name;                 // default: hostname
  std::string pool;                      // default: the controller's default pool
  int heartbeat_interval_ms = 5'000;
  std::string metrics_host = "127.0.0.1";
  int metrics_port = 9400;               // per-GPU Prometheus metrics at /metrics; -1: off
  std::string nvml_library = "libnvidia-ml.so.1";
  std::string catalog_overrides_file;    // lines "name_substring tflops [vram_mib]"
  std::string region_dir;                // per-GPU quota regions; empty: /dev/shm/tensorfusion
  int sync_interval_ms = 1'000;          // how often vGPU limits are synced from the controller
  int stop_grace_seconds = 10;           // SIGTERM -> SIGKILL for processes of a taken-back vGPU
  std::string worker_address;            // HOST:PORT of this node's `tfusion worker`; empty: none
  std::string credential_file = ".tfusion/node-credential";  // NodeAgentOptions::credential_file
  std::string ca_file;                   // https:// controllers: NodeAgentOptions::ca_file
  std::string mps_pipe_dir;              // an operator's MPS daemon, published to tenants (hypervisor/mps.h)
  int64_t host_tier_budget_bytes = -1;   // NodeAgentOptions::host_tier_budget_bytes
  std::string disk_tier_dir;             // NodeAgentOptions::disk_tier_dir
};

struct UpOptions {
  std::string state_dir = ".tfusion";    // holds state.db and the generated token
  std::string listen_host = "127.0.0.1";
  int port = 9300;
  int metrics_port = 9400;
  std::string token;                     // empty: reuse STATE_DIR/token or generate one
  std::string durability = "power";      // as ControllerOptions
  std::string nvml_library = "libnvidia-ml.so.1";
  std::string region_dir;                // per-GPU quota regions; empty: /dev/shm/tensorfusion
  int stop_grace_seconds = 10;           // as HypervisorOptions
  int history_interval_seconds = 5;      // as ControllerOptions
  // HTTPS: `tls` makes a CA and a server certificate in STATE_DIR/tls (self_signed_ca.h) naming
  // localhost, 127.0.0.1, ::1, the listen address (for 0.0.0.0: the host name and interface
  // addresses) and `tls_names`; or the operator's own tls_cert/tls_key (then the local agent
  // verifies it against ca_file, else $TFUSION_CA_FILE, else the system's trust store).
  bool tls = false;
  std::vector<std::string> tls_names;
  std::string tls_cert;
  std::string tls_key;
  std::string ca_file;
  bool insecure_listen = false;          // as ControllerOptions
  std::string mps_pipe_dir;              // as HypervisorOptions
  int64_t host_tier_budget_bytes = -1;   // as HypervisorOptions
  std::string disk_tier_dir;             // as HypervisorOptions
};

struct ClientOptions {
  std::string url = "http://127.0.0.1:9300";
  // The bearer token: `token`, else the first line of `token_file`, else of .tfusion/token in the
  // current folder (where `tfusion up` writes it) when that exists.
  std::string token;
  std::ostream* out = nullptr;           // default std::cout
  std::string token_file;
  std::string ca_file;                   // https:// URLs: HttpClient's ca_file
};

// A table cell as a terminal may show it: control characters and UTF-8 C1 controls become '?'.
std::string PrintableCell(const std::string& cell);

// Runs until SIGINT/SIGTERM (or RequestShutdown()).
int RunController(const ControllerOptions& options);
int RunHypervisor(const HypervisorOptions& options);
int RunUp(const UpOptions& options);
// Makes the running RunController/RunHypervisor/RunUp return (async-signal-safe).
void RequestShutdown();

// Client commands: print a table (or an error) and return an exit code.
int PoolList(const ClientOptions& client);                          // tfusion pool ls
// A pool's settings as `tfusion pool create/set` give them; unset fields keep their value (set) or
// take the controller's default (create). placement_mode: docs/scheduler.md (validated by the
// controller); tflops_oversell_ratio in [1, 100].
struct PoolSettings {
  std::string name;
  std::optional<std::string> placement_mode;
  std::optional<double> tflops_oversell_ratio;
  std::optional<int> vram_expand_to_host_percent;  // 0..400
  std::optional<int> vram_expand_to_disk_percent;  // 0..400
};
int PoolCreate(const ClientOptions& client, const PoolSettings& pool);  // tfusion pool create NAME
int PoolSet(const ClientOptions& client, const PoolSettings& pool);     // tfusion pool set NAME
int PoolDelete(const ClientOptions& client, const std::string& name);  // tfusion pool rm NAME
int NodeList(const ClientOptions& client);                          // tfusion node ls
int NodeRemove(const ClientOptions& client, const std::string& name);  // tfusion node rm NAME
// tfusion node cordon / uncordon NAME (admin): the node keeps its allocations and takes no new ones.
int NodeCordon(const ClientOptions& client, const std::string& name, bool cordon);
// tfusion token create/ls/rm (admin): API tokens with a role (admin, tenant, node).
struct TokenSpec {
  std::string role, tenant, node, description;
};
int TokenCreate(const ClientOptions& client, const TokenSpec& spec);
// tfusion freeze/thaw ID --controller: the request through the API, for a pooled allocation;
// `zero` (freeze only): scale to zero, the node agent also checkpoints the processes.
int AllocationTier(const ClientOptions& client, const std::string& id, bool freeze, bool zero = false);
// tfusion patch ID --idle-swap D --idle-disk D --idle-zero D: the allocation's tier idle overrides
// (PATCH /v1/allocations/ID), ms; unset fields keep their value, -1 sends null (back to the QoS
// default). Prints the allocation's overrides as the controller now holds them.
struct IdlePatch {
  std::optional<int64_t> idle_swap_ms, idle_disk_ms, idle_zero_ms;
};
int AllocationPatch(const ClientOptions& client, const std::string& id, const IdlePatch& patch);
int TokenList(const ClientOptions& client);
int TokenRevoke(const ClientOptions& client, const std::string& id);

// A tenant's quota as `tfusion quota set` gives it: unset fields keep their value (a new tenant:
// 0); 0 means no limit. Limits are on what the tenant's live allocations hold in total.
struct QuotaSettings {
  std::string tenant;
  std::optional<double> max_tflops;
  std::optional<int64_t> max_vram_mib;
  std::optional<int> max_gpus;
  std::optional<std::string> max_qos;  // "" = any
};
int QuotaSet(const ClientOptions& client, const QuotaSettings& quota);  // tfusion quota set TENANT
int QuotaGet(const ClientOptions& client, const std::string& tenant);   // tfusion quota get TENANT
int QuotaRemove(const ClientOptions& client, const std::string& tenant);  // tfusion quota rm TENANT
int QuotaList(const ClientOptions& client);                             // tfusion quota ls
int Ps(const ClientOptions& client);                                // tfusion ps (allocations)
// tfusion top: the GPUs of the pool, their allocation and use. Redraws every interval_seconds
// (REQUIRES a finite value in [0.1, 3600]; the CLI validates it) until SIGINT/SIGTERM, clearing
// the screen between frames when the output is a terminal; returns 0 then. A failed refresh is
// shown in its frame and the next one is tried. `once`: print one table and return (scripts).
struct TopOptions {
  double interval_seconds = 2;
  bool once = false;
};
int Top(const ClientOptions& client, const TopOptions& options);

}  // namespace tf::controller
