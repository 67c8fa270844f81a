// Logging for code that runs inside a tenant's process: one formatted line per call, written
// with a single write(2) to stderr, prefixed "tfusion-limiter:". Never on a hot path; callers
// that may repeat use a once-flag.
#pragma once

namespace tf::limiter {

void GuestLog(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace tf::limiter
