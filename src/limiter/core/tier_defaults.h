// VRAM tiering's idle timeouts by QoS (0 low .. 3 critical), in ms, 0 = never. Header-only: the
// node agent and `tfusion run` write them into the regions, the controller validates overrides
// against them.
#pragma once

#include <cstdint>

namespace tf::limiter {

// Idle time before an automatic swap-out: 10 s, 60 s, 10 min, never.
constexpr uint64_t DefaultIdleSwapMs(uint32_t qos) {
  return qos == 0 ? 10'000 : qos == 1 ? 60'000 : qos == 2 ? 600'000 : 0;
}
// Idle time before swapped copies move on to the disk tier: 2 min, 10 min, never, never.
constexpr uint64_t DefaultIdleDiskMs(uint32_t qos) { return qos == 0 ? 120'000 : qos == 1 ? 600'000 : 0; }
// Idle time before a swapped process is checkpointed by the driver (scale to zero): never by
// default, for every QoS; an override must be longer than the swap timeout.
constexpr uint64_t DefaultIdleZeroMs(uint32_t) { return 0; }

}  // namespace tf::limiter
