// Logging for code that runs inside a tenant's process (limiter, NVML shim, client stub): one
// line, written with a single write(2) to stderr so lines of concurrent threads never mix, with
// the library's prefix ("tfusion-limiter"). No allocation. Never meant for a hot path: callers log
// once per cause.
#pragma once

#include <cstdarg>

namespace tf::driver {

void GuestLogV(const char* prefix, const char* fmt, va_list ap);

}  // namespace tf::driver
