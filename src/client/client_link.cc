// JIT options and the linker on the remote vGPU (remote_protocol.h "JIT options and the
// linker"): cuModuleLoadDataEx with options, cuLinkCreate_v2, cuLinkAddData_v2,
// cuLinkAddFile_v2, cuLinkComplete, cuLinkDestroy. Option values that point to this process's
// memory (the log buffers) stay here: the worker compiles with buffers of its own and returns the
// log text with each reply, which is copied into the application's buffers, bounded by the sizes
// it gave; out options (wall time, log sizes) are written back into its option array as the
// driver would. A linked cubin is kept here, owned by the link state until cuLinkDestroy.
#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <vector>

#include "client/client_internal.h"
#include "client/thread_scratch.h"
#include "tf_client_impl.h"

namespace tf::client {
namespace {

using driver::Fn;
using remote::Op;
using transport::Reader;
using transport::Writer;

// Where the application wants a JIT invocation's outputs: its option array (out values) and log
// buffers with their capacities.
struct JitTarget {
  unsigned n = 0;
  CUjit_option* ids = nullptr;
  void** values = nullptr;
  char* info = nullptr;
  size_t info_cap = 0;
  char* error = nullptr;
  size_t error_cap = 0;
};

size_t SlotSize(void* v) { return static_cast<size_t>(reinterpret_cast<uintptr_t>(v)); }

// Checks the options and notes where logs go. Pointer-valued options are refused (logged once).
CUresult ReadTarget(unsigned n, CUjit_option* ids, void** values, JitTarget* t) {
  if (n > 0 && (ids == nullptr || values == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  if (n > remote::kMaxJitOptions) return CUDA_ERROR_INVALID_VALUE;
  t->n = n;
  t->ids = ids;
  t->values = values;
  for (unsigned i = 0; i < n; ++i) {
    if (remote::IsJitPointerOption(ids[i])) {
      static std::atomic<bool> logged{false};
      if (!logged.exchange(true)) {
        ClientLog("JIT option %d points to this process's memory and is not forwarded: "
                  "returning CUDA_ERROR_NOT_SUPPORTED", static_cast<int>(ids[i]));
      }
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    switch (ids[i]) {
      case CU_JIT_INFO_LOG_BUFFER: t->info = static_cast<char*>(values[i]); break;
      case CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES: t->info_cap = SlotSize(values[i]); break;
      case CU_JIT_ERROR_LOG_BUFFER: t->error = static_cast<char*>(values[i]); break;
      case CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES: t->error_cap = SlotSize(values[i]); break;
      default: break;
    }
  }
  if (t->info == nullptr) t->info_cap = 0;
  if (t->error == nullptr) t->error_cap = 0;
  return CUDA_SUCCESS;
}

// "JIT options". forward_logs: false for a linker input's own options (its log options are
// dropped; the link state's buffers get the messages).
void WriteOptions(const JitTarget& t, bool forward_logs, Writer& w) {
  uint32_t count = 0;
  auto is_log = [](CUjit_option o) {
    return o == CU_JIT_INFO_LOG_BUFFER || o == CU_JIT_ERROR_LOG_BUFFER ||
           o == CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES || o == CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES;
  };
  for (unsigned i = 0; i < t.n; ++i) count += forward_logs || !is_log(t.ids[i]) ? 1 : 0;
  w.U32(count);
  for (unsigned i = 0; i < t.n; ++i) {
    if (!forward_logs && is_log(t.ids[i])) continue;
    w.U32(static_cast<uint32_t>(t.ids[i]));
    const bool buffer = t.ids[i] == CU_JIT_INFO_LOG_BUFFER || t.ids[i] == CU_JIT_ERROR_LOG_BUFFER;
    w.U64(buffer ? 0 : static_cast<uint64_t>(reinterpret_cast<uintptr_t>(t.values[i])));
  }
}

void CopyLog(const uint8_t* text, uint32_t len, char* buf, size_t cap) {
  if (buf == nullptr || cap == 0) return;
  const size_t n = std::min<size_t>(len, cap - 1);
  memcpy(buf, text, n);
  buf[n] = '\0';
}

// "JIT result": writes the out slots and logs into the application's arrays and buffers and
// returns the driver's result (CUDA_ERROR_UNKNOWN for a malformed reply).
CUresult ApplyResult(Reader& rd, const JitTarget& t) {
  int32_t result = 0;
  uint32_t count = 0;
  if (!rd.I32(&result) || !rd.U32(&count) || count != t.n) return CUDA_ERROR_UNKNOWN;
  std::vector<uint64_t> slots(count);
  for (auto& v : slots) rd.U64(&v);
  const uint8_t *info = nullptr, *error = nullptr;
  uint32_t info_len = 0, error_len = 0;
  if (!rd.Blob(&info, &info_len, remote::kMaxJitLogBytes) ||
      !rd.Blob(&error, &error_len, remote::kMaxJitLogBytes)) {
    return CUDA_ERROR_UNKNOWN;
  }
  for (unsigned i = 0; i < t.n; ++i) {
    switch (t.ids[i]) {
      case CU_JIT_WALL_TIME:
      case CU_JIT_THREADS_PER_BLOCK:
      case CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES:
      case CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES:
        t.values[i] = reinterpret_cast<void*>(static_cast<uintptr_t>(slots[i]));
        break;
      default: break;
    }
  }
  CopyLog(info, info_len, t.info, t.info_cap);
  CopyLog(error, error_len, t.error, t.error_cap);
  return static_cast<CUresult>(result);
}

// A link state of this process: where its logs go and, once complete, its cubin.
struct LinkRecord {
  const Session* owner = nullptr;
  JitTarget target;
  std::vector<uint8_t> cubin;
};
// Guarded by State().mu (every use holds a Locked).
std::map<uint64_t, LinkRecord>& Links() {
  static auto* links = new std::map<uint64_t, LinkRecord>;
  return *links;
}

LinkRecord* FindLink(Session* s, CUlinkState state) {
  auto it = Links().find(H(state));
  if (it == Links().end() || it->second.owner != s) return nullptr;
  return &it->second;
}

CUresult AddData(CUlinkState state, CUjitInputType type, const void* data, size_t size,
                 const char* name, unsigned n, CUjit_option* ids, void** values) {
  if (data == nullptr || size == 0 || type < 0 || type >= CU_JIT_NUM_INPUT_TYPES) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  JitTarget input;
  if (CUresult r = ReadTarget(n, ids, values, &input); r != CUDA_SUCCESS) return r;
  const size_t name_len = name ? strnlen(name, remote::kMaxFunctionName + 1) : 0;
  if (name_len > remote::kMaxFunctionName) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  Session* s = l.session();
  LinkRecord* link = FindLink(s, state);
  if (link == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  uint8_t* buf = ThreadScratch(Scratch::kLink);
  if (buf == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  Writer w(buf, ScratchBytes(Scratch::kLink));
  w.U64(H(state));
  w.U32(static_cast<uint32_t>(type));
  if (CUresult r = SendImageBytes(s, data, size, w); r != CUDA_SUCCESS) return r;
  w.Blob(name ? name : "", static_cast<uint32_t>(name_len));
  WriteOptions(input, false, w);
  ReplyView rv;
  CUresult r = CallSync(s, Op(Fn::cuLinkAddData_v2), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  return ApplyResult(rv.reader, link->target);
}

}  // namespace

CUresult Impl_cuModuleLoadDataEx(CUmodule* module, const void* image, unsigned int numOptions,
                                 CUjit_option* options, void** optionValues) {
  if (module == nullptr || image == nullptr) return CUDA_ERROR_INVALID_VALUE;
  JitTarget t;
  if (CUresult r = ReadTarget(numOptions, options, optionValues, &t); r != CUDA_SUCCESS) return r;
  TF_LOCK(l);
  TF_CTX(l);
  Session* s = l.session();
  uint8_t buf[64 + remote::kMaxJitOptions * 12];
  Writer w(buf, sizeof(buf));
  if (CUresult r = SendImage(s, image, w); r != CUDA_SUCCESS) return r;
  WriteOptions(t, true, w);
  ReplyView rv;
  CUresult r = CallSync(s, Op(Fn::cuModuleLoadDataEx), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  r = ApplyResult(rv.reader, t);
  if (r != CUDA_SUCCESS) return r;
  uint64_t m = 0;
  if (!rv.reader.U64(&m)) return CUDA_ERROR_UNKNOWN;
  *module = reinterpret_cast<CUmodule>(m);
  return CUDA_SUCCESS;
}

CUresult Impl_cuLinkCreate_v2(unsigned int numOptions, CUjit_option* options, void** optionValues,
                              CUlinkState* stateOut) {
  if (stateOut == nullptr) return CUDA_ERROR_INVALID_VALUE;
  JitTarget t;
  if (CUresult r = ReadTarget(numOptions, options, optionValues, &t); r != CUDA_SUCCESS) return r;
  TF_LOCK(l);
  TF_CTX(l);
  Session* s = l.session();
  uint8_t buf[16 + remote::kMaxJitOptions * 12];
  Writer w(buf, sizeof(buf));
  WriteOptions(t, true, w);
  ReplyView rv;
  CUresult r = CallSync(s, Op(Fn::cuLinkCreate_v2), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  r = ApplyResult(rv.reader, t);
  if (r != CUDA_SUCCESS) return r;
  uint64_t h = 0;
  if (!rv.reader.U64(&h) || h == 0) return CUDA_ERROR_UNKNOWN;
  LinkRecord& rec = Links()[h];
  rec = LinkRecord();
  rec.owner = s;
  rec.target = t;
  *stateOut = reinterpret_cast<CUlinkState>(h);
  return CUDA_SUCCESS;
}

CUresult Impl_cuLinkAddData_v2(CUlinkState state, CUjitInputType type, void* data, size_t size,
                               const char* name, unsigned int numOptions, CUjit_option* options,
                               void** optionValues) {
  return AddData(state, type, data, size, name, numOptions, options, optionValues);
}

// The file is read here (the worker cannot see this machine's files) and added as data named
// by its path.
CUresult Impl_cuLinkAddFile_v2(CUlinkState state, CUjitInputType type, const char* path,
                               unsigned int numOptions, CUjit_option* options,
                               void** optionValues) {
  if (path == nullptr) return CUDA_ERROR_INVALID_VALUE;
  FILE* f = fopen(path, "rb");
  if (f == nullptr) return CUDA_ERROR_FILE_NOT_FOUND;
  std::vector<uint8_t> bytes;
  uint8_t chunk[65536];
  size_t n;
  while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0) {
    if (bytes.size() + n > remote::kMaxImageBytes) break;
    bytes.insert(bytes.end(), chunk, chunk + n);
  }
  const bool failed = ferror(f) != 0 || n > 0;
  fclose(f);
  if (failed) return CUDA_ERROR_FILE_NOT_FOUND;
  if (bytes.empty()) return CUDA_ERROR_INVALID_IMAGE;
  return AddData(state, type, bytes.data(), bytes.size(), path, numOptions, options, optionValues);
}

CUresult Impl_cuLinkComplete(CUlinkState state, void** cubinOut, size_t* sizeOut) {
  if (cubinOut == nullptr || sizeOut == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  Session* s = l.session();
  LinkRecord* link = FindLink(s, state);
  if (link == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  uint8_t buf[16];
  Writer w(buf, sizeof(buf));
  w.U64(H(state));
  ReplyView rv;
  CUresult r = CallSync(s, Op(Fn::cuLinkComplete), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  r = ApplyResult(rv.reader, link->target);
  if (r != CUDA_SUCCESS) return r;
  uint64_t size = 0;
  if (!rv.reader.U64(&size) || size == 0 || size != rv.bulk_len || rv.bulk == nullptr) {
    return CUDA_ERROR_UNKNOWN;
  }
  link->cubin.assign(rv.bulk, rv.bulk + size);
  *cubinOut = link->cubin.data();
  *sizeOut = link->cubin.size();
  return CUDA_SUCCESS;
}

CUresult Impl_cuLinkDestroy(CUlinkState state) {
  TF_LOCK(l);
  Session* s = l.session();
  if (FindLink(s, state) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  uint8_t buf[16];
  Writer w(buf, sizeof(buf));
  w.U64(H(state));
  CUresult r = Simple(l, Fn::cuLinkDestroy, w);
  if (r == CUDA_SUCCESS) Links().erase(H(state));
  return r;
}

}  // namespace tf::client
