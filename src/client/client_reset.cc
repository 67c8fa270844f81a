// Resetting a device's primary context remotely (cuDevicePrimaryCtxReset, cudaDeviceReset): the
// worker destroys what the session made in that context and retires every name of it
// (session.cc PrimaryCtxReset); the client drops what it caches about those objects.
#include <cstdint>

#include "client/client_internal.h"
#include "client/export_tables.h"
#include "tf_client_impl.h"

namespace tf::client {
namespace {

using driver::Fn;
using transport::Writer;

// Everything the client knows about objects of the reset context: allocations, streams,
// captures, modules' functions, arrays and textures, graphs, and every cached answer (they may
// name retired handles). The contexts themselves, libraries and their kernels
// (context-independent), the device snapshot, the images sent (the worker keeps them by content)
// and host memory (the worker registers its regions again) stay. REQUIRES State().mu.
void DropContextState(Session* s) {
  for (auto it = s->functions.begin(); it != s->functions.end();) {
    if (s->kernels.count(it->first)) ++it;  // a kernel launched as a function
    else it = s->functions.erase(it);
  }
  s->other_function_names.clear();
  s->allocs.clear();
  s->streams.clear();
  s->capturing.clear();
  s->arrays.clear();
  s->mipmaps.clear();
  s->textures.clear();
  s->surfaces.clear();
  s->answers.clear();
  s->exec_host_nodes.clear();
  s->graph_allocs.clear();
  s->exec_outliving.clear();
  s->capture_deps.clear();
  s->capture_edges.clear();
  ForgetOccupancy(s);
}

}  // namespace

CUresult Impl_cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  uint64_t primary = 0;
  {
    TF_LOCK(l);
    Session* s = l.session();
    if (dev < 0 || static_cast<size_t>(dev) >= s->devices.size()) return CUDA_ERROR_INVALID_DEVICE;
    uint8_t buf[8];
    Writer w(buf, sizeof(buf));
    w.I32(dev);
    CUresult r = Simple(l, Fn::cuDevicePrimaryCtxReset_v2, w);
    if (r != CUDA_SUCCESS) return r;
    for (const auto& [c, info] : s->context_info) {
      if (info.primary && info.device == dev) primary = c;
    }
    DropContextState(s);
  }
  // As the driver: the context's storage (cudart's per-context state) is destroyed with it.
  if (primary != 0) ReleaseContextStorage(primary);
  return CUDA_SUCCESS;
}

CUresult Impl_cuDevicePrimaryCtxReset(CUdevice dev) { return Impl_cuDevicePrimaryCtxReset_v2(dev); }

}  // namespace tf::client
