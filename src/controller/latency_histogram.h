// LatencyHistogram: a lock-free histogram of durations, for the controller's per-stage timings
// (where an API call's time goes: waiting for the controller lock, deciding and staging under it,
// waiting for the store batch to be durable, the whole request as the HTTP server saw it).
//
// Buckets are geometric, 8 per doubling from 1 microsecond to about 17 s (quantiles come back as
// the upper edge of their bucket, so within 9 % of the true value). Record is wait-free (one
// relaxed atomic add); readers see a consistent-enough snapshot for monitoring and benchmarks.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string_view>

#include "common/prometheus_text.h"

namespace tf::controller {

class LatencyHistogram {
 public:
  static constexpr int kBuckets = 8 * 24 + 1;  // the last one holds everything longer

  void Record(double seconds);
  uint64_t Count() const;
  // The q-quantile (0 < q <= 1) in seconds, as the upper edge of its bucket; 0 when empty.
  double Quantile(double q) const;
  void Reset();
  // Prometheus histogram samples `name_bucket{labels,le="..."}` (cumulative, coarse buckets: every
  // doubling from 16 us to 2 s, and +Inf), `name_sum` and `name_count`, in seconds. The caller
  // starts the family.
  void WriteTo(prom::Exposition* out, std::string_view name, prom::Labels labels) const;

 private:
  static double UpperEdge(int bucket);  // seconds
  std::array<std::atomic<uint64_t>, kBuckets> counts_{};
  std::atomic<uint64_t> sum_ns_{0};
};

}  // namespace tf::controller
