// tfusion-worker: the worker as a standalone binary (the same code `tfusion worker` runs).
//   tfusion-worker --listen HOST:PORT|unix:/path [--listen ...] [--token T] [--driver LIBCUDA]
//                  [--session-env KEY=VALUE ...] [--ready-file FILE] [--session-host-mem SIZE]
//                  [--tls-cert PEM --tls-key PEM]
// The token may also come from TFUSION_TOKEN (keeps it out of the process list).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cli/remote_run.h"

int main(int argc, char** argv) {
  std::vector<std::string> listen, env;
  std::string driver, ready;
  tf::cli::WorkerHooks hooks;
  std::string token = getenv("TFUSION_TOKEN") ? getenv("TFUSION_TOKEN") : "";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* flag) -> const char* {
      if (i + 1 >= argc) {
        fprintf(stderr, "tfusion-worker: %s needs a value\n", flag);
        exit(2);
      }
      return argv[++i];
    };
    if (a == "--listen") listen.push_back(value("--listen"));
    else if (a == "--token") token = value("--token");
    else if (a == "--driver") driver = value("--driver");
    else if (a == "--session-env") env.push_back(value("--session-env"));
    else if (a == "--ready-file") ready = value("--ready-file");
    else if (a == "--session-host-mem") hooks.session_host_mem = value("--session-host-mem");
    else if (a == "--tls-cert") hooks.tls_cert = value("--tls-cert");
    else if (a == "--tls-key") hooks.tls_key = value("--tls-key");
    else {
      fprintf(stderr, "usage: tfusion-worker --listen HOST:PORT|unix:/path [--token T] "
                      "[--driver LIBCUDA] [--session-env K=V] [--ready-file F] "
                      "[--session-host-mem SIZE] [--tls-cert PEM --tls-key PEM]\n");
      return 2;
    }
  }
  return tf::cli::RunWorkerCommand(listen, token, driver, env, ready, hooks);
}
