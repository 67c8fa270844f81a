#include "controller/placement.h"

#include <algorithm>
#include <cctype>

namespace tf::controller {
namespace {

bool ModelMatches(const std::string& model, const std::string& wanted) {
  if (wanted.empty()) return true;
  auto it = std::search(model.begin(), model.end(), wanted.begin(), wanted.end(),
                        [](char a, char b) { return std::tolower(a) == std::tolower(b); });
  return it != model.end();
}

// Lower is better: the share of the GPU's compute left free after placing the request.
double LeftoverScore(const Gpu& g, const PlacementRequest& r) {
  return (g.tflops - g.used_tflops - r.tflops) / (g.tflops > 0 ? g.tflops : 1.0);
}

class CompactFirstPlacement : public PlacementEngine {
 public:
  StatusOr<PlacementDecision> Place(const PlacementRequest& r,
                                    const std::vector<const Gpu*>& gpus) override {
    // Epsilon keeps float rounding from refusing an exact fit (e.g. 10 x 0.1 TFLOPS).
    constexpr double kEps = 1e-9;
    auto fits = [&](const Gpu& g) {
      return g.schedulable && g.tflops - g.used_tflops + kEps >= r.tflops &&
             g.vram_mib - g.used_vram_mib >= r.vram_mib && ModelMatches(g.model, r.gpu_model);
    };
    PlacementDecision best;
    double best_score = 1e300;
    std::vector<const Gpu*> node_fits;
    size_t i = 0;
    while (i < gpus.size()) {
      const std::string& node = gpus[i]->node;
      node_fits.clear();
      for (; i < gpus.size() && gpus[i]->node == node; ++i) {
        if (fits(*gpus[i])) node_fits.push_back(gpus[i]);
      }
      if (static_cast<int>(node_fits.size()) < r.gpu_count) continue;
      std::partial_sort(node_fits.begin(), node_fits.begin() + r.gpu_count, node_fits.end(),
                        [&](const Gpu* a, const Gpu* b) {
                          return LeftoverScore(*a, r) < LeftoverScore(*b, r);
                        });
      double score = 0;
      for (int k = 0; k < r.gpu_count; ++k) score += LeftoverScore(*node_fits[k], r);
      if (score < best_score) {
        best_score = score;
        best.node = node;
        best.gpu_uuids.clear();
        for (int k = 0; k < r.gpu_count; ++k) best.gpu_uuids.push_back(node_fits[k]->uuid);
      }
    }
    if (best.node.empty()) {
      return OutOfMemory("no node in pool '" + r.pool + "' has " + std::to_string(r.gpu_count) +
                         " GPU(s) with " + std::to_string(r.tflops) + " TFLOPS and " +
                         std::to_string(r.vram_mib) + " MiB free");
    }
    return best;
  }
};

}  // namespace

std::unique_ptr<PlacementEngine> MakeCompactFirstPlacement() {
  return std::make_unique<CompactFirstPlacement>();
}

}  // namespace tf::controller
