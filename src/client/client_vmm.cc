// Virtual memory management (PyTorch's expandable segments). Generated from
// api/remote_surface.tsv: cuMemGetAllocationGranularity, cuMemAddressReserve/Free,
// cuMemCreate/Release and cuMemMap/Unmap, whose client-side bookkeeping is here (hook=client);
// cuMemSetAccess is forwarded synchronously by hand (it is not stream-ordered).
// Addresses and handles are the worker's; a mapped range is device memory to the client's pointer
// attributes and copy-direction guesses until it is unmapped. Exporting handles (IPC) is not
// forwarded.
#include "client/client_internal.h"
#include "tf_client_impl.h"

namespace tf::client {

using driver::Fn;
using transport::Writer;

// hook=client: a mapped range is device memory to the client's pointer queries and copies until
// it is unmapped.
void ClientDone_cuMemMap(Session* s, CUdeviceptr ptr, size_t size, size_t, CUmemGenericAllocationHandle,
                         unsigned long long) {
  RecordDeviceAlloc(s, ptr, size, 0);
}

void ClientDone_cuMemUnmap(Session* s, CUdeviceptr ptr, size_t size) {
  s->allocs.erase(s->allocs.lower_bound(ptr), s->allocs.lower_bound(ptr + size));
}

CUresult Impl_cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc,
                             size_t count) {
  if (desc == nullptr || count == 0 || count > 64) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  uint8_t buf[24 + 64 * 12];
  Writer w(buf, sizeof(buf));
  w.U64(ptr);
  w.U64(size);
  w.U32(static_cast<uint32_t>(count));
  for (size_t i = 0; i < count; ++i) {
    w.U32(static_cast<uint32_t>(desc[i].location.type));
    w.I32(desc[i].location.id);
    w.U32(static_cast<uint32_t>(desc[i].flags));
  }
  return Simple(l, Fn::cuMemSetAccess, w);
}

}  // namespace tf::client
