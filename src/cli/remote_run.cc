#include "cli/remote_run.h"

#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <utility>

#include "cli/forward_signals.h"
#include "cli/quantity.h"
#include "worker/session_host_memory.h"
#include "controller/tls_files.h"
#include "transport/tcp_transport.h"
#include "worker/session_ticket.h"
#include "worker/worker.h"

namespace tf::cli {
namespace {

pid_t g_remote_child = 0;

bool IsFile(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string ExeDirectory() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  buf[n] = '\0';
  std::string s(buf);
  auto slash = s.rfind('/');
  return slash == std::string::npos ? "." : s.substr(0, slash);
}

std::string ClientInjectDir(std::string* looked) {
  std::vector<std::string> candidates;
  if (const char* env = getenv("TFUSION_CLIENT_DIR"); env && *env) candidates.push_back(env);
  std::string exe = ExeDirectory();
  candidates.push_back(exe + "/../client/inject");
  candidates.push_back(exe + "/../lib/tensorfusion/client-inject");
  for (const auto& c : candidates) {
    if (IsFile(c + "/libcuda.so.1")) {
      char real[PATH_MAX];
      return realpath(c.c_str(), real) ? std::string(real) : c;
    }
    *looked += (looked->empty() ? "" : ", ") + c;
  }
  return "";
}

}  // namespace

int RunRemote(const std::string& remote, const std::string& token,
              const std::vector<std::string>& command, const RemoteLimits& limits) {
  if (command.empty()) {
    fprintf(stderr, "tfusion run: no command given (usage: tfusion run --remote HOST:PORT -- CMD)\n");
    return 2;
  }
  if (remote.empty()) {
    fprintf(stderr, "tfusion run: --remote needs HOST:PORT or unix:/path of a tfusion worker\n");
    return 2;
  }
  std::string looked;
  std::string inject = ClientInjectDir(&looked);
  if (inject.empty()) {
    fprintf(stderr, "tfusion run: the remote client library is not installed (looked in %s; set "
                    "TFUSION_CLIENT_DIR)\n", looked.c_str());
    return 2;
  }
  std::string ld = inject;
  if (const char* old = getenv("LD_LIBRARY_PATH"); old && *old) ld += std::string(":") + old;
  // Valid for TFUSION_TICKET_TTL seconds (default a day): long enough for the command, shorter
  // than forever.
  int64_t ttl = 24 * 3600;
  if (const char* t = getenv("TFUSION_TICKET_TTL"); t && *t) {
    char* end = nullptr;
    long long v = strtoll(t, &end, 10);
    if (*end != '\0' || v <= 0 || v > 365LL * 24 * 3600) {
      fprintf(stderr, "tfusion run: TFUSION_TICKET_TTL=%s: give whole seconds from 1 to a year\n", t);
      return 2;
    }
    ttl = v;
  }
  // Bound to the limits the program is given below: a session it opens without them, or with
  // others, is refused by the worker (docs/remote.md, "Session tickets").
  const std::string ticket =
      token.empty() ? "" : worker::MintSessionTicket(token, time(nullptr) + ttl, worker::SessionLimitsDigest(limits));
  if (!token.empty() && ticket.empty()) {
    fprintf(stderr, "tfusion run: cannot make a session ticket (no randomness)\n");
    return 2;
  }
  g_remote_child = fork();
  if (g_remote_child < 0) {
    fprintf(stderr, "tfusion run: fork: %s\n", strerror(errno));
    return 2;
  }
  if (g_remote_child == 0) {
    setenv("LD_LIBRARY_PATH", ld.c_str(), 1);
    setenv("TFUSION_REMOTE", remote.c_str(), 1);
    // The program gets a session ticket, never the worker's token (docs/remote.md).
    unsetenv("TFUSION_TOKEN");
    if (!ticket.empty()) setenv("TFUSION_TOKEN", ticket.c_str(), 1);
    setenv("TRITON_LIBCUDA_PATH", inject.c_str(), 1);
    unsetenv("TFUSION_REAL_LIBCUDA");
    // The stub sends these with its first request; the worker validates them.
    for (const worker::LimitsEnvVar& v : worker::kLimitsEnv) {
      const std::string& value = limits.*v.field;
      unsetenv(v.name);
      if (!value.empty()) setenv(v.name, value.c_str(), 1);
    }
    std::vector<char*> argv;
    for (const auto& a : command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    const int why = errno;
    fprintf(stderr, "tfusion run: cannot run %s: %s\n", argv[0], strerror(why));
    _exit(why == ENOENT ? 127 : 126);  // as a shell: not found, or found and not runnable
  }
  ForwardSignalsTo(g_remote_child);
  int status = 0;
  while (waitpid(g_remote_child, &status, 0) < 0 && errno == EINTR) {
  }
  StopForwardingSignals();
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

int RunWorkerCommand(const std::vector<std::string>& listen, const std::string& token,
                     const std::string& driver, const std::vector<std::string>& session_env,
                     const std::string& ready_file, const WorkerHooks& hooks) {
  worker::WorkerOptions o;
  o.listen = listen;
  o.token = token;
  o.ready_file = ready_file;
  o.spin_us = hooks.spin_us;
  o.spin_sessions = hooks.spin_sessions;
  o.driver_path = driver;
  if (o.driver_path.empty()) {
    if (const char* env = getenv("TFUSION_REAL_LIBCUDA"); env && *env) o.driver_path = env;
  }
  if (o.driver_path.empty()) {
    for (const char* p : {"/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/usr/lib64/libcuda.so.1",
                          "/usr/local/nvidia/lib64/libcuda.so.1", "/usr/lib/wsl/lib/libcuda.so.1",
                          "/lib/x86_64-linux-gnu/libcuda.so.1"}) {
      if (IsFile(p)) {
        o.driver_path = p;
        break;
      }
    }
  }
  if (o.driver_path.empty()) {
    fprintf(stderr, "tfusion worker: no NVIDIA driver found (give --driver or set "
                    "TFUSION_REAL_LIBCUDA)\n");
    return 2;
  }
  for (const auto& kv : session_env) {
    auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) {
      fprintf(stderr, "tfusion worker: --session-env wants KEY=VALUE, got '%s'\n", kv.c_str());
      return 2;
    }
    o.session_env.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
  }
  if (token.empty()) {
    fprintf(stderr, "tfusion worker: warning: no --token: any client that reaches the listener "
                    "is accepted\n");
  }
  if (!hooks.session_host_mem.empty()) {
    auto bytes = ParseVramSize("--session-host-mem", hooks.session_host_mem);
    if (!bytes.ok()) {
      fprintf(stderr, "tfusion worker: %s\n", bytes.status().message().c_str());
      return 2;
    }
    o.session_host_mem = *bytes;
  }
  fprintf(stderr, "tfusion worker: each session may pin %.4g MiB of host memory%s\n",
          static_cast<double>(o.session_host_mem ? o.session_host_mem : worker::DefaultSessionHostMemory()) /
              (1 << 20),
          o.session_host_mem ? "" : " (a quarter of this machine's memory; --session-host-mem)");
  controller::ServerTlsFiles tls{hooks.tls_cert, hooks.tls_key};
  if (tls.enabled()) {
    StatusOr<std::string> cert = controller::CheckServerTls(tls, time(nullptr));
    if (!cert.ok()) {
      fprintf(stderr, "tfusion worker: %s\n", cert.status().message().c_str());
      return 2;
    }
    fprintf(stderr, "tfusion worker: TCP clients only over TLS, certificate %s\n", cert->c_str());
    o.tls_cert = hooks.tls_cert;
    o.tls_key = hooks.tls_key;
  }
  for (const auto& addr : listen) {
    transport::HostPort hp;
    if (tls.enabled() || addr.rfind("unix:", 0) == 0 || !transport::ParseHostPort(addr.c_str(), &hp).ok()) {
      continue;
    }
    if (!controller::IsLoopbackHost(hp.host)) {
      fprintf(stderr, "tfusion worker: warning: %s is reachable from the network and served without "
                      "TLS: calls, session ids and every byte tenants copy cross it in clear (give "
                      "--tls-cert/--tls-key)\n", addr.c_str());
    }
  }
  o.prepare_limits = hooks.prepare_limits;
  o.vgpu_for_every_session = hooks.vgpu_for_every_session;
  o.session_ended = hooks.session_ended;
  o.periodic = hooks.periodic;
  o.keeper = hooks.keeper;
  return worker::RunWorker(o);
}

}  // namespace tf::cli
