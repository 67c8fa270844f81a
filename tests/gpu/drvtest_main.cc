// drvtest SUBCOMMAND --flag value ...: see drvtest.h for the subcommands.
#include <cstdio>
#include <cstring>

#include "drvtest.h"

int main(int argc, char** argv) {
  using namespace tf::gpu;
  if (argc < 2) {
    std::fprintf(stderr, "usage: drvtest alloc|meminfo|procaddr|hold|reclaim|arrays [--flag value]...\n");
    return 2;
  }
  Flags flags;
  if (!flags.Parse(argc, argv, 2)) return 2;
  const char* cmd = argv[1];
  int rc = 2;
  if (std::strcmp(cmd, "alloc") == 0) {
    rc = RunAlloc(flags);
  } else if (std::strcmp(cmd, "meminfo") == 0) {
    rc = RunMemInfo(flags);
  } else if (std::strcmp(cmd, "procaddr") == 0) {
    rc = RunProcAddr(flags);
  } else if (std::strcmp(cmd, "hold") == 0) {
    rc = RunHold(flags);
  } else if (std::strcmp(cmd, "reclaim") == 0) {
    rc = RunReclaim(flags);
  } else if (std::strcmp(cmd, "arrays") == 0) {
    rc = RunArrays(flags);
  } else {
    std::fprintf(stderr, "unknown subcommand '%s'\n", cmd);
    return 2;
  }
  return rc;
}
