// tfusion: one binary for the CLI and the daemons.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include "cli/local_vgpu.h"
#include "cli/quantity.h"
#include "cli/remote_run.h"
#include "cli/worker_sessions.h"
#include "hypervisor/remote_sessions.h"
#include "cli/worker_zero.h"
#include "controller/model.h"
#include "limiter/core/gpu_region.h"
#include "limiter/core/tier_defaults.h"
#include "cli/run_command.h"
#include "deviceplugin/device_plugin_command.h"
#include "hypervisor/mps.h"
#include "controller/cli_commands.h"
#include "controller/tls_files.h"
#include "k8s/k8s_server.h"

namespace {

int UsageError(const char* command, const tf::Status& s) {
  std::fprintf(stderr, "%s: %s\n", command, s.message().c_str());
  return 2;
}

void AddCaFileFlag(CLI::App* cmd, std::string* ca_file) {
  cmd->add_option("--ca-file", *ca_file,
                  "for an https:// controller: PEM file of the CA its certificate must chain to (default: "
                  "the system's trust store)")->envname("TFUSION_CA_FILE");
}

void AddServerTlsFlags(CLI::App* cmd, std::string* cert, std::string* key, bool* insecure_listen) {
  cmd->add_option("--tls-cert", *cert, "serve HTTPS with this PEM certificate (chain, leaf first)");
  cmd->add_option("--tls-key", *key, "the certificate's PEM private key (unencrypted)");
  cmd->add_flag("--insecure-listen", *insecure_listen,
                "allow a plaintext API off loopback (refused without it: tokens would cross the network in clear)");
}

void AddClientFlags(CLI::App* cmd, tf::controller::ClientOptions* c) {
  cmd->add_option("--url", c->url, "controller URL; several replicas: comma-separated (the one that serves answers)")
      ->envname("TFUSION_URL")
      ->capture_default_str();
  cmd->add_option("--token", c->token, "API token")->envname("TFUSION_TOKEN");
  cmd->add_option("--token-file", c->token_file, "file holding the API token (default: .tfusion/token when present)");
  AddCaFileFlag(cmd, &c->ca_file);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"TensorFusion: GPU virtualization and pooling"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "tfusion 0.1.0");

  // ---- local vGPU
  tf::cli::RunOptions run;
  auto* run_cmd = app.add_subcommand("run", "run a command on a vGPU of this machine");
  run_cmd->add_option("--vram", run.vram, "VRAM ceiling, e.g. 8GiB or 512MiB (default: the whole GPU)");
  run_cmd->add_option("--tflops", run.tflops, "compute request (guaranteed) in FP16 dense TFLOPS");
  run_cmd->add_option("--percent", run.percent,
                      "compute request (guaranteed) in percent of the GPU (without --tflops or --percent: the whole "
                      "GPU's compute, in a pool too)");
  run_cmd->add_option("--tflops-limit", run.tflops_limit,
                      "compute limit (ceiling it may burst to) in FP16 dense TFLOPS (default: the request)");
  run_cmd->add_option("--percent-limit", run.percent_limit,
                      "compute limit (ceiling it may burst to) in percent of the GPU (default: the request)");
  std::string run_gpu;
  run_cmd->add_option("--gpu", run_gpu, "GPU index as nvidia-smi numbers them, or its UUID (default 0)");
  run_cmd->add_option("--vgpu", run.vgpu, "vGPU name shared by several processes");
  run_cmd->add_option("--driver", run.driver, "path of the real libcuda.so.1");
  run_cmd->add_option("--nvml", run.nvml, "path of the real libnvidia-ml.so.1");
  std::string remote;
  run_cmd->add_option("--remote", remote, "run on a remote GPU worker: HOST:PORT (TCP) or unix:PATH");
  run_cmd->add_option("--token", run.token, "token of the controller or remote worker")->envname("TFUSION_TOKEN");
  run_cmd->add_option("--controller", run.controller,
                      "controller URL: the pool places the vGPU; several replicas: comma-separated (the run follows the leader)")
      ->envname("TFUSION_URL");
  run_cmd->add_option("--pool", run.pool, "pool to place the vGPU in");
  std::string run_ca_file;
  AddCaFileFlag(run_cmd, &run_ca_file);
  run_cmd->add_option("--worker-token", run.worker_token,
                       "token of the worker a vGPU placed on another node runs through (default: --token)")
      ->envname("TFUSION_WORKER_TOKEN");
  run_cmd->add_option("--qos", run.qos,
                      "low, medium (default), high or critical: who borrows idle compute first, and "
                      "who may preempt whom in a pool");
  run_cmd->add_option("--tenant", run.tenant, "tenant whose quota the pooled vGPU counts against (tfusion quota)")
      ->envname("TFUSION_TENANT");
  run_cmd->add_flag("--tiering", run.tiering,
                    "movable VRAM: the vGPU can be frozen to host memory (tfusion freeze) and is "
                    "swapped out when idle");
  run_cmd->add_option("--idle-swap", run.idle_swap,
                      "with tiering: swap out after this long without GPU calls, e.g. 10s or 5m; 0 = "
                      "never (default by QoS: low 10s, medium 60s, high 10m, critical never)");
  run_cmd->add_option("--disk-tier", run.disk_tier,
                      "with tiering: folder (on NVMe) that swapped VRAM moves on to after --idle-disk");
  run_cmd->add_option("--idle-disk", run.idle_disk,
                      "with --disk-tier: move swapped VRAM to disk after this long idle (default by QoS: "
                      "low 2m, medium 10m, high and critical never)");
  run_cmd->add_option("--idle-zero", run.idle_zero,
                      "with tiering: scale to zero after this long idle (longer than --idle-swap): the "
                      "swapped tenant is checkpointed by the driver, its context included (default never)");
  run_cmd->add_option("--mps-pipe-dir", run.mps_pipe_dir,
                      "pipe directory of the MPS daemon an operator runs (default: $TFUSION_MPS_PIPE_DIRECTORY, "
                      "else the node agent's)");
  run_cmd->add_option("command", run.command, "-- CMD ARGS")->required()->expected(-1);

  bool smi_processes = false;
  auto* smi_cmd = app.add_subcommand("smi", "show the vGPUs of this machine, their limits and use");
  smi_cmd->add_flag("--processes,-p", smi_processes, "also list processes");

  std::string freeze_vgpu, thaw_vgpu;
  double freeze_timeout = 120;
  bool freeze_no_wait = false;
  bool freeze_via_controller = false;
  auto* freeze_cmd = app.add_subcommand("freeze", "swap a vGPU's VRAM out to host memory (a local vGPU, or with "
                                                  "--controller a pooled allocation on any node)");
  freeze_cmd->add_option("vgpu", freeze_vgpu, "vGPU name (tfusion smi); with --controller, the allocation id")
      ->required();
  freeze_cmd->add_option("--timeout", freeze_timeout, "seconds to wait for every process (default 120)")
      ->check(CLI::Number)->check(CLI::Range(0.1, 86400.0));
  freeze_cmd->add_flag("--no-wait", freeze_no_wait, "return once the request is made");
  auto* thaw_cmd = app.add_subcommand("thaw", "bring a frozen vGPU's VRAM back to the GPU (a local vGPU, or with "
                                              "--controller a pooled allocation on any node)");
  thaw_cmd->add_option("vgpu", thaw_vgpu, "vGPU name (tfusion smi); with --controller, the allocation id")
      ->required();
  thaw_cmd->add_option("--timeout", freeze_timeout, "seconds to wait for every process (default 120)")
      ->check(CLI::Number)->check(CLI::Range(0.1, 86400.0));
  thaw_cmd->add_flag("--no-wait", freeze_no_wait, "return once the request is made");
  tf::cli::ZeroOptions freeze_zero;
  freeze_cmd->add_flag("--zero", freeze_zero.zero,
                       "then checkpoint each process with the driver: its context and fixed VRAM leave the GPU too");
  for (auto* c : {freeze_cmd, thaw_cmd}) {
    c->add_option("--driver", freeze_zero.driver, "path of the real libcuda.so.1 (checkpoint and restore)");
  }

  std::vector<std::string> worker_listen, worker_env;
  std::string worker_token, worker_driver, worker_ready;
  auto* worker_cmd = app.add_subcommand("worker", "serve remote vGPU clients on this GPU host");
  worker_cmd->add_option("--listen", worker_listen, "HOST:PORT or unix:PATH (repeatable)")->required();
  worker_cmd->add_option("--token", worker_token, "token clients must present")->envname("TFUSION_TOKEN");
  std::string worker_token_file;
  worker_cmd->add_option("--token-file", worker_token_file, "file whose first line is the token (instead of --token)");
  worker_cmd->add_option("--driver", worker_driver, "driver library the sessions load");
  worker_cmd->add_option("--session-env", worker_env, "K=V set in every session (repeatable)");
  worker_cmd->add_option("--ready-file", worker_ready, "file written once listening");
  bool worker_tiering = false;
  std::string worker_idle_swap;
  worker_cmd->add_flag("--tiering", worker_tiering,
                       "every session gets a vGPU with movable VRAM (tfusion freeze remote-PID; idle sessions "
                       "are swapped out to host memory)");
  worker_cmd->add_option("--idle-swap", worker_idle_swap,
                         "swap a session out after this long without GPU calls (implies --tiering; default: "
                         "by QoS, medium 60s; 0 = never)");
  std::string worker_idle_zero;
  worker_cmd->add_option("--idle-zero", worker_idle_zero,
                         "with --tiering: checkpoint a swapped session with the driver after this long "
                         "without GPU calls, giving its context back too (longer than --idle-swap; "
                         "default never); the client's next call restores it");
  std::string worker_nvml;
  uint32_t worker_spin_us = tf::worker::WorkerOptions{}.spin_us;
  worker_cmd->add_option("--spin-us", worker_spin_us,
                         "microseconds a session waits awake for its client's next call before "
                         "sleeping (0-10000; more costs CPU, less adds a wake-up per call)")
      ->check(CLI::Number)->check(CLI::Range(0, 10000))->capture_default_str();
  int worker_spin_sessions = -1;
  worker_cmd->add_option("--spin-sessions", worker_spin_sessions,
                         "sessions spin (--spin-us) only while at most this many are live "
                         "(0-4096; default a quarter of this machine's cores, at least 1)")
      ->check(CLI::Number)->check(CLI::Range(0, 4096));
  std::string worker_host_mem;
  worker_cmd->add_option("--session-host-mem", worker_host_mem,
                         "host memory each session may pin for its client: page-locked and mapped "
                         "memory, its copy buffer, and managed memory when the client has no "
                         "--vram (with one, managed memory counts against it); beyond it the call "
                         "fails with CUDA_ERROR_OUT_OF_MEMORY (e.g. 8GiB; a bare number is MiB; "
                         "default: a quarter of this machine's memory)");
  std::string worker_mps_pipe_dir;
  worker_cmd->add_option("--mps-pipe-dir", worker_mps_pipe_dir,
                         "the MPS control daemon's pipe directory an operator runs: every session "
                         "with a vGPU runs under it with its limits (default: "
                         "TFUSION_MPS_PIPE_DIRECTORY, else the node agent's)");
  tf::cli::WorkerHooks hooks;
  worker_cmd->add_option("--tls-cert", hooks.tls_cert,
                         "serve TCP clients over TLS with this PEM certificate (chain, leaf first); "
                         "clients trust its CA with TFUSION_CA_FILE / --ca-file");
  worker_cmd->add_option("--tls-key", hooks.tls_key, "the certificate's PEM private key (unencrypted)");
  worker_cmd->add_option("--nvml", worker_nvml,
                         "libnvidia-ml.so.1 used to find the GPU for clients that ask for a vGPU "
                         "(default: found on this machine)");

  // ---- control plane
  tf::controller::UpOptions up;
  auto* up_cmd = app.add_subcommand("up", "start the controller and this machine's node agent");
  up_cmd->add_option("--state-dir", up.state_dir, "state folder")->capture_default_str();
  up_cmd->add_option("--listen", up.listen_host, "API address")->capture_default_str();
  up_cmd->add_option("--port", up.port, "API port")->capture_default_str();
  up_cmd->add_option("--metrics-port", up.metrics_port, "node metrics port")->capture_default_str();
  up_cmd->add_option("--token", up.token, "API token (default: generated)");
  up_cmd->add_option("--durability", up.durability,
                     "store durability: power (fsync every commit) or process (survives a crash of "
                     "tfusion; power loss may lose about the last second)")->capture_default_str();
  up_cmd->add_option("--stop-grace", up.stop_grace_seconds,
                     "seconds between SIGTERM and SIGKILL for processes of a preempted vGPU")
      ->check(CLI::Number)->check(CLI::Range(0, 3600))->capture_default_str();
  up_cmd->add_option("--history-interval", up.history_interval_seconds,
                     "seconds between two samples of the usage history (console charts; kept 1 h)")
      ->check(CLI::Number)->check(CLI::Range(1, 60))->capture_default_str();
  up_cmd->add_flag("--tls", up.tls,
                   "serve HTTPS with a CA and server certificate made in the state folder (tls/ca.pem is "
                   "what clients pass as --ca-file)");
  up_cmd->add_option("--tls-name", up.tls_names,
                     "with --tls: another host name or address the server certificate names (repeatable)");
  AddServerTlsFlags(up_cmd, &up.tls_cert, &up.tls_key, &up.insecure_listen);
  AddCaFileFlag(up_cmd, &up.ca_file);
  up_cmd->add_option("--mps-pipe-dir", up.mps_pipe_dir,
                     "pipe directory of the MPS daemon an operator runs: tenants started here run under it")
      ->envname("TFUSION_MPS_PIPE_DIRECTORY");

  std::string up_host_tier_budget, hv_host_tier_budget;
  const char* host_tier_budget_help =
      "host memory the swapped VRAM of each GPU's tenants may hold, e.g. 64GiB (0: none; default: the GPU's "
      "VRAM, at most half this machine's memory); reported to the controller";
  const char* disk_tier_help = "folder (on NVMe) of this node's VRAM disk tier: its free space is reported to the controller";
  up_cmd->add_option("--host-tier-budget", up_host_tier_budget, host_tier_budget_help)->envname("TFUSION_HOST_TIER_BUDGET");
  up_cmd->add_option("--disk-tier", up.disk_tier_dir, disk_tier_help);

  tf::controller::ControllerOptions ctl;
  auto* ctl_cmd = app.add_subcommand("controller", "run the controller (API, scheduler, store)");
  ctl_cmd->add_option("--listen", ctl.listen_host, "API address")->capture_default_str();
  ctl_cmd->add_option("--port", ctl.port, "API port (0: any)")->capture_default_str();
  ctl_cmd->add_option("--store", ctl.store, "sqlite:PATH or etcd:http://HOST:PORT[,...]")->capture_default_str();
  ctl_cmd->add_option("--token", ctl.token, "API token")->envname("TFUSION_TOKEN");
  ctl_cmd->add_option("--token-file", ctl.token_file, "file holding the API token");
  ctl_cmd->add_option("--durability", ctl.durability,
                      "SQLite: power (fsync every commit) or process (survives a controller crash; "
                      "power loss may lose about the last second)")->capture_default_str();
  ctl_cmd->add_option("--identity", ctl.identity, "replica name for leader election");
  ctl_cmd->add_option("--leader-ttl", ctl.leader_ttl_seconds,
                      "seconds the leader's etcd lease lives without renewal: a standby takes over about this "
                      "long after the leader dies (renewed every third of it)")
      ->check(CLI::Number)->check(CLI::Range(2, 60))->capture_default_str();
  ctl_cmd->add_option("--history-interval", ctl.history_interval_seconds,
                      "seconds between two samples of the usage history (console charts; kept 1 h)")
      ->check(CLI::Number)->check(CLI::Range(1, 60))->capture_default_str();
  AddServerTlsFlags(ctl_cmd, &ctl.tls_cert, &ctl.tls_key, &ctl.insecure_listen);
  ctl_cmd->add_option("--kube-api", ctl.kube_api,
                      "reconcile tensor-fusion.ai objects with this Kubernetes API server: https://HOST:PORT, "
                      "http://HOST:PORT (kubectl proxy) or in-cluster");
  ctl_cmd->add_option("--kube-token-file", ctl.kube_token_file,
                      "bearer token for --kube-api (default: the pod's service-account token)");
  ctl_cmd->add_option("--kube-ca-file", ctl.kube_ca_file,
                      "CA bundle that verifies --kube-api (default: the pod's service-account ca.crt)");
  ctl_cmd->add_option("--kube-resync", ctl.kube_resync_seconds,
                      "seconds between two status refreshes when no object changes")
      ->check(CLI::Number)->check(CLI::Range(1, 3600))->capture_default_str();

  tf::controller::HypervisorOptions hv;
  auto* hv_cmd = app.add_subcommand("hypervisor", "run the node agent of this machine");
  hv_cmd->add_option("--controller", hv.controller_url,
                     "controller URL; several replicas: comma-separated (the agent follows the leader)")
      ->capture_default_str();
  hv_cmd->add_option("--token", hv.token, "API token")->envname("TFUSION_TOKEN");
  hv_cmd->add_option("--token-file", hv.token_file, "file holding the API token");
  AddCaFileFlag(hv_cmd, &hv.ca_file);
  hv_cmd->add_option("--node", hv.node_name, "node name (default: host name)");
  hv_cmd->add_option("--credential-file", hv.credential_file,
                     "where the agent keeps its node credential (made at first start)")->capture_default_str();
  hv_cmd->add_option("--pool", hv.pool, "pool to join");
  hv_cmd->add_option("--metrics-port", hv.metrics_port, "metrics port (-1: off)")->capture_default_str();
  hv_cmd->add_option("--metrics-listen", hv.metrics_host, "metrics address (0.0.0.0: every interface)")
      ->capture_default_str();
  hv_cmd->add_option("--catalog-overrides", hv.catalog_overrides_file, "GPU model overrides file");
  hv_cmd->add_option("--worker-address", hv.worker_address,
                     "HOST:PORT of this node's tfusion worker: commands placed here from other machines run through it");
  hv_cmd->add_option("--stop-grace", hv.stop_grace_seconds,
                     "seconds between SIGTERM and SIGKILL for processes of a preempted vGPU")
      ->check(CLI::Number)->check(CLI::Range(0, 3600))->capture_default_str();
  hv_cmd->add_option("--mps-pipe-dir", hv.mps_pipe_dir,
                     "pipe directory of the MPS daemon an operator runs: tenants started here run under it")
      ->envname("TFUSION_MPS_PIPE_DIRECTORY");
  hv_cmd->add_option("--host-tier-budget", hv_host_tier_budget, host_tier_budget_help)->envname("TFUSION_HOST_TIER_BUDGET");
  hv_cmd->add_option("--disk-tier", hv.disk_tier_dir, disk_tier_help);

  auto device_plugin = tf::deviceplugin::AddDevicePluginCommand(&app);

  tf::controller::ClientOptions client;
  for (auto* c : {freeze_cmd, thaw_cmd}) {
    c->add_flag("--controller", freeze_via_controller,
                "ask the controller instead (a pooled allocation, on any node; VGPU is its allocation id)");
    AddClientFlags(c, &client);
  }
  auto* pool_cmd = app.add_subcommand("pool", "list, create, change or remove pools");
  pool_cmd->require_subcommand(1);
  auto* pool_ls = pool_cmd->add_subcommand("ls", "list pools");
  std::string pool_name, pool_mode, pool_oversell, pool_expand_host, pool_expand_disk;
  auto* pool_create = pool_cmd->add_subcommand("create", "create a pool");
  pool_create->add_option("name", pool_name)->required();
  auto* pool_set = pool_cmd->add_subcommand("set", "change a pool's placement mode, oversell ratio or VRAM "
                                                   "expansion into host memory or disk");
  pool_set->add_option("name", pool_name)->required();
  for (auto* c : {pool_create, pool_set}) {
    c->add_option("--mode", pool_mode, "placement mode: NodeCompactGPULowLoad, CompactFirst, LowLoadFirst, "
                                       "BestFit, FGD or FragAware");
    c->add_option("--oversell", pool_oversell, "TFLOPS oversell ratio, 1 to 100 (1: no overselling)");
    c->add_option("--vram-expand-host", pool_expand_host,
                  "percent of each GPU's VRAM that vGPUs may oversubscribe into host memory (0-400; its "
                  "allocations get VRAM tiering)");
    c->add_option("--vram-expand-disk", pool_expand_disk,
                  "percent of each GPU's VRAM that vGPUs may oversubscribe onto disk (0-400)");
  }
  auto* pool_rm = pool_cmd->add_subcommand("rm", "remove a pool");
  pool_rm->add_option("name", pool_name)->required();
  for (auto* c : {pool_ls, pool_create, pool_set, pool_rm}) AddClientFlags(c, &client);

  auto* quota_cmd = app.add_subcommand("quota", "per-tenant quotas on TFLOPS, VRAM and vGPUs");
  quota_cmd->require_subcommand(1);
  std::string quota_tenant, quota_tflops, quota_vram, quota_gpus, quota_max_qos;
  auto* quota_set = quota_cmd->add_subcommand("set", "set a tenant's limits (others keep their value; 0 = no limit)");
  quota_set->add_option("tenant", quota_tenant)->required();
  quota_set->add_option("--tflops", quota_tflops, "FP16 TFLOPS the tenant's allocations may hold in total");
  quota_set->add_option("--vram", quota_vram, "VRAM in total, e.g. 40GiB");
  quota_set->add_option("--gpus", quota_gpus, "vGPUs in total");
  quota_set->add_option("--max-qos", quota_max_qos,
                        "the highest QoS its allocations may ask for (low, medium, high, critical; any = no cap): "
                        "QoS decides who preempts whom");
  auto* quota_get = quota_cmd->add_subcommand("get", "a tenant's limits and use");
  quota_get->add_option("tenant", quota_tenant)->required();
  auto* quota_ls = quota_cmd->add_subcommand("ls", "every tenant's limits and use");
  auto* quota_rm = quota_cmd->add_subcommand("rm", "remove a tenant's quota (its allocations stay)");
  quota_rm->add_option("tenant", quota_tenant)->required();
  for (auto* c : {quota_set, quota_get, quota_ls, quota_rm}) AddClientFlags(c, &client);
  auto* node_cmd = app.add_subcommand("node", "list nodes, cordon or uncordon one, or remove one");
  node_cmd->require_subcommand(1);
  auto* node_ls = node_cmd->add_subcommand("ls", "list nodes and their GPUs");
  AddClientFlags(node_ls, &client);
  std::string node_rm_name;
  auto* node_rm = node_cmd->add_subcommand("rm", "remove a node that holds no allocations (its agent may enroll again)");
  node_rm->add_option("name", node_rm_name)->required();
  AddClientFlags(node_rm, &client);
  std::string node_cordon_name;
  auto* node_cordon = node_cmd->add_subcommand(
      "cordon", "keep new allocations off a node (admin): it keeps its allocations and running work; to drain it "
                "for maintenance, cordon it and wait until `tfusion node ls` shows 0 under ALLOCS");
  node_cordon->add_option("name", node_cordon_name)->required();
  auto* node_uncordon = node_cmd->add_subcommand("uncordon", "let a cordoned node take new allocations again (admin)");
  node_uncordon->add_option("name", node_cordon_name)->required();
  for (auto* c : {node_cordon, node_uncordon}) AddClientFlags(c, &client);
  tf::controller::TokenSpec token_spec;
  std::string token_rm_id;
  auto* token_cmd = app.add_subcommand("token", "API tokens with a role: admin, tenant (its own allocations), node");
  token_cmd->require_subcommand(1);
  auto* token_create = token_cmd->add_subcommand("create", "create a token (printed once; stored hashed)");
  token_create->add_option("--role", token_spec.role, "admin, tenant or node")->required();
  token_create->add_option("--tenant", token_spec.tenant, "the tenant a tenant token speaks for");
  token_create->add_option("--node", token_spec.node, "the node a node token speaks for");
  token_create->add_option("--description", token_spec.description, "free text shown by token ls");
  auto* token_ls = token_cmd->add_subcommand("ls", "list tokens (never their secrets)");
  auto* token_rm = token_cmd->add_subcommand("rm", "revoke a token");
  token_rm->add_option("id", token_rm_id)->required();
  for (auto* c : {token_create, token_ls, token_rm}) AddClientFlags(c, &client);
  auto* patch_cmd = app.add_subcommand("patch", "change a pooled allocation's tier idle timeouts");
  std::string patch_id, patch_idle_swap, patch_idle_disk, patch_idle_zero;
  patch_cmd->add_option("allocation", patch_id, "allocation id (tfusion ps)")->required();
  patch_cmd->add_option("--idle-swap", patch_idle_swap,
                        "swap out after this long without GPU calls (10s, 5m; 0 = never; 'default': the QoS's)");
  patch_cmd->add_option("--idle-disk", patch_idle_disk, "move swapped VRAM on to the disk tier after this long idle");
  patch_cmd->add_option("--idle-zero", patch_idle_zero,
                        "scale to zero (driver checkpoint) after this long idle; longer than the swap timeout");
  AddClientFlags(patch_cmd, &client);
  auto* ps_cmd = app.add_subcommand("ps", "list allocations");
  AddClientFlags(ps_cmd, &client);
  auto* top_cmd = app.add_subcommand("top", "GPUs of the pool and their use, redrawn until Ctrl-C");
  std::string top_interval = "2";
  bool top_once = false;
  top_cmd->add_option("--interval,-d", top_interval, "seconds between redraws, 0.1 to 3600")->capture_default_str();
  top_cmd->add_flag("--once", top_once, "print the table once and exit (scripts)");
  AddClientFlags(top_cmd, &client);

  tf::k8s::K8sOptions k8s;
  auto* k8s_cmd = app.add_subcommand("k8s", "Kubernetes admission webhook and scheduler extender (HTTPS)");
  k8s_cmd->add_option("--listen", k8s.listen_host, "address")->capture_default_str();
  k8s_cmd->add_option("--port", k8s.port, "HTTPS port (0: any)")->capture_default_str();
  k8s_cmd->add_option("--tls-cert", k8s.tls_cert, "server certificate (PEM)")->required();
  k8s_cmd->add_option("--tls-key", k8s.tls_key, "server private key (PEM)")->required();
  k8s_cmd->add_option("--controller", k8s.controller_url, "controller URL")->required();
  k8s_cmd->add_option("--token-file", k8s.token_file, "file holding the controller token (else $TFUSION_TOKEN)");
  AddCaFileFlag(k8s_cmd, &k8s.ca_file);
  k8s_cmd->add_option("--scheduler-name", k8s.scheduler_name, "schedulerName set on TensorFusion pods")
      ->capture_default_str();
  k8s_cmd->add_option("--limiter-image", k8s.limiter_image, "image of the init container that copies the libraries")
      ->capture_default_str();
  k8s_cmd->add_option("--worker-token-secret", k8s.worker_token_secret,
                      "remote pods: Secret (key token) with what the client stub presents to the worker");
  k8s_cmd->add_option("--worker-token-file", k8s.worker_token_file,
                      "remote pods: file whose first line is the workers' token; each pod gets its own session "
                      "ticket, bound to its limits and allocation (instead of --worker-token-secret)");
  k8s_cmd->add_option("--ticket-days", k8s.ticket_days, "how long a pod's session ticket opens sessions, 1 to 3650")
      ->capture_default_str();
  k8s_cmd->add_option("--host-shm-dir", k8s.host_shm_dir,
                      "local pods: the node agents' quota regions on the host (their $TFUSION_SHM_DIR)")
      ->capture_default_str();
  k8s_cmd->add_option("--kube-api", k8s.kube_api, "Kubernetes API server, https://HOST:PORT or in-cluster (default)");
  k8s_cmd->add_option("--kube-token-file", k8s.kube_token_file, "its token (default: the service account's)");
  k8s_cmd->add_option("--kube-ca-file", k8s.kube_ca_file, "its CA (default: the service account's)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; every usage error exits 2, as other command-line tools do
    // (CLI11's own codes, 105-115, read like a command's exit status under `tfusion run`).
    return app.exit(e) == 0 ? 0 : 2;
  }

  if (run_cmd->parsed()) {
    // Left empty, these mean "no limit" (the whole GPU, no cap): an empty value given (an unset
    // variable, `--vram "$VRAM"`) is refused rather than taken for that.
    for (const char* name : {"--vram", "--tflops", "--percent", "--tflops-limit", "--percent-limit", "--qos", "--gpu",
                             "--vgpu"}) {
      const CLI::Option* opt = run_cmd->get_option(name);
      bool empty = opt->count() > 0 && opt->results().empty();
      for (const std::string& value : opt->results()) empty = empty || value.empty();
      if (empty) {
        std::fprintf(stderr, "tfusion run: %s was given an empty value (an unset variable?); leave the flag out for "
                             "its default\n", name);
        return 2;
      }
    }
  }
  if (run_cmd->parsed() && !run_gpu.empty()) {
    if (auto g = tf::cli::ParseGpuSelector(run_gpu, &run); !g.ok()) {
      std::fprintf(stderr, "tfusion run: %s\n", g.message().c_str());
      return 2;
    }
  }
  if (run_cmd->parsed() && !run_ca_file.empty()) {
    // The pool calls of tfusion run read the CA file from the environment (HttpClient's default),
    // and so does the client stub for a worker served over TLS.
    if (tf::Status ca = tf::controller::CheckCaFile(run_ca_file); !ca.ok()) return UsageError("tfusion run", ca);
    setenv("TFUSION_CA_FILE", run_ca_file.c_str(), 1);
  }
  if (run_cmd->parsed() && !remote.empty()) {
    if (run.tiering || !run.idle_swap.empty() || !run.disk_tier.empty() || !run.idle_zero.empty()) {
      std::fprintf(stderr, "tfusion run: --tiering, --idle-swap and --idle-zero work on a local vGPU only, not with --remote\n");
      return 2;
    }
    if (!run.vgpu.empty()) {
      std::fprintf(stderr, "tfusion run: --vgpu names a vGPU of this machine; with --remote the "
                           "worker makes one per client from --vram/--tflops/--percent\n");
      return 2;
    }
    if (!run.mps_pipe_dir.empty()) {
      std::fprintf(stderr, "tfusion run: --mps-pipe-dir names an MPS daemon of this machine; a remote "
                           "session runs on the worker's host, whose operator decides about MPS\n");
      return 2;
    }
    if (tf::Status c = tf::cli::CheckRemoteComputeFlags(tf::cli::ComputeFlagsOf(run), run.qos); !c.ok()) {
      std::fprintf(stderr, "tfusion run: %s\n", c.message().c_str());
      return 2;
    }
    // Checked here for the syntax; the worker checks them against its GPU.
    if (!run.vram.empty()) {
      if (auto v = tf::cli::ParseVramSize("--vram", run.vram); !v.ok()) {
        std::fprintf(stderr, "tfusion run: %s\n", v.status().message().c_str());
        return 2;
      }
    }
    // --gpu goes as typed (index or UUID of the worker's GPU); the worker checks it.
    return tf::cli::RunRemote(remote, run.token, run.command,
                              {run.vram, run.tflops, run.percent, run_gpu, run.tflops_limit, run.percent_limit, run.qos});
  }
  if (run_cmd->parsed()) return tf::cli::RunCommand(run);
  if (worker_cmd->parsed()) {
    if (worker_token.empty() && !worker_token_file.empty()) {
      std::ifstream in(worker_token_file);
      if (!in || !std::getline(in, worker_token) || worker_token.empty()) {
        std::fprintf(stderr, "tfusion worker: cannot read a token from %s\n", worker_token_file.c_str());
        return 2;
      }
    }
    // The MPS daemon the sessions with a vGPU go under, as `tfusion run` chooses it: one given
    // (flag or environment) is checked now and a bad one refused; the node agent's is looked up
    // for each session, since the agent may start or stop while the worker runs.
    auto mps = tf::cli::ChooseMpsPipeDirectory(worker_mps_pipe_dir, "tfusion worker");
    if (!mps.ok()) {
      std::fprintf(stderr, "tfusion worker: %s\n", mps.status().message().c_str());
      return 2;
    }
    const char* mps_env = getenv(tf::hypervisor::kMpsPipeDirEnv);
    const bool mps_given = !worker_mps_pipe_dir.empty() || (mps_env != nullptr && *mps_env != '\0');
    const std::string mps_dir = mps_given ? *mps : "";
    if (!mps->empty()) {
      std::fprintf(stderr, "tfusion worker: MPS: sessions with a vGPU run under the MPS daemon of %s\n",
                   mps->c_str());
    }
    // A client that asks for limits or a GPU of its own gets a vGPU "remote-<session pid>" (with
    // "@<allocation id>" for a pooled run placed here: worker_sessions.h) on that
    // GPU (default GPU 0), made in its session before the driver loads and enforced by the
    // limiter; the session sees only that GPU. It goes with the session.
    hooks.prepare_limits = [&](const tf::worker::SessionLimits& l, pid_t session,
                               std::vector<std::pair<std::string, std::string>>* env,
                               std::string* driver) -> std::string {
      tf::cli::RunOptions ro;
      ro.vram = l.vram;
      ro.tflops = l.tflops;
      ro.percent = l.percent;
      ro.tflops_limit = l.tflops_limit;
      ro.percent_limit = l.percent_limit;
      ro.qos = l.qos;
      ro.driver = worker_driver;
      ro.nvml = worker_nvml;
      ro.tiering = worker_tiering || !worker_idle_swap.empty();
      ro.idle_swap = worker_idle_swap;
      ro.idle_zero = worker_idle_zero;
      // A client from a pool allocation sends its idle timeouts (limits record 4; 5 adds the idle
      // zero timeout and the allocation the session's vGPU is bound to): they win over the
      // worker's. Without --tiering they change nothing.
      std::string vgpu_id;
      if (tf::Status a = tf::cli::ApplyClientAllocation(l, session, static_cast<bool>(hooks.keeper), &ro, &vgpu_id);
          !a.ok())
        return a.message();
      if (!l.gpu.empty()) {
        if (tf::Status g = tf::cli::ParseGpuSelector(l.gpu, &ro); !g.ok()) return g.message();
      }
      if (mps_dir.empty()) {
        ro.mps_pipe_dir = tf::cli::PublishedMpsPipeDirectoryIfRunning("tfusion worker");
      } else if (tf::Status st = tf::hypervisor::CheckMpsPipeDirectory("the MPS pipe directory", mps_dir); !st.ok()) {
        std::fprintf(stderr, "tfusion worker: session %d: %s; running without MPS\n", static_cast<int>(session),
                     st.message().c_str());
      } else {
        ro.mps_pipe_dir = mps_dir;
      }
      // Held by the session until it exits: a worker killed outright leaves the vGPU, and this
      // tells the next worker (or `tfusion smi`) that its session is gone. Without a lock folder
      // of its own nothing is ever removed that way, and the session runs (logged); a lock file
      // it made but could not lock would be taken for an ended session's, so it is refused.
      // A vGPU of this id that a dead session of the same pid left (its worker killed outright,
      // no sweep since) is removed first, so that this session does not take over its counters.
      // Still in use (a live session of another PID namespace with this pid): shared, as before.
      tf::hypervisor::ClearEndedVgpuOfId(tf::cli::RegionDir(), vgpu_id);
      std::string unlocked;
      if (tf::hypervisor::HoldSessionVgpuLock(tf::cli::RegionDir(), vgpu_id, &unlocked) < 0) {
        if (tf::hypervisor::SessionLockDirTrusted(tf::cli::RegionDir(), false, nullptr))
          return "cannot take the session's lock: " + unlocked;
        std::fprintf(stderr, "tfusion worker: session %d: %s; its vGPU stays if the worker is killed outright\n",
                     static_cast<int>(session), unlocked.c_str());
      }
      auto prepared = tf::cli::PrepareVgpu(ro, vgpu_id);
      if (!prepared.ok()) return prepared.status().message();
      if (tf::Status f = tf::cli::FinishSessionVgpu(prepared->region_path, vgpu_id); !f.ok()) return f.message();
      *env = prepared->env;
      *driver = prepared->limiter;
      if (!ro.mps_pipe_dir.empty()) {
        std::fprintf(stderr, "tfusion worker: session %d runs under the MPS daemon of %s\n", static_cast<int>(session),
                     ro.mps_pipe_dir.c_str());
      }
      return "";
    };
    hooks.spin_us = worker_spin_us;
    hooks.spin_sessions = worker_spin_sessions;
    hooks.session_host_mem = worker_host_mem;
    hooks.vgpu_for_every_session = worker_tiering || !worker_idle_swap.empty();
    if (!worker_idle_swap.empty()) {
      if (auto ms = tf::cli::ParseDurationMs("--idle-swap", worker_idle_swap); !ms.ok()) {
        std::fprintf(stderr, "tfusion worker: %s\n", ms.status().message().c_str());
        return 2;
      }
    }
    if (!worker_idle_zero.empty()) {
      if (!hooks.vgpu_for_every_session) {
        std::fprintf(stderr, "tfusion worker: --idle-zero needs --tiering\n");
        return 2;
      }
      auto zero = tf::cli::ParseDurationMs("--idle-zero", worker_idle_zero);
      if (!zero.ok()) {
        std::fprintf(stderr, "tfusion worker: %s\n", zero.status().message().c_str());
        return 2;
      }
      // Against the worker's own swap timeout (the flag, else the default QoS's).
      auto swap = worker_idle_swap.empty() ? tf::StatusOr<uint64_t>(tf::limiter::DefaultIdleSwapMs(tf::limiter::kDefaultQos))
                                           : tf::cli::ParseDurationMs("--idle-swap", worker_idle_swap);
      tf::Status valid = tf::controller::ValidateIdleZero(
          "--idle-zero", static_cast<int64_t>(*zero), worker_idle_swap.empty() ? "the QoS's idle swap timeout" : "--idle-swap",
          static_cast<int64_t>(*swap));
      if (!valid.ok()) {
        std::fprintf(stderr, "tfusion worker: %s\n", valid.message().c_str());
        return 2;
      }
    }
    if (hooks.vgpu_for_every_session) {
      // Scale to zero: the keeper restores a checkpointed session at its client's next call, and
      // checkpoints idle ones (--idle-zero); `tfusion freeze remote-PID --zero` checkpoints.
      auto libcuda = tf::cli::FindDriverLibrary("libcuda.so.1", worker_driver, "TFUSION_REAL_LIBCUDA");
      if (libcuda.ok()) {
        hooks.keeper = [path = *libcuda](const std::atomic<bool>& stop) { tf::cli::RunWorkerZeroKeeper(path, stop); };
      } else {
        std::fprintf(stderr, "tfusion worker: sessions cannot be checkpointed (scale to zero): %s\n",
                     libcuda.status().message().c_str());
      }
    }
    // Sessions that ask for a vGPU need NVML to find their GPU: said at start, not at each
    // refused client.
    if (auto nvml = tf::cli::FindDriverLibrary("libnvidia-ml.so.1", worker_nvml, "TFUSION_REAL_LIBNVML"); !nvml.ok()) {
      std::fprintf(stderr, "tfusion worker: clients that ask for a vGPU (--vram, --tflops, --percent, --gpu) will be "
                   "refused: %s\n", nvml.status().message().c_str());
    }
    hooks.session_ended = [](pid_t session) {
      tf::cli::RemoveSessionVgpus(session);
    };
    // What sessions of a worker killed outright (SIGKILL) left: their vGPUs, no longer used. At
    // start, then every 10 s (sessions still dying at start, stuck in the driver's teardown,
    // hold their locks until they are gone).
    hooks.periodic = [] {
      if (std::vector<std::string> gone = tf::cli::RemoveEndedSessionVgpus(); !gone.empty()) {
        std::string ids;
        for (const std::string& id : gone) ids += (ids.empty() ? "" : ", ") + id;
        std::fprintf(stderr, "tfusion worker: removed %zu vGPU(s) that ended sessions or runs left (a worker or a "
                     "tfusion run killed outright, or a stop that timed out): %s\n", gone.size(), ids.c_str());
      }
    };
    hooks.periodic();
    return tf::cli::RunWorkerCommand(worker_listen, worker_token, worker_driver, worker_env,
                                     worker_ready, hooks);
  }
  if (smi_cmd->parsed()) return tf::cli::SmiCommand(smi_processes);
  if ((freeze_cmd->parsed() || thaw_cmd->parsed()) && freeze_via_controller && !freeze_zero.driver.empty()) {
    std::fprintf(stderr, "tfusion: --driver works on a local vGPU only, not with --controller (the node agent "
                         "uses its own)\n");
    return 2;
  }
  if (freeze_cmd->parsed() && freeze_via_controller)
    return tf::controller::AllocationTier(client, freeze_vgpu, true, freeze_zero.zero);
  if (patch_cmd->parsed()) {
    tf::controller::IdlePatch patch;
    for (auto [flag, text, out] : {std::tuple{"--idle-swap", &patch_idle_swap, &patch.idle_swap_ms},
                                   std::tuple{"--idle-disk", &patch_idle_disk, &patch.idle_disk_ms},
                                   std::tuple{"--idle-zero", &patch_idle_zero, &patch.idle_zero_ms}}) {
      if (text->empty()) continue;
      if (*text == "default") {
        *out = -1;
        continue;
      }
      tf::StatusOr<uint64_t> ms = tf::cli::ParseDurationMs(flag, *text);
      if (!ms.ok()) return UsageError("tfusion patch", ms.status());
      *out = static_cast<int64_t>(*ms);
    }
    return tf::controller::AllocationPatch(client, patch_id, patch);
  }
  if (thaw_cmd->parsed() && freeze_via_controller) return tf::controller::AllocationTier(client, thaw_vgpu, false);
  if (freeze_cmd->parsed()) return tf::cli::FreezeCommand(freeze_vgpu, true, freeze_timeout, !freeze_no_wait, freeze_zero);
  if (thaw_cmd->parsed()) return tf::cli::FreezeCommand(thaw_vgpu, false, freeze_timeout, !freeze_no_wait, freeze_zero);
  if (k8s_cmd->parsed()) return tf::k8s::RunK8s(k8s);
  // --host-tier-budget of `up` and `hypervisor`: a size, or 0 for no host tier.
  for (auto [text, bytes] : {std::pair{&up_host_tier_budget, &up.host_tier_budget_bytes},
                             std::pair{&hv_host_tier_budget, &hv.host_tier_budget_bytes}}) {
    if (text->empty()) continue;
    auto parsed = *text == "0" ? tf::StatusOr<uint64_t>(uint64_t{0}) : tf::cli::ParseVramSize("--host-tier-budget", *text);
    if (!parsed.ok()) {
      std::fprintf(stderr, "tfusion: %s\n", parsed.status().message().c_str());
      return 2;
    }
    *bytes = static_cast<int64_t>(*parsed);
  }
  if (up_cmd->parsed()) return tf::controller::RunUp(up);
  if (ctl_cmd->parsed()) return tf::controller::RunController(ctl);
  if (hv_cmd->parsed()) return tf::controller::RunHypervisor(hv);
  if (device_plugin.cmd->parsed()) return tf::deviceplugin::RunDevicePluginCommand(*device_plugin.options);
  if (pool_ls->parsed()) return tf::controller::PoolList(client);
  if (pool_create->parsed() || pool_set->parsed()) {
    tf::controller::PoolSettings settings{pool_name, std::nullopt, std::nullopt, std::nullopt, std::nullopt};
    if (!pool_mode.empty()) settings.placement_mode = pool_mode;
    if (!pool_oversell.empty()) {
      tf::StatusOr<double> r = tf::cli::ParsePositive("--oversell", pool_oversell, 100);
      if (r.ok() && *r < 1) r = tf::InvalidArgument("--oversell " + pool_oversell + ": must be at least 1");
      if (!r.ok()) return UsageError("tfusion pool", r.status());
      settings.tflops_oversell_ratio = *r;
    }
    for (auto [flag, text, field] : {std::tuple{"--vram-expand-host", &pool_expand_host, &settings.vram_expand_to_host_percent},
                                     std::tuple{"--vram-expand-disk", &pool_expand_disk, &settings.vram_expand_to_disk_percent}}) {
      if (text->empty()) continue;
      tf::StatusOr<uint64_t> r = tf::cli::ParseCount(flag, *text, 400);
      if (!r.ok()) return UsageError("tfusion pool", r.status());
      *field = static_cast<int>(*r);
    }
    return pool_set->parsed() ? tf::controller::PoolSet(client, settings)
                              : tf::controller::PoolCreate(client, settings);
  }
  if (quota_set->parsed()) {
    tf::controller::QuotaSettings q{quota_tenant, std::nullopt, std::nullopt, std::nullopt, std::nullopt};
    if (!quota_max_qos.empty()) {
      if (quota_max_qos != "any" && !tf::controller::ParseQos(quota_max_qos).ok())
        return UsageError("tfusion quota", tf::InvalidArgument("--max-qos must be one of low, medium, high, critical, any"));
      q.max_qos = quota_max_qos == "any" ? "" : quota_max_qos;
    }
    if (!quota_tflops.empty()) {
      tf::StatusOr<double> t = tf::cli::ParseLimit("--tflops", quota_tflops);
      if (!t.ok()) return UsageError("tfusion quota", t.status());
      q.max_tflops = *t;
    }
    if (!quota_vram.empty()) {
      tf::StatusOr<uint64_t> v = tf::cli::ParseVramLimitMib("--vram", quota_vram);
      if (!v.ok()) return UsageError("tfusion quota", v.status());
      q.max_vram_mib = static_cast<int64_t>(*v);
    }
    if (!quota_gpus.empty()) {
      tf::StatusOr<uint64_t> g = tf::cli::ParseCount("--gpus", quota_gpus, 100000);
      if (!g.ok()) return UsageError("tfusion quota", g.status());
      q.max_gpus = static_cast<int>(*g);
    }
    return tf::controller::QuotaSet(client, q);
  }
  if (quota_get->parsed()) return tf::controller::QuotaGet(client, quota_tenant);
  if (quota_ls->parsed()) return tf::controller::QuotaList(client);
  if (quota_rm->parsed()) return tf::controller::QuotaRemove(client, quota_tenant);
  if (pool_rm->parsed()) return tf::controller::PoolDelete(client, pool_name);
  if (node_ls->parsed()) return tf::controller::NodeList(client);
  if (node_rm->parsed()) return tf::controller::NodeRemove(client, node_rm_name);
  if (node_cordon->parsed()) return tf::controller::NodeCordon(client, node_cordon_name, true);
  if (node_uncordon->parsed()) return tf::controller::NodeCordon(client, node_cordon_name, false);
  if (token_create->parsed()) return tf::controller::TokenCreate(client, token_spec);
  if (token_ls->parsed()) return tf::controller::TokenList(client);
  if (token_rm->parsed()) return tf::controller::TokenRevoke(client, token_rm_id);
  if (ps_cmd->parsed()) return tf::controller::Ps(client);
  if (top_cmd->parsed()) {
    tf::StatusOr<double> interval = tf::cli::ParsePositive("--interval", top_interval, 3600);
    if (interval.ok() && *interval < 0.1)
      interval = tf::InvalidArgument("--interval " + top_interval + ": must be at least 0.1 seconds");
    if (!interval.ok()) {
      std::fprintf(stderr, "tfusion top: %s\n", interval.status().message().c_str());
      return 2;
    }
    return tf::controller::Top(client, {*interval, top_once});
  }
  return 1;
}
