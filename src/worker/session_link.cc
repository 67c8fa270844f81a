// JitSession: cuModuleLoadDataEx with JIT options and the cuLink* family (session_link.h).
#include "worker/session_link.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

#include "client/remote_protocol.h"

namespace tf::worker {
namespace {

using driver::Fn;
using transport::Reader;
using transport::Writer;
using Options = JitSession::Options;

// Decodes "JIT options" (remote_protocol.h). logs: whether log buffers are made (per-input
// options of cuLinkAddData carry none). False on malformed or refused input.
bool ReadOptions(Reader& rd, bool logs, Options* o) {
  uint32_t n = 0;
  if (!rd.U32(&n) || n > remote::kMaxJitOptions) return false;
  uint64_t info_size = 0, error_size = 0;
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t id = 0;
    uint64_t value = 0;
    rd.U32(&id);
    if (!rd.U64(&value) || id >= CU_JIT_NUM_OPTIONS || remote::IsJitPointerOption(id)) return false;
    const auto opt = static_cast<CUjit_option>(id);
    if (!logs && (opt == CU_JIT_INFO_LOG_BUFFER || opt == CU_JIT_ERROR_LOG_BUFFER ||
                  opt == CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES ||
                  opt == CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES)) {
      return false;
    }
    if (opt == CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES || opt == CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES) {
      value = std::min<uint64_t>(value, remote::kMaxJitLogBytes);
      (opt == CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES ? info_size : error_size) = value;
    }
    if (opt == CU_JIT_INFO_LOG_BUFFER) o->info_slot = static_cast<int>(i);
    if (opt == CU_JIT_ERROR_LOG_BUFFER) o->error_slot = static_cast<int>(i);
    o->ids.push_back(opt);
    o->values.push_back(reinterpret_cast<void*>(static_cast<uintptr_t>(value)));
  }
  // Log buffers: this side's, of the size the client asked for (a buffer without a size gets
  // none, as the driver would write nothing into it).
  if (o->info_slot >= 0) {
    o->info.assign(info_size + 1, '\0');
    o->values[o->info_slot] = info_size ? o->info.data() : nullptr;
  }
  if (o->error_slot >= 0) {
    o->error.assign(error_size + 1, '\0');
    o->values[o->error_slot] = error_size ? o->error.data() : nullptr;
  }
  return true;
}

void WriteLog(const std::vector<char>& log, Writer& out) {
  const size_t n = log.empty() ? 0 : strnlen(log.data(), log.size());
  out.Blob(log.data(), static_cast<uint32_t>(n));
}

// "JIT result": the driver's result, the option slots after the call, the two logs.
void WriteResult(CUresult r, const Options& o, Writer& out) {
  out.I32(r);
  out.U32(static_cast<uint32_t>(o.ids.size()));
  for (size_t i = 0; i < o.ids.size(); ++i) {
    const bool buffer = static_cast<int>(i) == o.info_slot || static_cast<int>(i) == o.error_slot;
    out.U64(buffer ? 0 : static_cast<uint64_t>(reinterpret_cast<uintptr_t>(o.values[i])));
  }
  WriteLog(o.info, out);
  WriteLog(o.error, out);
}

}  // namespace

CUresult JitSession::LoadDataEx(Reader& rd, const ImageLookup& images, Writer& out,
                                uint64_t* module) {
  *module = 0;
  uint64_t lo = 0, hi = 0, n = 0;
  rd.U64(&lo);
  rd.U64(&hi);
  rd.U64(&n);
  Options o;
  if (!ReadOptions(rd, true, &o) || !rd.Finish()) return CUDA_ERROR_INVALID_VALUE;
  const std::vector<uint8_t>* image = images(lo, hi, n);
  if (image == nullptr) return CUDA_ERROR_INVALID_IMAGE;
  if (d_.cuModuleLoadDataEx == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  CUmodule m = nullptr;
  CUresult r = d_.cuModuleLoadDataEx(&m, image->data(), static_cast<unsigned>(o.ids.size()),
                                     o.ids.data(), o.values.data());
  WriteResult(r, o, out);
  if (r == CUDA_SUCCESS) {
    *module = reinterpret_cast<uint64_t>(m);
    out.U64(handles_.Publish(HandleKind::kModule, *module));
  }
  return CUDA_SUCCESS;
}

CUresult JitSession::Link(Fn fn, Reader& rd, const ImageLookup& images, Writer& out,
                          std::vector<uint8_t>* bulk, uint64_t* bulk_len, uint64_t max_bulk) {
  if (fn == Fn::cuLinkCreate_v2) {
    auto e = std::make_unique<LinkEntry>();
    if (!ReadOptions(rd, true, &e->options) || !rd.Finish()) return CUDA_ERROR_INVALID_VALUE;
    if (d_.cuLinkCreate_v2 == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
    Options& o = e->options;
    CUresult r = d_.cuLinkCreate_v2(static_cast<unsigned>(o.ids.size()), o.ids.data(),
                                    o.values.data(), &e->state);
    WriteResult(r, o, out);
    if (r == CUDA_SUCCESS) {
      const uint64_t h = reinterpret_cast<uint64_t>(e->state);
      out.U64(handles_.Publish(HandleKind::kLinkState, h));
      links_[h] = std::move(e);
    }
    return CUDA_SUCCESS;
  }
  uint64_t h = 0;
  if (!rd.U64(&h)) return CUDA_ERROR_INVALID_VALUE;
  if (!handles_.Resolve(HandleKind::kLinkState, h, &h)) return CUDA_ERROR_INVALID_HANDLE;
  auto it = links_.find(h);
  if (it == links_.end()) return CUDA_ERROR_INVALID_HANDLE;
  LinkEntry& e = *it->second;
  switch (fn) {
    case Fn::cuLinkAddData_v2: {
      uint32_t type = 0;
      uint64_t lo = 0, hi = 0, n = 0;
      const uint8_t* name = nullptr;
      uint32_t name_len = 0;
      rd.U32(&type);
      rd.U64(&lo);
      rd.U64(&hi);
      rd.U64(&n);
      Options input;
      if (!rd.Blob(&name, &name_len, remote::kMaxFunctionName) || !ReadOptions(rd, false, &input) ||
          !rd.Finish() || type >= CU_JIT_NUM_INPUT_TYPES) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      const std::vector<uint8_t>* image = images(lo, hi, n);
      if (image == nullptr) return CUDA_ERROR_INVALID_IMAGE;
      if (d_.cuLinkAddData_v2 == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
      // The driver may read PTX text up to a NUL: the copy carries one past the input's length.
      std::vector<uint8_t> data(image->begin(), image->end());
      data.push_back(0);
      const std::string unit(reinterpret_cast<const char*>(name), name_len);
      CUresult r = d_.cuLinkAddData_v2(e.state, static_cast<CUjitInputType>(type), data.data(), n,
                                       unit.c_str(), static_cast<unsigned>(input.ids.size()),
                                       input.ids.data(), input.values.data());
      WriteResult(r, e.options, out);
      return CUDA_SUCCESS;
    }
    case Fn::cuLinkComplete: {
      if (!rd.Finish()) return CUDA_ERROR_INVALID_VALUE;
      if (d_.cuLinkComplete == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
      void* cubin = nullptr;
      size_t size = 0;
      CUresult r = d_.cuLinkComplete(e.state, &cubin, &size);
      if (r == CUDA_SUCCESS && (cubin == nullptr || size == 0)) r = CUDA_ERROR_UNKNOWN;
      if (r == CUDA_SUCCESS && size > max_bulk) {
        fprintf(stderr, "tfusion-worker: cuLinkComplete: a cubin of %zu bytes exceeds the "
                "transport's bulk limit of %llu bytes\n", size,
                static_cast<unsigned long long>(max_bulk));
        r = CUDA_ERROR_NOT_SUPPORTED;
      }
      WriteResult(r, e.options, out);
      if (r == CUDA_SUCCESS) {
        out.U64(size);
        bulk->assign(static_cast<const uint8_t*>(cubin), static_cast<const uint8_t*>(cubin) + size);
        *bulk_len = size;
      }
      return CUDA_SUCCESS;
    }
    case Fn::cuLinkDestroy: {
      if (!rd.Finish()) return CUDA_ERROR_INVALID_VALUE;
      CUresult r = d_.cuLinkDestroy ? d_.cuLinkDestroy(e.state) : CUDA_ERROR_NOT_SUPPORTED;
      if (r == CUDA_SUCCESS) {
        handles_.RetireReal(HandleKind::kLinkState, h);
        links_.erase(it);
      }
      return r;
    }
    default:
      return CUDA_ERROR_NOT_SUPPORTED;
  }
}

void JitSession::DestroyAll() {
  for (auto& [h, e] : links_) {
    if (d_.cuLinkDestroy) d_.cuLinkDestroy(e->state);
  }
  links_.clear();
}

}  // namespace tf::worker
