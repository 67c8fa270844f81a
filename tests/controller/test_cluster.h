// Helpers shared by the controller tests: a temporary directory and a small cluster.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "controller/controller.h"

namespace tf::controller::testing {

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/tfctrl-XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Registers `nodes` nodes with `gpus_per_node` GPUs of 100 TFLOPS and 80 GiB each.
inline void AddNodes(Controller& c, int nodes, int gpus_per_node, const std::string& pool = "") {
  for (int n = 0; n < nodes; ++n) {
    NodeRegistration reg{"node-" + std::to_string(n), pool, "", {}};
    for (int g = 0; g < gpus_per_node; ++g)
      reg.gpus.push_back({"GPU-" + std::to_string(n) + "-" + std::to_string(g), "H100-SXM", g, 0,
                          100.0, 81920});
    auto st = c.RegisterNode(reg);
    if (!st.ok()) abort();
  }
}

}  // namespace tf::controller::testing
