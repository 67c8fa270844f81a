#include "driver/trace.h"

#include <unistd.h>

#include <algorithm>
#include <cstdarg>
#include <cstring>

namespace tf::driver {
namespace {
int g_trace_fd = 2;
}

void SetTraceFd(int fd) { g_trace_fd = fd; }

void TraceBuffer::Begin(const char* name) {
  len_ = 0;
  first_ = true;
  Append("tfusion-trace: %s(", name);
}

void TraceBuffer::Sep(const char* name) {
  Append(first_ ? "%s=" : ", %s=", name);
  first_ = false;
}

void TraceBuffer::Append(const char* fmt, ...) {
  if (len_ >= sizeof(buf_) - 1) return;
  va_list ap;
  va_start(ap, fmt);
  int n = std::vsnprintf(buf_ + len_, sizeof(buf_) - len_, fmt, ap);
  va_end(ap);
  if (n > 0) len_ = std::min(sizeof(buf_) - 1, len_ + static_cast<size_t>(n));
}

void TraceBuffer::End() {
  Append(")\n");
  if (len_ == sizeof(buf_) - 1) buf_[len_ - 1] = '\n';
  ssize_t ignored = ::write(g_trace_fd, buf_, len_);
  (void)ignored;
}

}  // namespace tf::driver
