// Token-bucket arithmetic shared by both compute modes (compute_lease.cc, compute_share.cc).
// Buckets hold GPU-busy nanoseconds and refill at a share of the GPU in ppm.
//
// Bucket and time words live in the world-writable region: any tenant may have written any value
// into them. Arithmetic on such a word goes through ElapsedNs or SaneTokens first, so that no
// value read from the region can overflow (undefined behaviour) in the process reading it.
#pragma once

#include <cstdint>

#include "limiter/core/region_layout.h"

namespace tf::limiter::bucket {

inline constexpr int64_t kMinBurstNs = 2'000'000;               // cap is max(share x 100 ms, 2 ms)
inline constexpr int64_t kMaxRefillGapNs = 1'000'000'000'000;   // 1000 s: keeps share x dt in int64

inline int64_t ClampShare(uint64_t share_ppm) {
  return static_cast<int64_t>(share_ppm < kShareWholeGpuPpm ? share_ppm : kShareWholeGpuPpm);
}
inline int64_t BurstNs(int64_t share_ppm) {
  int64_t b = share_ppm * 100;  // share x 100 ms, share in ppm
  return b > kMinBurstNs ? b : kMinBurstNs;
}
// now_ns (this process's clock) minus then_ns (a time read from the region), saturated to
// +-kMaxRefillGapNs: exact for any two times of one boot, and no overflow whatever then_ns holds.
inline int64_t ElapsedNs(int64_t now_ns, int64_t then_ns) {
  if (then_ns < now_ns - kMaxRefillGapNs) return kMaxRefillGapNs;
  if (then_ns > now_ns + kMaxRefillGapNs) return -kMaxRefillGapNs;
  return now_ns - then_ns;
}
// A token count read from the region, saturated to +-kMaxRefillGapNs (1000 s of a whole GPU, far
// beyond any burst or debt the limiter stores), so that adding a refill or a charge cannot overflow.
inline int64_t SaneTokens(int64_t tokens) {
  return tokens > kMaxRefillGapNs ? kMaxRefillGapNs : tokens < -kMaxRefillGapNs ? -kMaxRefillGapNs : tokens;
}
inline int64_t RefillAmount(int64_t share_ppm, int64_t dt_ns) {
  if (dt_ns > kMaxRefillGapNs) dt_ns = kMaxRefillGapNs;
  return share_ppm * dt_ns / 1'000'000;
}
// Wall nanoseconds until a bucket at `tokens` refilling at `share_ppm` (> 0) is positive again,
// at most `cap_ns` (0 when it already is).
inline int64_t NsUntilPositive(int64_t tokens, int64_t share_ppm, int64_t cap_ns) {
  if (tokens > 0) return 0;
  if (share_ppm <= 0) return cap_ns;
  int64_t need = 1 - SaneTokens(tokens);
  __int128 ns = (static_cast<__int128>(need) * 1'000'000 + share_ppm - 1) / share_ppm;
  return ns > cap_ns ? cap_ns : static_cast<int64_t>(ns);
}

}  // namespace tf::limiter::bucket
