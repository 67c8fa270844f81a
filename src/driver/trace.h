// The trace formatter behind TFUSION_TRACE: renders one driver call as a single line
// "tfusion-trace: cuMemAlloc_v2(dptr=0x7ffd..., bytesize=1048576)" and writes it with one
// write(2), so lines from concurrent threads never interleave. No allocation, no locks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <type_traits>

namespace tf::driver {

class TraceBuffer {
 public:
  void Begin(const char* name);
  template <typename T>
  void Arg(const char* name, T value) {
    Sep(name);
    if constexpr (std::is_pointer_v<T>) {
      Append("%p", reinterpret_cast<const void*>(value));
    } else if constexpr (std::is_enum_v<T>) {
      Append("%lld", static_cast<long long>(value));
    } else if constexpr (std::is_floating_point_v<T>) {
      Append("%g", static_cast<double>(value));
    } else if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) {
      Append("%lld", static_cast<long long>(value));
    } else if constexpr (std::is_integral_v<T>) {
      Append("%llu", static_cast<unsigned long long>(value));
    } else {
      Append("{%zu bytes}", sizeof(T));
    }
  }
  void End();
  const char* text() const { return buf_; }

 private:
  void Sep(const char* name);
  void Append(const char* fmt, ...) __attribute__((format(printf, 2, 3)));
  char buf_[512];
  size_t len_ = 0;
  bool first_ = true;
};

// Where trace lines go (a file descriptor); set once at start-up.
void SetTraceFd(int fd);

}  // namespace tf::driver
