// Fake driver: device printf, JIT options and the linker (cuLink*), built on the module images of
// fake_modules.cc ("fakecuda:<module>").
//
// Device printf: the built-in kernel printf_lines(unsigned lines, unsigned tag) appends lines to a
// per-process FIFO, and the synchronizing calls (cuCtxSynchronize, cuStreamSynchronize,
// cuEventSynchronize, synchronous copies and memsets) write it to stdout with stdio, unflushed, as
// the real driver prints kernel printf output at synchronizing points.
//
// JIT logs: cuModuleLoadDataEx and the linker write their messages into CU_JIT_INFO_LOG_BUFFER /
// CU_JIT_ERROR_LOG_BUFFER (bounded by the *_SIZE_BYTES options, which come back as the bytes
// written) and report CU_JIT_WALL_TIME as 0.25 ms.
//
// Linking: each input must be a fakecuda image; cuLinkComplete produces the image
// "fakecuda:<m1>+<m2>+..." (NUL-terminated), whose module finds the kernels of every part.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "fake_driver.h"

namespace fakecuda {
namespace {

std::mutex printf_mu;
std::string& PrintfFifo() {
  static std::string* fifo = new std::string;  // leaked: used from stream threads at exit
  return *fifo;
}

constexpr const char kImagePrefix[] = "fakecuda:";

// The options of one JIT invocation, as the caller passed them; out values are written back into
// the caller's array slots.
class JitLog {
 public:
  JitLog(unsigned n, const CUjit_option* options, void** values) {
    for (unsigned i = 0; options != nullptr && values != nullptr && i < n; ++i) {
      switch (options[i]) {
        case CU_JIT_INFO_LOG_BUFFER: info_ = static_cast<char*>(values[i]); break;
        case CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES:
          info_size_ = static_cast<size_t>(reinterpret_cast<uintptr_t>(values[i]));
          info_size_slot_ = &values[i];
          break;
        case CU_JIT_ERROR_LOG_BUFFER: error_ = static_cast<char*>(values[i]); break;
        case CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES:
          error_size_ = static_cast<size_t>(reinterpret_cast<uintptr_t>(values[i]));
          error_size_slot_ = &values[i];
          break;
        case CU_JIT_WALL_TIME: {
          float ms = 0.25f;
          values[i] = nullptr;
          std::memcpy(&values[i], &ms, sizeof(ms));
          break;
        }
        default: break;
      }
    }
    if (info_ && info_size_) info_[0] = '\0';
    if (error_ && error_size_) error_[0] = '\0';
  }
  void Info(const std::string& line) { Append(info_, info_size_, info_size_slot_, &info_used_, line); }
  void Error(const std::string& line) {
    Append(error_, error_size_, error_size_slot_, &error_used_, line);
  }

 private:
  static void Append(char* buf, size_t size, void** slot, size_t* used, const std::string& line) {
    if (buf == nullptr || size == 0) return;
    size_t room = size - 1 - *used;
    size_t n = std::min(room, line.size());
    std::memcpy(buf + *used, line.data(), n);
    *used += n;
    buf[*used] = '\0';
    if (slot) *slot = reinterpret_cast<void*>(static_cast<uintptr_t>(*used));
  }
  char* info_ = nullptr;
  char* error_ = nullptr;
  size_t info_size_ = 0, error_size_ = 0, info_used_ = 0, error_used_ = 0;
  void** info_size_slot_ = nullptr;
  void** error_size_slot_ = nullptr;
};

bool IsFakeImage(const void* data, size_t size) {
  const size_t prefix = sizeof(kImagePrefix) - 1;
  return data != nullptr && size > prefix && std::memcmp(data, kImagePrefix, prefix) == 0;
}

// A link in progress: the option array stays the caller's (CUDA requires it to outlive the state
// when output options are used), the module names collected so far, and the result.
struct LinkState {
  unsigned num_options = 0;
  CUjit_option* options = nullptr;
  void** values = nullptr;
  std::vector<void*> initial;  // the values as given at cuLinkCreate
  std::vector<std::string> parts;
  std::string log_info, log_error;
  std::string image;  // after cuLinkComplete
};

std::mutex link_mu;
std::set<LinkState*>& Links() {
  static std::set<LinkState*>* links = new std::set<LinkState*>;
  return *links;
}

// Rewrites the state's accumulated logs into the caller's buffers. The buffer sizes are the ones
// given at cuLinkCreate (the size slots have been overwritten with the bytes written since).
void WriteLinkLogs(LinkState* s) {
  std::vector<void*> values = s->initial;
  JitLog log(s->num_options, s->options, values.data());
  if (!s->log_info.empty()) log.Info(s->log_info);
  if (!s->log_error.empty()) log.Error(s->log_error);
  for (unsigned i = 0; i < s->num_options; ++i) s->values[i] = values[i];
}

}  // namespace

void AppendDevicePrintf(const std::string& text) {
  std::lock_guard<std::mutex> lock(printf_mu);
  PrintfFifo() += text;
}

void FlushDevicePrintf() {
  std::string out;
  {
    std::lock_guard<std::mutex> lock(printf_mu);
    out.swap(PrintfFifo());
  }
  if (!out.empty()) std::fwrite(out.data(), 1, out.size(), stdout);
}

void PrintfLines(void** params, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*) {
  unsigned lines = *static_cast<unsigned*>(params[0]);
  unsigned tag = *static_cast<unsigned*>(params[1]);
  std::string text;
  char line[128];
  for (unsigned i = 0; i < lines; ++i) {
    std::snprintf(line, sizeof(line), "device printf tag=%u line=%u %s\n", tag, i,
                  "................................................");
    text += line;
  }
  AppendDevicePrintf(text);
}

void ChecksumParams(void** params, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                    void*) {
  CUdeviceptr out = *static_cast<CUdeviceptr*>(params[0]);
  const auto* bytes = static_cast<const unsigned char*>(params[1]);
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < kChecksumParamBytes; ++i) h = (h ^ bytes[i]) * 0x100000001b3ull;
  *reinterpret_cast<uint64_t*>(out) = h;
}

void AddU32(void** params, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*) {
  CUdeviceptr dst = *static_cast<CUdeviceptr*>(params[0]);
  unsigned value = *static_cast<unsigned*>(params[1]);
  size_t count = *static_cast<size_t*>(params[2]);
  auto* p = reinterpret_cast<unsigned*>(dst);
  for (size_t i = 0; i < count; ++i) p[i] += value;
}

void JitLoadLog(unsigned n, CUjit_option* options, void** values, const void* image, bool ok) {
  JitLog log(n, options, values);
  if (ok) {
    log.Info(std::string("fakecuda jit: loaded module ") +
             (static_cast<const char*>(image) + sizeof(kImagePrefix) - 1) + "\n");
  } else {
    log.Error("fakecuda jit: not a fakecuda image\n");
  }
}

}  // namespace fakecuda

using fakecuda::LinkState;

CUresult cuLinkCreate_v2(unsigned int num_options, CUjit_option* options, void** values,
                         CUlinkState* state_out) {
  FAKECUDA_ENTER();
  FAKECUDA_REQUIRE_CONTEXT(ctx);
  (void)ctx;
  if (state_out == nullptr || (num_options > 0 && (options == nullptr || values == nullptr))) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto* s = new LinkState;
  s->num_options = num_options;
  s->options = options;
  s->values = values;
  if (num_options > 0) s->initial.assign(values, values + num_options);
  fakecuda::WriteLinkLogs(s);
  std::lock_guard<std::mutex> lock(fakecuda::link_mu);
  fakecuda::Links().insert(s);
  *state_out = reinterpret_cast<CUlinkState>(s);
  return CUDA_SUCCESS;
}

CUresult cuLinkAddData_v2(CUlinkState state, CUjitInputType type, void* data, size_t size,
                          const char* name, unsigned int num_options, CUjit_option* options,
                          void** values) {
  FAKECUDA_ENTER();
  (void)num_options;
  (void)options;
  (void)values;
  auto* s = reinterpret_cast<LinkState*>(state);
  std::lock_guard<std::mutex> lock(fakecuda::link_mu);
  if (!fakecuda::Links().count(s)) return CUDA_ERROR_INVALID_HANDLE;
  if (data == nullptr || size == 0 || type < 0 || type >= CU_JIT_NUM_INPUT_TYPES) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const std::string unit = name ? name : "<unnamed>";
  if (!s->image.empty()) return CUDA_ERROR_INVALID_VALUE;  // already completed
  if (!fakecuda::IsFakeImage(data, size)) {
    s->log_error += "fakecuda link: " + unit + ": not a fakecuda image\n";
    fakecuda::WriteLinkLogs(s);
    return type == CU_JIT_INPUT_PTX ? CUDA_ERROR_INVALID_PTX : CUDA_ERROR_INVALID_IMAGE;
  }
  const char* text = static_cast<const char*>(data) + sizeof(fakecuda::kImagePrefix) - 1;
  std::string module(text, strnlen(text, size - (sizeof(fakecuda::kImagePrefix) - 1)));
  s->parts.push_back(module);
  s->log_info += "fakecuda link: added " + unit + " (module " + module + ")\n";
  fakecuda::WriteLinkLogs(s);
  return CUDA_SUCCESS;
}

CUresult cuLinkAddFile_v2(CUlinkState state, CUjitInputType type, const char* path,
                          unsigned int num_options, CUjit_option* options, void** values) {
  FAKECUDA_ENTER();
  if (path == nullptr) return CUDA_ERROR_INVALID_VALUE;
  FILE* f = std::fopen(path, "rb");
  if (f == nullptr) return CUDA_ERROR_FILE_NOT_FOUND;
  std::string bytes;
  char chunk[4096];
  size_t n;
  while ((n = std::fread(chunk, 1, sizeof(chunk), f)) > 0) bytes.append(chunk, n);
  std::fclose(f);
  return cuLinkAddData_v2(state, type, bytes.data(), bytes.size(), path, num_options, options,
                          values);
}

CUresult cuLinkComplete(CUlinkState state, void** cubin_out, size_t* size_out) {
  FAKECUDA_ENTER();
  auto* s = reinterpret_cast<LinkState*>(state);
  std::lock_guard<std::mutex> lock(fakecuda::link_mu);
  if (!fakecuda::Links().count(s)) return CUDA_ERROR_INVALID_HANDLE;
  if (cubin_out == nullptr || size_out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (s->parts.empty()) {
    s->log_error += "fakecuda link: nothing to link\n";
    fakecuda::WriteLinkLogs(s);
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::string image = fakecuda::kImagePrefix;
  for (size_t i = 0; i < s->parts.size(); ++i) image += (i ? "+" : "") + s->parts[i];
  s->image = image;
  s->image.push_back('\0');
  s->log_info += "fakecuda link: linked " + std::to_string(s->parts.size()) + " units\n";
  fakecuda::WriteLinkLogs(s);
  *cubin_out = s->image.data();
  *size_out = s->image.size();
  return CUDA_SUCCESS;
}

CUresult cuLinkDestroy(CUlinkState state) {
  FAKECUDA_ENTER();
  auto* s = reinterpret_cast<LinkState*>(state);
  std::lock_guard<std::mutex> lock(fakecuda::link_mu);
  if (fakecuda::Links().erase(s) == 0) return CUDA_ERROR_INVALID_HANDLE;
  delete s;
  return CUDA_SUCCESS;
}
