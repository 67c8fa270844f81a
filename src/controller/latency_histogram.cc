#include "controller/latency_histogram.h"

#include <cmath>
#include <cstdio>
#include <vector>

namespace tf::controller {

double LatencyHistogram::UpperEdge(int bucket) {
  return 1e-6 * std::exp2(static_cast<double>(bucket) / 8.0);
}

void LatencyHistogram::Record(double seconds) {
  int b = 0;
  if (seconds > 1e-6) {
    b = static_cast<int>(std::ceil(std::log2(seconds / 1e-6) * 8.0));
    if (b < 0) b = 0;
    if (b >= kBuckets) b = kBuckets - 1;
  }
  counts_[static_cast<size_t>(b)].fetch_add(1, std::memory_order_relaxed);
  const double ns = seconds > 0 ? seconds * 1e9 : 0;
  sum_ns_.fetch_add(static_cast<uint64_t>(ns), std::memory_order_relaxed);
}

uint64_t LatencyHistogram::Count() const {
  uint64_t n = 0;
  for (const auto& c : counts_) n += c.load(std::memory_order_relaxed);
  return n;
}

double LatencyHistogram::Quantile(double q) const {
  const uint64_t n = Count();
  if (n == 0) return 0;
  const auto rank = static_cast<uint64_t>(std::ceil(q * static_cast<double>(n)));
  uint64_t seen = 0;
  for (int b = 0; b < kBuckets; ++b) {
    seen += counts_[static_cast<size_t>(b)].load(std::memory_order_relaxed);
    if (seen >= rank && seen > 0) return UpperEdge(b);
  }
  return UpperEdge(kBuckets - 1);
}

void LatencyHistogram::Reset() {
  for (auto& c : counts_) c.store(0, std::memory_order_relaxed);
  sum_ns_.store(0, std::memory_order_relaxed);
}

void LatencyHistogram::WriteTo(prom::Exposition* out, std::string_view name, prom::Labels labels) const {
  // Coarse edges: 16 us * 2^k, k = 0..17 (about 2.1 s); each is an exact bucket edge (b = 32 + 8k).
  std::vector<double> edges;
  std::vector<uint64_t> cumulative;
  uint64_t seen = 0;
  int next = 0;
  for (int k = 0; k <= 17; ++k) {
    const int edge = 32 + 8 * k;
    for (; next <= edge; ++next) seen += counts_[static_cast<size_t>(next)].load(std::memory_order_relaxed);
    edges.push_back(UpperEdge(edge));
    cumulative.push_back(seen);
  }
  for (; next < kBuckets; ++next) seen += counts_[static_cast<size_t>(next)].load(std::memory_order_relaxed);
  out->Histogram(name, labels, edges, cumulative,
                 static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) / 1e9, seen);
}

}  // namespace tf::controller
