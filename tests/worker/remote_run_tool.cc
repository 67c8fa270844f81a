// tfusion-remote-run REMOTE TOKEN -- CMD...: RunRemote as `tfusion run --remote` will call it.
#include <cstring>
#include <string>
#include <vector>

#include "cli/remote_run.h"

int main(int argc, char** argv) {
  if (argc < 5 || strcmp(argv[3], "--") != 0) return 2;
  std::vector<std::string> cmd(argv + 4, argv + argc);
  return tf::cli::RunRemote(argv[1], argv[2], cmd);
}
