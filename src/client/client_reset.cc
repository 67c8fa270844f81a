// Resetting a device's primary context remotely (cuDevicePrimaryCtxReset, cudaDeviceReset): the
// worker destroys what the session made in that context and retires every name of it
// (session.cc PrimaryCtxReset); the client drops what it caches about those objects.
#include <cstdint>
#include <vector>

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
// and registered host memory (the worker registers its regions again) stay; page-locked and
// managed memory go (client_host.cc HostMemoryAfterReset). REQUIRES State().mu.
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
    for (const auto& [c, info] : s->context_info) {
      if (info.primary && info.device == dev) primary = c;
    }
    // i32 device, u32 n, n x u64: the host regions the reset frees (the worker drops every
    // mirror itself, and keeps its other regions registered).
    const std::vector<HostRange> freed = HostMemoryFreedByReset(s, primary);
    std::vector<uint64_t> regions;
    for (const HostRange& h : freed) {
      if (h.region_id != 0) regions.push_back(h.region_id);
    }
    std::vector<uint8_t> buf(8 + 8 * regions.size());
    Writer w(buf.data(), buf.size());
    w.I32(dev);
    w.U32(static_cast<uint32_t>(regions.size()));
    for (uint64_t id : regions) w.U64(id);
    CUresult r = Simple(l, Fn::cuDevicePrimaryCtxReset_v2, w);
    if (r != CUDA_SUCCESS) return r;
    HostMemoryAfterReset(s, freed);
    DropContextState(s);
  }
  // As the driver: the context's storage (cudart's per-context state) is destroyed with it.
  if (primary != 0) ReleaseContextStorage(primary);
  return CUDA_SUCCESS;
}

CUresult Impl_cuDevicePrimaryCtxReset(CUdevice dev) { return Impl_cuDevicePrimaryCtxReset_v2(dev); }

}  // namespace tf::client
