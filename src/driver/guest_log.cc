#include "driver/guest_log.h"

#include <unistd.h>

#include <cstdio>

namespace tf::driver {

void GuestLogV(const char* prefix, const char* fmt, va_list ap) {
  char buf[640];
  int n = snprintf(buf, sizeof(buf), "%s: ", prefix);
  if (n < 0) return;
  if (static_cast<size_t>(n) > sizeof(buf) - 2) n = static_cast<int>(sizeof(buf) - 2);
  int m = vsnprintf(buf + n, sizeof(buf) - static_cast<size_t>(n) - 1, fmt, ap);
  size_t room = sizeof(buf) - static_cast<size_t>(n) - 2;
  size_t len = static_cast<size_t>(n) + (m > 0 ? (static_cast<size_t>(m) < room ? static_cast<size_t>(m) : room) : 0);
  buf[len++] = '\n';
  ssize_t ignored = write(2, buf, len);
  (void)ignored;
}

}  // namespace tf::driver
