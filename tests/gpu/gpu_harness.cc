#include "gpu_harness.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace tf::gpu {

bool ParseBytes(const std::string& text, uint64_t* bytes) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const unsigned long long value = std::strtoull(text.c_str(), &end, 10);
  if (errno != 0 || end == text.c_str()) return false;
  const std::string unit(end);
  uint64_t scale = 1;
  if (unit.empty() || unit == "B") {
    scale = 1;
  } else if (unit == "KiB") {
    scale = 1024;
  } else if (unit == "MiB") {
    scale = kMiB;
  } else if (unit == "GiB") {
    scale = kGiB;
  } else {
    return false;
  }
  *bytes = static_cast<uint64_t>(value) * scale;
  return true;
}

bool Flags::Parse(int argc, char** argv, int first) {
  for (int i = first; i < argc; i += 2) {
    const std::string name = argv[i];
    if (name.rfind("--", 0) != 0 || i + 1 >= argc) {
      std::fprintf(stderr, "bad argument near '%s': flags are --name value\n", name.c_str());
      return false;
    }
    values_[name.substr(2)] = argv[i + 1];
  }
  return true;
}

std::string Flags::Str(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

uint64_t Flags::Bytes(const std::string& name, uint64_t fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  uint64_t bytes = 0;
  if (!ParseBytes(it->second, &bytes)) {
    errors_.push_back("--" + name + " " + it->second);
    return fallback;
  }
  return bytes;
}

double Flags::Num(const std::string& name, double fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  char* end = nullptr;
  const double value = std::strtod(it->second.c_str(), &end);
  if (end == it->second.c_str() || *end != '\0') {
    errors_.push_back("--" + name + " " + it->second);
    return fallback;
  }
  return value;
}

bool Flags::OnlyKnown(const std::vector<std::string>& known) const {
  bool ok = true;
  for (const auto& [name, value] : values_) {
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      std::fprintf(stderr, "unknown flag --%s\n", name.c_str());
      ok = false;
    }
  }
  return ok;
}

bool FlagsOk(const Flags& flags) {
  for (const auto& bad : flags.errors()) std::fprintf(stderr, "bad flag value: %s\n", bad.c_str());
  return flags.errors().empty();
}

void Result(const std::string& key, const std::string& value) {
  std::printf("RESULT %s=%s\n", key.c_str(), value.c_str());
  std::fflush(stdout);
}

void Result(const std::string& key, uint64_t value) {
  Result(key, std::to_string(value));
}

void ResultF(const std::string& key, double value) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.3f", value);
  Result(key, std::string(text));
}

std::string CuErrorName(CUresult rc) {
  const char* name = nullptr;
  if (cuGetErrorName(rc, &name) == CUDA_SUCCESS && name != nullptr) return name;
  return "CUresult(" + std::to_string(static_cast<int>(rc)) + ")";
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t index =
      std::min(values.size() - 1, static_cast<size_t>(p * static_cast<double>(values.size())));
  return values[index];
}

uint64_t NowNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

DriverSession::DriverSession(int ordinal) {
  rc_ = cuInit(0);
  if (rc_ != CUDA_SUCCESS) {
    failed_call_ = "cuInit";
    return;
  }
  rc_ = cuDeviceGet(&device_, ordinal);
  if (rc_ != CUDA_SUCCESS) {
    failed_call_ = "cuDeviceGet";
    return;
  }
  rc_ = cuDevicePrimaryCtxRetain(&ctx_, device_);
  if (rc_ != CUDA_SUCCESS) {
    failed_call_ = "cuDevicePrimaryCtxRetain";
    return;
  }
  retained_ = true;
  rc_ = cuCtxSetCurrent(ctx_);
  if (rc_ != CUDA_SUCCESS) failed_call_ = "cuCtxSetCurrent";
}

DriverSession::~DriverSession() {
  if (retained_) cuDevicePrimaryCtxRelease(device_);
}

int DriverSession::Attribute(CUdevice_attribute attr) const {
  int value = 0;
  if (cuDeviceGetAttribute(&value, attr, device_) != CUDA_SUCCESS) return -1;
  return value;
}

bool WriteFileAtomic(const std::string& path, const std::string& content) {
  const std::string tmp = path + ".tmp" + std::to_string(getpid());
  FILE* file = std::fopen(tmp.c_str(), "w");
  if (file == nullptr) return false;
  const bool written = std::fwrite(content.data(), 1, content.size(), file) == content.size();
  const bool closed = std::fclose(file) == 0;
  if (!written || !closed) return false;
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

bool WaitForFile(const std::string& path, double timeout_s) {
  const uint64_t deadline = NowNs() + static_cast<uint64_t>(timeout_s * 1e9);
  struct stat st {};
  while (stat(path.c_str(), &st) != 0) {
    if (NowNs() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

CUresult LoadModule(const unsigned char* image, CUmodule* module) {
  return cuModuleLoadData(module, image);
}

}  // namespace tf::gpu
