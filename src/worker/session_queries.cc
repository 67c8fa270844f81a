// Queries and host-side encodings of a worker session (see session_queries.h).
#include "worker/session_queries.h"

#include <cstring>

namespace tf::worker {
namespace {

using driver::Fn;
using transport::Reader;
using transport::Writer;

template <class T>
T As(uint64_t v) {
  return reinterpret_cast<T>(v);
}

constexpr size_t kTensorMapBytes = sizeof(CUtensorMap);  // 128

}  // namespace

#define CALL(fn, ...) (d_.fn ? d_.fn(__VA_ARGS__) : CUDA_ERROR_NOT_SUPPORTED)

bool SessionQueries::Handles(Fn fn) {
  switch (fn) {
    case Fn::cuTensorMapReplaceAddress:
      return true;
    default:
      return false;
  }
}

CUresult SessionQueries::Call(Fn fn, Reader& rd, Writer& out) {
  switch (fn) {
    case Fn::cuTensorMapReplaceAddress:
      return ReplaceAddress(rd, out);
    default:
      return CUDA_ERROR_NOT_SUPPORTED;
  }
}

// cuTensorMapReplaceAddress: the 128-byte map, u64 address; the map comes back. (The encodings
// are generated: api/remote_surface.tsv.)
CUresult SessionQueries::ReplaceAddress(Reader& rd, Writer& out) {
  CUtensorMap map;
  memset(&map, 0, sizeof(map));
  uint64_t addr = 0;
  rd.Bytes(&map, kTensorMapBytes);
  if (!rd.U64(&addr) || !rd.Finish()) return CUDA_ERROR_INVALID_VALUE;
  const CUresult r = CALL(cuTensorMapReplaceAddress, &map, As<void*>(addr));
  if (r == CUDA_SUCCESS) out.Bytes(&map, kTensorMapBytes);
  return r;
}

}  // namespace tf::worker
